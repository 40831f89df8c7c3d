#include "common/token_file.h"

#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <string>

#include "common/error.h"
#include "test_util.h"

using Catch::Matchers::Contains;
using ddprun::ConfigError;
using ddprun::readTokenFile;

TEST_CASE("token file: the first line, trimmed", "[token]") {
  ddprun::test::TempDir dir;
  ddprun::test::writeFile(dir.file("t"), "  tok-123 \nsecond line\n");
  CHECK(readTokenFile(dir.file("t"), "--x") == "tok-123");
  ddprun::test::writeFile(dir.file("u"), "tok-no-newline");
  CHECK(readTokenFile(dir.file("u"), "--x") == "tok-no-newline");
}

TEST_CASE("token file: not a regular file, too large, empty or missing is a ConfigError", "[token]") {
  ddprun::test::TempDir dir;
  CHECK_THROWS_WITH(readTokenFile("/dev/zero", "--rdzv_conf token_file"),
                    Contains("--rdzv_conf token_file '/dev/zero' is not a regular file"));
  REQUIRE(::mkfifo(dir.file("fifo").c_str(), 0600) == 0);  // nobody writes it: must not hang
  CHECK_THROWS_WITH(readTokenFile(dir.file("fifo"), "--x"), Contains("is not a regular file"));
  CHECK_THROWS_WITH(readTokenFile(dir.path(), "--x"), Contains("is not a regular file"));
  ddprun::test::writeFile(dir.file("big"), "secret-token-xyz\n" + std::string(5000, 'p'));
  try {
    readTokenFile(dir.file("big"), "--x");
    FAIL("a 5 KB token file was read");
  } catch (const ConfigError& e) {
    CHECK_THAT(e.what(), Contains("at most 4096"));
    CHECK_THAT(e.what(), !Contains("secret"));  // never the content
  }
  ddprun::test::writeFile(dir.file("empty"), "");
  CHECK_THROWS_WITH(readTokenFile(dir.file("empty"), "--x"), Contains("holds no token"));
  ddprun::test::writeFile(dir.file("blank"), "   \ntoken-on-line-2\n");
  CHECK_THROWS_WITH(readTokenFile(dir.file("blank"), "--x"), Contains("holds no token"));
  CHECK_THROWS_WITH(readTokenFile(dir.file("missing"), "--x"), Contains("cannot be read"));
}
