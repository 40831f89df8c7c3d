// A server's last words on an HTTP/2 connection it refuses or cuts: a GOAWAY whose debug data says
// why, so that a client can tell "refused, and why" from "nothing there". The daemon's listener
// writes one before it closes a connection at its cap, the relay before it cuts one for abuse; an
// agent that cannot connect reads it back (goAwayReason) and says so instead of waiting in silence.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ddprun {

// The client connection preface and an empty SETTINGS frame: what a client sends first.
std::string http2ClientPreface();

// GOAWAY(ENHANCE_YOUR_CALM) carrying `reason` (cut to 256 bytes): on a fresh connection (last
// stream 0: nothing was processed), or between two frames of a server that already spoke, with
// the highest stream the server may have processed (a client retries only the streams above it:
// 0 there would let it send again a call that was done, an Add twice).
std::string http2GoAway(std::string_view reason, uint32_t lastStream = 0);

// The debug data of the first GOAWAY frame in what a server sent (frames from its first byte),
// made printable; nullopt when there is none.
std::optional<std::string> goAwayReason(std::string_view received);

}  // namespace ddprun
