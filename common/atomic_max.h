// Raising an atomic to a value if it is lower (an atomic max), without a lock.
#pragma once

#include <atomic>

namespace ddprun {

// Sets `a` to `value` if it is lower; returns what it held before.
template <typename T>
T raiseTo(std::atomic<T>& a, T value) {
  T prev = a.load();
  while (prev < value && !a.compare_exchange_weak(prev, value)) {
  }
  return prev;
}

}  // namespace ddprun
