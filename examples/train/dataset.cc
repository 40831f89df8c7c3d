#include "examples/train/dataset.h"

#include <cmath>
#include <numbers>
#include <numeric>
#include <utility>

namespace train {

uint64_t Rng::next() {
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

double Rng::uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

double Rng::normal() {
  const double u1 = 1.0 - uniform();  // (0, 1]
  const double u2 = uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

Dataset::Dataset(std::size_t samples, uint64_t seed) : features_(samples * kFeatures), targets_(samples) {
  Rng rng(seed ^ 0xda7a5e7ULL);
  for (std::size_t i = 0; i < samples; ++i) {
    double x[kFeatures];
    for (int k = 0; k < kFeatures; ++k) {
      x[k] = rng.normal();
      features_[i * kFeatures + k] = static_cast<float>(x[k]);
    }
    const double y = std::sin(x[0] + x[1]) + 0.5 * x[2] * x[3] - 0.3 * x[4] * x[4] + 0.3 +
                     0.2 * std::tanh(x[5] - x[6]) + 0.05 * rng.normal();
    targets_[i] = static_cast<float>(y);
  }
}

std::vector<std::size_t> epochOrder(std::size_t n, uint64_t seed, int epoch) {
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  Rng rng(seed * 1000003ULL + static_cast<uint64_t>(epoch));
  for (std::size_t i = n; i > 1; --i) {  // Fisher-Yates
    std::swap(order[i - 1], order[rng.next() % i]);
  }
  return order;
}

}  // namespace train
