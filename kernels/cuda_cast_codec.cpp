// The cast codecs (none, fp32, fp16, bf16) on the CUDA backend, and gcz::cuda::make_codec().
//
// detail::CastCodec owns the stream layout; this class supplies only the element conversion: each chunk
// is staged through reused pinned host buffers, copied to the device, converted by launch_convert and
// copied back, all on the codec's own stream, which is synchronised before convert() returns.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include "../codec/src/cuda_hooks.h"
#include "cast.cuh"
#include "cuda_runtime.cuh"
#include "gcz/detail/cast_codec.h"

namespace gcz::cuda {
namespace {

// Chunks larger than this are converted in slices, which bounds the staging memory (pinned and device)
// to 2^23 elements per side: at most 64 MiB each.
constexpr uint64_t kMaxSliceElements = uint64_t{1} << 23;

class CudaCastCodec final : public detail::CastCodec {
 public:
  static Result<std::unique_ptr<CudaCastCodec>> create(std::string_view name, std::optional<DType> target) {
    GCZ_ASSIGN_OR_RETURN(Stream stream, Stream::create());
    return std::unique_ptr<CudaCastCodec>(new CudaCastCodec(name, target, std::move(stream)));
  }

 protected:
  Status convert(DType from, const void* src, DType to, void* dst, uint64_t n) override;

 private:
  CudaCastCodec(std::string_view name, std::optional<DType> target, Stream stream)
      : CastCodec(std::string(name), target), stream_(std::move(stream)) {}

  Status convert_slices(DType from, const std::byte* src, DType to, std::byte* dst, uint64_t n);

  Buffer h_src_{Buffer::Kind::kPinnedHost};
  Buffer h_dst_{Buffer::Kind::kPinnedHost};
  Buffer d_src_{Buffer::Kind::kDevice};
  Buffer d_dst_{Buffer::Kind::kDevice};
  // Declared last so that it is destroyed first: its destructor waits for work queued on the buffers
  // before they are freed.
  Stream stream_;
};

Status CudaCastCodec::convert(DType from, const void* src, DType to, void* dst, uint64_t n) {
  if (n == 0) return Status::ok();
  if (from == to) {  // a plain copy: same bytes as the CPU backend, without a round trip over the bus
    std::memmove(dst, src, n * dtype_size(from));
    return Status::ok();
  }
  Status status = convert_slices(from, static_cast<const std::byte*>(src), to, static_cast<std::byte*>(dst), n);
  if (!status) {
    (void)stream_.synchronize();  // leave nothing in flight after a failure
    return status.with_context("CUDA codec '" + std::string(name()) + "'");
  }
  return status;
}

Status CudaCastCodec::convert_slices(DType from, const std::byte* src, DType to, std::byte* dst, uint64_t n) {
  // The stream's device is made current for the calls below, and the caller's put back after them.
  int caller_device = 0;
  GCZ_RETURN_IF_ERROR(check(cudaGetDevice(&caller_device), "cudaGetDevice"));
  GCZ_RETURN_IF_ERROR(check(cudaSetDevice(stream_.device()), "cudaSetDevice"));
  struct RestoreDevice {
    int device;
    ~RestoreDevice() { (void)cudaSetDevice(device); }
  } restore{caller_device};
  const std::size_t in_size = dtype_size(from);
  const std::size_t out_size = dtype_size(to);
  const uint64_t slice = std::min(n, kMaxSliceElements);
  GCZ_RETURN_IF_ERROR(h_src_.ensure_capacity(slice * in_size));
  GCZ_RETURN_IF_ERROR(d_src_.ensure_capacity(slice * in_size));
  GCZ_RETURN_IF_ERROR(h_dst_.ensure_capacity(slice * out_size));
  GCZ_RETURN_IF_ERROR(d_dst_.ensure_capacity(slice * out_size));

  for (uint64_t done = 0; done < n;) {
    const uint64_t count = std::min(slice, n - done);
    const std::size_t in_bytes = count * in_size;
    const std::size_t out_bytes = count * out_size;
    std::memcpy(h_src_.data(), src + done * in_size, in_bytes);
    GCZ_RETURN_IF_ERROR(check(cudaMemcpyAsync(d_src_.data(), h_src_.data(), in_bytes, cudaMemcpyHostToDevice,
                                              stream_.get()),
                              "cudaMemcpyAsync (host to device)"));
    GCZ_RETURN_IF_ERROR(launch_convert(from, d_src_.data(), to, d_dst_.data(), count, stream_.get()));
    GCZ_RETURN_IF_ERROR(check(cudaMemcpyAsync(h_dst_.data(), d_dst_.data(), out_bytes, cudaMemcpyDeviceToHost,
                                              stream_.get()),
                              "cudaMemcpyAsync (device to host)"));
    GCZ_RETURN_IF_ERROR(stream_.synchronize());
    std::memcpy(dst + done * out_size, h_dst_.data(), out_bytes);
    done += count;
  }
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<Codec>> make_codec(std::string_view name, const Params& params) {
  const auto target = detail::cast_codec_target(name);
  if (!target) return unsupported("codec '" + std::string(name) + "' has no CUDA implementation");
  if (!params.empty()) {
    return invalid_argument("codec '" + std::string(name) + "' takes no parameters, got '" + params.begin()->first +
                            "'");
  }
  GCZ_RETURN_IF_ERROR(device_status());
  GCZ_ASSIGN_OR_RETURN(std::unique_ptr<CudaCastCodec> codec, CudaCastCodec::create(name, *target));
  return std::unique_ptr<Codec>(std::move(codec));
}

}  // namespace gcz::cuda
