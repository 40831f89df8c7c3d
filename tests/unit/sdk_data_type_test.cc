// Element types: float16 and bfloat16 conversions (round to nearest even), sizes and names.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>

#include "worker_sdk/communicator.h"
#include "worker_sdk/data_type.h"

using ddp::BFloat16;
using ddp::Half;

TEST_CASE("float16 conversions round to nearest even", "[sdk]") {
  CHECK(ddp::toHalf(1.0f).bits == 0x3c00);
  CHECK(ddp::toHalf(-2.0f).bits == 0xc000);
  CHECK(ddp::toHalf(0.0f).bits == 0x0000);
  CHECK(ddp::toHalf(-0.0f).bits == 0x8000);
  CHECK(ddp::toHalf(65504.0f).bits == 0x7bff);  // the largest half
  CHECK(ddp::toHalf(65519.0f).bits == 0x7bff);
  CHECK(ddp::toHalf(65520.0f).bits == 0x7c00);  // rounds to infinity
  CHECK(ddp::toHalf(std::numeric_limits<float>::infinity()).bits == 0x7c00);
  CHECK(ddp::toHalf(2049.0f).bits == ddp::toHalf(2048.0f).bits);  // a tie goes to the even neighbour
  CHECK(ddp::toFloat(ddp::toHalf(2051.0f)) == 2052.0f);
  CHECK(ddp::toHalf(std::ldexp(1.0f, -24)).bits == 0x0001);  // the smallest subnormal
  CHECK(ddp::toHalf(std::ldexp(1.0f, -26)).bits == 0x0000);
  CHECK(ddp::toHalf(std::ldexp(1.0f, -14)).bits == 0x0400);  // the smallest normal
  CHECK(std::isnan(ddp::toFloat(ddp::toHalf(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(ddp::toFloat(Half{0x3555}) == Approx(0.333251953125));
}

TEST_CASE("float16 and bfloat16 survive a round trip through float", "[sdk]") {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const Half h{static_cast<uint16_t>(bits)};
    const BFloat16 b{static_cast<uint16_t>(bits)};
    if (!std::isnan(ddp::toFloat(h)) && ddp::toHalf(ddp::toFloat(h)).bits != bits) FAIL("half " << bits);
    if (!std::isnan(ddp::toFloat(b)) && ddp::toBFloat16(ddp::toFloat(b)).bits != bits) FAIL("bfloat16 " << bits);
  }
}

TEST_CASE("bfloat16 conversions round to nearest even", "[sdk]") {
  CHECK(ddp::toBFloat16(1.0f).bits == 0x3f80);
  CHECK(ddp::toBFloat16(-1.0f).bits == 0xbf80);
  CHECK(ddp::toFloat(ddp::toBFloat16(257.0f)) == 256.0f);  // tie to even
  CHECK(ddp::toFloat(ddp::toBFloat16(259.0f)) == 260.0f);
  CHECK(std::isnan(ddp::toFloat(ddp::toBFloat16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST_CASE("data types: sizes, names and the type of an element", "[sdk]") {
  CHECK(ddp::elementSize(ddp::DataType::kFloat16) == 2);
  CHECK(ddp::elementSize(ddp::DataType::kInt64) == 8);
  CHECK(std::string(ddp::toString(ddp::DataType::kBFloat16)) == "bfloat16");
  CHECK(std::string(ddp::toString(ddp::ReduceOp::kProduct)) == "prod");
  STATIC_REQUIRE(ddp::dataTypeOf<float>() == ddp::DataType::kFloat32);
  STATIC_REQUIRE(ddp::dataTypeOf<int64_t>() == ddp::DataType::kInt64);
  STATIC_REQUIRE(ddp::dataTypeOf<Half>() == ddp::DataType::kFloat16);
  CHECK(ddp::parseBackend("gloo") == ddp::Backend::kGloo);
  CHECK(ddp::parseBackend("nccl") == ddp::Backend::kNccl);
  CHECK_THROWS_WITH(ddp::parseBackend("mpi"), Catch::Matchers::Contains("gloo or nccl"));
  CHECK(ddp::isBackendAvailable(ddp::Backend::kGloo));
}
