// The probes of shared_math_probes.h on the device: one thread per record, grid-stride. Compiled with
// the CUDA backend's own flags (--fmad=false), so the device arithmetic is the backend's.
#include <cuda_runtime_api.h>

#include <string>

#include "shared_math_device.h"

namespace gcz::test {
namespace {

__global__ void probe_kernel(Probe p, uint64_t n, uint64_t* out) {
  const int words = probe_words(p);
  for (uint64_t r = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; r < n; r += uint64_t{gridDim.x} * blockDim.x) {
    run_probe(p, r, out + r * words);
  }
}

Status check(cudaError_t err, const char* call) {
  if (err == cudaSuccess) return Status::ok();
  return device_error(std::string(call) + " failed: " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

}  // namespace

Status run_probe_on_device(Probe p, uint64_t n, std::vector<uint64_t>& out) {
  const std::size_t bytes = n * probe_words(p) * sizeof(uint64_t);
  out.assign(n * probe_words(p), 0);
  if (n == 0) return Status::ok();
  uint64_t* d_out = nullptr;
  GCZ_RETURN_IF_ERROR(check(cudaMalloc(&d_out, bytes), "cudaMalloc"));
  struct Free {
    uint64_t* p;
    ~Free() { (void)cudaFree(p); }
  } free_out{d_out};
  // Poisoned, so that a record the kernel skipped cannot pass for one it wrote.
  GCZ_RETURN_IF_ERROR(check(cudaMemset(d_out, 0xA5, bytes), "cudaMemset"));
  probe_kernel<<<1024, 128>>>(p, n, d_out);
  GCZ_RETURN_IF_ERROR(check(cudaGetLastError(), "probe_kernel launch"));
  GCZ_RETURN_IF_ERROR(check(cudaDeviceSynchronize(), "probe_kernel"));
  return check(cudaMemcpy(out.data(), d_out, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy (device to host)");
}

}  // namespace gcz::test
