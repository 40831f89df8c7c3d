// The arithmetic of simulated NCCL collectives (internal to libsimgpu): a fixed reduction order
// (rank 0, 1, ..., n-1), so every rank computes bit-identical results, run after run.
#pragma once

#include <nccl.h>

#include <cstddef>
#include <vector>

namespace simgpu {

// Bytes of one element; 0 for a type simgpu does not support (fp8).
std::size_t elementBytes(ncclDataType_t type);
bool validOp(ncclRedOp_t op);

// out[i] = op over ranks of inputs[r][i], folded in rank order. ncclAvg as NCCL computes it:
// floating types pre-multiply each input by 1/n, then sum (NCCL's PreMulSum); integer types sum,
// then divide. Half and bfloat16 round after every step, as device arithmetic in the type does.
void reduce(ncclDataType_t type, ncclRedOp_t op, const std::vector<const void*>& inputs, std::size_t count, void* out);

}  // namespace simgpu
