// Element-wise reductions on host memory (internal), for the gloo backend: gloo's algorithms move
// bytes and call one of these to combine them. Half and bfloat16 combine through float.
#pragma once

#include <cstddef>

#include "worker_sdk/data_type.h"

namespace ddp::detail {

// out[i] = a[i] op b[i]; out may alias a or b. kAvg reduces as kSum (divide afterwards).
using ReduceFunction = void (*)(void* out, const void* a, const void* b, std::size_t count);

ReduceFunction hostReduceFunction(DataType type, ReduceOp op);

// data[i] /= divisor (integers: truncated toward zero).
void divideInPlace(void* data, std::size_t count, DataType type, int divisor);

}  // namespace ddp::detail
