// The element conversion kernel of the cast codecs: launch_convert (dispatch) -> convert_kernel (a
// grid-stride loop) -> convert_element (the per-element math of gcz/detail/float_bits.h). The conversion
// matrix mirrors gcz::convert_elements (codec/src/convert.cpp) case by case, so the bytes are the same.
#include "cast.cuh"

#include <cstdint>

#include "cuda_runtime.cuh"
#include "gcz/detail/float_bits.h"

namespace gcz::cuda {
namespace {

using detail::bit_cast;

constexpr unsigned kBlockThreads = 256;
constexpr uint64_t kMaxBlocks = 4096;  // enough to fill any current GPU; the loop strides over the rest

// Elements travel as their bit patterns, so no load, store or move can touch a NaN payload.
template <DType D> struct BitsOf;
template <> struct BitsOf<DType::kFloat16> { using type = uint16_t; };
template <> struct BitsOf<DType::kBFloat16> { using type = uint16_t; };
template <> struct BitsOf<DType::kFloat32> { using type = uint32_t; };
template <> struct BitsOf<DType::kFloat64> { using type = uint64_t; };
template <DType D> using Bits = typename BitsOf<D>::type;

// Widens a float16/bfloat16/float32 element to float exactly, and narrows a float64 one to float
// (float_bits.h: f64_to_f32, round to nearest even).
template <DType From>
__device__ __forceinline__ float to_f32(Bits<From> x) {
  if constexpr (From == DType::kFloat16) return detail::f16_to_f32(x);
  if constexpr (From == DType::kBFloat16) return detail::bf16_to_f32(x);
  if constexpr (From == DType::kFloat32) return bit_cast<float>(x);
  if constexpr (From == DType::kFloat64) return detail::f64_to_f32(bit_cast<double>(x));
}

template <DType From, DType To>
__device__ __forceinline__ Bits<To> convert_element(Bits<From> x) {
  if constexpr (To == DType::kFloat64) {
    return bit_cast<uint64_t>(detail::f32_to_f64(to_f32<From>(x)));
  } else if constexpr (To == DType::kFloat32) {
    return bit_cast<uint32_t>(to_f32<From>(x));
  } else if constexpr (To == DType::kFloat16) {
    if constexpr (From == DType::kFloat64) return detail::f64_to_f16(bit_cast<double>(x));
    else return detail::f32_to_f16(to_f32<From>(x));
  } else {
    if constexpr (From == DType::kFloat64) return detail::f64_to_bf16(bit_cast<double>(x));
    else return detail::f32_to_bf16(to_f32<From>(x));
  }
}

template <DType From, DType To>
__global__ void __launch_bounds__(kBlockThreads)
    convert_kernel(const Bits<From>* __restrict__ d_src, Bits<To>* __restrict__ d_dst, uint64_t n) {
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    d_dst[i] = convert_element<From, To>(d_src[i]);
  }
}

template <DType From, DType To>
Status launch_typed(const void* d_src, void* d_dst, uint64_t n, cudaStream_t stream) {
  if constexpr (From == To) {
    return check(cudaMemcpyAsync(d_dst, d_src, n * sizeof(Bits<From>), cudaMemcpyDeviceToDevice, stream),
                 "cudaMemcpyAsync (device to device)");
  } else {
    const uint64_t blocks_needed = (n + kBlockThreads - 1) / kBlockThreads;
    const unsigned blocks = static_cast<unsigned>(blocks_needed < kMaxBlocks ? blocks_needed : kMaxBlocks);
    // cudaGetLastError reports the last error of any runtime call on this thread: clear one left by an
    // earlier call (a failed free, say) so that it is not taken for this launch's.
    (void)cudaGetLastError();
    convert_kernel<From, To><<<blocks, kBlockThreads, 0, stream>>>(static_cast<const Bits<From>*>(d_src),
                                                                  static_cast<Bits<To>*>(d_dst), n);
    return check(cudaGetLastError(), "convert kernel launch");
  }
}

template <DType From>
Status launch_from(DType to, const void* d_src, void* d_dst, uint64_t n, cudaStream_t stream) {
  switch (to) {
    case DType::kFloat16: return launch_typed<From, DType::kFloat16>(d_src, d_dst, n, stream);
    case DType::kBFloat16: return launch_typed<From, DType::kBFloat16>(d_src, d_dst, n, stream);
    case DType::kFloat32: return launch_typed<From, DType::kFloat32>(d_src, d_dst, n, stream);
    case DType::kFloat64: return launch_typed<From, DType::kFloat64>(d_src, d_dst, n, stream);
  }
  return internal_error("launch_convert: unknown target dtype");
}

bool aligned(const void* p, std::size_t alignment) { return reinterpret_cast<uintptr_t>(p) % alignment == 0; }

}  // namespace

Status launch_convert(DType from, const void* d_src, DType to, void* d_dst, uint64_t n, cudaStream_t stream) {
  if (n == 0) return Status::ok();
  if (n > kMaxNumel) return internal_error("launch_convert: element count " + std::to_string(n) + " is too large");
  if (d_src == nullptr || d_dst == nullptr || !aligned(d_src, dtype_size(from)) || !aligned(d_dst, dtype_size(to))) {
    return internal_error("launch_convert: null or misaligned device pointer");
  }
  switch (from) {
    case DType::kFloat16: return launch_from<DType::kFloat16>(to, d_src, d_dst, n, stream);
    case DType::kBFloat16: return launch_from<DType::kBFloat16>(to, d_src, d_dst, n, stream);
    case DType::kFloat32: return launch_from<DType::kFloat32>(to, d_src, d_dst, n, stream);
    case DType::kFloat64: return launch_from<DType::kFloat64>(to, d_src, d_dst, n, stream);
  }
  return internal_error("launch_convert: unknown source dtype");
}

}  // namespace gcz::cuda
