// Why an agent cannot connect to its rendezvous, as far as one plain TCP attempt can tell: gRPC's
// channel says only "not connected", and an agent refused at a daemon's connection cap used to
// wait in silence until its connect timeout, as if nothing listened there.
#pragma once

#include <chrono>
#include <string>

namespace ddprun {

struct Unreachable {
  std::string why;       // one line; empty when the server answered as an HTTP/2 server does
  bool foreign = false;  // something answered, but not as a gRPC server can (HTTP/1.x): no retry helps
};

// Connects to `endpoint` (HOST:PORT) once, sends the HTTP/2 client preface and reads what comes
// back within `timeout`. Says "nothing listens" (refused), "no answer" (timeout), "refused the
// connection: <the server's GOAWAY reason>", "accepts connections but closes them", "accepts
// connections but answers nothing" (a silent port, or a stuck server), "answered in HTTP/1.x"
// (foreign), or "answered, but not in HTTP/2"; empty when the server answered as an HTTP/2
// server does (gRPC's own retries will get there).
Unreachable probeConnection(const std::string& endpoint, std::chrono::milliseconds timeout);
// probeConnection's line.
std::string whyUnreachable(const std::string& endpoint, std::chrono::milliseconds timeout);

}  // namespace ddprun
