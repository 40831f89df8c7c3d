#include "worker_sdk/host_reduce.h"

#include <algorithm>
#include <cstdint>

#include "common/error.h"

namespace ddp::detail {

namespace {

struct Sum {
  template <typename T>
  T operator()(T a, T b) const { return a + b; }
};
struct Product {
  template <typename T>
  T operator()(T a, T b) const { return a * b; }
};
struct Min {
  template <typename T>
  T operator()(T a, T b) const { return std::min(a, b); }
};
struct Max {
  template <typename T>
  T operator()(T a, T b) const { return std::max(a, b); }
};

// Loads and stores of an element type as its arithmetic type.
template <typename T>
struct Element {
  using Math = T;
  static Math load(T v) { return v; }
  static T store(Math v) { return v; }
};
template <>
struct Element<Half> {
  using Math = float;
  static float load(Half v) { return toFloat(v); }
  static Half store(float v) { return toHalf(v); }
};
template <>
struct Element<BFloat16> {
  using Math = float;
  static float load(BFloat16 v) { return toFloat(v); }
  static BFloat16 store(float v) { return toBFloat16(v); }
};

// The loops promise the compiler that their pointers do not overlap (gloo passes either the
// output as one of the inputs, or three separate buffers), so that they vectorize: an all-reduce
// of large buffers spends much of its time here. The result is the same element by element.
template <typename T, typename Op>
void accumulate(T* __restrict o, const T* __restrict y, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) {
    o[i] = Element<T>::store(Op()(Element<T>::load(o[i]), Element<T>::load(y[i])));
  }
}

template <typename T, typename Op>
void combine(T* __restrict o, const T* __restrict x, const T* __restrict y, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) {
    o[i] = Element<T>::store(Op()(Element<T>::load(x[i]), Element<T>::load(y[i])));
  }
}

template <typename T, typename Op>
void reduce(void* out, const void* a, const void* b, std::size_t count) {
  auto* o = static_cast<T*>(out);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  if (o == x) {
    accumulate<T, Op>(o, y, count);
  } else if (o == y) {
    accumulate<T, Op>(o, x, count);  // every op here is commutative
  } else {
    combine<T, Op>(o, x, y, count);
  }
}

template <typename T>
ReduceFunction forOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return &reduce<T, Sum>;
    case ReduceOp::kProduct: return &reduce<T, Product>;
    case ReduceOp::kMin: return &reduce<T, Min>;
    case ReduceOp::kMax: return &reduce<T, Max>;
  }
  throw ddprun::ConfigError("unknown reduce op");
}

template <typename T>
void divide(void* data, std::size_t count, int divisor) {
  auto* d = static_cast<T*>(data);
  using Math = typename Element<T>::Math;
  const auto by = static_cast<Math>(divisor);
  for (std::size_t i = 0; i < count; ++i) d[i] = Element<T>::store(Element<T>::load(d[i]) / by);
}

}  // namespace

ReduceFunction hostReduceFunction(DataType type, ReduceOp op) {
  switch (type) {
    case DataType::kFloat32: return forOp<float>(op);
    case DataType::kFloat64: return forOp<double>(op);
    case DataType::kInt32: return forOp<int32_t>(op);
    case DataType::kInt64: return forOp<int64_t>(op);
    case DataType::kFloat16: return forOp<Half>(op);
    case DataType::kBFloat16: return forOp<BFloat16>(op);
  }
  throw ddprun::ConfigError("unknown data type");
}

void divideInPlace(void* data, std::size_t count, DataType type, int divisor) {
  switch (type) {
    case DataType::kFloat32: return divide<float>(data, count, divisor);
    case DataType::kFloat64: return divide<double>(data, count, divisor);
    case DataType::kInt32: return divide<int32_t>(data, count, divisor);
    case DataType::kInt64: return divide<int64_t>(data, count, divisor);
    case DataType::kFloat16: return divide<Half>(data, count, divisor);
    case DataType::kBFloat16: return divide<BFloat16>(data, count, divisor);
  }
}

}  // namespace ddp::detail
