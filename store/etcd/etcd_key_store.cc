#include "store/etcd/etcd_key_store.h"

#include <fmt/format.h>

#include <charconv>
#include <memory>
#include <optional>
#include <random>
#include <set>

#include "common/error.h"
#include "common/store_prefix.h"
#include "etcd/etcd_watch.h"

namespace ddprun {

namespace {

// A nonce only has to outlive the retries of one call (the client's retryTimeout); a lease is
// renewed by granting a new one when half its TTL has passed, and old nonces expire with theirs.
constexpr std::chrono::seconds kNonceLeaseTtl{120};

// Keys per transaction: etcd's default --max-txn-ops is 128, and a read adds the round marker.
constexpr std::size_t kKeysPerTxn = 100;

void checkKey(const std::string& key) {
  if (key.empty()) throw ConfigError("store: empty key");
}

int64_t parseCounter(const std::string& key, const std::string& value) {
  int64_t n = 0;
  auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
  if (ec != std::errc() || p != value.data() + value.size()) {
    throw StateError("store: add() on key '" + key + "' whose value is not a number");
  }
  return n;
}

std::string randomId() {
  std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{:016x}", rng());
}

// The transaction applies only if key k is as `kv` read it: the same mod revision, or still missing.
void unchangedSince(etcdserverpb::TxnRequest& t, const std::string& k, const std::optional<EtcdKeyValue>& kv) {
  auto* cmp = t.add_compare();
  cmp->set_key(k);
  cmp->set_result(etcdserverpb::Compare::EQUAL);
  if (kv) {
    cmp->set_target(etcdserverpb::Compare::MOD);
    cmp->set_mod_revision(kv->modRevision);
  } else {
    cmp->set_target(etcdserverpb::Compare::CREATE);  // create_revision 0: the key is missing
    cmp->set_create_revision(0);
  }
}

}  // namespace

EtcdKeyStore::EtcdKeyStore(EtcdKeyStoreOptions options) : EtcdKeyStore(std::move(options), nullptr) {}

EtcdKeyStore::EtcdKeyStore(EtcdKeyStoreOptions options, std::shared_ptr<EtcdClient> client)
    : options_(std::move(options)),
      dataPrefix_(options_.prefix + "kv/"),
      opPrefix_(options_.prefix + "op/"),
      marker_(options_.prefix + std::string(kRoundMarker)),
      owned_(client ? std::move(client) : std::make_shared<EtcdClient>(options_.client)),
      client_(*owned_),
      clientId_(randomId()) {
  if (options_.prefix.empty() || options_.prefix.back() != '/') {
    throw ConfigError("etcd store: prefix '" + options_.prefix + "' must end with '/'");
  }
}

EtcdKeyStore::~EtcdKeyStore() = default;

void EtcdKeyStore::guard(etcdserverpb::TxnRequest& t) const {
  if (!options_.fenceByRound) return;
  auto* cmp = t.add_compare();
  cmp->set_key(marker_);
  cmp->set_target(etcdserverpb::Compare::VERSION);
  cmp->set_result(etcdserverpb::Compare::GREATER);
  cmp->set_version(0);
}

void EtcdKeyStore::throwStale() const {
  throw StateError("stale round: the store of '" + options_.prefix +
                           "' is gone (a newer round started, or the job ended)");
}

bool EtcdKeyStore::roundIsCurrent() { return !options_.fenceByRound || client_.get(marker_).has_value(); }

int64_t EtcdKeyStore::keyLease() {
  if (!options_.fenceByRound) return 0;
  std::lock_guard<std::mutex> lock(leaseMutex_);
  if (!roundLeaseKnown_) {
    // The round marker lives on the job's lease, which every agent renews: keys on it go when
    // every agent has died, instead of staying in etcd for good.
    auto kv = client_.get(marker_);
    if (!kv) throwStale();
    roundLease_ = kv->lease;
    roundLeaseKnown_ = true;
  }
  return roundLease_;
}

std::string EtcdKeyStore::dataKey(const std::string& key) const {
  checkKey(key);
  return dataPrefix_ + key;
}

void EtcdKeyStore::set(const std::string& key, const std::string& value) {
  if (!options_.fenceByRound) {
    client_.put(dataKey(key), value);
    return;
  }
  etcdserverpb::TxnRequest t;
  guard(t);
  auto* put = t.add_success()->mutable_request_put();
  put->set_key(dataKey(key));
  put->set_value(value);
  put->set_lease(keyLease());
  if (!client_.txn(t).succeeded()) throwStale();
}

std::string EtcdKeyStore::get(const std::string& key) { return get(key, options_.timeout); }

std::string EtcdKeyStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  const std::string k = dataKey(key);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    wait({key}, std::max(std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()),
                         std::chrono::milliseconds(0)));
    if (auto kv = client_.get(k)) return kv->value;
    // Deleted between the wait and the read: wait again.
  }
}

int64_t EtcdKeyStore::nonceLease() {
  // Under the rendezvous, nonces go with the round's keys (next round, job end) or with the
  // job's lease when every agent dies: found by the test that kills every agent.
  if (options_.fenceByRound) return keyLease();
  std::lock_guard<std::mutex> lock(leaseMutex_);
  auto now = std::chrono::steady_clock::now();
  if (lease_ == 0 || now - leaseGranted_ > kNonceLeaseTtl / 2) {
    lease_ = client_.grantLease(kNonceLeaseTtl);
    leaseGranted_ = now;
  }
  return lease_;
}

int64_t EtcdKeyStore::add(const std::string& key, int64_t delta) {
  const std::string k = dataKey(key);
  for (;;) {
    auto kv = client_.get(k);
    int64_t value = (kv ? parseCounter(key, kv->value) : 0) + delta;
    std::string nonce;
    {
      std::lock_guard<std::mutex> lock(leaseMutex_);
      nonce = opPrefix_ + clientId_ + "-" + std::to_string(++nonceSeq_);
    }
    etcdserverpb::TxnRequest t;
    unchangedSince(t, k, kv);
    auto* put = t.add_success()->mutable_request_put();
    put->set_key(k);
    put->set_value(std::to_string(value));
    put->set_lease(keyLease());
    auto* mark = t.add_success()->mutable_request_put();
    mark->set_key(nonce);
    mark->set_lease(nonceLease());
    guard(t);
    if (client_.txn(t).succeeded()) return value;
    // Lost the race, or an earlier attempt of this very transaction was applied and its answer
    // lost (the client retried it on another member): the nonce tells which.
    if (client_.get(nonce)) return value;
    if (!roundIsCurrent()) throwStale();
  }
}

std::string EtcdKeyStore::compareSet(const std::string& key, const std::string& expected, const std::string& desired,
                                     bool* wasMissing) {
  const std::string k = dataKey(key);
  etcdserverpb::TxnRequest t;
  auto* cmp = t.add_compare();
  cmp->set_key(k);
  cmp->set_result(etcdserverpb::Compare::EQUAL);
  if (expected.empty()) {
    cmp->set_target(etcdserverpb::Compare::CREATE);
    cmp->set_create_revision(0);
  } else {
    cmp->set_target(etcdserverpb::Compare::VALUE);
    cmp->set_value(expected);
  }
  auto* put = t.add_success()->mutable_request_put();
  put->set_key(k);
  put->set_value(desired);
  put->set_lease(keyLease());
  t.add_failure()->mutable_request_range()->set_key(k);
  guard(t);
  if (options_.fenceByRound) t.add_failure()->mutable_request_range()->set_key(marker_);
  auto resp = client_.txn(t);
  if (wasMissing) *wasMissing = expected.empty() && resp.succeeded();
  if (resp.succeeded()) return desired;
  if (options_.fenceByRound && resp.responses(1).response_range().kvs_size() == 0) throwStale();
  // A retried transaction whose first attempt was applied lands here too, and reads `desired`:
  // the same answer.
  const auto& range = resp.responses(0).response_range();
  if (wasMissing) *wasMissing = range.kvs_size() == 0;
  return range.kvs_size() > 0 ? range.kvs(0).value() : std::string();
}

void EtcdKeyStore::append(const std::string& key, const std::string& value) {
  const std::string k = dataKey(key);
  for (;;) {
    auto kv = client_.get(k);
    etcdserverpb::TxnRequest t;
    unchangedSince(t, k, kv);
    auto* put = t.add_success()->mutable_request_put();
    put->set_key(k);
    put->set_value(kv ? kv->value + value : value);
    put->set_lease(keyLease());
    guard(t);
    if (client_.txn(t).succeeded()) return;
    if (!roundIsCurrent()) throwStale();  // else another writer came first: read again
  }
}

std::vector<std::string> EtcdKeyStore::multiGet(const std::vector<std::string>& keys, std::vector<bool>* found) {
  std::vector<std::string> values;
  readAll(keys, found, &values);
  return values;
}

void EtcdKeyStore::multiSet(const std::vector<std::string>& keys, const std::vector<std::string>& values) {
  if (keys.size() != values.size()) {
    throw ConfigError("store: multi_set of " + std::to_string(keys.size()) + " keys and " +
                      std::to_string(values.size()) + " values");
  }
  for (std::size_t at = 0; at < keys.size(); at += kKeysPerTxn) {
    etcdserverpb::TxnRequest t;
    guard(t);
    for (std::size_t i = at; i < std::min(keys.size(), at + kKeysPerTxn); ++i) {
      auto* put = t.add_success()->mutable_request_put();
      put->set_key(dataKey(keys[i]));
      put->set_value(values[i]);
      put->set_lease(keyLease());
    }
    if (!client_.txn(t).succeeded()) throwStale();
  }
}

std::vector<std::string> EtcdKeyStore::listKeys() {
  if (!roundIsCurrent()) throwStale();
  std::vector<std::string> keys;
  for (auto& kv : client_.getPrefix(dataPrefix_)) keys.push_back(kv.key.substr(dataPrefix_.size()));
  return keys;
}

int64_t EtcdKeyStore::readAll(const std::vector<std::string>& keys, std::vector<bool>* present,
                              std::vector<std::string>* values) {
  present->assign(keys.size(), false);
  if (values) values->assign(keys.size(), "");
  int64_t revision = 0;
  // One transaction of ranges: one request, one revision for every key; etcd takes at most 128
  // operations per transaction (--max-txn-ops), so a long list is read in parts.
  for (std::size_t at = 0; at < keys.size() || at == 0; at += kKeysPerTxn) {
    const std::size_t end = std::min(keys.size(), at + kKeysPerTxn);
    etcdserverpb::TxnRequest t;
    for (std::size_t i = at; i < end; ++i) t.add_success()->mutable_request_range()->set_key(dataKey(keys[i]));
    if (options_.fenceByRound) t.add_success()->mutable_request_range()->set_key(marker_);
    auto resp = client_.txn(t);
    if (options_.fenceByRound && resp.responses(static_cast<int>(end - at)).response_range().kvs_size() == 0) {
      throwStale();
    }
    for (std::size_t i = at; i < end; ++i) {
      const auto& r = resp.responses(static_cast<int>(i - at)).response_range();
      if (r.kvs_size() > 0) {
        (*present)[i] = true;
        if (values) (*values)[i] = r.kvs(0).value();
      }
    }
    revision = resp.header().revision();
    if (end == keys.size()) break;
  }
  return revision;
}

void EtcdKeyStore::throwTimeout(const std::set<std::string>& missing, std::chrono::milliseconds timeout) const {
  std::string names;
  for (const auto& m : missing) names += (names.empty() ? "" : ", ") + m.substr(dataPrefix_.size());
  throw TimeoutError("store: timed out after " + std::to_string(timeout.count()) + " ms waiting for keys: " + names);
}

void EtcdKeyStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  if (keys.empty()) return;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<bool> present;
  readAll(keys, &present, nullptr);
  std::set<std::string> missing;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (!present[i]) missing.insert(dataKey(keys[i]));
  }
  if (missing.empty()) return;
  // The whole round's prefix: its keys, and the round marker whose deletion ends the wait. From
  // now, then read again what is still missing: a watch from the read's revision would land in
  // etcd's 100 ms catch-up loop whenever another rank wrote in between (EtcdWatch).
  auto watchFromNow = [&] {
    auto w = std::make_unique<EtcdWatch>(client_, options_.prefix, etcdPrefixEnd(options_.prefix),
                                                 EtcdWatch::kFromNow);
    if (!w->startedAfter(deadline)) throwTimeout(missing, timeout);
    std::vector<std::string> names;
    for (const auto& m : missing) names.push_back(m.substr(dataPrefix_.size()));
    std::vector<bool> now;
    readAll(names, &now, nullptr);
    for (std::size_t i = 0; i < names.size(); ++i) {
      if (now[i]) missing.erase(dataKey(names[i]));
    }
    return w;
  };
  auto watch = watchFromNow();
  while (!missing.empty()) {
    if (std::chrono::steady_clock::now() >= deadline) throwTimeout(missing, timeout);
    std::vector<mvccpb::Event> events;
    try {
      events = watch->next(deadline);
    } catch (const EtcdCompacted&) {
      // What happened meanwhile is lost to the watch: watch anew and read again (the marker too).
      watch = watchFromNow();
      continue;
    }
    for (const auto& ev : events) {
      if (ev.type() == mvccpb::Event::PUT) missing.erase(ev.kv().key());
      if (options_.fenceByRound && ev.type() == mvccpb::Event::DELETE && ev.kv().key() == marker_) throwStale();
    }
  }
}

bool EtcdKeyStore::check(const std::vector<std::string>& keys) {
  if (keys.empty()) return true;
  std::vector<bool> present;
  readAll(keys, &present, nullptr);
  for (bool p : present) {
    if (!p) return false;
  }
  return true;
}

bool EtcdKeyStore::deleteKey(const std::string& key) { return client_.deleteKey(dataKey(key)) > 0; }

int64_t EtcdKeyStore::numKeys() { return client_.countPrefix(dataPrefix_); }

}  // namespace ddprun
