// The element conversion kernel of the cast codecs: launch_convert (dispatch) -> convert_kernel (a
// grid-stride loop over tiles of 16-byte vectors, loaded and stored whole) -> convert_element (the
// per-element math of gcz/detail/float_bits.h, or the device's own float16 conversion where its bits
// are the same). The conversion matrix mirrors gcz::convert_elements (codec/src/convert.cpp) case by
// case, so the bytes are the same.
#include <cuda_fp16.h>

#include <cstdint>
#include <string>

#include "cast.cuh"
#include "cuda_runtime.cuh"
#include "gcz/detail/float_bits.h"

namespace gcz::cuda {
namespace {

using detail::bit_cast;

constexpr unsigned kBlockThreads = 256;
constexpr uint64_t kMaxBlocks = 4096;  // enough to fill any current GPU; the loop strides over the rest
constexpr std::size_t kAlignment = 256;  // of both pointers, as cudaMalloc gives: any vector's alignment

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
  if constexpr (From == DType::kFloat32 && To == DType::kFloat16) {
    // The conversion instruction rounds to nearest even, overflows to Inf and makes subnormals as
    // f32_to_f16 does, in a few instructions rather than f32_to_f16's thirty, which held this kernel
    // to 0.72 of the H200's copy rate (CudaExhaustive compares all 2^32 inputs). It need not keep a
    // NaN's payload, so a NaN takes f32_to_f16.
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) return detail::f32_to_f16(bit_cast<float>(x));
    return __half_as_ushort(__float2half_rn(bit_cast<float>(x)));
  } else if constexpr (To == DType::kFloat64) {
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

// A vector: 16 bytes of the wider of the two dtypes, as many elements of the narrower. A warp's
// threads take consecutive vectors, so each of its loads and stores is one contiguous span, and
// each thread has kUnroll vectors in flight. On the H200, one element per thread reached 0.52-0.65
// of the device copy's rate; runs of 8 or 16 elements per thread (strided across the warp) left the
// widenings at 0.39-0.64.
template <DType From, DType To>
inline constexpr unsigned kVector = 16 /
                                    (sizeof(Bits<From>) > sizeof(Bits<To>) ? sizeof(Bits<From>) : sizeof(Bits<To>));
constexpr unsigned kUnroll = 4;
constexpr uint64_t kTile = uint64_t{kBlockThreads} * kUnroll;  // vectors a block converts per turn

// N elements aligned to their size, so that they load and store as whole vectors.
template <class T, unsigned N>
struct alignas(sizeof(T) * N) Run {
  T v[N];
};

// Converts the whole vectors of [0, n) a tile per block per turn, and the n % kVector elements after
// them one per thread of the first block. d_src and d_dst are aligned to kAlignment.
template <DType From, DType To>
__global__ void __launch_bounds__(kBlockThreads)
    convert_kernel(const Bits<From>* __restrict__ d_src, Bits<To>* __restrict__ d_dst, uint64_t n) {
  constexpr unsigned V = kVector<From, To>;
  using In = Run<Bits<From>, V>;
  using Out = Run<Bits<To>, V>;
  const uint64_t vectors = n / V;
  const auto* src = reinterpret_cast<const In*>(d_src);
  auto* dst = reinterpret_cast<Out*>(d_dst);
  for (uint64_t base = uint64_t{blockIdx.x} * kTile; base < vectors; base += uint64_t{gridDim.x} * kTile) {
    In in[kUnroll];
#pragma unroll
    for (unsigned u = 0; u < kUnroll; ++u) {
      const uint64_t i = base + u * kBlockThreads + threadIdx.x;
      if (i < vectors) in[u] = src[i];
    }
#pragma unroll
    for (unsigned u = 0; u < kUnroll; ++u) {
      const uint64_t i = base + u * kBlockThreads + threadIdx.x;
      if (i < vectors) {
        Out out;
#pragma unroll
        for (unsigned k = 0; k < V; ++k) out.v[k] = convert_element<From, To>(in[u].v[k]);
        dst[i] = out;
      }
    }
  }
  if (blockIdx.x == 0) {
    const uint64_t tail = vectors * V + threadIdx.x;
    if (tail < n) d_dst[tail] = convert_element<From, To>(d_src[tail]);
  }
}

template <DType From, DType To>
Status launch_typed(const void* d_src, void* d_dst, uint64_t n, cudaStream_t stream) {
  if constexpr (From == To) {
    return check(cudaMemcpyAsync(d_dst, d_src, n * sizeof(Bits<From>), cudaMemcpyDeviceToDevice, stream),
                 "cudaMemcpyAsync (device to device)");
  } else {
    const uint64_t tiles = (n / kVector<From, To> + kTile - 1) / kTile;
    const unsigned blocks = static_cast<unsigned>(tiles < 1 ? 1 : tiles < kMaxBlocks ? tiles : kMaxBlocks);
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
  if (d_src == nullptr || d_dst == nullptr || !aligned(d_src, kAlignment) || !aligned(d_dst, kAlignment)) {
    return internal_error("launch_convert: null device pointer, or one not aligned to " + std::to_string(kAlignment) +
                          " bytes");
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
