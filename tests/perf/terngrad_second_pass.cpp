// terngrad_second_pass — the pieces of tensor-scale TernGrad's second pass timed apart on one thread,
// beside a plain read of the same bytes in the same run (docs/PERFORMANCE.md, "A 2-core Xeon").
//
// The second pass goes span by span (65280 elements): the span's coarse draw bytes (fill_coarse8,
// which also prefetches the span's values), then its trits (terngrad_encode_span). Timed here:
//   read          a plain read of the values (the yardstick)
//   draws         the coarse draws alone, without the prefetch
//   draws+pf      the draws with the prefetch of the span's values, as the codec makes them
//   trits L2      the trit loop over one span's values again and again (in L2)
//   trits mem     the trit loop over every span's values, from memory
//   pass          draws+pf then trits, span by span: the codec's second pass
//
//   build/tests/terngrad_second_pass [REPEATS] [MIB]      (defaults 5 and 1024; best of REPEATS each)
//
// Data: the bench's synthetic gradients, their tensor scale at the default clip. Not a test.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "codecs/quant_uniforms.h"
#include "codecs/terngrad_span.h"
#include "gcz/bench.h"
#include "gcz/detail/philox.h"

namespace {

using namespace gcz::detail;

constexpr uint64_t kSpan = 65280;  // terngrad.cpp's span
constexpr uint64_t kSeed = 1, kKey = 2;

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

uint64_t read_all(const std::vector<float>& x) {
  const auto* w = reinterpret_cast<const uint64_t*>(x.data());
  uint64_t lanes[8] = {};
  for (std::size_t i = 0; i + 8 <= x.size() / 2; i += 8) {
    for (int j = 0; j < 8; ++j) lanes[j] ^= w[i + j];
  }
  uint64_t all = 0;
  for (uint64_t l : lanes) all ^= l;
  return all;
}

struct Scratch {
  std::vector<uint8_t> u = std::vector<uint8_t>(kSpan + 32), trits = std::vector<uint8_t>(kSpan + 5);
  std::vector<uint32_t> ties = std::vector<uint32_t>(tie_room(kSpan, kSpan));
  std::vector<uint8_t> out;
};

// The trits of span a (its values at x, all finite or not), into s.out.
void trits(const float* x, uint64_t a, float scale, bool finite, Scratch& s) {
  const FineDraws fine{kSeed, kKey, kStreamTernGrad, a};
  terngrad_encode_span({x, s.u.data(), fine, kSpan, kSpan, &scale, /*stochastic=*/true, /*base3=*/true, finite,
                        s.trits.data(), s.ties.data(), s.out.data() + a / 5});
}

}  // namespace

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::atoi(argv[1]) : 5;
  const uint64_t mib = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1024;
  if (repeats < 1 || mib < 1 || mib > (uint64_t{1} << 20)) {
    std::fprintf(stderr, "usage: terngrad_second_pass [REPEATS >= 1] [MIB, 1..1048576]\n");
    return 2;
  }
  const uint64_t cols = gcz::kBenchSyntheticColumns, rows = std::max<uint64_t>(1, (mib << 20) / 4 / cols);
  std::vector<float> x(rows * cols);
  gcz::bench_synthetic_fill(x.data(), rows);
  TernGradMoments m;
  terngrad_add_moments(x.data(), x.size(), m);
  const float scale = m.scale(2.5);
  const bool finite = m.finite == x.size();
  const uint64_t spans = x.size() / kSpan, n = spans * kSpan;  // whole spans only
  if (spans == 0) {
    std::fprintf(stderr, "terngrad_second_pass: fewer than %llu elements\n", static_cast<unsigned long long>(kSpan));
    return 2;
  }
  Scratch s;
  s.out.resize(n / 5 + 32);
  fill_coarse8(kSeed, kKey, kStreamTernGrad, 0, kSpan, s.u.data());

  enum { kRead, kDraws, kDrawsPf, kTritsL2, kTritsMem, kPass, kCount };
  const char* names[kCount] = {"read", "draws", "draws+pf", "trits L2", "trits mem", "pass"};
  double best[kCount];
  std::fill(best, best + kCount, INFINITY);
  volatile uint64_t sink = 0;
  for (int r = 0; r < repeats; ++r) {
    double t = now();
    auto lap = [&](int k) {
      const double t1 = now();
      best[k] = std::min(best[k], t1 - t);
      t = t1;
    };
    sink = sink + read_all(x);
    lap(kRead);
    for (uint64_t a = 0; a < n; a += kSpan) fill_coarse8(kSeed, kKey, kStreamTernGrad, a, kSpan, s.u.data());
    lap(kDraws);
    for (uint64_t a = 0; a < n; a += kSpan) {
      fill_coarse8(kSeed, kKey, kStreamTernGrad, a, kSpan, s.u.data(), x.data() + a);
    }
    lap(kDrawsPf);
    for (uint64_t a = 0; a < n; a += kSpan) trits(x.data(), a, scale, finite, s);
    lap(kTritsL2);
    for (uint64_t a = 0; a < n; a += kSpan) trits(x.data() + a, a, scale, finite, s);
    lap(kTritsMem);
    for (uint64_t a = 0; a < n; a += kSpan) {
      fill_coarse8(kSeed, kKey, kStreamTernGrad, a, kSpan, s.u.data(), x.data() + a);
      trits(x.data() + a, a, scale, finite, s);
    }
    lap(kPass);
  }
  const double gb = static_cast<double>(n) * 4 / 1e9;
  std::printf("%llu MiB of float32 in spans of %llu, one thread, best of %d; GB/s of input\n",
              static_cast<unsigned long long>(mib), static_cast<unsigned long long>(kSpan), repeats);
  for (int k = 0; k < kCount; ++k) std::printf("%-10s %8.2f\n", names[k], gb / best[k]);
  std::printf("draws+pf then trits L2, added: %.2f\n", gb / (best[kDrawsPf] + best[kTritsL2]));
  return 0;
}
