// gcz::cuda::kernel_rates: the GPU's copy yardstick and the cast kernels, timed on device-resident
// data with CUDA events (gcz bench --device cuda prints them).
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "../codec/src/cuda_hooks.h"
#include "cast.cuh"
#include "cuda_runtime.cuh"

namespace gcz::cuda {
namespace {

// Fewer elements than this do not fill the GPU for long enough to time: refuse rather than mislead.
constexpr uint64_t kMinElements = kMinKernelRateElements;
constexpr unsigned kFillThreads = 256;
constexpr unsigned kFillBlocks = 4096;

// Gradient-like values without a host round trip: element i is a hash of i made a magnitude between
// 2^-47 and 2^-4 (its exponent spread evenly over 2^-24 .. 2^-4), of either sign, never zero (zeros
// can run faster than real data do).
__global__ void fill_kernel(float* d, uint64_t n) {
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    uint32_t h = static_cast<uint32_t>(i) ^ (static_cast<uint32_t>(i >> 32) * 0x9E3779B9u);
    h ^= h >> 16;
    h *= 0x7FEB352Du;
    h ^= h >> 15;
    h *= 0x846CA68Bu;
    h ^= h >> 16;
    const float u = static_cast<float>((h & 0x7FFFFFu) | 1u) * 0x1p-23f;  // (0, 1)
    const float magnitude = ldexpf(u, -4 - static_cast<int>((h >> 23) % 21u));
    d[i] = (h >> 31) ? -magnitude : magnitude;
  }
}

class Event {
 public:
  static Result<Event> create() {
    cudaEvent_t e = nullptr;
    GCZ_RETURN_IF_ERROR(check(cudaEventCreate(&e), "cudaEventCreate"));
    return Event(e);
  }
  Event(Event&& other) noexcept : event_(other.event_) { other.event_ = nullptr; }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Event& operator=(Event&&) = delete;
  ~Event() {
    if (event_ != nullptr) (void)cudaEventDestroy(event_);
  }
  cudaEvent_t get() const { return event_; }

 private:
  explicit Event(cudaEvent_t e) : event_(e) {}
  cudaEvent_t event_;
};

}  // namespace

Result<std::vector<DeviceKernelRate>> kernel_rates(uint64_t max_n, int repeats) {
  std::size_t free_bytes = 0, total_bytes = 0;
  GCZ_RETURN_IF_ERROR(check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo"));
  const uint64_t n = std::min<uint64_t>(max_n, free_bytes / 2 / 12);
  if (n < kMinElements) {
    return device_error("too little free GPU memory to time the kernels: " + std::to_string(free_bytes >> 20) +
                        " MiB free, " + std::to_string(kMinElements * 12 * 2 >> 20) + " MiB needed");
  }
  Buffer f32(Buffer::Kind::kDevice), out32(Buffer::Kind::kDevice);
  Buffer f16(Buffer::Kind::kDevice), bf16(Buffer::Kind::kDevice);
  // Made after the buffers, so destroyed before them: its destructor waits for the work queued on them.
  GCZ_ASSIGN_OR_RETURN(Stream stream, Stream::create());
  GCZ_RETURN_IF_ERROR(f32.ensure_capacity(n * 4));
  GCZ_RETURN_IF_ERROR(out32.ensure_capacity(n * 4));
  GCZ_RETURN_IF_ERROR(f16.ensure_capacity(n * 2));
  GCZ_RETURN_IF_ERROR(bf16.ensure_capacity(n * 2));
  (void)cudaGetLastError();
  fill_kernel<<<kFillBlocks, kFillThreads, 0, stream.get()>>>(static_cast<float*>(f32.data()), n);
  GCZ_RETURN_IF_ERROR(check(cudaGetLastError(), "fill kernel launch"));
  GCZ_RETURN_IF_ERROR(stream.synchronize());

  struct Op {
    const char* name;
    DType from;
    const void* src;
    DType to;
    void* dst;
  };
  // The conversions back read what the ones before them wrote.
  const Op ops[] = {
      {"device copy", DType::kFloat32, f32.data(), DType::kFloat32, out32.data()},
      {"fp32 -> fp16", DType::kFloat32, f32.data(), DType::kFloat16, f16.data()},
      {"fp32 -> bf16", DType::kFloat32, f32.data(), DType::kBFloat16, bf16.data()},
      {"fp16 -> fp32", DType::kFloat16, f16.data(), DType::kFloat32, out32.data()},
      {"bf16 -> fp32", DType::kBFloat16, bf16.data(), DType::kFloat32, out32.data()},
  };
  GCZ_ASSIGN_OR_RETURN(Event start, Event::create());
  GCZ_ASSIGN_OR_RETURN(Event stop, Event::create());
  std::vector<DeviceKernelRate> rates;
  for (const Op& op : ops) {
    GCZ_RETURN_IF_ERROR(launch_convert(op.from, op.src, op.to, op.dst, n, stream.get()));  // warm-up
    std::vector<float> ms;
    for (int r = 0; r < repeats; ++r) {
      GCZ_RETURN_IF_ERROR(check(cudaEventRecord(start.get(), stream.get()), "cudaEventRecord"));
      GCZ_RETURN_IF_ERROR(launch_convert(op.from, op.src, op.to, op.dst, n, stream.get()));
      GCZ_RETURN_IF_ERROR(check(cudaEventRecord(stop.get(), stream.get()), "cudaEventRecord"));
      GCZ_RETURN_IF_ERROR(check(cudaEventSynchronize(stop.get()), "cudaEventSynchronize"));
      float elapsed = 0;
      GCZ_RETURN_IF_ERROR(check(cudaEventElapsedTime(&elapsed, start.get(), stop.get()), "cudaEventElapsedTime"));
      ms.push_back(elapsed);
    }
    std::sort(ms.begin(), ms.end());
    const float median = ms.size() % 2 ? ms[ms.size() / 2] : (ms[ms.size() / 2 - 1] + ms[ms.size() / 2]) / 2;
    const double bytes = static_cast<double>(n) * static_cast<double>(dtype_size(op.from) + dtype_size(op.to));
    rates.push_back({op.name, n, median > 0 ? bytes / (median * 1e-3) / 1e9 : 0});
  }
  GCZ_RETURN_IF_ERROR(stream.synchronize());
  return rates;
}

}  // namespace gcz::cuda
