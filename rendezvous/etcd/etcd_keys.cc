#include "rendezvous/etcd/etcd_keys.h"

#include <fmt/format.h>


#include "common/store_prefix.h"

namespace ddprun {

namespace {

std::string trimmed(std::string_view root) {
  while (!root.empty() && root.back() == '/') root.remove_suffix(1);
  return std::string(root);
}

void deleteRange(const std::string& from, const std::string& to, etcdserverpb::TxnRequest* txn) {
  auto* del = txn->add_success()->mutable_request_delete_range();
  del->set_key(from);
  del->set_range_end(to);
}

}  // namespace

EtcdKeys::EtcdKeys(std::string_view root, std::string_view runId)
    : job_(trimmed(root) + runPrefix(runId)), rdzv_(job_ + "rdzv/"), rounds_(trimmed(root) + storeRoundsPrefix(runId)) {}

std::string EtcdKeys::node(std::string_view nodeId) const { return nodes().append(nodeId); }

std::string EtcdKeys::event(std::string_view nodeId, uint64_t seq) const {
  return rdzv_ + "events/" + std::string(nodeId) + "/" + seqKey(seq);
}

std::string EtcdKeys::notices(std::string_view nodeId) const { return rdzv_ + "notices/" + std::string(nodeId) + "/"; }

std::string EtcdKeys::notice(std::string_view nodeId, uint64_t seq) const { return notices(nodeId) + seqKey(seq); }

std::string EtcdKeys::round(uint64_t round) const { return rounds_ + std::to_string(round) + "/"; }

std::string EtcdKeys::roundMarker(uint64_t round) const { return this->round(round).append(kRoundMarker); }

std::optional<std::string> EtcdKeys::nodeOfNodeKey(std::string_view key) const {
  const std::string prefix = nodes();
  if (key.substr(0, prefix.size()) != prefix) return std::nullopt;
  return std::string(key.substr(prefix.size()));
}

std::optional<std::string> EtcdKeys::nodeOfEventKey(std::string_view key) const {
  const std::string prefix = rdzv_ + "events/";
  if (key.substr(0, prefix.size()) != prefix) return std::nullopt;
  std::string_view rest = key.substr(prefix.size());
  return std::string(rest.substr(0, rest.find('/')));
}

std::string seqKey(uint64_t seq) {
  return fmt::format("{:020}", seq);
}

etcdserverpb::TxnRequest whileDriver(const EtcdKeys& keys, const std::string& nodeId) {
  etcdserverpb::TxnRequest t;
  auto* cmp = t.add_compare();
  cmp->set_key(keys.driver());
  cmp->set_target(etcdserverpb::Compare::VALUE);
  cmp->set_result(etcdserverpb::Compare::EQUAL);
  cmp->set_value(nodeId);
  return t;
}

void dropRoundsBelow(const EtcdKeys& keys, uint64_t keep, etcdserverpb::TxnRequest* txn) {
  const std::string kept = keys.round(keep);
  deleteRange(keys.rounds(), kept, txn);
  deleteRange(etcdPrefixEnd(kept), etcdPrefixEnd(keys.rounds()), txn);
}

void dropAllRounds(const EtcdKeys& keys, etcdserverpb::TxnRequest* txn) {
  deleteRange(keys.rounds(), etcdPrefixEnd(keys.rounds()), txn);
}

}  // namespace ddprun
