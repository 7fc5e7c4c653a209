#include "gcz/backend.h"

#include <string>

#include "cuda_hooks.h"

namespace gcz {

std::string_view backend_name(Backend b) { return b == Backend::kCuda ? "cuda" : "cpu"; }

std::optional<DeviceRequest> parse_device_request(std::string_view s) {
  if (s == "auto") return DeviceRequest::kAuto;
  if (s == "cpu") return DeviceRequest::kCpu;
  if (s == "cuda" || s == "gpu") return DeviceRequest::kCuda;
  return std::nullopt;
}

bool built_with_cuda() {
#ifdef GCZ_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

Status cuda_status() { return cuda::device_status(); }

Result<std::vector<DeviceKernelRate>> cuda_kernel_rates(uint64_t max_n, int repeats) {
  if (max_n < kMinKernelRateElements) {
    return invalid_argument("cuda_kernel_rates: " + std::to_string(max_n) + " elements are too few to time; at least " +
                            std::to_string(kMinKernelRateElements));
  }
  if (repeats < 1) {
    return invalid_argument("cuda_kernel_rates: repeats must be at least 1, got " + std::to_string(repeats));
  }
  GCZ_RETURN_IF_ERROR(cuda::device_status());
  return cuda::kernel_rates(max_n, repeats);
}

Result<Backend> resolve_backend(DeviceRequest request) {
  switch (request) {
    case DeviceRequest::kCpu: return Backend::kCpu;
    case DeviceRequest::kCuda: {
      Status s = cuda_status();
      if (!s) return s.with_context("--device cuda");
      return Backend::kCuda;
    }
    case DeviceRequest::kAuto: return cuda_status() ? Backend::kCuda : Backend::kCpu;
  }
  return Backend::kCpu;
}

}  // namespace gcz
