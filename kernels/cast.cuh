// kernels/cast.cuh — the element conversion kernel of the cast codecs (none, fp32, fp16, bf16), internal
// to the CUDA backend. It produces the same bytes as gcz::convert_elements on the CPU: the per-element
// math is gcz/detail/float_bits.h, shared by both backends.
//
//   GCZ_RETURN_IF_ERROR(gcz::cuda::launch_convert(gcz::DType::kFloat32, d_src, gcz::DType::kFloat16, d_dst,
//                                                 n, stream));   // asynchronous on `stream`
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "gcz/status.h"
#include "gcz/tensor.h"

namespace gcz::cuda {

// Queues on `stream` the conversion of n elements of dtype `from` at device pointer d_src into dtype `to`
// at device pointer d_dst (equal dtypes: a device-to-device copy). The ranges must not overlap, and each
// pointer must be aligned to 256 bytes (cudaMalloc's are). Returns the launch error, if
// any (kInternal for a null or misaligned pointer); errors raised while the kernel runs surface at the
// next synchronisation.
Status launch_convert(DType from, const void* d_src, DType to, void* d_dst, uint64_t n, cudaStream_t stream);

}  // namespace gcz::cuda
