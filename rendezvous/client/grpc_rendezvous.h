// The agent's rendezvous backend for multi-node jobs: one Session stream to the rendezvous server
// (embedded in one agent, or the ddprun-rdzv daemon). Server pushes arrive on a reader thread and
// are handed to the agent's event loop through `post`; heartbeats go out from a small thread,
// which also fences the workers when the server stops answering them.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "rendezvous/client/client_core.h"  // FenceTiming
#include "rendezvous/client/rendezvous.h"
#include "rendezvous/rules/state_machine.h"
#include "tls/tls_options.h"

namespace ddprun {

struct GrpcRendezvousOptions : NodeOptions {
  std::string endpoint;        // HOST:PORT of the rendezvous server
  std::string token;           // job token, sent as metadata; never logged
  std::chrono::milliseconds connectTimeout{30000};
  // TLS to the server (--rdzv_conf protocol=https,cacert=...,cert=...,key=...).
  TlsClientOptions tls{};
};

// Joins when join() is called; its destructor ends the session (the server sees this node leave)
// and joins its threads.
std::unique_ptr<Rendezvous> makeGrpcRendezvous(GrpcRendezvousOptions options, ClientCore::Post post);

}  // namespace ddprun
