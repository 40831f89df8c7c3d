// Small helpers shared by the unit tests: a temporary folder, files, environment variables set for
// the duration of a test, and stderr captured into a string. No sockets, no child processes.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>

namespace ddprun::test {

// A fresh folder under $TMPDIR (or /tmp), removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/ddprun_unit_XXXXXX";
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline void writeFile(const std::string& path, const std::string& content, mode_t mode = 0644) {
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (!out) throw std::runtime_error("cannot write " + path);
    out << content;
  }
  if (::chmod(path.c_str(), mode) != 0) throw std::runtime_error("cannot chmod " + path);
}

inline std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

// Sets (or unsets, with nullopt) one environment variable and restores the old value afterwards.
class ScopedEnv {
 public:
  ScopedEnv(std::string name, const std::optional<std::string>& value) : name_(std::move(name)) {
    if (const char* old = std::getenv(name_.c_str())) old_ = old;
    if (value) ::setenv(name_.c_str(), value->c_str(), 1);
    else ::unsetenv(name_.c_str());
  }
  ~ScopedEnv() {
    if (old_) ::setenv(name_.c_str(), old_->c_str(), 1);
    else ::unsetenv(name_.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

// Redirects fd 1 or 2 into a temporary file while alive; text() returns what was written so far.
class OutputCapture {
 public:
  explicit OutputCapture(int fd) : fd_(fd), path_(dir_.file("captured.txt")) {
    flushAll();
    saved_ = ::dup(fd_);
    std::FILE* f = std::fopen(path_.c_str(), "w");
    if (!f || saved_ < 0) throw std::runtime_error("cannot capture output");
    ::dup2(::fileno(f), fd_);
    std::fclose(f);
  }
  ~OutputCapture() { restore(); }
  OutputCapture(const OutputCapture&) = delete;
  OutputCapture& operator=(const OutputCapture&) = delete;

  std::string text() {
    flushAll();
    return readFile(path_);
  }
  void restore() {
    if (saved_ < 0) return;
    flushAll();
    ::dup2(saved_, fd_);
    ::close(saved_);
    saved_ = -1;
  }

 private:
  static void flushAll() {
    std::cout.flush();
    std::cerr.flush();
    std::fflush(stdout);
    std::fflush(stderr);
  }

  TempDir dir_;
  int fd_;
  std::string path_;
  int saved_ = -1;
};

}  // namespace ddprun::test
