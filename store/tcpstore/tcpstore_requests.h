// torch's TCPStore commands as store requests, and the store's responses as TCPStore's answers: the
// protocol's translation, apart from the connections that carry it (tcpstore_server.cc) and the
// bytes of each command (tcpstore_codec.h).
#pragma once

#include <cstdint>
#include <string>

#include "ddprun/v1/store.pb.h"
#include "store/core/run_scoped_store.h"
#include "store/tcpstore/tcpstore_codec.h"

namespace ddprun::tcpstore {

// How a request's answer is written, by what the command was.
enum class Reply { kNone, kValue, kCompareSet, kAdd, kCheck, kWait, kDelete, kNumKeys, kMultiGet, kListKeys };

// What a connection owes for one request it sent to the store.
struct Owed {
  Reply reply = Reply::kNone;
  std::string expected;  // compare_set: what a missing key answers
};

// The store request of `command` (its keys and values are moved out) in `scope`, and what its
// answer must be. Only for the commands the store answers: not VALIDATE, PING, CANCEL_WAIT, the
// queues, BARRIER or WATCH_KEY (the connection answers or refuses those itself). A WAIT waits up
// to waitTimeoutMs (torch's wait has no timeout on the wire: its client gives up by itself).
// torch's GET does not wait (its client waits first) and reads a missing key as empty: it is a
// one-key multi_get.
void toStoreRequest(Command& command, const StoreScope& scope, uint32_t waitTimeoutMs, v1::StoreRequest& request,
                    Owed& owed);

// Appends the answer of a successful response to `out` (nothing for a SET, APPEND or MULTI_SET:
// torch's server answers none).
void encodeAnswer(const Owed& owed, const v1::StoreResponse& response, std::string& out);

}  // namespace ddprun::tcpstore
