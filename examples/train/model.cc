#include "examples/train/model.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>

namespace train {

namespace {

constexpr int kIn = Dataset::kFeatures;
constexpr double kFixedScale = 131072.0;  // 2^17: the fixed-point grid is 2^-17

int64_t toFixed(double g) { return std::llround(std::clamp(g, -1.0, 1.0) * kFixedScale); }

void initUniform(std::vector<float>& v, Rng& rng, double bound) {
  for (float& x : v) x = static_cast<float>((2.0 * rng.uniform() - 1.0) * bound);
}

}  // namespace

Mlp::Mlp(uint64_t seed)
    : w1_(kHidden * kIn), b1_(kHidden), w2_(kHidden), b2_(1),
      gw1_(w1_.size()), gb1_(b1_.size()), gw2_(w2_.size()), gb2_(b2_.size()),
      aw1_(w1_.size()), ab1_(b1_.size()), aw2_(w2_.size()), ab2_(b2_.size()) {
  Rng rng(seed ^ 0x5eed0f1a7ULL);  // PyTorch's nn.Linear init: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
  initUniform(w1_, rng, 1.0 / std::sqrt(double(kIn)));
  initUniform(b1_, rng, 1.0 / std::sqrt(double(kIn)));
  initUniform(w2_, rng, 1.0 / std::sqrt(double(kHidden)));
  initUniform(b2_, rng, 1.0 / std::sqrt(double(kHidden)));
}

std::vector<std::span<float>> Mlp::parameters() { return {w1_, b1_, w2_, b2_}; }
std::vector<std::span<float>> Mlp::gradients() { return {gw1_, gb1_, gw2_, gb2_}; }

std::size_t Mlp::parameterCount() const { return w1_.size() + b1_.size() + w2_.size() + b2_.size(); }

std::vector<float> Mlp::flatParameters() const {
  std::vector<float> flat;
  for (const auto* t : {&w1_, &b1_, &w2_, &b2_}) flat.insert(flat.end(), t->begin(), t->end());
  return flat;
}

void Mlp::setFlatParameters(const std::vector<float>& flat) {
  auto at = flat.begin();
  for (auto* t : {&w1_, &b1_, &w2_, &b2_}) {
    std::copy(at, at + static_cast<std::ptrdiff_t>(t->size()), t->begin());
    at += static_cast<std::ptrdiff_t>(t->size());
  }
}

void Mlp::zeroGrad() {
  for (auto* a : {&aw1_, &ab1_, &aw2_, &ab2_}) std::fill(a->begin(), a->end(), 0);
}

double Mlp::accumulate(const float* x, float target) {
  double h[kHidden];
  double out = b2_[0];
  for (int j = 0; j < kHidden; ++j) {
    double z = b1_[j];
    for (int k = 0; k < kIn; ++k) z += double(w1_[j * kIn + k]) * x[k];
    h[j] = std::tanh(z);
    out += double(w2_[j]) * h[j];
  }
  const double err = out - target;
  ab2_[0] += toFixed(err);
  for (int j = 0; j < kHidden; ++j) {
    aw2_[j] += toFixed(err * h[j]);
    const double dz = err * w2_[j] * (1.0 - h[j] * h[j]);
    ab1_[j] += toFixed(dz);
    for (int k = 0; k < kIn; ++k) aw1_[j * kIn + k] += toFixed(dz * x[k]);
  }
  return 0.5 * err * err;
}

void Mlp::writeGradient(int t, double scale) {
  const std::vector<int64_t>* acc[] = {&aw1_, &ab1_, &aw2_, &ab2_};
  std::vector<float>* grad[] = {&gw1_, &gb1_, &gw2_, &gb2_};
  for (std::size_t i = 0; i < acc[t]->size(); ++i) {
    (*grad[t])[i] = static_cast<float>(static_cast<double>((*acc[t])[i]) / kFixedScale * scale);
  }
}

void Mlp::step(float lr) {
  std::vector<float>* params[] = {&w1_, &b1_, &w2_, &b2_};
  const std::vector<float>* grads[] = {&gw1_, &gb1_, &gw2_, &gb2_};
  for (int t = 0; t < kTensors; ++t) {
    for (std::size_t i = 0; i < params[t]->size(); ++i) (*params[t])[i] -= lr * (*grads[t])[i];
  }
}

std::string digest(const std::vector<float>& params) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (float p : params) {
    const auto q = static_cast<uint64_t>(std::llround(double(p) * 1e4));
    for (int b = 0; b < 8; ++b) {
      h ^= (q >> (8 * b)) & 0xff;
      h *= 0x100000001b3ULL;
    }
  }
  return fmt::format("{:016x}", h);
}

double l2(const std::vector<float>& params) {
  double sum = 0;
  for (float p : params) sum += double(p) * p;
  return std::sqrt(sum);
}

}  // namespace train
