// The CUDA entry points of a build without CUDA: every request says so.
#include "cuda_hooks.h"

namespace gcz::cuda {

Status device_status() {
  return device_error("this gcz was built without CUDA (configure with -DGCZ_WITH_CUDA=ON to enable it)");
}

Result<std::unique_ptr<Codec>> make_codec(std::string_view, const Params&) { return device_status(); }

Result<std::vector<DeviceKernelRate>> kernel_rates(uint64_t, int) { return device_status(); }

}  // namespace gcz::cuda
