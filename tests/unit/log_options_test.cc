#include "agent/log_options.h"

#include <catch2/catch.hpp>

#include "common/error.h"

using ddprun::ConfigError;
using ddprun::expandPrefix;
using ddprun::LogOptions;
using ddprun::PrefixFields;
using ddprun::StreamSpec;

TEST_CASE("StreamSpec parses one value for every local rank", "[logs]") {
  StreamSpec spec = StreamSpec::parse("3", "--redirects");
  CHECK(spec.all == ddprun::kBothStreams);
  CHECK(spec.perRank.empty());
  CHECK(spec.forRank(0) == 3);
  CHECK(spec.forRank(7) == 3);

  CHECK(StreamSpec::parse("0", "--tee").all == ddprun::kNoStreams);
  CHECK(StreamSpec::parse("1", "--tee").all == ddprun::kStdout);
  CHECK(StreamSpec::parse("2", "--tee").all == ddprun::kStderr);
}

TEST_CASE("StreamSpec parses a per-rank map", "[logs]") {
  StreamSpec spec = StreamSpec::parse("0:1,1:2", "--redirects");
  CHECK(spec.all == ddprun::kNoStreams);
  CHECK(spec.perRank == std::map<int, int>{{0, 1}, {1, 2}});
  CHECK(spec.forRank(0) == ddprun::kStdout);
  CHECK(spec.forRank(1) == ddprun::kStderr);
  CHECK(spec.forRank(2) == ddprun::kNoStreams);  // ranks not listed get nothing
}

TEST_CASE("StreamSpec treats an empty spec as no streams", "[logs]") {
  StreamSpec spec = StreamSpec::parse("", "--tee");
  CHECK(spec.all == ddprun::kNoStreams);
  CHECK(spec.perRank.empty());
}

TEST_CASE("StreamSpec rejects bad values with a ConfigError naming the flag", "[logs]") {
  CHECK_THROWS_AS(StreamSpec::parse("4", "--redirects"), ConfigError);
  CHECK_THROWS_AS(StreamSpec::parse("-1", "--redirects"), ConfigError);
  CHECK_THROWS_AS(StreamSpec::parse("x", "--redirects"), ConfigError);
  CHECK_THROWS_AS(StreamSpec::parse("a:1", "--redirects"), ConfigError);
  CHECK_THROWS_AS(StreamSpec::parse("1:x", "--redirects"), ConfigError);
  CHECK_THROWS_AS(StreamSpec::parse("0:4", "--redirects"), ConfigError);
  CHECK_THROWS_AS(StreamSpec::parse("-1:1", "--redirects"), ConfigError);
  CHECK_THROWS_AS(StreamSpec::parse("0:1:2", "--redirects"), ConfigError);
  CHECK_THROWS_AS(StreamSpec::parse("0:1,,1:2", "--redirects"), ConfigError);
  CHECK_THROWS_WITH(StreamSpec::parse("4", "--tee"), Catch::Contains("--tee") && Catch::Contains("'4'"));
  CHECK_THROWS_WITH(StreamSpec::parse("a:1", "--redirects"), Catch::Contains("--redirects"));
}

TEST_CASE("parseRankFilter accepts commas and spaces", "[logs]") {
  CHECK(LogOptions::parseRankFilter("0,2") == std::set<int>{0, 2});
  CHECK(LogOptions::parseRankFilter("0 2") == std::set<int>{0, 2});
  CHECK(LogOptions::parseRankFilter("3") == std::set<int>{3});
  CHECK(LogOptions::parseRankFilter("1, 0") == std::set<int>{0, 1});
  CHECK(LogOptions::parseRankFilter("").empty());
}

TEST_CASE("parseRankFilter rejects anything but local ranks", "[logs]") {
  CHECK_THROWS_AS(LogOptions::parseRankFilter("a"), ConfigError);
  CHECK_THROWS_AS(LogOptions::parseRankFilter("0,x"), ConfigError);
  CHECK_THROWS_AS(LogOptions::parseRankFilter("-1"), ConfigError);
  CHECK_THROWS_AS(LogOptions::parseRankFilter("1.5"), ConfigError);
  CHECK_THROWS_WITH(LogOptions::parseRankFilter("0;1"), Catch::Contains("--local_ranks_filter"));
}

TEST_CASE("expandPrefix fills the default template as torchrun does", "[logs]") {
  PrefixFields fields{5, 0, "default", "node7"};
  CHECK(expandPrefix(LogOptions{}.prefixTemplate, fields) == "[default0]:");
  fields.localRank = 3;
  CHECK(expandPrefix("[{role}{local_rank}]:", fields) == "[default3]:");
}

TEST_CASE("expandPrefix accepts torchrun's ${name} spelling and every field", "[logs]") {
  PrefixFields fields{5, 1, "trainer", "node7"};
  CHECK(expandPrefix("[${rank}]: ", fields) == "[5]: ");
  CHECK(expandPrefix("${role_name}${local_rank}", fields) == "trainer1");
  CHECK(expandPrefix("{host}/{rank}/{local_rank}/{role}/{role_name}", fields) == "node7/5/1/trainer/trainer");
  CHECK(expandPrefix("${hostname}:${rank}: ", fields) == "node7:5: ");  // torchrun 2.x's macros
  CHECK(expandPrefix("no fields at all", fields) == "no fields at all");
  CHECK(expandPrefix("cost $5 {rank}", fields) == "cost $5 5");
  CHECK(expandPrefix("", fields).empty());
}

TEST_CASE("expandPrefix rejects unknown fields and unclosed braces", "[logs]") {
  PrefixFields fields{0, 0, "default", "h"};
  CHECK_THROWS_AS(expandPrefix("{nope}", fields), ConfigError);
  CHECK_THROWS_WITH(expandPrefix("[{gpu}]", fields), Catch::Contains("{gpu}"));
  CHECK_THROWS_AS(expandPrefix("${rank", fields), ConfigError);
  CHECK_THROWS_AS(ddprun::validatePrefixTemplate("{unknown}"), ConfigError);
  CHECK_NOTHROW(ddprun::validatePrefixTemplate("[{rank}]{host}:"));
}
