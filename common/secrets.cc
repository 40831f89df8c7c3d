#include "common/secrets.h"

#include <algorithm>

namespace ddprun {

bool constantTimeEquals(std::string_view a, std::string_view b) {
  // Visit every byte of the longer input whatever the contents, so timing does not reveal the
  // length of a matching prefix. volatile keeps the compiler from adding an early exit.
  volatile unsigned char diff = a.size() == b.size() ? 0 : 1;
  const std::size_t n = std::max(a.size(), b.size());
  for (std::size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = diff | static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

}  // namespace ddprun
