// Element types and reductions of the collectives, as NCCL's ncclDataType_t and ncclRedOp_t.
// Half and BFloat16 are storage types (16 bits, no arithmetic): convert through float.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace ddp {

enum class DataType { kFloat32, kFloat64, kInt32, kInt64, kFloat16, kBFloat16 };

// kAvg is the sum divided by the world size (integers: truncated toward zero).
enum class ReduceOp { kSum, kAvg, kMin, kMax, kProduct };

// IEEE 754 binary16.
struct Half {
  uint16_t bits = 0;
};
// The upper half of a binary32 (bfloat16).
struct BFloat16 {
  uint16_t bits = 0;
};

// Round to nearest even; NaN stays NaN, overflow becomes infinity.
Half toHalf(float value);
BFloat16 toBFloat16(float value);
float toFloat(Half value);
float toFloat(BFloat16 value);

std::size_t elementSize(DataType type);
const char* toString(DataType type);
const char* toString(ReduceOp op);

template <typename T>
constexpr DataType dataTypeOf() {
  if constexpr (std::is_same_v<T, float>) return DataType::kFloat32;
  else if constexpr (std::is_same_v<T, double>) return DataType::kFloat64;
  else if constexpr (std::is_same_v<T, int32_t>) return DataType::kInt32;
  else if constexpr (std::is_same_v<T, int64_t>) return DataType::kInt64;
  else if constexpr (std::is_same_v<T, Half>) return DataType::kFloat16;
  else if constexpr (std::is_same_v<T, BFloat16>) return DataType::kBFloat16;
  else static_assert(sizeof(T) == 0, "unsupported element type");
}

}  // namespace ddp
