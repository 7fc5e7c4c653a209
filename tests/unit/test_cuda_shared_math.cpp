// CPU/GPU parity of the math both backends share (the Philox draws, QSGD's and TernGrad's per-element
// math, the float64 sum order, PowerSGD's Gaussian start and Gram–Schmidt, Top-K's keys, the float
// conversions): every probe of shared_math_probes.h gives the same 64-bit words on the device as on
// the host. Skips, saying why, in a build without CUDA or without a usable device.
#include <gtest/gtest.h>

#include <cstdio>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "gcz/backend.h"
#include "shared_math_probes.h"
#if GCZ_TESTS_WITH_CUDA
#include "shared_math_device.h"
#endif

namespace gcz::test {
namespace {

std::vector<uint64_t> host_probe(Probe p, uint64_t n) {
  std::vector<uint64_t> out(n * probe_words(p));
  for (uint64_t r = 0; r < n; ++r) run_probe(p, r, out.data() + r * probe_words(p));
  return out;
}

struct ProbeCase {
  Probe probe;
  const char* name;
  uint64_t records;
};

void PrintTo(const ProbeCase& c, std::ostream* os) { *os << c.name << ", " << c.records << " records"; }

class CudaSharedMath : public ::testing::TestWithParam<ProbeCase> {};

TEST_P(CudaSharedMath, DeviceWordsEqualHostWords) {
#if !GCZ_TESTS_WITH_CUDA
  GTEST_SKIP() << "built without the CUDA backend: the shared math is checked on a device only in a CUDA build";
#else
  const Status device = cuda_status();
  if (!device) GTEST_SKIP() << "no CUDA device: " << device.message();
  const ProbeCase& c = GetParam();
  const std::vector<uint64_t> host = host_probe(c.probe, c.records);
  std::vector<uint64_t> gpu;
  const Status run = run_probe_on_device(c.probe, c.records, gpu);
  ASSERT_TRUE(run) << run.message();
  ASSERT_EQ(gpu.size(), host.size());
  const int words = probe_words(c.probe);
  uint64_t differing = 0;
  std::string first;
  for (uint64_t r = 0; r < c.records; ++r) {
    for (int w = 0; w < words; ++w) {
      const uint64_t h = host[r * words + w], g = gpu[r * words + w];
      if (h == g) continue;
      if (differing++ == 0) {
        char text[160];
        std::snprintf(text, sizeof text, "record %llu word %d: host 0x%016llx, device 0x%016llx",
                      static_cast<unsigned long long>(r), w, static_cast<unsigned long long>(h),
                      static_cast<unsigned long long>(g));
        first = text;
      }
      break;
    }
  }
  EXPECT_EQ(differing, 0u) << differing << " of " << c.records << " records differ; the first: " << first;
#endif
}

INSTANTIATE_TEST_SUITE_P(Cuda, CudaSharedMath,
                         ::testing::Values(ProbeCase{Probe::kPhilox, "philox", uint64_t{1} << 20},
                                           ProbeCase{Probe::kQsgd, "qsgd", uint64_t{1} << 20},
                                           ProbeCase{Probe::kTernGrad, "terngrad", uint64_t{1} << 20},
                                           ProbeCase{Probe::kReduce, "reduce", uint64_t{1} << 14},
                                           ProbeCase{Probe::kPowerSgd, "powersgd", uint64_t{1} << 14},
                                           ProbeCase{Probe::kKeysAndCasts, "keys_and_casts", uint64_t{1} << 20}),
                         [](const ::testing::TestParamInfo<ProbeCase>& info) { return std::string(info.param.name); });

// The probes reach what they are for, so that equal words mean something: every QSGD code of every
// width, base3's full range, each trit under both roundings, zero and kept PowerSGD columns.
TEST(SharedMathProbes, ReachEveryCodeTheyCheck) {
  std::set<uint64_t> qsgd_codes[9];
  const std::vector<uint64_t> q = host_probe(Probe::kQsgd, uint64_t{1} << 16);
  for (uint64_t r = 0; r < (uint64_t{1} << 16); ++r) {
    const uint64_t* w = q.data() + r * probe_words(Probe::kQsgd);
    const int bits = static_cast<int>(w[10]);
    qsgd_codes[bits].insert(w[5] >> 32);             // stochastic
    qsgd_codes[bits].insert((w[5] >> 16) & 0xFFFF);  // nearest
  }
  // Every code but level 0 with the sign bit, which the encoder never writes.
  for (int b = 2; b <= 8; ++b) EXPECT_EQ(qsgd_codes[b].size(), (1u << b) - 1) << b << "-bit codes";

  std::set<uint64_t> stochastic, nearest, drawn, base3;
  const std::vector<uint64_t> t = host_probe(Probe::kTernGrad, uint64_t{1} << 16);
  for (uint64_t r = 0; r < (uint64_t{1} << 16); ++r) {
    const uint64_t* w = t.data() + r * probe_words(Probe::kTernGrad);
    stochastic.insert((w[2] >> 16) & 0xFF);
    nearest.insert((w[2] >> 8) & 0xFF);
    drawn.insert(w[2] & 0xFF);
    base3.insert(w[5] >> 8);
  }
  EXPECT_EQ(stochastic.size(), 3u);
  EXPECT_EQ(nearest.size(), 3u);
  EXPECT_EQ(drawn.size(), 3u);
  EXPECT_EQ(base3.size(), 243u);

  uint64_t zero_columns = 0, kept_columns = 0;
  const std::vector<uint64_t> g = host_probe(Probe::kPowerSgd, uint64_t{1} << 10);
  for (uint64_t r = 0; r < (uint64_t{1} << 10); ++r) {
    const uint64_t* w = g.data() + r * probe_words(Probe::kPowerSgd);
    const uint64_t n = w[67] / 16, rank = w[67] % 16;
    for (uint64_t c = 0; c < rank; ++c) {
      bool zero = true;
      for (uint64_t i = 0; i < n; ++i) zero = zero && w[c * n + i] == 0;
      (zero ? zero_columns : kept_columns) += 1;
    }
  }
  EXPECT_GT(zero_columns, 100u);
  EXPECT_GT(kept_columns, 100u);
}

}  // namespace
}  // namespace gcz::test
