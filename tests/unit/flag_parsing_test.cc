#include "launcher/flag_parsing.h"

#include <signal.h>

#include <catch2/catch.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "test_util.h"

using ddprun::ConfigError;
using ddprun::LaunchConfig;
using ddprun::parseIntFlag;
using ddprun::parseNnodes;
using ddprun::parseRendezvousConf;
using ddprun::parseSecondsFlag;
using ddprun::parseSignals;
using ddprun::SecondsRange;
using Catch::Contains;

TEST_CASE("parseText passes free text through as typed", "[cli][flag_parsing]") {
  CHECK(ddprun::parseText("--role", " trainer ") == " trainer ");
  CHECK(ddprun::parseText("--log_dir", "").empty());
}

TEST_CASE("parseIntFlag takes whole integers within the range", "[cli][flag_parsing]") {
  CHECK(parseIntFlag("--master_port", "1", ddprun::kMasterPortRange) == 1);
  CHECK(parseIntFlag("--master_port", "65535", ddprun::kMasterPortRange) == 65535);
  CHECK(parseIntFlag("--master_port", " 123 ", ddprun::kMasterPortRange) == 123);
  CHECK(parseIntFlag("--max_restarts", "0", ddprun::kMaxRestartsRange) == 0);
  CHECK(parseIntFlag("--max_restarts", "1000000", ddprun::kMaxRestartsRange) == 1000000);
}

TEST_CASE("parseIntFlag names the flag, the value and the range", "[cli][flag_parsing]") {
  CHECK_THROWS_WITH(parseIntFlag("--master_port", "70000", ddprun::kMasterPortRange),
                    "--master_port '70000': expected an integer from 1 to 65535");
  CHECK_THROWS_WITH(parseIntFlag("--max_restarts", "-1", ddprun::kMaxRestartsRange),
                    "--max_restarts '-1': expected an integer from 0 to 1000000");
  for (const char* bad : {"0", "65536", "http", "", "1.5", "12abc", "99999999999999999999"}) {
    INFO("value '" << bad << "'");
    CHECK_THROWS_AS(parseIntFlag("--master_port", bad, ddprun::kMasterPortRange), ConfigError);
  }
}

TEST_CASE("parseSecondsFlag takes non-negative numbers", "[cli][flag_parsing]") {
  CHECK(parseSecondsFlag("--shutdown_timeout", "2.5", ddprun::kShutdownTimeoutRange) == 2.5);
  CHECK(parseSecondsFlag("--hang_timeout", "0", ddprun::kHangTimeoutRange) == 0.0);
  CHECK(parseSecondsFlag("--monitor_interval", " 1 ", ddprun::kMonitorIntervalRange) == 1.0);
  CHECK_THROWS_WITH(parseSecondsFlag("--shutdown_timeout", "-1", ddprun::kShutdownTimeoutRange),
                    "--shutdown_timeout '-1': expected a number of seconds from 0 to 86400");
  // Every duration flag has a finite range: the extremes that used to overflow are refused.
  for (auto range : {ddprun::kShutdownTimeoutRange, ddprun::kHangTimeoutRange, ddprun::kMonitorIntervalRange,
                     ddprun::kJoinTimeoutRange, ddprun::kLastCallTimeoutRange, ddprun::kHeartbeatTimeoutRange}) {
    CHECK(range.max <= 604800);
    CHECK_THROWS_AS(parseSecondsFlag("--x", "1e300", range), ConfigError);
    CHECK_THROWS_AS(parseSecondsFlag("--x", "9223372036854775808", range), ConfigError);
  }
  CHECK_THROWS_AS(parseSecondsFlag("--x", "0.000001", ddprun::kHeartbeatTimeoutRange), ConfigError);
  for (const char* bad : {"fast", "", "inf", "nan", "1e400", "1s"}) {
    INFO("value '" << bad << "'");
    CHECK_THROWS_AS(parseSecondsFlag("--hang_timeout", bad, ddprun::kHangTimeoutRange), ConfigError);
  }
}

TEST_CASE("parseSecondsFlag names a bounded range", "[cli][flag_parsing]") {
  SecondsRange range{0.5, 60};
  CHECK(parseSecondsFlag("--x", "60", range) == 60.0);
  CHECK(parseSecondsFlag("--x", "0.5", range) == 0.5);
  CHECK_THROWS_WITH(parseSecondsFlag("--x", "61", range), "--x '61': expected a number of seconds from 0.5 to 60");
  CHECK_THROWS_WITH(parseSecondsFlag("--x", "0.1", range), Contains("from 0.5 to 60"));
}

TEST_CASE("parseNnodes takes N and MIN:MAX", "[cli][flag_parsing]") {
  CHECK(parseNnodes("1").min == 1);
  CHECK(parseNnodes("1").max == 1);
  CHECK(parseNnodes("4").min == 4);
  CHECK(parseNnodes("4").max == 4);
  CHECK(parseNnodes(" 2 : 8 ").min == 2);
  CHECK(parseNnodes(" 2 : 8 ").max == 8);
  CHECK(parseNnodes("100000").max == 100000);
}

TEST_CASE("parseNnodes rejects what is not a positive range", "[cli][flag_parsing]") {
  CHECK_THROWS_WITH(parseNnodes("3:2"), "--nnodes '3:2': MIN is larger than MAX");
  CHECK_THROWS_WITH(parseNnodes("1:2:3"), "--nnodes '1:2:3': expected N or MIN:MAX");
  for (const char* bad : {"0", "x", "1:", ":1", "", "-1", "100001", "1:100001", "0:2"}) {
    INFO("value '" << bad << "'");
    CHECK_THROWS_WITH(parseNnodes(bad), Contains("--nnodes '" + std::string(bad) + "'"));
  }
}

TEST_CASE("parseSignals takes names with or without SIG", "[cli][flag_parsing]") {
  CHECK(parseSignals("SIGTERM,SIGINT,SIGHUP,SIGQUIT") == std::vector<int>{SIGTERM, SIGINT, SIGHUP, SIGQUIT});
  CHECK(parseSignals("TERM, HUP") == std::vector<int>{SIGTERM, SIGHUP});
  CHECK(parseSignals("SIGUSR1,,") == std::vector<int>{SIGUSR1});
  CHECK(parseSignals("").empty());
}

TEST_CASE("parseSignals rejects unknown signals and those ddprun cannot forward", "[cli][flag_parsing]") {
  CHECK_THROWS_WITH(parseSignals("SIGTERM,SIGBOGUS"),
                    "--signals_to_handle 'SIGTERM,SIGBOGUS': 'SIGBOGUS' is not a signal ddprun can handle");
  for (const char* bad : {"SIGKILL", "STOP", "SIGCHLD", "sigterm", "15"}) {
    INFO("value '" << bad << "'");
    CHECK_THROWS_WITH(parseSignals(bad), Contains(bad));
  }
}

TEST_CASE("checkStartMethod accepts torchrun's start methods", "[cli][flag_parsing]") {
  for (const char* good : {"spawn", "fork", "forkserver"}) CHECK_NOTHROW(ddprun::checkStartMethod(good));
  CHECK_THROWS_WITH(ddprun::checkStartMethod("thread"), "--start_method 'thread': expected spawn, fork or forkserver");
  CHECK_THROWS_AS(ddprun::checkStartMethod(""), ConfigError);
}

TEST_CASE("parseRdzvBackend: static, grpc, c10d as an alias of grpc, etcd and torch's etcd-v2 as etcd", "[cli][flag_parsing]") {
  using ddprun::RdzvBackend;
  CHECK(ddprun::parseRdzvBackend("static") == RdzvBackend::kStatic);
  CHECK(ddprun::parseRdzvBackend("etcd") == RdzvBackend::kEtcd);
  CHECK(ddprun::parseRdzvBackend("etcd-v2") == RdzvBackend::kEtcd);
  CHECK(ddprun::parseRdzvBackend("grpc") == RdzvBackend::kGrpc);
  CHECK(ddprun::parseRdzvBackend("c10d") == RdzvBackend::kGrpc);
  CHECK(std::string(ddprun::backendName(RdzvBackend::kEtcd)) == "etcd");
  CHECK_THROWS_WITH(ddprun::parseRdzvBackend("etcd-v3"), "--rdzv_backend 'etcd-v3': expected static, grpc, c10d, etcd or etcd-v2");
  CHECK_THROWS_AS(ddprun::parseRdzvBackend(""), ConfigError);
}

TEST_CASE("parseRendezvousConf sets torchrun's timeouts and takes its store keys", "[cli][flag_parsing]") {
  LaunchConfig cfg;
  parseRendezvousConf(" join_timeout = 60,last_call_timeout=2.5,heartbeat_timeout=3,timeout=9,store_type=tcp,,", cfg);
  CHECK(cfg.joinTimeoutSeconds == 60.0);
  CHECK(cfg.lastCallTimeoutSeconds == 2.5);
  CHECK(cfg.heartbeatTimeoutSeconds == 3.0);
  CHECK_FALSE(cfg.isHost.has_value());

  LaunchConfig untouched;
  parseRendezvousConf("", untouched);
  CHECK(untouched.joinTimeoutSeconds == 600.0);
  CHECK(untouched.lastCallTimeoutSeconds == 30.0);
  CHECK(untouched.heartbeatTimeoutSeconds == 5.0);
}

TEST_CASE("parseRendezvousConf: is_host and token_file", "[cli][flag_parsing]") {
  for (const char* yes : {"1", "true", "YES"}) {
    LaunchConfig cfg;
    parseRendezvousConf(std::string("is_host=") + yes, cfg);
    CHECK(cfg.isHost == std::optional<bool>(true));
  }
  LaunchConfig no;
  parseRendezvousConf("is_host=False", no);
  CHECK(no.isHost == std::optional<bool>(false));
  CHECK_THROWS_WITH(parseRendezvousConf("is_host=maybe", no), "--rdzv_conf is_host 'maybe': expected 1/0, true/false");

  ddprun::test::TempDir dir;
  ddprun::test::writeFile(dir.file("token"), "secret\n", 0600);
  LaunchConfig withToken;
  parseRendezvousConf("token_file=" + dir.file("token"), withToken);
  CHECK(withToken.tokenFile == dir.file("token"));
  CHECK_THROWS_WITH(parseRendezvousConf("token_file=" + dir.file("none"), withToken),
                    Contains("token_file '" + dir.file("none") + "' cannot be read"));
}

TEST_CASE("parseRendezvousConf rejects bare words and zero timeouts, naming the key", "[cli][flag_parsing]") {
  LaunchConfig cfg;
  CHECK_THROWS_WITH(parseRendezvousConf("join_timeout", cfg), "--rdzv_conf 'join_timeout': expected KEY=VALUE pairs");
  CHECK_THROWS_WITH(parseRendezvousConf("join_timeout=0", cfg), Contains("join_timeout '0': expected a number of seconds from 1"));
  LaunchConfig heartbeat;
  CHECK_THROWS_AS(parseRendezvousConf("heartbeat_timeout=0", heartbeat), ConfigError);
  LaunchConfig lastCall;
  CHECK_NOTHROW(parseRendezvousConf("last_call_timeout=0", lastCall));
  CHECK_THROWS_WITH(parseRendezvousConf("join_timeout=-1", lastCall),
                    "--rdzv_conf join_timeout '-1': expected a number of seconds from 1 to 604800");
}

TEST_CASE("parseRendezvousConf: an unknown key is a warning naming the closest known key, not an error",
          "[cli][flag_parsing]") {
  LaunchConfig cfg;
  auto warnings = parseRendezvousConf("join_timout=5,last_call_timeout=1,bogus_key=1", cfg);
  REQUIRE(warnings.size() == 2);
  CHECK(warnings[0] == "--rdzv_conf: unknown key 'join_timout' ignored (did you mean 'join_timeout'?)");
  CHECK_THAT(warnings[1], Contains("unknown key 'bogus_key' ignored"));
  CHECK(cfg.joinTimeoutSeconds == 600.0);  // the misspelled key set nothing
  CHECK(cfg.lastCallTimeoutSeconds == 1.0);
  CHECK(parseRendezvousConf("join_timeout=5", cfg).empty());
}

TEST_CASE("parseRendezvousConf: a value quoted as a whole, as PyTorch's launcher tests pass it", "[cli][flag_parsing]") {
  // test_run.py passes --rdzv-conf='join_timeout=5,last_call_timeout=1,timeout=5' with no shell.
  LaunchConfig cfg;
  CHECK(parseRendezvousConf("'join_timeout=5,last_call_timeout=1,timeout=5'", cfg).empty());
  CHECK(cfg.joinTimeoutSeconds == 5.0);
  CHECK(cfg.lastCallTimeoutSeconds == 1.0);
  LaunchConfig doubleQuoted;
  CHECK(parseRendezvousConf("\"join_timeout=7\",'last_call_timeout'='2',is_host=\"false\"", doubleQuoted).empty());
  CHECK(doubleQuoted.joinTimeoutSeconds == 7.0);
  CHECK(doubleQuoted.lastCallTimeoutSeconds == 2.0);
  CHECK(doubleQuoted.isHost == std::optional<bool>(false));
}

TEST_CASE("parseRendezvousConf: torchrun's keys mean here what they mean there", "[cli][flag_parsing]") {
  // timeout (etcd v1, static): the time to form the rendezvous; join_timeout wins when both are given.
  LaunchConfig timeout;
  parseRendezvousConf("timeout=45", timeout);
  CHECK(timeout.joinTimeoutSeconds == 45.0);
  LaunchConfig both;
  parseRendezvousConf("timeout=45,join_timeout=9", both);
  CHECK(both.joinTimeoutSeconds == 9.0);
  // close_timeout: the host's wait for the others to read the end of the job.
  LaunchConfig close;
  CHECK(close.closeTimeoutSeconds == 2.0);
  parseRendezvousConf("close_timeout=12", close);
  CHECK(close.closeTimeoutSeconds == 12.0);
  // keep_alive_interval x keep_alive_max_attempt: a node's death, heartbeat_timeout's meaning.
  LaunchConfig keepAlive;
  parseRendezvousConf("keep_alive_interval=2,keep_alive_max_attempt=4", keepAlive);
  CHECK(keepAlive.heartbeatTimeoutSeconds == 8.0);
  LaunchConfig explicitBeat;
  parseRendezvousConf("keep_alive_interval=2,heartbeat_timeout=3", explicitBeat);
  CHECK(explicitBeat.heartbeatTimeoutSeconds == 3.0);
  // etcd-v2's names for the TLS files.
  LaunchConfig tls;
  parseRendezvousConf("protocol=HTTPS,ca_cert=/c/ca.pem,ssl_cert=/c/me.pem,ssl_cert_key=/c/me.key", tls);
  CHECK(tls.tls);
  CHECK(tls.tlsCaCert == "/c/ca.pem");
  CHECK(tls.tlsCert == "/c/me.pem");
  CHECK(tls.tlsKey == "/c/me.key");
  // Checked, no effect here: every key torchrun's backends read is known (no warning).
  LaunchConfig rest;
  CHECK(parseRendezvousConf("read_timeout=60,store_type=file,use_libuv=t,rank=0,is_host=y", rest).empty());
  CHECK(rest.isHost == std::optional<bool>(true));
}

TEST_CASE("parseRendezvousConf: numbers, booleans and durations are still strict", "[cli][flag_parsing]") {
  LaunchConfig cfg;
  CHECK_THROWS_WITH(parseRendezvousConf("timeout=soon", cfg), Contains("--rdzv_conf timeout 'soon'"));
  CHECK_THROWS_WITH(parseRendezvousConf("close_timeout=-1", cfg), Contains("--rdzv_conf close_timeout '-1'"));
  CHECK_THROWS_WITH(parseRendezvousConf("read_timeout=0", cfg), Contains("--rdzv_conf read_timeout '0'"));
  CHECK_THROWS_WITH(parseRendezvousConf("keep_alive_max_attempt=2.5", cfg), Contains("keep_alive_max_attempt '2.5'"));
  CHECK_THROWS_WITH(parseRendezvousConf("use_libuv=perhaps", cfg), "--rdzv_conf use_libuv 'perhaps': expected 1/0, true/false");
  CHECK_THROWS_WITH(parseRendezvousConf("store_type=redis", cfg), "--rdzv_conf store_type 'redis': expected tcp or file");
  CHECK_THROWS_WITH(parseRendezvousConf("rank=x", cfg), Contains("--rdzv_conf rank 'x'"));
  CHECK_THROWS_WITH(parseRendezvousConf("'join_timeout=never'", cfg), Contains("--rdzv_conf join_timeout 'never'"));
}

TEST_CASE("parseRendezvousConf: torch's etcd keys and ours, checked at once", "[cli][flag_parsing]") {
  LaunchConfig cfg;
  CHECK_FALSE(cfg.tls);
  CHECK(cfg.etcdPrefix == "/ddprun");
  parseRendezvousConf("protocol=https,cacert=/c/ca.pem,cert=/c/me.pem,key=/c/me.key,etcd_prefix=/torchelastic/p2p", cfg);
  CHECK(cfg.tls);
  CHECK(cfg.tlsCaCert == "/c/ca.pem");
  CHECK(cfg.tlsCert == "/c/me.pem");
  CHECK(cfg.tlsKey == "/c/me.key");
  CHECK(cfg.etcdPrefix == "/torchelastic/p2p");
  LaunchConfig bad;
  CHECK_THROWS_WITH(parseRendezvousConf("protocol=ftp", bad), "--rdzv_conf protocol: expected http or https");
  CHECK_THROWS_WITH(parseRendezvousConf("etcd_prefix=relative", bad), Contains("starting with /"));
  CHECK_THROWS_WITH(parseRendezvousConf("auth_file=/nonexistent/etcd.auth", bad), Contains("--rdzv_conf auth_file"));
}

TEST_CASE("parseRendezvousConf: TLS keys for both backends, and what does not go without what", "[cli][flag_parsing]") {
  LaunchConfig cfg;
  parseRendezvousConf("protocol=https,cacert=/c/ca.pem,cert=/c/me.pem,key=/c/me.key,server_cert=/c/s.pem,"
                      "server_key=/c/s.key", cfg);
  CHECK(cfg.tls);
  CHECK(cfg.tlsServerCert == "/c/s.pem");
  CHECK(cfg.tlsServerKey == "/c/s.key");
  LaunchConfig bad;
  CHECK_THROWS_WITH(parseRendezvousConf("protocol=https,cert=/c/me.pem", bad), Contains("cert and key go together"));
  LaunchConfig bad2;
  CHECK_THROWS_WITH(parseRendezvousConf("protocol=https,server_key=/c/s.key", bad2),
                    Contains("server_cert and server_key go together"));
  // Without protocol=https the files would be ignored and the rendezvous would go in clear.
  LaunchConfig bad3;
  CHECK_THROWS_WITH(parseRendezvousConf("cacert=/c/ca.pem", bad3), Contains("need protocol=https"));
}
