#include "launcher/program.h"

#include <sys/stat.h>

#include <catch2/catch.hpp>

#include "common/error.h"
#include "test_util.h"

using ddprun::ConfigError;
using ddprun::findExecutable;
using ddprun::resolveProgram;
using ddprun::test::TempDir;
using ddprun::test::writeFile;

namespace {

// A folder with a fake python3 (mode 0755) and a training script (mode 0644).
struct ProgramDirs {
  TempDir bin;
  TempDir work;
  std::string python = bin.file("python3");
  std::string script = work.file("train.py");

  ProgramDirs() {
    writeFile(python, "#!/bin/sh\nexit 0\n", 0755);
    writeFile(script, "print('hi')\n", 0644);
  }
};

}  // namespace

TEST_CASE("a .py program runs under the python found on PATH with -u", "[program]") {
  ProgramDirs d;
  auto resolved = resolveProgram(d.script, {"--lr", "0.1"}, false, false, "python3", "/nonexistent:" + d.bin.path());
  CHECK(resolved.executable == d.python);
  CHECK(resolved.args == std::vector<std::string>{"-u", d.script, "--lr", "0.1"});
}

TEST_CASE("the first executable python on PATH wins", "[program]") {
  ProgramDirs d;
  TempDir notExec;
  writeFile(notExec.file("python3"), "#!/bin/sh\n", 0644);
  TempDir second;
  writeFile(second.file("python3"), "#!/bin/sh\n", 0755);
  auto resolved = resolveProgram(d.script, {}, false, false, "python3",
                                 notExec.path() + ":" + d.bin.path() + ":" + second.path());
  CHECK(resolved.executable == d.python);
}

TEST_CASE("PYTHON_EXEC may name another interpreter", "[program]") {
  ProgramDirs d;
  writeFile(d.bin.file("mypython"), "#!/bin/sh\n", 0755);
  auto resolved = resolveProgram(d.script, {}, false, false, "mypython", d.bin.path());
  CHECK(resolved.executable == d.bin.file("mypython"));
  auto absolute = resolveProgram(d.script, {}, false, false, d.python, "/nonexistent");
  CHECK(absolute.executable == d.python);
}

TEST_CASE("flag -m runs a module under python with -u -m", "[program]") {
  ProgramDirs d;
  auto resolved = resolveProgram("pkg.train", {"a", "-b"}, true, false, "python3", d.bin.path());
  CHECK(resolved.executable == d.python);
  CHECK(resolved.args == std::vector<std::string>{"-u", "-m", "pkg.train", "a", "-b"});
}

TEST_CASE("flag --no_python runs a .py program directly", "[program]") {
  ProgramDirs d;
  const std::string tool = d.work.file("tool.py");
  writeFile(tool, "#!/bin/sh\n", 0755);
  auto resolved = resolveProgram(tool, {"x"}, false, true, "python3", d.bin.path());
  CHECK(resolved.executable == tool);
  CHECK(resolved.args == std::vector<std::string>{"x"});
}

TEST_CASE("a program that is not .py runs directly, found by path or on PATH", "[program]") {
  ProgramDirs d;
  writeFile(d.bin.file("mytool"), "#!/bin/sh\n", 0755);
  auto onPath = resolveProgram("mytool", {"--flag"}, false, false, "python3", "/nonexistent:" + d.bin.path());
  CHECK(onPath.executable == d.bin.file("mytool"));
  CHECK(onPath.args == std::vector<std::string>{"--flag"});

  auto byPath = resolveProgram("/bin/true", {}, false, false, "python3", "/nonexistent");
  CHECK(byPath.executable == "/bin/true");
  CHECK(byPath.args.empty());
}

TEST_CASE("a missing program is a ConfigError naming it", "[program]") {
  ProgramDirs d;
  const std::string missing = d.work.file("missing_tool");
  CHECK_THROWS_AS(resolveProgram(missing, {}, false, false, "python3", d.bin.path()), ConfigError);
  CHECK_THROWS_WITH(resolveProgram(missing, {}, false, false, "python3", d.bin.path()),
                    Catch::Contains(missing) && Catch::Contains("no such file"));
  const std::string missingPy = d.work.file("missing.py");
  CHECK_THROWS_WITH(resolveProgram(missingPy, {}, false, false, "python3", d.bin.path()),
                    Catch::Contains(missingPy));
}

TEST_CASE("a file without execute permission is a ConfigError naming it", "[program]") {
  ProgramDirs d;
  const std::string data = d.work.file("data.bin");
  writeFile(data, "x", 0644);
  CHECK_THROWS_AS(resolveProgram(data, {}, false, false, "python3", d.bin.path()), ConfigError);
  CHECK_THROWS_WITH(resolveProgram(data, {}, false, false, "python3", d.bin.path()),
                    Catch::Contains(data) && Catch::Contains("not executable"));
  // --no_python on a script that is not executable.
  CHECK_THROWS_WITH(resolveProgram(d.script, {}, false, true, "python3", d.bin.path()), Catch::Contains(d.script));
}

TEST_CASE("a directory is a ConfigError naming it", "[program]") {
  ProgramDirs d;
  CHECK_THROWS_AS(resolveProgram(d.work.path(), {}, false, false, "python3", d.bin.path()), ConfigError);
  CHECK_THROWS_WITH(resolveProgram(d.work.path(), {}, false, false, "python3", d.bin.path()),
                    Catch::Contains(d.work.path()) && Catch::Contains("directory"));
}

TEST_CASE("a command that is not on PATH is a ConfigError naming it", "[program]") {
  ProgramDirs d;
  CHECK_THROWS_AS(resolveProgram("no_such_command_xyz", {}, false, false, "python3", d.bin.path()), ConfigError);
  CHECK_THROWS_WITH(resolveProgram("no_such_command_xyz", {}, false, false, "python3", d.bin.path()),
                    Catch::Contains("no_such_command_xyz") && Catch::Contains("PATH"));
}

TEST_CASE("flag -m together with --no_python is a ConfigError", "[program]") {
  ProgramDirs d;
  CHECK_THROWS_AS(resolveProgram("pkg.train", {}, true, true, "python3", d.bin.path()), ConfigError);
  CHECK_THROWS_WITH(resolveProgram("pkg.train", {}, true, true, "python3", d.bin.path()),
                    Catch::Contains("--no_python"));
}

TEST_CASE("a missing python interpreter is a ConfigError naming it", "[program]") {
  ProgramDirs d;
  CHECK_THROWS_WITH(resolveProgram(d.script, {}, false, false, "python3", "/nonexistent"),
                    Catch::Contains("python3"));
  CHECK_THROWS_AS(resolveProgram("pkg.mod", {}, true, false, "python3", "/nonexistent"), ConfigError);
}

TEST_CASE("an empty program is a ConfigError", "[program]") {
  CHECK_THROWS_AS(resolveProgram("", {}, false, false, "python3", "/usr/bin:/bin"), ConfigError);
}

TEST_CASE("findExecutable skips directories and non-executable files", "[program]") {
  ProgramDirs d;
  TempDir first;
  ::mkdir(first.file("tool").c_str(), 0755);  // a directory named like the command
  TempDir second;
  writeFile(second.file("tool"), "x", 0644);
  TempDir third;
  writeFile(third.file("tool"), "#!/bin/sh\n", 0755);
  CHECK(findExecutable("tool", first.path() + ":" + second.path() + ":" + third.path()) == third.file("tool"));
  CHECK(findExecutable("tool", first.path() + ":" + second.path()).empty());
  CHECK(findExecutable("", third.path()).empty());
}
