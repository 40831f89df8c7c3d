// A small MLP, 16 -> 32 (tanh) -> 1, with a squared-error loss. Parameters are float32 tensors
// initialised from the seed, so every rank starts from the same point.
//
// Per-sample gradients are computed in double, clipped to [-1, 1] and accumulated in fixed point
// (multiples of 2^-17, in int64), so a rank's partial sum is exact whatever samples it holds. The
// float32 all-reduce of those partial sums is then exact too (they fit in float's 24-bit
// mantissa), which makes training bit-identical for every power-of-two world size dividing the
// batch: the data-parallel result is the single-process result, not just close to it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "examples/train/dataset.h"

namespace train {

class Mlp {
 public:
  static constexpr int kHidden = 32;
  static constexpr int kTensors = 4;  // w1, b1, w2, b2: the order backward finishes them is reversed

  explicit Mlp(uint64_t seed);

  // The tensors, in registration order (w1, b1, w2, b2).
  std::vector<std::span<float>> parameters();
  std::vector<std::span<float>> gradients();
  std::vector<float> flatParameters() const;
  void setFlatParameters(const std::vector<float>& flat);
  std::size_t parameterCount() const;

  // Starts a step: clears the fixed-point accumulators.
  void zeroGrad();
  // Forward and backward for one sample; adds its gradient to the accumulators; returns its loss
  // (0.5 * (prediction - target)^2).
  double accumulate(const float* x, float target);
  // Writes tensor `t`'s accumulated gradient, times `scale` (a power of two keeps it exact), into
  // gradients()[t].
  void writeGradient(int t, double scale);
  // p -= lr * grad for every parameter.
  void step(float lr);

 private:
  std::vector<float> w1_, b1_, w2_, b2_;        // w1_: kHidden x kFeatures, row-major
  std::vector<float> gw1_, gb1_, gw2_, gb2_;    // gradients, what the reducer averages
  std::vector<int64_t> aw1_, ab1_, aw2_, ab2_;  // fixed-point accumulators
};

// FNV-1a over the parameters rounded to 1e-4, as 16 hex digits.
std::string digest(const std::vector<float>& params);
double l2(const std::vector<float>& params);

}  // namespace train
