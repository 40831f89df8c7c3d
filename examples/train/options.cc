#include "examples/train/options.h"

#include <charconv>
#include <functional>
#include <map>
#include <stdexcept>
#include <string_view>

namespace train {

namespace {

template <typename T>
T parseNumber(const std::string& flag, const std::string& text, T min) {
  T value{};
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || text.empty() || value < min) {
    throw std::invalid_argument(flag + " expects a number of at least " + std::to_string(min) + ", got '" + text + "'");
  }
  return value;
}

}  // namespace

const char* usage() {
  return "usage: train [--epochs N] [--batch B] [--lr X] [--seed S] [--samples N] [--backend gloo|nccl]\n"
         "             [--checkpoint PATH] [--crash_at_epoch E] [--timeout SECONDS] [--device D]\n"
         "             [--stall_at_step N] [--leave_at_step N] [--slow_rank R --slow_ms MS]\n"
         "Run under ddprun, e.g.: ddprun --standalone --nproc_per_node=4 train --epochs 5\n";
}

Options parseOptions(int argc, char** argv) {
  Options o;
  using Setter = std::function<void(const std::string& flag, const std::string& value)>;
  const std::map<std::string, Setter> setters = {
      {"--epochs", [&](auto& f, auto& v) { o.epochs = parseNumber<int>(f, v, 1); }},
      {"--batch", [&](auto& f, auto& v) { o.batch = parseNumber<int>(f, v, 1); }},
      {"--lr", [&](auto& f, auto& v) { o.lr = parseNumber<double>(f, v, 0.0); }},
      {"--seed", [&](auto& f, auto& v) { o.seed = parseNumber<uint64_t>(f, v, 0); }},
      {"--samples", [&](auto& f, auto& v) { o.samples = parseNumber<int>(f, v, 1); }},
      {"--timeout", [&](auto& f, auto& v) { o.timeoutS = parseNumber<double>(f, v, 0.001); }},
      {"--device", [&](auto& f, auto& v) { o.device = parseNumber<int>(f, v, 0); }},
      {"--crash_at_epoch", [&](auto& f, auto& v) { o.crashAtEpoch = parseNumber<int>(f, v, 0); }},
      {"--stall_at_step", [&](auto& f, auto& v) { o.stallAtStep = parseNumber<int>(f, v, 0); }},
      {"--leave_at_step", [&](auto& f, auto& v) { o.leaveAtStep = parseNumber<int>(f, v, 0); }},
      {"--slow_rank", [&](auto& f, auto& v) { o.slowRank = parseNumber<int>(f, v, 0); }},
      {"--slow_ms", [&](auto& f, auto& v) { o.slowMs = parseNumber<int>(f, v, 0); }},
      {"--checkpoint", [&](auto& f, auto& v) {
         if (v.empty()) throw std::invalid_argument(f + " expects a path");
         o.checkpoint = v;
       }},
      {"--backend", [&](auto& f, auto& v) {
         if (v != "gloo" && v != "nccl") throw std::invalid_argument(f + " expects gloo or nccl, got '" + v + "'");
         o.backend = v;
       }},
  };
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      o.help = true;
      continue;
    }
    std::string value;
    bool inlineValue = false;
    if (auto eq = arg.find('='); eq != std::string::npos && arg.rfind("--", 0) == 0) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      inlineValue = true;
    }
    auto it = setters.find(arg);
    if (it == setters.end()) throw std::invalid_argument("unknown argument '" + std::string(argv[i]) + "'");
    if (!inlineValue) {
      if (i + 1 >= argc) throw std::invalid_argument(arg + " expects a value");
      value = argv[++i];
    }
    it->second(arg, value);
  }
  return o;
}

}  // namespace train
