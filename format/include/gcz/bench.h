// gcz/bench.h — codec throughput measured against memcpy in the same run (benchmarks, not tests).
//
//   gcz::BenchOptions o;                       // synthetic float32 data unless inputs are given
//   auto r = gcz::run_bench({"fp16", "bf16"}, o);
//   r->memcpy_gbps; r->rows[0].encode_gbps / r->memcpy_gbps;
//   r->yardsticks[1].read_gbps;                // what 2 threads (if asked for) could read
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gcz/backend.h"
#include "gcz/pipeline.h"
#include "gcz/status.h"
#include "gcz/tensor_io.h"

namespace gcz {

inline constexpr unsigned kBenchMaxThreads = kMaxThreads;  // the most threads a row may ask for

struct BenchResult;

struct BenchOptions {
  std::vector<std::string> inputs;     // tensor files; empty = synthetic data
  uint64_t synthetic_bytes = 256ull << 20;  // float32 bytes of synthetic data (heavy-tailed, seeded)
  int repeats = 5;                     // best of this many timed runs
  std::vector<unsigned> threads = {1};  // measure each spec with each of these (1..kBenchMaxThreads)
  DeviceRequest device = DeviceRequest::kCpu;
  ReadOptions read;
  // Called with what has been measured so far: once the yardsticks are, then after every row (so a
  // caller can print rows as they come).
  std::function<void(const BenchResult&)> progress;
};

struct BenchRow {
  std::string spec;
  unsigned threads = 1;  // as asked: an input with fewer pieces of work than threads leaves some idle
  double encode_gbps = 0;  // input bytes per second / 1e9
  double decode_gbps = 0;  // decoded bytes (the input's size) per second / 1e9
  double ratio = 0;        // input bytes / stream bytes
};

// What the machine itself does with the input's bytes on a number of threads, each thread taking a
// contiguous share: copy them (memcpy) and read them (an XOR over every 8-byte word). They show how
// far the memory's bandwidth scaled during the run, and so how far a codec limited by it could.
struct BenchYardstick {
  unsigned threads = 1;
  double memcpy_gbps = 0;  // input bytes per second / 1e9, as the rows count them
  double read_gbps = 0;
};

// The float32 elements the GPU's own rates are measured on (1 GiB, many times its L2 cache).
inline constexpr uint64_t kBenchDeviceElements = uint64_t{1} << 28;

// Which of the CPU code's paths ran; every one gives the same bits.
enum class CpuCode {
  kPortable,  // no AVX2 (or FMA, F16C)
  kAvx2,      // the AVX2 paths
  kAvx512,    // the AVX2 paths, and the bulk Philox draws' AVX-512 kernel
};

struct BenchResult {
  uint64_t input_bytes = 0;
  uint64_t tensors = 0;
  double memcpy_gbps = 0;  // the same number of bytes copied by one thread, best of the same repeats
  std::vector<unsigned> row_threads;       // each spec's rows' thread counts, in order
  std::vector<BenchYardstick> yardsticks;  // for 1 and each thread count of the rows, ascending
  Backend backend = Backend::kCpu;
  CpuCode cpu_code = CpuCode::kPortable;
  // On the CUDA backend: cuda_kernel_rates(kBenchDeviceElements, repeats), the device copy first.
  std::vector<DeviceKernelRate> device_kernels;
  std::vector<BenchRow> rows;
};

// The benchmark's synthetic data: `rows` rows of kBenchSyntheticColumns float32 values to `out`,
// gradient-like (Gaussian rows, their scales over four decades, 5% of them zero), seeded.
inline constexpr uint64_t kBenchSyntheticColumns = 1024;
void bench_synthetic_fill(float* out, uint64_t rows);

// The most synthetic bytes run_bench takes on this machine: a fifth of the memory this process may use
// (its physical memory, or less under ulimit -v or -d or a cgroup's limit), since a run holds about
// five copies of the data (the input, the memcpy yardstick's copy, the streams, the
// decoded values, a stream's bytes before zstd); 16 TiB where the memory is unknown.
uint64_t bench_max_synthetic_bytes();

// Encodes and decodes the data in memory with each spec (the codec and its zstd stage; no file I/O)
// on each thread count (element-wise codecs split every tensor into one piece per thread; a tensor
// the codec does not suit goes to its fallback, as gcz encode would) and times it against a
// single-threaded memcpy of the same bytes. Rows come per spec, then per distinct thread count in
// the order given (a GPU backend has one row per spec, threads 1). The yardsticks are measured first,
// and on a GPU backend the device's own rates with them.
// Errors: kInvalidArgument for repeats < 1, no or out-of-range thread counts, synthetic data larger
// than bench_max_synthetic_bytes(), a spec that does not
// parse or make its codec on the backend, and inputs with no elements (all before anything is
// measured but the last); the readers' errors for the inputs; kDeviceError when the backend is not usable
// or, on a GPU, when its kernels cannot be timed (less than 48 MiB of device memory free).
Result<BenchResult> run_bench(const std::vector<std::string>& specs, const BenchOptions& options);

}  // namespace gcz
