// Detects hung ranks: workers that use the SDK (or the Python package `ddprun`, python/) send
// "RANK STEP" datagrams to a unix socket named in DDPRUN_HEARTBEAT_SOCKET, optionally followed by
// key=value tokens (section=NAME: the named phase the rank is in, such as a checkpoint; unknown
// keys are ignored, so that senders may add some; time=SECONDS: the step's compute time, for
// stragglers); a rank that has beaten once and then stays
// silent for the timeout is reported as hung (with its last step and section), so a stuck
// collective is found without waiting out its own timeout. Ranks that never beat (programs
// without the SDK or the package) are never reported. With a timeout of 0 it only listens: the
// agent asks it whether a rank is alive (--finish_timeout) and how far the attempt got.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "agent/hang_calibration.h"

namespace boost::asio {
class io_context;
}

namespace ddprun {

struct HungRank {
  int rank = 0;
  int64_t lastStep = 0;
  std::chrono::milliseconds silentFor{0};
  std::string section;  // the section its last beat named, or empty
  std::chrono::milliseconds bound{0};  // the silence that made it hung
  bool calibrated = false;             // the bound was learned (--hang_timeout=auto)
};

class HangDetector {
 public:
  using OnHung = std::function<void(const HungRank&)>;

  // Binds an abstract-namespace unix datagram socket. Throws SystemError. timeout 0: never
  // reports a rank hung.
  HangDetector(boost::asio::io_context& io, std::chrono::milliseconds timeout, OnHung onHung);
  // --hang_timeout=auto: the bound is learned from the beats (agent/hang_calibration.h).
  HangDetector(boost::asio::io_context& io, HangCalibrationRules rules, OnHung onHung);
  ~HangDetector();

  // The value for DDPRUN_HEARTBEAT_SOCKET ("@" + abstract name).
  const std::string& socketName() const;
  // A new attempt starts: forget every rank and drop datagrams of the previous attempt.
  void arm();
  // Stop reporting (the group is stopping); arm() starts again.
  void disarm();
  // The rank exited (0): it beats no more and is no longer watched in this attempt.
  void forget(int rank);
  // How long since the rank's last beat in this attempt; nullopt if it has not beaten.
  std::optional<std::chrono::milliseconds> silentFor(int rank);
  // The highest step any rank beat in this attempt (finished ranks included); nullopt: no beat.
  std::optional<int64_t> bestStep();
  // Called, on the event loop, for every beat of the armed attempt that carries a step's compute
  // time ("time=SECONDS": libddp's GradientReducer, ddprun.report_step(step, seconds)).
  void setOnStepTime(std::function<void(int rank, double seconds)> onStepTime);
  // --hang_timeout=auto: what this node learned per section, and bounds learned elsewhere in the
  // job (the longer wins). Empty / ignored with a fixed timeout.
  std::map<std::string, std::chrono::milliseconds> learnedSections() const;
  void adoptSections(const std::map<std::string, std::chrono::milliseconds>& sections);

 private:
  class Impl;
  std::shared_ptr<Impl> impl_;  // shared with pending handlers
};

}  // namespace ddprun
