// The heartbeat grammar (docs/heartbeat.md) against its golden table (tests/data/heartbeat_golden.tsv,
// which tests/integration/test_heartbeat_grammar.py holds the Python package to as well): the
// agent's parser gives every row's verdict and values, and libddp's writer, both the formatter
// and a Heartbeat on a channel, produces every row a writer produces, byte for byte.
#include <catch2/catch.hpp>

#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "common/heartbeat_message.h"
#include "common/strings.h"
#include "worker_sdk/heartbeat.h"

namespace {

std::string unescape(std::string_view text) {
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '\\' || i + 1 >= text.size()) {
      out += text[i];
      continue;
    }
    const char n = text[++i];
    if (n == 'n') {
      out += '\n';
    } else if (n == 'r') {
      out += '\r';
    } else if (n == 't') {
      out += '\t';
    } else if (n == 'x') {
      out += static_cast<char>(std::stoi(std::string(text.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    } else {
      out += n;
    }
  }
  return out;
}

struct Row {
  std::string line;
  std::string datagram;
  bool accepted = false;
  int rank = 0;
  int64_t step = 0;
  std::string section;
  std::optional<double> time;
  bool written = false;
  std::optional<std::string> inputSection;  // as the API was called
  std::optional<double> inputSeconds;
};

std::vector<Row> goldenRows() {
  std::ifstream in(DDPRUN_TEST_DATA_DIR "/heartbeat_golden.tsv");
  REQUIRE(in.good());
  std::vector<Row> rows;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const auto f = ddprun::split(line, '\t');
    INFO(line);
    REQUIRE(f.size() == 7);
    Row r;
    r.line = line;
    r.datagram = unescape(f[0]);
    r.accepted = f[1] == "ok";
    if (r.accepted) {
      r.rank = static_cast<int>(*ddprun::parseInt(f[2]));
      r.step = *ddprun::parseInt(f[3]);
    }
    if (f[4] != "-") r.section = unescape(f[4]);
    if (f[5] != "-") r.time = std::strtod(f[5].c_str(), nullptr);
    r.written = f[6] != "-";
    if (!r.section.empty()) r.inputSection = r.section;
    r.inputSeconds = r.time;
    if (r.written && f[6] != "write") {
      for (const auto& part : ddprun::split(f[6], ';')) {
        if (ddprun::startsWith(part, "section=")) r.inputSection = unescape(part.substr(8));
        if (ddprun::startsWith(part, "seconds=")) r.inputSeconds = std::strtod(part.c_str() + 8, nullptr);
      }
    }
    rows.push_back(std::move(r));
  }
  return rows;
}

}  // namespace

TEST_CASE("the agent's parser reads every golden datagram as the table says", "[heartbeat]") {
  const auto rows = goldenRows();
  REQUIRE(rows.size() > 30);
  for (const auto& row : rows) {
    INFO(row.line);
    const auto parsed = ddprun::parseHeartbeat(row.datagram);
    REQUIRE(parsed.has_value() == row.accepted);
    if (!parsed) continue;
    CHECK(parsed->rank == row.rank);
    CHECK(parsed->step == row.step);
    CHECK(parsed->section == row.section);
    CHECK(parsed->stepSeconds == row.time);
  }
}

TEST_CASE("libddp's formatter writes every golden datagram a writer produces", "[heartbeat]") {
  for (const auto& row : goldenRows()) {
    if (!row.written) continue;
    INFO(row.line);
    const std::string section = row.inputSection ? ddprun::cleanHeartbeatSection(*row.inputSection) : "";
    const auto seconds = row.inputSeconds ? ddprun::cleanHeartbeatStepSeconds(*row.inputSeconds) : std::nullopt;
    CHECK(ddprun::formatHeartbeat(ddprun::HeartbeatMessage{row.rank, row.step, section, seconds}) == row.datagram);
  }
}

TEST_CASE("libddp's Heartbeat sends every golden datagram a writer produces on its channel", "[heartbeat][sdk]") {
  for (const auto& row : goldenRows()) {
    if (!row.written) continue;
    INFO(row.line);
    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0);
    auto receive = [&] {
      char buf[512];
      const ssize_t n = ::recv(sv[0], buf, sizeof(buf), MSG_DONTWAIT);
      return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string("(nothing)");
    };
    {
      ddp::Heartbeat heartbeat(ddp::HeartbeatOptions{.socket = "", .rank = row.rank,
                                                     .minInterval = std::chrono::milliseconds(0), .fd = sv[1]});
      REQUIRE(heartbeat.enabled());
      auto beat = [&] {
        heartbeat.beat(row.step, row.inputSeconds);
        CHECK(receive() == row.datagram);
      };
      if (row.inputSection) {
        auto section = heartbeat.section(*row.inputSection);
        (void)receive();  // the beat on entry
        beat();
      } else {
        beat();
      }
    }
    ::close(sv[0]);
    ::close(sv[1]);
  }
}

TEST_CASE("the grammar's bounds", "[heartbeat]") {
  CHECK(ddprun::cleanHeartbeatSection(std::string(100, 'a')).size() == ddprun::kMaxHeartbeatSection);
  CHECK(ddprun::cleanHeartbeatStepSeconds(86400.0) == 86400.0);
  CHECK_FALSE(ddprun::cleanHeartbeatStepSeconds(86400.001));
  CHECK_FALSE(ddprun::cleanHeartbeatStepSeconds(-0.001));
  char small[8];
  CHECK(ddprun::formatHeartbeat(1, 123456789, "", std::nullopt, small, sizeof(small)) == 0);  // does not fit
}
