// Linked into every executable of a DDPRUN_PORTABLE build (the wheel), nowhere else.
//
// libstdc++ 12 as Debian builds it (against glibc 2.36) implements std::random_device with
// arc4random, and its static archive pulls that object in from its own string code, whether or not
// ddprun uses std::random_device. Bound to glibc, that one call would make the wheel need glibc
// 2.36 (Debian 12) instead of 2.34 (Ubuntu 22.04, RHEL 9). A definition here, in the executable,
// satisfies the reference first; it reads the kernel's random source like glibc's does.
// auditwheel's symbol check (scripts/package.sh) fails the wheel if another new symbol appears.
#include <sys/random.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>

extern "C" uint32_t arc4random(void) noexcept {
  uint32_t value = 0;
  ssize_t got;
  do {
    got = ::getrandom(&value, sizeof value, 0);
  } while (got < 0 && errno == EINTR);
  if (got != static_cast<ssize_t>(sizeof value)) std::abort();  // glibc's arc4random aborts too
  return value;
}
