#include "cpu_features.h"

#include <atomic>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace gcz::detail {
namespace {
std::atomic<bool> g_avx2_allowed{true};
std::atomic<bool> g_avx512_allowed{true};

#if defined(__x86_64__)
// F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports does not know the name.
bool cpu_has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}
#endif
}  // namespace

bool cpu_has_avx2() {
#if defined(__x86_64__)
  static const bool has =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
  return has && g_avx2_allowed.load(std::memory_order_relaxed);
#else
  return false;
#endif
}

void allow_avx2_for_testing(bool allowed) { g_avx2_allowed.store(allowed); }

bool cpu_has_avx512() {
#if defined(__x86_64__)
  static const bool has = __builtin_cpu_supports("avx512f");
  return has && g_avx512_allowed.load(std::memory_order_relaxed) && cpu_has_avx2();
#else
  return false;
#endif
}

void allow_avx512_for_testing(bool allowed) { g_avx512_allowed.store(allowed); }

}  // namespace gcz::detail
