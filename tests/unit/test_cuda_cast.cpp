// CPU/GPU parity of the cast codecs (none, fp32, fp16, bf16): for every input dtype, the CUDA codec's
// encoded bytes equal the CPU codec's, and so do its decoded bytes. The test data is generated with fixed
// seeds and starts with the special values (NaN payloads, signalling NaN, ±Inf, ±0, subnormals, exact
// rounding ties, overflow boundaries). Without a usable CUDA device (or in a build without CUDA) the parity
// tests skip and say why.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "gcz/backend.h"
#include "gcz/codec.h"
#include "gcz/convert.h"
#include "gcz/tensor.h"

namespace gcz {
namespace {

// 2^23 + 3 elements take two slices of the CUDA codec's staging buffers (2^23 elements each) and eight
// turns of its kernel's grid-stride loop (4096 blocks of 256 threads), as every 2^24-element chunk of a
// real file does. The last 7, of random values only, reuse the grown buffers with bytes they do not hold.
constexpr uint64_t kSizes[] = {0, 1, 7, 4099, (uint64_t{1} << 23) + 3, 7};
constexpr uint64_t kMaxSize = (uint64_t{1} << 23) + 3;

struct Format {
  int exp_bits;
  int man_bits;
};

Format format_of(DType d) {
  switch (d) {
    case DType::kFloat16: return {5, 10};
    case DType::kBFloat16: return {8, 7};
    case DType::kFloat32: return {8, 23};
    case DType::kFloat64: return {11, 52};
  }
  return {8, 23};
}

uint64_t pack(Format f, uint64_t sign, uint64_t exp, uint64_t man) {
  return (sign << (f.exp_bits + f.man_bits)) | (exp << f.man_bits) | (man & ((uint64_t{1} << f.man_bits) - 1));
}

// Stores the low dtype_size(d) bytes of `bits` as element i of `buf`.
void put_bits(DType d, ByteBuffer& buf, std::size_t i, uint64_t bits) {
  std::memcpy(buf.data() + i * dtype_size(d), &bits, dtype_size(d));  // little-endian host
}

void put_double(DType d, ByteBuffer& buf, std::size_t i, double v) {
  convert_elements(DType::kFloat64, &v, d, buf.data() + i * dtype_size(d), 1);
}

// Bit patterns of special values in format f, for every sign.
std::vector<uint64_t> special_bits(Format f) {
  const uint64_t max_exp = (uint64_t{1} << f.exp_bits) - 1;
  const uint64_t quiet = uint64_t{1} << (f.man_bits - 1);
  const uint64_t all_man = (uint64_t{1} << f.man_bits) - 1;
  std::vector<uint64_t> out;
  for (uint64_t s : {0, 1}) {
    for (uint64_t bits : {
             pack(f, s, max_exp, quiet),                 // quiet NaN
             pack(f, s, max_exp, 1),                     // signalling NaN, lowest payload
             pack(f, s, max_exp, quiet | (all_man >> 1)),// NaN, full payload
             pack(f, s, max_exp, all_man >> 2),          // signalling NaN, high payload
             pack(f, s, max_exp, 0),                     // Inf
             pack(f, s, 0, 0),                           // zero
             pack(f, s, 0, 1),                           // smallest subnormal
             pack(f, s, 0, all_man),                     // largest subnormal
             pack(f, s, 1, 0),                           // smallest normal
             pack(f, s, max_exp - 1, all_man),           // largest finite
         }) {
      out.push_back(bits);
    }
  }
  return out;
}

// Values that sit on or next to the rounding boundaries of the narrower dtypes.
std::vector<double> special_values() {
  std::vector<double> out = {1.0, -1.5, 65504.0, 65519.0, 65520.0, -65520.0, 1e5, 3.4e38, 3.4028235677973366e38,
                             1e300, -1e-300, 1e-40, std::ldexp(1.0, -24), std::ldexp(1.0, -25),
                             std::ldexp(1.5, -25), std::ldexp(1.0, -14), std::ldexp(1.0, -126),
                             std::ldexp(1.0, -133), std::ldexp(1.0, -134), std::ldexp(1.0, -149),
                             std::ldexp(1.0, -150), std::ldexp(1.5, -150)};
  for (int k : {8, 11, 24}) {  // ties at bfloat16, float16 and float32 precision, both directions
    out.push_back(1.0 + std::ldexp(1.0, -k));
    out.push_back(1.0 + 3 * std::ldexp(1.0, -k));
    out.push_back(-(1.0 + std::ldexp(1.0, -k)));
  }
  return out;
}

// One random element of format f: any bit pattern, a value near the float16/bfloat16 range with a random
// mantissa, or such a value with the bits below a narrower precision forced to an exact tie.
uint64_t random_bits(Format f, std::mt19937_64& rng) {
  const uint64_t r = rng();
  const uint64_t bias = (uint64_t{1} << (f.exp_bits - 1)) - 1;
  const uint64_t max_exp = (uint64_t{1} << f.exp_bits) - 1;
  const uint64_t width_mask = (f.exp_bits + f.man_bits + 1 == 64) ? ~uint64_t{0}
                                                                  : (uint64_t{1} << (f.exp_bits + f.man_bits + 1)) - 1;
  switch (r % 4) {
    case 0: return rng() & width_mask;
    default: {
      // Exponents from below the float32 subnormals to above the float32 overflow (all of float16's).
      int64_t e = f.exp_bits >= 8 ? static_cast<int64_t>(bias) - 160 + static_cast<int64_t>(rng() % 300)
                                  : static_cast<int64_t>(rng() % (max_exp + 1));
      e = std::clamp<int64_t>(e, 0, static_cast<int64_t>(max_exp));
      uint64_t man = rng();
      if (r % 4 == 3) {  // tie at a narrower precision
        const int narrower[] = {7, 10, 23};
        const int keep = narrower[rng() % 3];
        if (keep < f.man_bits) {
          const int drop = f.man_bits - keep;
          man = (man & ~((uint64_t{1} << drop) - 1)) | (uint64_t{1} << (drop - 1));
        }
      }
      return pack(f, (r >> 8) & 1, static_cast<uint64_t>(e), man);
    }
  }
}

// n elements of dtype d: the special values first (unless told not to), then seeded random ones.
ByteBuffer make_data(DType d, uint64_t n, uint64_t seed, bool specials_first = true) {
  ByteBuffer buf(n * dtype_size(d));
  const Format f = format_of(d);
  std::size_t i = 0;
  for (uint64_t bits : special_bits(f)) {
    if (specials_first && i < n) put_bits(d, buf, i++, bits);
  }
  for (double v : special_values()) {
    if (specials_first && i < n) put_double(d, buf, i++, v);
  }
  std::mt19937_64 rng(seed);
  for (; i < n; ++i) put_bits(d, buf, i, random_bits(f, rng));
  return buf;
}

// "" when equal, else where and how the byte buffers first differ.
std::string first_difference(const ByteBuffer& cpu, const ByteBuffer& gpu, std::size_t elem) {
  if (cpu.size() != gpu.size()) {
    return "sizes differ: cpu " + std::to_string(cpu.size()) + ", cuda " + std::to_string(gpu.size());
  }
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    if (cpu[i] != gpu[i]) {
      const std::size_t e = i / elem;
      char text[160];
      uint64_t c = 0, g = 0;
      std::memcpy(&c, cpu.data() + e * elem, elem);
      std::memcpy(&g, gpu.data() + e * elem, elem);
      std::snprintf(text, sizeof text, "element %zu (byte %zu) differs: cpu 0x%llx, cuda 0x%llx", e, i,
                    static_cast<unsigned long long>(c), static_cast<unsigned long long>(g));
      return text;
    }
  }
  return "";
}

using CastCase = std::tuple<DType, std::string>;

class CudaCast : public ::testing::TestWithParam<CastCase> {
 protected:
  void SetUp() override {
    const Status s = cuda_status();
    if (!s) GTEST_SKIP() << "no CUDA device: " << s.message();
    const auto& [dtype, name] = GetParam();
    info_ = TensorInfo{"grad", dtype, {kMaxSize}};
    auto cpu = make_codec(name, {}, Backend::kCpu);
    ASSERT_TRUE(cpu) << cpu.status().message();
    auto gpu = make_codec(name, {}, Backend::kCuda);
    ASSERT_TRUE(gpu) << gpu.status().message();
    cpu_ = std::move(*cpu);
    gpu_ = std::move(*gpu);
  }

  DType stored_dtype() const {
    const auto& [dtype, name] = GetParam();
    if (name == "fp32") return DType::kFloat32;
    if (name == "fp16") return DType::kFloat16;
    if (name == "bf16") return DType::kBFloat16;
    return dtype;
  }

  TensorInfo info_;
  std::unique_ptr<Codec> cpu_;
  std::unique_ptr<Codec> gpu_;
};

TEST_P(CudaCast, EncodeMatchesCpu) {
  const ByteBuffer prefix = {std::byte{0xA5}, std::byte{0x5A}, std::byte{0x01}};
  for (std::size_t k = 0; k < std::size(kSizes); ++k) {
    const uint64_t n = kSizes[k];
    SCOPED_TRACE("n = " + std::to_string(n));
    const ByteBuffer src = make_data(info_.dtype, n, 1234 + k, k + 1 < std::size(kSizes));
    std::vector<ByteBuffer> cpu_out(1, prefix), gpu_out(1, prefix);  // encode appends
    const Status cs = cpu_->encode(info_, src.data(), 0, n, cpu_out);
    ASSERT_TRUE(cs) << cs.message();
    const Status gs = gpu_->encode(info_, src.data(), 0, n, gpu_out);
    ASSERT_TRUE(gs) << gs.message();
    ASSERT_EQ(gpu_out[0].size(), prefix.size() + n * dtype_size(stored_dtype()));
    ASSERT_EQ(first_difference(cpu_out[0], gpu_out[0], dtype_size(stored_dtype())), "");
  }
}

TEST_P(CudaCast, DecodeMatchesCpu) {
  for (std::size_t k = 0; k < std::size(kSizes); ++k) {
    const uint64_t n = kSizes[k];
    SCOPED_TRACE("n = " + std::to_string(n));
    // Any stored bit pattern, signalling NaNs included, not only what an encoder writes.
    const ByteBuffer stream = make_data(stored_dtype(), n, 5678 + k, k + 1 < std::size(kSizes));
    const std::vector<ByteSpan> in = {ByteSpan(stream)};
    ByteBuffer cpu_dst(n * dtype_size(info_.dtype), std::byte{0xEE});
    ByteBuffer gpu_dst(cpu_dst.size(), std::byte{0x11});
    const Status cs = cpu_->decode(info_, in, 0, n, cpu_dst.data());
    ASSERT_TRUE(cs) << cs.message();
    const Status gs = gpu_->decode(info_, in, 0, n, gpu_dst.data());
    ASSERT_TRUE(gs) << gs.message();
    ASSERT_EQ(first_difference(cpu_dst, gpu_dst, dtype_size(info_.dtype)), "");
  }
}

TEST_P(CudaCast, ChunkedEncodeMatchesWholeEncode) {
  const uint64_t n = 100003;
  const ByteBuffer src = make_data(info_.dtype, n, 42);
  std::vector<ByteBuffer> whole(1), chunked(1);
  ASSERT_TRUE(cpu_->encode(info_, src.data(), 0, n, whole));
  const std::size_t elem = dtype_size(info_.dtype);
  for (uint64_t first = 0; first < n; first += 4096) {
    const uint64_t count = std::min<uint64_t>(4096, n - first);
    const Status s = gpu_->encode(info_, src.data() + first * elem, first, count, chunked);
    ASSERT_TRUE(s) << s.message();
  }
  ASSERT_EQ(first_difference(whole[0], chunked[0], dtype_size(stored_dtype())), "");
}

// gcz encodes with one codec per thread: codecs on several threads at once, each on its own stream.
TEST_P(CudaCast, CodecsOnSeveralThreadsMatchCpu) {
  const auto& [dtype, name] = GetParam();
  constexpr int kThreads = 4;
  const uint64_t n = 300007;
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto cpu = make_codec(name, {}, Backend::kCpu);
      auto gpu = make_codec(name, {}, Backend::kCuda);
      if (!cpu || !gpu) {
        errors[t] = !cpu ? cpu.status().message() : gpu.status().message();
        return;
      }
      for (int round = 0; round < 3 && errors[t].empty(); ++round) {
        const ByteBuffer src = make_data(dtype, n, 1000 * t + round, round == 0);
        std::vector<ByteBuffer> cpu_out(1), gpu_out(1);
        const Status cs = (*cpu)->encode(info_, src.data(), 0, n, cpu_out);
        const Status gs = (*gpu)->encode(info_, src.data(), 0, n, gpu_out);
        errors[t] = !cs   ? cs.message()
                    : !gs ? gs.message()
                          : first_difference(cpu_out[0], gpu_out[0], dtype_size(stored_dtype()));
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(errors[t], "") << "thread " << t;
}

// Every float32 bit pattern, narrowed to float16 and bfloat16 by both backends, and every float16 and
// bfloat16 pattern widened back: the kernels are free to compute a conversion their own way (the
// float16 narrowing uses the device's conversion instruction for all but NaN), so all of them are
// compared, not a sample. About 16 GiB go through each backend in 256 MiB chunks.
TEST(CudaExhaustive, EveryBitPatternConvertsAsOnTheCpu) {
  const Status device = cuda_status();
  if (!device) GTEST_SKIP() << "no CUDA device: " << device.message();
  for (const std::string name : {"fp16", "bf16"}) {
    SCOPED_TRACE(name);
    auto cpu = make_codec(name, {}, Backend::kCpu);
    auto gpu = make_codec(name, {}, Backend::kCuda);
    ASSERT_TRUE(cpu && gpu);
    constexpr uint64_t kChunk = uint64_t{1} << 26;
    const TensorInfo info{"grad", DType::kFloat32, {kChunk}};
    std::vector<uint32_t> bits(kChunk);
    std::vector<ByteBuffer> cpu_out(1), gpu_out(1);
    for (uint64_t first = 0; first < (uint64_t{1} << 32); first += kChunk) {
      for (uint64_t i = 0; i < kChunk; ++i) bits[i] = static_cast<uint32_t>(first + i);
      cpu_out[0].clear();
      gpu_out[0].clear();
      ASSERT_TRUE((*cpu)->encode(info, bits.data(), 0, kChunk, cpu_out));
      const Status gs = (*gpu)->encode(info, bits.data(), 0, kChunk, gpu_out);
      ASSERT_TRUE(gs) << gs.message();
      ASSERT_EQ(cpu_out[0].size(), kChunk * 2);
      if (cpu_out[0] != gpu_out[0]) {
        FAIL() << "from 0x" << std::hex << first << ": " << first_difference(cpu_out[0], gpu_out[0], 2);
      }
    }
    // Decoding widens every stored 16-bit pattern to float32.
    ByteBuffer stream(uint64_t{1} << 17);
    for (uint32_t h = 0; h < (1u << 16); ++h) std::memcpy(stream.data() + 2 * h, &h, 2);
    const TensorInfo wide{"grad", DType::kFloat32, {uint64_t{1} << 16}};
    const std::vector<ByteSpan> in = {ByteSpan(stream)};
    ByteBuffer cpu_dst(uint64_t{1} << 18, std::byte{0xEE}), gpu_dst(cpu_dst.size(), std::byte{0x11});
    ASSERT_TRUE((*cpu)->decode(wide, in, 0, uint64_t{1} << 16, cpu_dst.data()));
    ASSERT_TRUE((*gpu)->decode(wide, in, 0, uint64_t{1} << 16, gpu_dst.data()));
    EXPECT_EQ(first_difference(cpu_dst, gpu_dst, 4), "");
  }
}

std::string case_name(const ::testing::TestParamInfo<CastCase>& info) {
  const auto& [dtype, name] = info.param;
  return std::string(dtype_name(dtype)) + "_" + name;
}

INSTANTIATE_TEST_SUITE_P(Cuda, CudaCast,
                         ::testing::Combine(::testing::Values(DType::kFloat16, DType::kBFloat16, DType::kFloat32,
                                                              DType::kFloat64),
                                            ::testing::Values("none", "fp32", "fp16", "bf16")),
                         case_name);

// Runs everywhere: the CUDA factory agrees with cuda_status(), and without a device fails cleanly.
TEST(CudaBackend, MakeCodecAgreesWithDeviceStatus) {
  const Status s = cuda_status();
  auto codec = make_codec("fp16", {}, Backend::kCuda);
  if (s) {
    EXPECT_TRUE(codec) << codec.status().message();
    EXPECT_TRUE(built_with_cuda());
  } else {
    ASSERT_FALSE(codec);
    EXPECT_EQ(codec.status().code(), StatusCode::kDeviceError);
    EXPECT_EQ(s.code(), StatusCode::kDeviceError);
    EXPECT_FALSE(s.message().empty());
    auto resolved = resolve_backend(DeviceRequest::kAuto);
    ASSERT_TRUE(resolved);
    EXPECT_EQ(*resolved, Backend::kCpu);
  }
}

// Runs everywhere: bad arguments are refused first, then a missing device; with a device, every
// operation is timed over the elements asked for, at a rate a GPU can reach.
TEST(CudaBackend, KernelRatesTimeEveryOperation) {
  for (uint64_t few : {uint64_t{0}, kMinKernelRateElements - 1}) {
    auto none = cuda_kernel_rates(few, 3);
    ASSERT_FALSE(none);
    EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  }
  auto no_repeats = cuda_kernel_rates(1 << 22, 0);
  ASSERT_FALSE(no_repeats);
  EXPECT_EQ(no_repeats.status().code(), StatusCode::kInvalidArgument);

  const Status s = cuda_status();
  auto rates = cuda_kernel_rates(uint64_t{1} << 22, 3);
  if (!s) {
    ASSERT_FALSE(rates);
    EXPECT_EQ(rates.status().code(), StatusCode::kDeviceError);
    EXPECT_EQ(rates.status().message(), s.message());
    return;
  }
  ASSERT_TRUE(rates) << rates.status().message();
  const std::vector<std::string> names = {"device copy", "fp32 -> fp16", "fp32 -> bf16", "fp16 -> fp32",
                                          "bf16 -> fp32"};
  ASSERT_EQ(rates->size(), names.size());
  for (std::size_t i = 0; i < names.size(); ++i) {
    EXPECT_EQ((*rates)[i].name, names[i]);
    EXPECT_EQ((*rates)[i].elements, uint64_t{1} << 22);
    // 1 GB/s to 100 TB/s: any GPU, and no time of zero or a launch that did nothing.
    EXPECT_GT((*rates)[i].gbps, 1.0) << names[i];
    EXPECT_LT((*rates)[i].gbps, 1e5) << names[i];
  }
}

}  // namespace
}  // namespace gcz
