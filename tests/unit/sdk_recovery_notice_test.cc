// libddp's reading of the agent's notices (worker_sdk/recovery_notice.h): the parser against the
// agent's own writer (InProcessRecovery::notice), malformed and hostile messages, and the reader
// on a real SOCK_SEQPACKET pair as ddprun creates it (stale notices dropped, the newest of several
// wins, bounded waits, end-of-file). Also the recovery tokens of Heartbeat's beats, read back with
// the agent's parser.
#include <catch2/catch.hpp>

#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "agent/in_process_recovery.h"
#include "common/error.h"
#include "common/heartbeat_message.h"
#include "worker_sdk/heartbeat.h"
#include "worker_sdk/recovery_notice.h"

using namespace std::chrono_literals;
using ddp::parseRecoveryNotice;

namespace {

// A channel as the agent makes it: agent's end and worker's end of a SOCK_SEQPACKET pair.
struct Channel {
  int agent = -1;
  int worker = -1;
  Channel() {
    int fds[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) == 0);
    agent = fds[0];
    worker = fds[1];
  }
  ~Channel() {
    if (agent >= 0) ::close(agent);
    if (worker >= 0) ::close(worker);
  }
  void send(const std::string& message) const {
    REQUIRE(::send(agent, message.data(), message.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(message.size()));
  }
  // The next message the worker sent, or "" after `timeout`.
  std::string receive(std::chrono::milliseconds timeout = 5s) const {
    timeval tv{static_cast<time_t>(timeout.count() / 1000), static_cast<suseconds_t>((timeout.count() % 1000) * 1000)};
    ::setsockopt(agent, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    char buf[512];
    const ssize_t n = ::recv(agent, buf, sizeof(buf), 0);
    return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
  }
};

std::string notice(uint64_t round, int rank = 1, const std::string& reason = "rank 2 failed") {
  return "recover round=" + std::to_string(round) + " restart=" + std::to_string(round) + " rank=" +
         std::to_string(rank) + " world=4 local_rank=" + std::to_string(rank) +
         " master_addr=10.0.0.1 master_port=29500 reason=" + reason;
}

std::string whyNot(const std::string& message) {
  std::string why;
  auto parsed = parseRecoveryNotice(message, &why);
  return parsed ? std::string("(parsed)") : why;
}

}  // namespace

TEST_CASE("recovery notice: the agent's own notice parses back field by field", "[recovery-sdk]") {
  ddprun::RoundInfo round;
  round.round = 7;
  round.restartCount = 3;
  round.rankOffset = 4;
  round.worldSize = 8;
  round.masterAddr = "node-a.example";
  round.masterPort = 29411;
  round.storeAddr = "10.1.2.3:29400";
  round.storePrefix = "/run/job1/round/7/";
  const std::string text = ddprun::InProcessRecovery::notice(round, 2, "rank 5 exited with 9 (SIGKILL)",
                                                             {{"LOCAL_WORLD_SIZE", "4"}, {"SPACE", "a b"}});
  std::string why;
  const auto parsed = parseRecoveryNotice(text, &why);
  INFO(text << " / " << why);
  REQUIRE(parsed);
  CHECK(parsed->round == 7);
  CHECK(parsed->restart == 3);
  CHECK(parsed->rank == 6);
  CHECK(parsed->world == 8);
  CHECK(parsed->localRank == 2);
  CHECK(parsed->masterAddr == "node-a.example");
  CHECK(parsed->masterPort == 29411);
  CHECK(parsed->envValue("DDPRUN_STORE_ADDR") == std::optional<std::string>("10.1.2.3:29400"));
  CHECK(parsed->envValue("DDPRUN_STORE_PREFIX") == std::optional<std::string>("/run/job1/round/7/"));
  CHECK(parsed->envValue("LOCAL_WORLD_SIZE") == std::optional<std::string>("4"));
  CHECK_FALSE(parsed->envValue("SPACE"));  // the agent leaves values with a space out
  CHECK(parsed->reason == "rank 5 exited with 9 (SIGKILL)");
}

TEST_CASE("recovery notice: unknown keys are skipped, reason is optional and runs to the end", "[recovery-sdk]") {
  auto parsed = parseRecoveryNotice("recover round=2 restart=1 rank=0 world=1 local_rank=0 master_addr=h "
                                    "master_port=1 future_key=x reason=a  b=c reason=d\n");
  REQUIRE(parsed);
  CHECK(parsed->reason == "a  b=c reason=d");
  parsed = parseRecoveryNotice("recover round=2 restart=1 rank=0 world=1 local_rank=0 master_addr=h master_port=1");
  REQUIRE(parsed);
  CHECK(parsed->reason.empty());
}

TEST_CASE("recovery notice: malformed and hostile messages are refused, each with why", "[recovery-sdk]") {
  CHECK(whyNot(notice(3)) == "(parsed)");
  CHECK(whyNot("hello world") == "not a notice (no leading \"recover\")");
  CHECK(whyNot("") == "not a notice (no leading \"recover\")");
  CHECK(whyNot("recovered round=1") == "not a notice (no leading \"recover\")");
  CHECK(whyNot("recover") == "missing round=");
  CHECK_THAT(whyNot("recover round=1 restart=0 rank=0 world=1 local_rank=0 master_port=5"),
             Catch::Matchers::Equals("missing master_addr="));
  CHECK_THAT(whyNot("recover round=1 round=2 restart=0"), Catch::Matchers::Contains("given twice"));
  CHECK_THAT(whyNot("recover round=1 junk"), Catch::Matchers::Contains("is not key=value"));
  CHECK_THAT(whyNot("recover round=1 =x"), Catch::Matchers::Contains("is not key=value"));
  CHECK_THAT(whyNot("recover round=1  restart=0"), Catch::Matchers::Contains("two spaces"));
  // Numbers: signs, letters, overflow, ranges.
  std::string text = notice(3);
  CHECK_THAT(whyNot(std::string(text).replace(text.find("rank=1"), 6, "rank=-1")), Catch::Matchers::Contains("rank"));
  CHECK_THAT(whyNot(std::string(text).replace(text.find("rank=1"), 6, "rank=4")),
             Catch::Matchers::Equals("rank 4 not in a world of 4"));
  CHECK_THAT(whyNot(std::string(text).replace(text.find("world=4"), 7, "world=0")), Catch::Matchers::Contains("world"));
  CHECK_THAT(whyNot(std::string(text).replace(text.find("round=3"), 7, "round=99999999999999999999999")),
             Catch::Matchers::Contains("round"));
  CHECK_THAT(whyNot(std::string(text).replace(text.find("rank=1"), 6, "rank=2147483648")),
             Catch::Matchers::Contains("rank"));
  CHECK_THAT(whyNot(std::string(text).replace(text.find("master_port=29500"), 17, "master_port=65536")),
             Catch::Matchers::Contains("master_port"));
  CHECK_THAT(whyNot(std::string(text).replace(text.find("master_port=29500"), 17, "master_port=0")),
             Catch::Matchers::Contains("master_port"));
  CHECK_THAT(whyNot(std::string(text).replace(text.find("master_addr=10.0.0.1"), 20, "master_addr=")),
             Catch::Matchers::Contains("master_addr"));
  // Bytes that are not printable ASCII, anywhere (a NUL, a line end, UTF-8, a terminal escape).
  CHECK_THAT(whyNot(notice(3) + std::string(1, '\0')), Catch::Matchers::Contains("printable"));
  CHECK_THAT(whyNot(notice(3, 1, "a\nb")), Catch::Matchers::Contains("printable"));
  CHECK_THAT(whyNot(notice(3, 1, "caf\xc3\xa9")), Catch::Matchers::Contains("printable"));
  CHECK_THAT(whyNot(notice(3, 1, "\x1b[2J")), Catch::Matchers::Contains("printable"));
  // Sizes: the whole message, env names and values, the number of env tokens.
  CHECK(whyNot(notice(3, 1, std::string(1024 - notice(3, 1, "").size(), 'x'))) == "(parsed)");
  CHECK_THAT(whyNot(notice(3, 1, std::string(1025 - notice(3, 1, "").size(), 'x'))),
             Catch::Matchers::Contains("over 1024"));
  CHECK_THAT(whyNot(notice(3, 1, std::string(1 << 20, 'x'))), Catch::Matchers::Contains("over 1024"));
  const std::string head = "recover round=3 restart=0 rank=0 world=1 local_rank=0 master_addr=h master_port=1 ";
  CHECK(whyNot(head + "env.A=" + std::string(256, 'v')) == "(parsed)");
  CHECK_THAT(whyNot(head + "env.A=" + std::string(257, 'v')), Catch::Matchers::Contains("over 256"));
  CHECK_THAT(whyNot(head + "env." + std::string(65, 'N') + "=1"), Catch::Matchers::Contains("env name"));
  CHECK_THAT(whyNot(head + "env.A-B=1"), Catch::Matchers::Contains("env name"));
  CHECK_THAT(whyNot(head + "env.=1"), Catch::Matchers::Contains("env name"));
  CHECK_THAT(whyNot(head + "env.A=1 env.A=2"), Catch::Matchers::Contains("given twice"));
  std::string many = head;
  for (int i = 0; i < 33; ++i) many += "env.V" + std::to_string(i) + "=1 ";
  CHECK_THAT(whyNot(many), Catch::Matchers::Contains("too many env"));
}

TEST_CASE("recovery notice: applying a notice gives the new round's environment, checked as a launch",
          "[recovery-sdk]") {
  ddp::Env current;
  current.rank = 2;
  current.worldSize = 4;
  current.localRank = 2;
  current.localWorldSize = 4;
  current.masterAddr = "old";
  current.masterPort = 1;
  current.round = 6;
  current.runId = "job1";
  current.storeAddr = "10.1.2.3:29400";
  current.storePrefix = "/run/job1/round/6/";
  current.heartbeatFd = 9;
  auto parsed = parseRecoveryNotice(
      "recover round=7 restart=2 rank=1 world=3 local_rank=1 master_addr=new master_port=2 "
      "env.DDPRUN_STORE_ADDR=10.1.2.4:29400 env.DDPRUN_STORE_PREFIX=/run/job1/round/7/ env.PATH=/evil reason=r");
  REQUIRE(parsed);
  const ddp::Env next = ddp::applyRecoveryNotice(current, *parsed);
  CHECK(next.rank == 1);
  CHECK(next.worldSize == 3);
  CHECK(next.localRank == 1);
  CHECK(next.localWorldSize == 3);  // narrowed to the new world
  CHECK(next.masterAddr == "new");
  CHECK(next.masterPort == 2);
  CHECK(next.restartCount == 2);
  CHECK(next.round == 7);
  CHECK(next.runId == "job1");
  CHECK(next.storeAddr == "10.1.2.4:29400");
  CHECK(next.storePrefix == "/run/job1/round/7/");
  CHECK(next.heartbeatFd == 9);

  // A store prefix of another round, or of another run, is refused as at a launch.
  auto otherRound = parseRecoveryNotice(
      "recover round=7 restart=2 rank=1 world=3 local_rank=1 master_addr=new master_port=2 "
      "env.DDPRUN_STORE_PREFIX=/run/job1/round/6/ reason=r");
  REQUIRE(otherRound);
  CHECK_THROWS_AS(ddp::applyRecoveryNotice(current, *otherRound), ddprun::ConfigError);
  auto otherRun = parseRecoveryNotice(
      "recover round=7 restart=2 rank=1 world=3 local_rank=1 master_addr=new master_port=2 "
      "env.DDPRUN_STORE_PREFIX=/run/job2/round/7/ reason=r");
  REQUIRE(otherRun);
  CHECK_THROWS_AS(ddp::applyRecoveryNotice(current, *otherRun), ddprun::ConfigError);
  // Without a store of its own the round keeps the address; the old round's prefix goes.
  auto noStore = parseRecoveryNotice(
      "recover round=8 restart=2 rank=0 world=3 local_rank=0 master_addr=new master_port=2 reason=r");
  REQUIRE(noStore);
  const ddp::Env kept = ddp::applyRecoveryNotice(current, *noStore);
  CHECK(kept.storeAddr == "10.1.2.3:29400");
  CHECK(kept.storePrefix.empty());
  CHECK(kept.round == 8);
}

TEST_CASE("recovery notice reader: stale notices are dropped, the newest of several wins, waits are bounded",
          "[recovery-sdk]") {
  Channel channel;
  ddp::NoticeReader reader(ddp::NoticeReaderOptions{.fd = channel.worker, .currentRound = 5});
  REQUIRE(reader.available());
  CHECK_FALSE(reader.poll());  // nothing pending: at once

  // Nothing comes: wait() returns after its timeout, not before, and not much later.
  auto start = std::chrono::steady_clock::now();
  CHECK_FALSE(reader.wait(200ms));
  auto took = std::chrono::steady_clock::now() - start;
  CHECK(took >= 190ms);
  CHECK(took < 5s);

  channel.send(notice(4));                 // stale: below the current round
  channel.send(notice(5));                 // stale: the current round
  channel.send("recover round=9 garbage");  // malformed
  channel.send("hello");                   // not a notice
  CHECK_FALSE(reader.poll());
  CHECK(reader.dropped() == 4);

  channel.send(notice(6, 1, "first"));
  channel.send(notice(8, 2, "newest"));
  channel.send(notice(7, 3, "older"));  // comes later, but of an older round
  channel.send(notice(3));
  auto got = reader.poll();
  REQUIRE(got);
  CHECK(got->round == 8);
  CHECK(got->reason == "newest");
  CHECK_FALSE(reader.poll());

  reader.setCurrentRound(8);
  channel.send(notice(8));
  CHECK_FALSE(reader.poll());  // stale now

  // wait() returns as soon as a notice comes from another thread.
  std::thread sender([&] {
    std::this_thread::sleep_for(100ms);
    channel.send(notice(9, 0, "late"));
  });
  start = std::chrono::steady_clock::now();
  got = reader.wait(10s);
  took = std::chrono::steady_clock::now() - start;
  sender.join();
  REQUIRE(got);
  CHECK(got->reason == "late");
  CHECK(took < 5s);
}

TEST_CASE("recovery notice reader: an oversized message is dropped whole, and later notices still read",
          "[recovery-sdk]") {
  Channel channel;
  ddp::NoticeReader reader(ddp::NoticeReaderOptions{.fd = channel.worker, .currentRound = 0});
  // A valid notice padded past the bound: its first 1025 bytes would parse if cut, so a reader
  // that truncates silently would take it.
  channel.send(notice(1, 1, std::string(4000, 'x')));
  channel.send(std::string(60000, 'r'));
  CHECK_FALSE(reader.poll());
  CHECK(reader.dropped() == 2);
  CHECK_THAT(reader.lastDropReason(), Catch::Matchers::Contains("over 1024"));
  channel.send(notice(2));
  auto got = reader.poll();
  REQUIRE(got);
  CHECK(got->round == 2);
}

TEST_CASE("recovery notice reader: the agent gone (end-of-file) ends waiting at once, no channel, no notices",
          "[recovery-sdk]") {
  Channel channel;
  ddp::NoticeReader reader(ddp::NoticeReaderOptions{.fd = channel.worker, .currentRound = 0});
  channel.send(notice(1));
  ::close(channel.agent);
  channel.agent = -1;
  auto got = reader.poll();  // what came before the end is still read
  REQUIRE(got);
  const auto start = std::chrono::steady_clock::now();
  CHECK_FALSE(reader.wait(10s));
  CHECK(std::chrono::steady_clock::now() - start < 5s);
  CHECK_FALSE(reader.available());

  ddp::NoticeReader none(ddp::NoticeReaderOptions{.fd = -1});
  CHECK_FALSE(none.available());
  CHECK_FALSE(none.wait(10s));
  // A descriptor that is no packet socket (a pipe under the same number) is not a channel.
  int pipeFds[2];
  REQUIRE(::pipe(pipeFds) == 0);
  ddp::NoticeReader pipeReader(ddp::NoticeReaderOptions{.fd = pipeFds[0]});
  CHECK_FALSE(pipeReader.available());
  ::close(pipeFds[0]);
  ::close(pipeFds[1]);
}

TEST_CASE("recovery notice reader: a forked child takes no notice meant for its parent", "[recovery-sdk]") {
  Channel channel;
  ddp::NoticeReader reader(ddp::NoticeReaderOptions{.fd = channel.worker, .currentRound = 0});
  channel.send(notice(1));
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // A DataLoader-like child: the descriptor is inherited, the reader must not read it.
    const bool quiet = !reader.available() && !reader.poll() && !reader.wait(50ms);
    ::_exit(quiet ? 0 : 1);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  auto got = reader.poll();  // still there for the parent
  REQUIRE(got);
  CHECK(got->round == 1);
}

TEST_CASE("heartbeat: recoverable=1 on every beat while set, failed=1 on the failure's beat only",
          "[recovery-sdk]") {
  Channel channel;
  ddp::Heartbeat heartbeat(ddp::HeartbeatOptions{.socket = "", .rank = 3, .minInterval = 0ms, .fd = channel.worker});
  heartbeat.beat(1);
  auto message = ddprun::parseHeartbeat(channel.receive());
  REQUIRE(message);
  CHECK_FALSE(message->recoverable);
  CHECK_FALSE(message->failed);

  heartbeat.setRecoverable(true);  // goes at once
  message = ddprun::parseHeartbeat(channel.receive());
  REQUIRE(message);
  CHECK(message->recoverable);
  CHECK(message->step == 1);
  heartbeat.beat(2, 0.5);
  const std::string bytes = channel.receive();
  CHECK(bytes == "3 2 time=0.500000 recoverable=1\n");

  heartbeat.reportFailed();
  message = ddprun::parseHeartbeat(channel.receive());
  REQUIRE(message);
  CHECK(message->recoverable);
  CHECK(message->failed);
  CHECK(message->rank == 3);
  heartbeat.beat(3);
  message = ddprun::parseHeartbeat(channel.receive());
  REQUIRE(message);
  CHECK_FALSE(message->failed);

  heartbeat.setRecoverable(false);
  message = ddprun::parseHeartbeat(channel.receive());
  REQUIRE(message);
  CHECK_FALSE(message->recoverable);

  // A section of the longest name still leaves room for the tokens within 255 bytes.
  heartbeat.setRecoverable(true);
  (void)channel.receive();
  {
    auto section = heartbeat.section(std::string(200, 's'));
    const std::string long_ = channel.receive();
    CHECK(long_.size() <= ddprun::kMaxHeartbeatDatagram);
    message = ddprun::parseHeartbeat(long_);
    REQUIRE(message);
    CHECK(message->recoverable);
  }
}
