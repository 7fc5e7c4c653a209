// kernels/cuda_runtime.cuh — thin RAII and error-as-value wrappers over the CUDA runtime, internal to
// the CUDA backend (kernels/). Nothing outside kernels/ includes this file or any CUDA header.
//
//   GCZ_ASSIGN_OR_RETURN(gcz::cuda::Stream stream, gcz::cuda::Stream::create());
//   gcz::cuda::Buffer d_buf(gcz::cuda::Buffer::Kind::kDevice);
//   GCZ_RETURN_IF_ERROR(d_buf.ensure_capacity(bytes));
//   GCZ_RETURN_IF_ERROR(gcz::cuda::check(cudaMemsetAsync(d_buf.data(), 0, bytes, stream.get()),
//                                        "cudaMemsetAsync"));
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string_view>

#include "gcz/status.h"

namespace gcz::cuda {

// Ok when err is cudaSuccess; otherwise a kDeviceError naming the call and the CUDA error, e.g.
// "cudaMemcpyAsync failed: cudaErrorInvalidValue (invalid argument)".
Status check(cudaError_t err, std::string_view call);

// An owned allocation of device memory or of pinned (page-locked) host memory.
class Buffer {
 public:
  enum class Kind { kDevice, kPinnedHost };

  explicit Buffer(Kind kind) : kind_(kind) {}
  ~Buffer() { release(); }
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  // Makes capacity() at least `bytes`. Growing discards the contents (these are staging buffers).
  Status ensure_capacity(std::size_t bytes);

  void* data() const { return ptr_; }
  std::size_t capacity() const { return capacity_; }

 private:
  void release();

  Kind kind_;
  void* ptr_ = nullptr;
  std::size_t capacity_ = 0;
};

// An owned non-blocking stream on the device that was current when it was created.
class Stream {
 public:
  static Result<Stream> create();
  ~Stream();
  Stream(Stream&& other) noexcept : stream_(other.stream_), device_(other.device_) { other.stream_ = nullptr; }
  Stream& operator=(Stream&& other) = delete;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  cudaStream_t get() const { return stream_; }
  int device() const { return device_; }
  // Waits for all work queued on the stream; reports any error that work raised.
  Status synchronize() const;

 private:
  Stream(cudaStream_t stream, int device) : stream_(stream), device_(device) {}

  cudaStream_t stream_ = nullptr;
  int device_ = 0;
};

}  // namespace gcz::cuda
