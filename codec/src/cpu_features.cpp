#include "cpu_features.h"

#include <atomic>

namespace gcz::detail {
namespace {
std::atomic<bool> g_avx2_allowed{true};
}  // namespace

bool cpu_has_avx2() {
#if defined(__x86_64__)
  static const bool has =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  return has && g_avx2_allowed.load(std::memory_order_relaxed);
#else
  return false;
#endif
}

void allow_avx2_for_testing(bool allowed) { g_avx2_allowed.store(allowed); }

}  // namespace gcz::detail
