#include "rendezvous/wire/worker_failure_message.h"

#include <algorithm>

namespace ddprun {

namespace {
constexpr std::size_t kMaxDescriptionBytes = 256;
}  // namespace

void toMessage(const WorkerFailure& failure, v1::WorkerFailed* message) {
  message->set_rank(failure.rank);
  message->set_exit_code(failure.exitCode);
  message->set_signal(failure.signal);
  message->set_exit_status(failure.exitStatus);
  message->set_description(failure.description.substr(0, kMaxDescriptionBytes));
  message->set_attempts_without_progress(failure.attemptsWithoutProgress);
}

WorkerFailure fromMessage(const v1::WorkerFailed& message) {
  WorkerFailure failure;
  failure.rank = message.rank() >= 0 ? message.rank() : -1;
  failure.exitCode = message.exit_code();
  failure.signal = message.signal() >= 0 ? message.signal() : 0;
  failure.exitStatus = message.exit_status() >= 1 && message.exit_status() <= 255 ? message.exit_status() : 1;
  failure.description = message.description().substr(0, kMaxDescriptionBytes);
  failure.attemptsWithoutProgress = std::clamp(message.attempts_without_progress(), 0, 1000000);
  for (char& c : failure.description) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';  // it goes into logs: one line
  }
  return failure;
}

}  // namespace ddprun
