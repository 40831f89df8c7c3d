// torch's store when the job's store is a ddprun store server (the rendezvous server's, or a
// daemon's): each round's sinks forward to the address the round names, through one forwarder made
// at the first round that names it (and again when the address changes). A forwarder that cannot
// be made gives sinks that answer UNAVAILABLE, so the workers' TCPStore connections close (the
// protocol has no error reply) and torch says so; the next round tries again.
#pragma once

#include <functional>
#include <string>

#include "store/client/store_client.h"
#include "store/core/store_request_sink.h"

namespace ddprun {

// The sinks of the round whose store is at `address`; call on one thread (the agent's).
using SinksForAddress = std::function<StoreRequestSink::Factory(const std::string& address)>;

// `client`: the token, TLS and timeouts; its address is each round's.
SinksForAddress forwardingByAddress(StoreClientOptions client);

// Sinks that answer every request UNAVAILABLE, saying `why`.
StoreRequestSink::Factory unavailableSinks(std::string why);

}  // namespace ddprun
