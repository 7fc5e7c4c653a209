// The two entry points of the CUDA backend that the rest of the library calls. They are defined in
// kernels/ when gcz is built with CUDA, and by cuda_unavailable.cpp otherwise.
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include "gcz/backend.h"
#include "gcz/codec.h"

namespace gcz::cuda {

// Ok when a CUDA device is usable; otherwise why not.
Status device_status();
// The CUDA implementation of codec `name`, or kUnsupported when it has none.
Result<std::unique_ptr<Codec>> make_codec(std::string_view name, const Params& params);
// gcz::cuda_kernel_rates, called once max_n >= 1, repeats >= 1 and the device are checked.
Result<std::vector<DeviceKernelRate>> kernel_rates(uint64_t max_n, int repeats);

}  // namespace gcz::cuda
