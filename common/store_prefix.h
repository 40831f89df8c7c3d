// The workers' store layout, one place for every user: the rendezvous (notices' store prefix), the
// agent (a single node's file store), the store server's run-scoped keys, the worker SDK (its
// store on etcd) and the etcd driver (which drops rounds). Every key of a run's store lives under
// runPrefix(id) + "round/<n>/", so a restarted group never reads a stale round's keys.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace ddprun {

// "/run/<id>/": everything of one run (the etcd backend keeps its rendezvous keys here too).
std::string runPrefix(std::string_view runId);

// "/run/<id>/round/": the stores of every round of a run.
std::string storeRoundsPrefix(std::string_view runId);

// "/run/<id>/round/<n>/": the store of one round (DDPRUN_STORE_PREFIX).
std::string storePrefix(std::string_view runId, uint64_t round);

// The store on etcd: the key under a round's prefix that says the round is current. The etcd
// driver writes it with the round's assignment; the workers' etcd store guards every write with
// it (store/etcd/etcd_key_store.h, fenceByRound).
inline constexpr std::string_view kRoundMarker = "alive";

}  // namespace ddprun
