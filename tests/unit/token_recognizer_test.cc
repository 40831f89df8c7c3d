// The front door's token recognizer (netguard/token_recognizer.h) on header blocks made by
// nghttp2's own HPACK encoder, framed as a client frames them: one HEADERS frame, HEADERS plus
// CONTINUATION, padding and priority, fed in pieces of any size.
#include "netguard/token_recognizer.h"

#include <nghttp2/nghttp2.h>

#include <catch2/catch.hpp>
#include <string>
#include <utility>
#include <vector>

namespace {

using ddprun::TokenRecognizer;
using Headers = std::vector<std::pair<std::string, std::string>>;

const std::string kPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

// HPACK with a dynamic table kept across blocks, as a client's connection keeps it.
struct Encoder {
  nghttp2_hd_deflater* hd = nullptr;
  Encoder() { REQUIRE(nghttp2_hd_deflate_new(&hd, 4096) == 0); }
  ~Encoder() { nghttp2_hd_deflate_del(hd); }
  std::string block(const Headers& headers) {
    std::vector<nghttp2_nv> nv;
    for (const auto& [k, v] : headers) {
      nv.push_back({reinterpret_cast<uint8_t*>(const_cast<char*>(k.data())),
                    reinterpret_cast<uint8_t*>(const_cast<char*>(v.data())), k.size(), v.size(), NGHTTP2_NV_FLAG_NONE});
    }
    std::string out(nghttp2_hd_deflate_bound(hd, nv.data(), nv.size()), '\0');
    const auto n = nghttp2_hd_deflate_hd(hd, reinterpret_cast<uint8_t*>(out.data()), out.size(), nv.data(), nv.size());
    REQUIRE(n >= 0);
    out.resize(static_cast<std::size_t>(n));
    return out;
  }
};

std::string frame(unsigned char type, unsigned char flags, uint32_t stream, const std::string& payload) {
  std::string f;
  f += static_cast<char>((payload.size() >> 16) & 0xff);
  f += static_cast<char>((payload.size() >> 8) & 0xff);
  f += static_cast<char>(payload.size() & 0xff);
  f += static_cast<char>(type);
  f += static_cast<char>(flags);
  f += static_cast<char>((stream >> 24) & 0x7f);
  f += static_cast<char>((stream >> 16) & 0xff);
  f += static_cast<char>((stream >> 8) & 0xff);
  f += static_cast<char>(stream & 0xff);
  return f + payload;
}

const std::string kSettings = frame(0x4, 0, 0, std::string(6, '\0'));

Headers request(const std::string& token) {
  Headers h{{":method", "POST"}, {":scheme", "http"}, {":path", "/ddprun.v1.Rendezvous/Session"},
            {":authority", "127.0.0.1:29400"}, {"content-type", "application/grpc"}, {"te", "trailers"}};
  if (!token.empty()) h.emplace_back("x-ddprun-token", token);
  return h;
}

TokenRecognizer::Verdict feedAll(TokenRecognizer& r, const std::string& bytes, std::size_t piece) {
  for (std::size_t i = 0; i < bytes.size(); i += piece) r.feed(bytes.data() + i, std::min(piece, bytes.size() - i));
  return r.verdict();
}

}  // namespace

TEST_CASE("token recognizer: the token in a client's first request headers", "[netguard]") {
  Encoder enc;
  const std::string bytes = kPreface + kSettings + frame(0x1, 0x4, 1, enc.block(request("s3cret")));
  for (std::size_t piece : {std::size_t{1}, std::size_t{7}, bytes.size()}) {
    TokenRecognizer r("x-ddprun-token", "s3cret");
    CHECK(feedAll(r, bytes, piece) == TokenRecognizer::Verdict::kFound);
  }
  TokenRecognizer wrong("x-ddprun-token", "other");
  CHECK(feedAll(wrong, bytes, 5) == TokenRecognizer::Verdict::kUndecided);
  TokenRecognizer prefix("x-ddprun-token", "s3cre");  // a prefix of it is not it
  CHECK(feedAll(prefix, bytes, 5) == TokenRecognizer::Verdict::kUndecided);
}

TEST_CASE("token recognizer: CONTINUATION, padding, priority, and the dynamic table across blocks", "[netguard]") {
  Encoder enc;
  const std::string first = enc.block(request(""));          // no token: fills the dynamic table
  const std::string second = enc.block(request("s3cret"));   // refers to entries of the first
  std::string padded;
  padded += static_cast<char>(3);                            // pad length
  padded += std::string(5, '\0');                            // priority: dependency and weight
  padded += second.substr(0, second.size() / 2);
  padded += std::string(3, '\0');                            // the padding
  const std::string bytes = kPreface + kSettings + frame(0x1, 0x4, 1, first) +
                            frame(0x1, 0x8 | 0x20, 3, padded) + frame(0x9, 0x4, 3, second.substr(second.size() / 2));
  TokenRecognizer r("x-ddprun-token", "s3cret");
  CHECK(feedAll(r, bytes, 3) == TokenRecognizer::Verdict::kFound);
}

TEST_CASE("token recognizer: gives up on garbage, oversized blocks, and many blocks without it", "[netguard]") {
  TokenRecognizer garbage("x-ddprun-token", "s3cret");
  CHECK(feedAll(garbage, kPreface + frame(0x1, 0x4, 1, std::string("\xff\xff\xff\xff\xff\xff", 6)), 4) ==
        TokenRecognizer::Verdict::kGaveUp);
  TokenRecognizer big("x-ddprun-token", "s3cret");
  CHECK(feedAll(big, kPreface + frame(0x1, 0x0, 1, std::string(TokenRecognizer::kMaxBlockBytes + 1, 'a')), 4096) ==
        TokenRecognizer::Verdict::kGaveUp);
  Encoder enc;
  std::string many = kPreface;
  for (int i = 0; i < TokenRecognizer::kMaxBlocks; ++i) many += frame(0x1, 0x4, 1 + 2 * i, enc.block(request("")));
  TokenRecognizer patient("x-ddprun-token", "s3cret");
  CHECK(feedAll(patient, many, 100) == TokenRecognizer::Verdict::kGaveUp);
  // Once decided, nothing changes it.
  CHECK(feedAll(patient, frame(0x1, 0x4, 99, enc.block(request("s3cret"))), 10) == TokenRecognizer::Verdict::kGaveUp);
  // No token configured: nothing to find.
  TokenRecognizer none("x-ddprun-token", "");
  CHECK(none.verdict() == TokenRecognizer::Verdict::kGaveUp);
}
