// terngrad_passes — tensor-scale TernGrad's two passes timed apart, on one and two threads, beside a
// plain read of the same bytes in the same run (docs/PERFORMANCE.md, "Against the targets").
//
// Encoding with a tensor scale reads the tensor twice: the first pass (Codec::prepare) gathers the
// moments that fix the scale, and no trit can be drawn before it ends; the second (Codec::encode)
// reads every element again and draws its trit. With the two-thread read rate R2 and the one-thread
// passes P1 and P2, no split of the work over two threads ends sooner than n/R2 + P2/2, so two threads
// encode at most (P1 + P2) / (n/R2 + P2/2) times faster than one; the program prints that bound.
//
//   build/tests/terngrad_passes [REPEATS] [MIB]      (defaults 5 and 1024; best of REPEATS each)
//
// Data: the bench's synthetic gradients (Gaussian rows with scales over four decades). Not a test.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "gcz/bench.h"
#include "gcz/codec.h"

namespace {

using gcz::Codec;

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// XOR of every 8-byte word of x, by `threads` threads taking contiguous shares: the read yardstick.
uint64_t read_all(const std::vector<float>& x, unsigned threads) {
  std::vector<uint64_t> part(threads);
  std::vector<std::thread> pool;
  const std::size_t words = x.size() / 2;
  for (unsigned k = 0; k < threads; ++k) {
    pool.emplace_back([&, k] {
      const auto* w = reinterpret_cast<const uint64_t*>(x.data());
      uint64_t lanes[8] = {};
      for (std::size_t i = words * k / threads / 8 * 8; i < words * (k + 1) / threads / 8 * 8; i += 8) {
        for (int j = 0; j < 8; ++j) lanes[j] ^= w[i + j];
      }
      for (uint64_t l : lanes) part[k] ^= l;
    });
  }
  for (std::thread& t : pool) t.join();
  uint64_t all = 0;
  for (uint64_t p : part) all ^= p;
  return all;
}

struct Times {
  double read = INFINITY, first = INFINITY, second = INFINITY, both = INFINITY;
};

// One encode of x as the gcz encoder streams a tensor-scale tensor: prepare() over the whole tensor,
// then encode() chunk by chunk. Adds its times to `best`; false (with a message) on an error.
bool encode_once(const gcz::TensorInfo& t, const std::vector<float>& x, unsigned threads, Times& best) {
  auto made = gcz::make_codec("terngrad", {}, gcz::Backend::kCpu);
  if (!made) return std::fprintf(stderr, "terngrad_passes: %s\n", made.status().message().c_str()), false;
  Codec& codec = **made;
  codec.set_threads(threads);
  codec.set_context({0, gcz::tensor_key(t.name)});
  const uint64_t n = x.size(), unit = codec.streaming_unit(), slice_unit = codec.prepare_unit();
  if (unit == 0 || slice_unit == 0) {
    return std::fprintf(stderr, "terngrad_passes: terngrad's tensor scale no longer streams\n"), false;
  }
  const uint64_t chunk = std::max(unit, (uint64_t{1} << 24) / unit * unit);
  const uint64_t slice = std::max(slice_unit, (uint64_t{1} << 24) / slice_unit * slice_unit);
  std::vector<gcz::ByteBuffer> out(codec.stream_names(t).size());
  const double t0 = now();
  for (uint64_t first = 0; first < n; first += slice) {
    if (gcz::Status s = codec.prepare(t, x.data() + first, first, std::min(slice, n - first)); !s) {
      return std::fprintf(stderr, "terngrad_passes: %s\n", s.message().c_str()), false;
    }
  }
  const double t1 = now();
  for (uint64_t first = 0; first < n; first += chunk) {
    for (gcz::ByteBuffer& b : out) b.clear();
    if (gcz::Status s = codec.encode(t, x.data() + first, first, std::min(chunk, n - first), out); !s) {
      return std::fprintf(stderr, "terngrad_passes: %s\n", s.message().c_str()), false;
    }
  }
  const double t2 = now();
  best.first = std::min(best.first, t1 - t0);
  best.second = std::min(best.second, t2 - t1);
  best.both = std::min(best.both, t2 - t0);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::atoi(argv[1]) : 5;
  const uint64_t mib = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1024;
  if (repeats < 1 || mib < 1 || mib > (uint64_t{1} << 20)) {
    std::fprintf(stderr, "usage: terngrad_passes [REPEATS >= 1] [MIB, 1..1048576]\n");
    return 2;
  }
  const uint64_t cols = gcz::kBenchSyntheticColumns, rows = std::max<uint64_t>(1, (mib << 20) / 4 / cols);
  std::vector<float> x(rows * cols);
  gcz::bench_synthetic_fill(x.data(), rows);
  const gcz::TensorInfo t{"synthetic", gcz::DType::kFloat32, {rows, cols}};
  const uint64_t expect = read_all(x, 1);
  Times best[2];
  for (int r = 0; r < repeats; ++r) {  // the thread counts interleaved, so both see the same machine
    for (unsigned threads : {1u, 2u}) {
      const double t0 = now();
      if (read_all(x, threads) != expect) return std::fprintf(stderr, "terngrad_passes: the read lost bytes\n"), 1;
      best[threads - 1].read = std::min(best[threads - 1].read, now() - t0);
      if (!encode_once(t, x, threads, best[threads - 1])) return 1;
    }
  }
  const double gb = static_cast<double>(x.size()) * 4 / 1e9;
  std::printf("%llu MiB of float32, best of %d; GB/s of input\n", static_cast<unsigned long long>(mib), repeats);
  std::printf("%-8s %10s %12s %12s %10s\n", "threads", "read", "first pass", "second pass", "encode");
  for (unsigned k = 0; k < 2; ++k) {
    std::printf("%-8u %10.2f %12.2f %12.2f %10.2f\n", k + 1, gb / best[k].read, gb / best[k].first, gb / best[k].second,
                gb / best[k].both);
  }
  std::printf("%-8s %10.2f %12.2f %12.2f %10.2f\n", "scaling", best[0].read / best[1].read,
              best[0].first / best[1].first, best[0].second / best[1].second, best[0].both / best[1].both);
  // Two threads: the first pass at no more than the two-thread read, the second at best halved.
  std::printf("most two threads can gain with this one-thread second pass: %.2fx\n",
              best[0].both / (best[1].read + best[0].second / 2));
  return 0;
}
