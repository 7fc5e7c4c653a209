// gcz/backend.h — where codecs run. The backend is a run-time value; callers never write #ifdef.
//
//   gcz::Result<gcz::Backend> b = gcz::resolve_backend(gcz::DeviceRequest::kAuto);  // CUDA if usable, else CPU
//   if (!b) ...;   // only kCuda can fail: "built without CUDA" or "no CUDA device"
#pragma once

#include <optional>
#include <string>
#include <string_view>

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

}  // namespace gcz
