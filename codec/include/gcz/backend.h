// gcz/backend.h — where codecs run. The backend is a run-time value; callers never write #ifdef.
//
//   gcz::Result<gcz::Backend> b = gcz::resolve_backend(gcz::DeviceRequest::kAuto);  // CUDA if usable, else CPU
//   if (!b) ...;   // only kCuda can fail: "built without CUDA" or "no CUDA device"
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gcz/status.h"

namespace gcz {

enum class Backend { kCpu, kCuda };
enum class DeviceRequest { kAuto, kCpu, kCuda };

std::string_view backend_name(Backend b);
std::optional<DeviceRequest> parse_device_request(std::string_view s);  // "auto", "cpu", "cuda"

// Whether this build has the CUDA backend compiled in.
bool built_with_cuda();
// Ok when a CUDA device can be used now; otherwise a kDeviceError status saying why.
Status cuda_status();
// kCpu -> CPU; kCuda -> CUDA or an error; kAuto -> CUDA when cuda_status() is ok, else CPU.
Result<Backend> resolve_backend(DeviceRequest request);

// One operation of the CUDA backend timed on data already on the GPU: bytes read plus bytes written
// per second / 1e9.
struct DeviceKernelRate {
  std::string name;       // "device copy" (the yardstick), "fp32 -> fp16", ...
  uint64_t elements = 0;  // float32 elements each run went over
  double gbps = 0;
};

// The GPU's own yardstick, a device-to-device copy of float32 elements, then the cast kernels the
// cast codecs run (float32 to float16 and bfloat16, and back) on the same elements: synthetic,
// gradient-like values resident on the device, each operation timed with CUDA events, the median of
// `repeats` runs after a warm-up. The elements are max_n, or fewer where 12 bytes each would take
// more than half the device's free memory. Errors: kInvalidArgument for max_n below
// kMinKernelRateElements (too short a run to time) or repeats < 1; kDeviceError without a usable
// device or where fewer than kMinKernelRateElements fit (less than 48 MiB free).
inline constexpr uint64_t kMinKernelRateElements = uint64_t{1} << 21;
Result<std::vector<DeviceKernelRate>> cuda_kernel_rates(uint64_t max_n, int repeats);

}  // namespace gcz
