// The store wire's framing (store/store_wire.h): frames out of a byte stream however it is cut,
// and the bound on a frame's length.
#include <catch2/catch.hpp>

#include <cstring>
#include <string>
#include <vector>

#include "ddprun/v1/store.pb.h"
#include "store/wire/store_wire.h"

using ddprun::storewire::FrameReader;

namespace {

ddprun::v1::StoreRequest addRequest(uint64_t id, const std::string& key) {
  ddprun::v1::StoreRequest r;
  r.set_id(id);
  r.mutable_add()->set_key(key);
  r.mutable_add()->set_delta(static_cast<int64_t>(id));
  return r;
}

void feed(FrameReader& reader, std::string_view bytes) {
  std::memcpy(reader.room(bytes.size()), bytes.data(), bytes.size());
  reader.appended(bytes.size());
}

}  // namespace

TEST_CASE("store wire: frames come out whole however the stream is cut", "[store_wire]") {
  std::string stream(ddprun::storewire::kMagic);
  std::vector<ddprun::v1::StoreRequest> sent;
  for (uint64_t id = 1; id <= 50; ++id) {
    sent.push_back(addRequest(id, std::string(id * 7, 'k')));
    ddprun::storewire::appendFrame(stream, sent.back());
  }
  const std::size_t cut = GENERATE(1, 3, 4, 5, 64, 100000);
  FrameReader reader(1 << 20);
  std::vector<ddprun::v1::StoreRequest> got;
  bool magicTaken = false;
  for (std::size_t at = 0; at < stream.size(); at += cut) {
    feed(reader, std::string_view(stream).substr(at, cut));
    if (!magicTaken) {
      if (reader.buffered() < ddprun::storewire::kMagic.size()) continue;
      CHECK(reader.take(ddprun::storewire::kMagic.size()) == ddprun::storewire::kMagic);
      magicTaken = true;
    }
    std::string_view payload;
    while (reader.next(payload) == FrameReader::Next::kFrame) {
      ddprun::v1::StoreRequest r;
      REQUIRE(r.ParseFromArray(payload.data(), static_cast<int>(payload.size())));
      got.push_back(r);
    }
  }
  REQUIRE(got.size() == sent.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    CHECK(got[i].id() == sent[i].id());
    CHECK(got[i].add().key() == sent[i].add().key());
  }
  CHECK(reader.buffered() == 0);
}

TEST_CASE("store wire: a length over the limit is refused before its bytes arrive", "[store_wire]") {
  FrameReader reader(1024);
  std::string_view payload;
  SECTION("just over") {
    feed(reader, std::string("\x00\x00\x04\x01", 4));
    CHECK(reader.next(payload) == FrameReader::Next::kTooLarge);
  }
  SECTION("4 GiB") {
    feed(reader, std::string("\xff\xff\xff\xff", 4));
    CHECK(reader.next(payload) == FrameReader::Next::kTooLarge);
  }
  SECTION("at the limit it waits for the bytes") {
    feed(reader, std::string("\x00\x00\x04\x00", 4));
    CHECK(reader.next(payload) == FrameReader::Next::kNeedMore);
    feed(reader, std::string(1024, 'x'));
    REQUIRE(reader.next(payload) == FrameReader::Next::kFrame);
    CHECK(payload.size() == 1024);
  }
  SECTION("the limit can grow once the peer is known") {
    feed(reader, std::string("\x00\x01\x00\x00", 4));
    CHECK(reader.next(payload) == FrameReader::Next::kTooLarge);
    reader.setMaxFrameBytes(1 << 20);
    CHECK(reader.next(payload) == FrameReader::Next::kNeedMore);
  }
}

TEST_CASE("store wire: an empty message is a frame of length zero", "[store_wire]") {
  ddprun::v1::StoreHello hello;
  std::string out;
  ddprun::storewire::appendFrame(out, hello);
  CHECK(out == std::string("\0\0\0\0", 4));
  FrameReader reader(16);
  feed(reader, out);
  std::string_view payload;
  REQUIRE(reader.next(payload) == FrameReader::Next::kFrame);
  CHECK(payload.empty());
}

TEST_CASE("store wire: a reader fed by append holds only what no whole frame took", "[store_wire]") {
  ddprun::storewire::FrameReader reader(ddprun::storewire::kMaxFrameBytes);
  std::string stream;
  ddprun::v1::StoreRequest r;
  r.set_id(1);
  r.mutable_get()->set_key(std::string(1000, 'k'));
  ddprun::storewire::appendFrame(stream, r);
  ddprun::storewire::appendFrame(stream, r);
  const std::size_t one = stream.size() / 2;
  // A whole frame and the first 10 bytes of the next.
  reader.append(stream.data(), one + 10);
  CHECK(reader.pendingFrameBytes() == one);
  std::string_view payload;
  REQUIRE(reader.next(payload) == ddprun::storewire::FrameReader::Next::kFrame);
  CHECK(reader.next(payload) == ddprun::storewire::FrameReader::Next::kNeedMore);
  reader.compact();
  CHECK(reader.held() == 10);
  CHECK(reader.buffered() == 10);
  CHECK(reader.pendingFrameBytes() == one);  // its header is here: its size is known
  reader.append(stream.data() + one + 10, one - 10);
  REQUIRE(reader.next(payload) == ddprun::storewire::FrameReader::Next::kFrame);
  ddprun::v1::StoreRequest back;
  REQUIRE(back.ParseFromArray(payload.data(), static_cast<int>(payload.size())));
  CHECK(back.get().key() == r.get().key());
  reader.compact();
  CHECK(reader.held() == 0);
  CHECK(reader.pendingFrameBytes() == 0);
  reader.append(stream.data(), 3);  // not even a header
  CHECK(reader.pendingFrameBytes() == 0);
}
