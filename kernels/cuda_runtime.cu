// The CUDA runtime wrappers of cuda_runtime.cuh, and gcz::cuda::device_status().
#include "cuda_runtime.cuh"

#include <string>

#include "../codec/src/cuda_hooks.h"

#ifndef GCZ_CUDA_ARCHITECTURES
#define GCZ_CUDA_ARCHITECTURES "unknown"
#endif

namespace gcz::cuda {
namespace {

// Loading this empty kernel proves the device can run code built for GCZ_CUDA_ARCHITECTURES.
__global__ void probe_kernel() {}

std::string error_text(cudaError_t err) {
  return std::string(cudaGetErrorName(err)) + " (" + cudaGetErrorString(err) + ")";
}

Status probe_device() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    // No driver, and one too old for this runtime, both read "insufficient driver": say which.
    int driver = 0, runtime = 0;
    (void)cudaDriverGetVersion(&driver);
    (void)cudaRuntimeGetVersion(&runtime);
    (void)cudaGetLastError();
    auto version = [](int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); };
    std::string what = "no CUDA device found";
    if (err == cudaErrorInsufficientDriver) {
      what = driver == 0 ? "no NVIDIA driver is loaded"
                         : "the NVIDIA driver supports CUDA up to " + version(driver) + ", too old for the CUDA " +
                               version(runtime) + " gcz was built with";
    }
    return device_error(what + " (cudaGetDeviceCount: " + error_text(err) + ")");
  }
  if (count <= 0) return device_error("no CUDA device found (cudaGetDeviceCount returned 0)");

  int device = 0;
  GCZ_RETURN_IF_ERROR(check(cudaGetDevice(&device), "cudaGetDevice"));
  cudaFuncAttributes attr{};
  err = cudaFuncGetAttributes(&attr, probe_kernel);
  if (err != cudaSuccess) {
    int major = 0, minor = 0;
    (void)cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    (void)cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    (void)cudaGetLastError();  // clear the error so later calls start clean
    return device_error("CUDA device " + std::to_string(device) + " (compute capability " + std::to_string(major) +
                        "." + std::to_string(minor) + ") cannot run gcz's kernels, built for CUDA architectures " +
                        GCZ_CUDA_ARCHITECTURES + " (cudaFuncGetAttributes: " + error_text(err) + ")");
  }
  return Status::ok();
}

}  // namespace

Status device_status() {
  static const Status status = probe_device();  // probed once per process
  return status;
}

Status check(cudaError_t err, std::string_view call) {
  if (err == cudaSuccess) return Status::ok();
  return device_error(std::string(call) + " failed: " + error_text(err));
}

// --- Buffer ------------------------------------------------------------------------------------------

Buffer::Buffer(Buffer&& other) noexcept : kind_(other.kind_), ptr_(other.ptr_), capacity_(other.capacity_) {
  other.ptr_ = nullptr;
  other.capacity_ = 0;
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    release();
    kind_ = other.kind_;
    ptr_ = other.ptr_;
    capacity_ = other.capacity_;
    other.ptr_ = nullptr;
    other.capacity_ = 0;
  }
  return *this;
}

Status Buffer::ensure_capacity(std::size_t bytes) {
  if (bytes <= capacity_) return Status::ok();
  release();
  void* ptr = nullptr;
  if (kind_ == Kind::kDevice) {
    GCZ_RETURN_IF_ERROR(check(cudaMalloc(&ptr, bytes), "cudaMalloc(" + std::to_string(bytes) + " bytes)"));
  } else {
    GCZ_RETURN_IF_ERROR(check(cudaMallocHost(&ptr, bytes), "cudaMallocHost(" + std::to_string(bytes) + " bytes)"));
  }
  ptr_ = ptr;
  capacity_ = bytes;
  return Status::ok();
}

void Buffer::release() {
  if (ptr_ == nullptr) return;
  // Errors cannot be returned from here; a failed free leaves nothing for the caller to do.
  if (kind_ == Kind::kDevice) {
    (void)cudaFree(ptr_);
  } else {
    (void)cudaFreeHost(ptr_);
  }
  ptr_ = nullptr;
  capacity_ = 0;
}

// --- Stream ------------------------------------------------------------------------------------------

Result<Stream> Stream::create() {
  int device = 0;
  GCZ_RETURN_IF_ERROR(check(cudaGetDevice(&device), "cudaGetDevice"));
  cudaStream_t stream = nullptr;
  GCZ_RETURN_IF_ERROR(check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags"));
  return Stream(stream, device);
}

Stream::~Stream() {
  if (stream_ == nullptr) return;
  (void)cudaStreamSynchronize(stream_);  // queued copies may still target buffers about to be freed
  (void)cudaStreamDestroy(stream_);
}

Status Stream::synchronize() const { return check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

}  // namespace gcz::cuda
