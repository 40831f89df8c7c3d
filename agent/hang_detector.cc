#include "agent/hang_detector.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <random>

#include "common/error.h"
#include "common/strings.h"
#include "common/unique_fd.h"

namespace ddprun {

class HangDetector::Impl : public std::enable_shared_from_this<HangDetector::Impl> {
 public:
  Impl(boost::asio::io_context& io, std::chrono::milliseconds timeout, std::optional<HangCalibrationRules> rules,
       OnHung onHung)
      : timeout_(timeout), onHung_(std::move(onHung)), descriptor_(io), timer_(io) {
    if (rules) {
      calibration_.emplace(*rules);
      timeout_ = std::min(rules->floor, std::chrono::milliseconds(1000));  // the check period's base
    }
    UniqueFd sock(::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!sock) throw DDPRUN_SYSTEM_ERROR("heartbeat socket");
    std::random_device rd;
    std::string abstract = "ddprun-hb-" + std::to_string(::getpid()) + "-" + std::to_string(rd());
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path + 1, abstract.data(), abstract.size());  // sun_path[0] = 0: abstract
    auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + abstract.size());
    if (::bind(sock.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) throw DDPRUN_SYSTEM_ERROR("bind " + abstract);
    name_ = "@" + abstract;
    descriptor_.assign(sock.release());
  }

  void start() {
    waitReadable();
    scheduleCheck();
  }

  void stop() {
    boost::system::error_code ignored;
    timer_.cancel();
    descriptor_.close(ignored);
  }

  const std::string& name() const { return name_; }

  std::optional<std::chrono::milliseconds> silentFor(int rank) {
    readAll();
    auto it = beats_.find(rank);
    if (it == beats_.end()) return std::nullopt;
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - it->second.at);
  }

  void setOnStepTime(std::function<void(int, double)> f) { onStepTime_ = std::move(f); }

  std::map<std::string, std::chrono::milliseconds> learnedSections() const {
    return calibration_ ? calibration_->learned() : std::map<std::string, std::chrono::milliseconds>{};
  }

  void adoptSections(const std::map<std::string, std::chrono::milliseconds>& sections) {
    if (!calibration_) return;
    for (const auto& [section, longest] : sections) calibration_->adopt(section, longest);
    for (const auto& line : calibration_->takeChanges()) spdlog::warn("{} (job-wide)", line);
  }

  std::optional<int64_t> bestStep() {
    readAll();
    return bestStep_;
  }

  void arm() {
    armed_ = false;
    readAll();  // whatever is queued was sent by the previous attempt
    beats_.clear();
    finished_.clear();
    bestStep_.reset();
    reported_ = false;
    if (calibration_) calibration_->newAttempt();
    armed_ = true;
  }

  void disarm() { armed_ = false; }

  void forget(int rank) {
    readAll();  // its last beats, queued before it exited, must not bring it back
    beats_.erase(rank);
    finished_.insert(rank);
  }

 private:
  struct Beat {
    std::chrono::steady_clock::time_point at;
    int64_t step = 0;
    std::string section;
  };

  void waitReadable() {
    descriptor_.async_wait(boost::asio::posix::descriptor_base::wait_read,
                           [self = shared_from_this()](const boost::system::error_code& ec) {
                             if (ec) return;
                             self->readAll();
                             self->waitReadable();
                           });
  }

  void readAll() {
    char buf[256];  // "RANK STEP section=NAME": a name is at most 64 bytes (python/ddprun)
    while (true) {
      ssize_t n = ::recv(descriptor_.native_handle(), buf, sizeof(buf) - 1, 0);
      if (n <= 0) break;
      if (!armed_) continue;
      auto parts = split(trim(std::string_view(buf, static_cast<size_t>(n))), ' ');
      if (parts.size() < 2) continue;
      auto rank = parseInt(parts[0]);
      auto step = parseInt(parts[1]);
      if (!rank || !step || *rank < 0) continue;  // garbage from a confused client: ignored
      std::string section;
      std::optional<double> stepTime;
      for (std::size_t i = 2; i < parts.size(); ++i) {
        if (startsWith(parts[i], "section=")) section = printable(parts[i].substr(8), 64);
        if (startsWith(parts[i], "time=")) stepTime = parseSeconds(parts[i].substr(5));
      }
      if (stepTime && onStepTime_ && !finished_.count(static_cast<int>(*rank))) {
        onStepTime_(static_cast<int>(*rank), *stepTime);
      }
      bestStep_ = std::max(bestStep_.value_or(*step), *step);
      if (finished_.count(static_cast<int>(*rank))) continue;
      const auto now = std::chrono::steady_clock::now();
      auto& beat = beats_[static_cast<int>(*rank)];
      if (calibration_ && beat.at != std::chrono::steady_clock::time_point{}) {
        // The silence before this beat was spent in the section the previous beat named.
        calibration_->observe(static_cast<int>(*rank), beat.section,
                              std::chrono::duration_cast<std::chrono::milliseconds>(now - beat.at));
      }
      beat = Beat{now, *step, std::move(section)};
    }
    if (calibration_) {
      for (const auto& line : calibration_->takeChanges()) spdlog::warn("{}", line);
    }
  }

  void scheduleCheck() {
    if (timeout_.count() <= 0) return;  // listening only
    timer_.expires_after(std::max(timeout_ / 4, std::chrono::milliseconds(10)));
    timer_.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
      if (ec) return;
      self->check();
      self->scheduleCheck();
    });
  }

  void check() {
    if (!armed_ || reported_) return;
    auto now = std::chrono::steady_clock::now();
    for (const auto& [rank, beat] : beats_) {
      auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - beat.at);
      const auto bound = calibration_ ? calibration_->timeoutFor(rank, beat.section) : timeout_;
      if (silent >= bound) {
        reported_ = true;  // one report per attempt
        onHung_(HungRank{rank, beat.step, silent, beat.section, bound, calibration_.has_value()});
        return;
      }
    }
  }

  std::chrono::milliseconds timeout_;
  OnHung onHung_;
  boost::asio::posix::stream_descriptor descriptor_;
  boost::asio::steady_timer timer_;
  std::string name_;
  std::map<int, Beat> beats_;
  std::set<int> finished_;  // ranks that exited in this attempt
  std::optional<int64_t> bestStep_;
  std::optional<HangCalibration> calibration_;
  std::function<void(int, double)> onStepTime_;
  bool armed_ = false;     // beats of the current attempt are taken
  bool reported_ = false;  // a rank of this attempt was reported hung
};

HangDetector::HangDetector(boost::asio::io_context& io, std::chrono::milliseconds timeout, OnHung onHung)
    : impl_(std::make_shared<Impl>(io, timeout, std::nullopt, std::move(onHung))) {
  impl_->start();
}
HangDetector::HangDetector(boost::asio::io_context& io, HangCalibrationRules rules, OnHung onHung)
    : impl_(std::make_shared<Impl>(io, std::chrono::milliseconds(0), rules, std::move(onHung))) {
  impl_->start();
}
HangDetector::~HangDetector() { impl_->stop(); }
const std::string& HangDetector::socketName() const { return impl_->name(); }
void HangDetector::arm() { impl_->arm(); }
void HangDetector::disarm() { impl_->disarm(); }
void HangDetector::forget(int rank) { impl_->forget(rank); }
std::optional<std::chrono::milliseconds> HangDetector::silentFor(int rank) { return impl_->silentFor(rank); }
std::optional<int64_t> HangDetector::bestStep() { return impl_->bestStep(); }
std::map<std::string, std::chrono::milliseconds> HangDetector::learnedSections() const {
  return impl_->learnedSections();
}
void HangDetector::adoptSections(const std::map<std::string, std::chrono::milliseconds>& sections) {
  impl_->adoptSections(sections);
}
void HangDetector::setOnStepTime(std::function<void(int, double)> onStepTime) {
  impl_->setOnStepTime(std::move(onStepTime));
}

}  // namespace ddprun
