// A minimal data-parallel trainer on the installed worker SDK: every rank computes a gradient of a
// linear model on its own shard, GradientReducer averages it across the ranks (gloo), and the
// ranks step in lockstep. Rank 0 prints the model's final weights; every rank prints a digest of
// them, which must be equal on every rank (what examples/consumer's test checks).
#include <worker_sdk/ddp.h>

#include <cstdio>
#include <exception>
#include <span>
#include <vector>

int main() {
  try {
    const ddp::Env env = ddp::Env::fromEnviron();
    auto store = ddp::makeStore(env);
    auto comm = ddp::makeCommunicator(ddp::Backend::kGloo, env, *store);
    // y = 3x + 1 on x in [0, 1), each rank with its own interleaved samples.
    std::vector<float> w{0.f, 0.f}, grad(2);
    ddp::GradientReducer reducer(*comm, {std::span<float>(grad)});
    for (int step = 0; step < 200; ++step) {
      grad[0] = grad[1] = 0;
      for (int i = env.rank; i < 64; i += env.worldSize) {
        const float x = static_cast<float>(i) / 64, err = w[0] * x + w[1] - (3 * x + 1);
        grad[0] += 2 * err * x / 64;
        grad[1] += 2 * err / 64;
      }
      reducer.markReady(0);
      reducer.finish();  // grad now holds the mean over the ranks
      for (std::size_t k = 0; k < w.size(); ++k) w[k] -= 0.5f * static_cast<float>(env.worldSize) * grad[k];
    }
    if (env.rank == 0) std::printf("%s\nweights %.3f %.3f\n", ddp::buildInfo().c_str(), w[0], w[1]);
    std::printf("rank %d of %d: digest %a %a\n", env.rank, env.worldSize, w[0], w[1]);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
}
