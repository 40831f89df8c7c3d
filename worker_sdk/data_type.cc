#include "worker_sdk/data_type.h"

#include <bit>
#include <cmath>

namespace ddp {

Half toHalf(float value) {
  const uint32_t x = std::bit_cast<uint32_t>(value);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) {  // infinity or NaN
    return Half{static_cast<uint16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x0200u : 0u))};
  }
  if (absx >= 0x477ff000u) return Half{static_cast<uint16_t>(sign | 0x7c00u)};  // rounds past 65504
  if (absx < 0x38800000u) {
    // Subnormal half (or zero): scale so that one half ulp (2^-24) is one unit, round to even.
    const float scaled = std::bit_cast<float>(absx) * 16777216.0f;  // exact: a power of two
    return Half{static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(scaled)))};
  }
  // Normal: rebias the exponent, drop 13 mantissa bits with round to nearest even.
  uint32_t bits = absx - ((127u - 15u) << 23);
  bits += 0x0fffu + ((bits >> 13) & 1u);
  return Half{static_cast<uint16_t>(sign | (bits >> 13))};
}

float toFloat(Half value) {
  const uint32_t sign = static_cast<uint32_t>(value.bits & 0x8000u) << 16;
  const uint32_t exponent = (value.bits >> 10) & 0x1fu;
  const uint32_t mantissa = value.bits & 0x3ffu;
  if (exponent == 0) {
    const float magnitude = static_cast<float>(mantissa) / 16777216.0f;  // mantissa * 2^-24
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent + 127u - 15u) << 23) | (mantissa << 13));
}

BFloat16 toBFloat16(float value) {
  const uint32_t x = std::bit_cast<uint32_t>(value);
  if ((x & 0x7fffffffu) > 0x7f800000u) return BFloat16{static_cast<uint16_t>((x >> 16) | 0x0040u)};  // NaN
  const uint32_t rounded = x + 0x7fffu + ((x >> 16) & 1u);
  return BFloat16{static_cast<uint16_t>(rounded >> 16)};
}

float toFloat(BFloat16 value) { return std::bit_cast<float>(static_cast<uint32_t>(value.bits) << 16); }

std::size_t elementSize(DataType type) {
  switch (type) {
    case DataType::kFloat32: return 4;
    case DataType::kFloat64: return 8;
    case DataType::kInt32: return 4;
    case DataType::kInt64: return 8;
    case DataType::kFloat16: return 2;
    case DataType::kBFloat16: return 2;
  }
  return 0;
}

const char* toString(DataType type) {
  switch (type) {
    case DataType::kFloat32: return "float32";
    case DataType::kFloat64: return "float64";
    case DataType::kInt32: return "int32";
    case DataType::kInt64: return "int64";
    case DataType::kFloat16: return "float16";
    case DataType::kBFloat16: return "bfloat16";
  }
  return "unknown";
}

const char* toString(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kProduct: return "prod";
  }
  return "unknown";
}

}  // namespace ddp
