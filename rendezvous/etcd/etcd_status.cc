#include "rendezvous/etcd/etcd_status.h"

#include <algorithm>
#include <map>

#include "common/strings.h"
#include "ddprun/v1/etcd_rendezvous.pb.h"
#include "rendezvous/etcd/etcd_keys.h"
#include "rendezvous/etcd/etcd_records.h"
#include "rendezvous/wire/status_proto.h"

namespace ddprun {

v1::StatusReply readEtcdStatus(EtcdStatusOptions o) {
  v1::StatusReply reply;
  reply.set_server("etcd");
  for (const auto& e : split(o.endpoints, ',')) {
    if (!e.empty()) o.client.endpoints.push_back(e);
  }
  o.client.callTimeout = o.timeout;
  o.client.retryTimeout = o.timeout;
  EtcdClient client(o.client);
  const EtcdKeys keys(o.prefix, o.runId);
  auto state = client.get(keys.state());
  const auto nodeKeys = client.getPrefix(keys.nodes());
  if (!state && nodeKeys.empty()) return reply;

  // The state is the driver's last write; before the first one, the job only has nodes' keys.
  v1::RendezvousSnapshot snapshot;
  RendezvousState::Snapshot rules;
  if (state && snapshot.ParseFromString(state->value)) rules = etcd_records::fromProto(snapshot);
  rules.job.runId = o.runId;
  const Micros now{0};
  v1::JobStatus* job = reply.add_jobs();
  job->set_run_id(o.runId);
  std::optional<JobEvent> lastFailure;
  if (snapshot.has_last_failure()) lastFailure = fromProto(snapshot.last_failure());
  toProto(RendezvousState::restore(rules, now), now, statusNodeLimit(o.maxNodes), lastFailure,
          snapshot.last_event_seq(), job);
  if (job->has_last_failure()) job->mutable_last_failure()->set_age_s(-1);  // the driver's clock, not ours
  // Liveness on etcd is each node's lease, not a heartbeat the reader saw: say how long each has
  // left, and list the nodes whose keys exist but that the driver has not taken in yet.
  std::map<std::string, int64_t> leases;
  for (const auto& kv : nodeKeys) leases[keys.nodeOfNodeKey(kv.key).value_or(kv.key)] = kv.lease;
  for (auto& node : *job->mutable_nodes()) {
    node.set_last_heartbeat_age_s(-1);
    auto it = leases.find(node.node_id());
    node.set_lease_left_s(it == leases.end() ? 0 : static_cast<double>(client.leaseTimeToLive(it->second)));
    if (it == leases.end()) node.set_state("gone");
    if (it != leases.end()) leases.erase(it);
  }
  for (const auto& [id, lease] : leases) {
    if (static_cast<std::size_t>(job->nodes_size()) >= statusNodeLimit(o.maxNodes)) break;
    v1::NodeStatus* node = job->add_nodes();
    node->set_node_id(id);
    node->set_group_rank(-1);
    node->set_state("joining");
    node->set_last_heartbeat_age_s(-1);
    node->set_lease_left_s(static_cast<double>(client.leaseTimeToLive(lease)));
  }
  job->set_node_count(static_cast<uint32_t>(std::max<std::size_t>(job->node_count(), nodeKeys.size())));
  return reply;
}

}  // namespace ddprun
