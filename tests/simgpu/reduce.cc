#include "tests/simgpu/reduce.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace simgpu {

namespace {

// IEEE binary16 and bfloat16 to and from float (round to nearest even), without CUDA's headers.
float halfToFloat(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      exp = 127 - 15 + 1;
      while (!(mant & 0x400u)) {
        mant <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t floatToHalf(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t absBits = bits & 0x7fffffffu;
  if (absBits >= 0x7f800000u) return sign | 0x7c00u | (absBits > 0x7f800000u ? 0x200u : 0);  // inf, nan
  if (absBits >= 0x477ff000u) return sign | 0x7c00u;  // rounds past 65504: inf
  if (absBits < 0x38800000u) {  // subnormal or zero in half
    const float a = std::fabs(f);
    return sign | static_cast<uint16_t>(std::nearbyint(a * 16777216.0f));  // units of 2^-24
  }
  const uint32_t mant = absBits & 0x7fffffu;
  uint32_t h = ((absBits >> 23) - 127 + 15) << 10 | (mant >> 13);
  const uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return sign | static_cast<uint16_t>(h);
}

float bf16ToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t floatToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);  // nan
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

struct Half {
  uint16_t bits;
};
struct BF16 {
  uint16_t bits;
};

template <typename T>
struct Math {
  using M = T;
  static M load(const void* p, std::size_t i) { return static_cast<const T*>(p)[i]; }
  static void store(void* p, std::size_t i, M v) { static_cast<T*>(p)[i] = v; }
  static constexpr bool kFloating = std::is_floating_point_v<T>;
};
template <>
struct Math<Half> {
  using M = float;
  static M load(const void* p, std::size_t i) { return halfToFloat(static_cast<const uint16_t*>(p)[i]); }
  static void store(void* p, std::size_t i, M v) { static_cast<uint16_t*>(p)[i] = floatToHalf(v); }
  static M round(M v) { return halfToFloat(floatToHalf(v)); }
  static constexpr bool kFloating = true;
};
template <>
struct Math<BF16> {
  using M = float;
  static M load(const void* p, std::size_t i) { return bf16ToFloat(static_cast<const uint16_t*>(p)[i]); }
  static void store(void* p, std::size_t i, M v) { static_cast<uint16_t*>(p)[i] = floatToBf16(v); }
  static M round(M v) { return bf16ToFloat(floatToBf16(v)); }
  static constexpr bool kFloating = true;
};

// Rounds an intermediate to the element type (a no-op where the math type is the element type).
template <typename T>
typename Math<T>::M roundTo(typename Math<T>::M v) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BF16>) {
    return Math<T>::round(v);
  } else {
    return v;
  }
}

template <typename T>
void reduceTyped(ncclRedOp_t op, const std::vector<const void*>& in, std::size_t count, void* out) {
  using M = typename Math<T>::M;
  const std::size_t n = in.size();
  for (std::size_t i = 0; i < count; ++i) {
    M acc{};
    for (std::size_t r = 0; r < n; ++r) {
      M v = Math<T>::load(in[r], i);
      if (op == ncclAvg && Math<T>::kFloating) v = roundTo<T>(v * roundTo<T>(M(1) / static_cast<M>(n)));
      if (r == 0) {
        acc = v;
        continue;
      }
      switch (op) {
        case ncclSum:
        case ncclAvg: acc = roundTo<T>(acc + v); break;
        case ncclProd: acc = roundTo<T>(acc * v); break;
        case ncclMax: acc = std::max(acc, v); break;
        case ncclMin: acc = std::min(acc, v); break;
        default: break;
      }
    }
    if (op == ncclAvg && !Math<T>::kFloating) acc = static_cast<M>(acc / static_cast<M>(n));
    Math<T>::store(out, i, acc);
  }
}

}  // namespace

std::size_t elementBytes(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    default: return 0;
  }
}

bool validOp(ncclRedOp_t op) { return op >= ncclSum && op <= ncclAvg; }

void reduce(ncclDataType_t type, ncclRedOp_t op, const std::vector<const void*>& in, std::size_t count, void* out) {
  switch (type) {
    case ncclInt8: return reduceTyped<int8_t>(op, in, count, out);
    case ncclUint8: return reduceTyped<uint8_t>(op, in, count, out);
    case ncclInt32: return reduceTyped<int32_t>(op, in, count, out);
    case ncclUint32: return reduceTyped<uint32_t>(op, in, count, out);
    case ncclInt64: return reduceTyped<int64_t>(op, in, count, out);
    case ncclUint64: return reduceTyped<uint64_t>(op, in, count, out);
    case ncclFloat16: return reduceTyped<Half>(op, in, count, out);
    case ncclBfloat16: return reduceTyped<BF16>(op, in, count, out);
    case ncclFloat32: return reduceTyped<float>(op, in, count, out);
    case ncclFloat64: return reduceTyped<double>(op, in, count, out);
    default: return;
  }
}

}  // namespace simgpu
