// A synthetic regression data set, generated deterministically from a seed (the same on every
// rank, with no files): x ~ N(0, 1)^16 and a nonlinear target
//   y = sin(x0 + x1) + 0.5 * x2 * x3 - 0.3 * x4^2 + 0.2 * tanh(x5 - x6) + small noise,
// which a linear model cannot fit but a small MLP can.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace train {

class Rng {  // splitmix64: portable and identical on every machine, unlike std distributions
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next();
  double uniform();  // [0, 1)
  double normal();   // N(0, 1), Box-Muller

 private:
  uint64_t state_;
};

class Dataset {
 public:
  static constexpr int kFeatures = 16;

  Dataset(std::size_t samples, uint64_t seed);
  std::size_t size() const { return targets_.size(); }
  const float* features(std::size_t i) const { return &features_[i * kFeatures]; }
  float target(std::size_t i) const { return targets_[i]; }

 private:
  std::vector<float> features_;
  std::vector<float> targets_;
};

// The sample order of an epoch: a permutation of [0, n) drawn from (seed, epoch), the same on
// every rank, as DistributedSampler's shuffle.
std::vector<std::size_t> epochOrder(std::size_t n, uint64_t seed, int epoch);

}  // namespace train
