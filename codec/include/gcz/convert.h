// gcz/convert.h — element conversions between the four floating dtypes.
//
// Narrowing rounds to nearest, ties to even (one rounding, also for float64 -> float16/bfloat16);
// overflow gives Inf; NaN stays NaN; subnormals are kept. Widening is exact. The results do not
// depend on the process's floating-point modes (rounding, flush to zero, denormals are zero), and
// no floating-point exception is raised where the process has unmasked one.
//
//   std::vector<uint16_t> h(n);
//   gcz::convert_elements(gcz::DType::kFloat32, src, gcz::DType::kFloat16, h.data(), n);
#pragma once

#include <cstddef>
#include <cstdint>

#include "gcz/tensor.h"

namespace gcz {

// Converts n elements from `from` at src to `to` at dst. src and dst must not overlap unless equal
// dtypes make it a copy of the same range.
void convert_elements(DType from, const void* src, DType to, void* dst, std::size_t n);

// Reads element i of a buffer of dtype `dtype` as a double (exact for every dtype).
double element_as_double(DType dtype, const void* data, std::size_t i);

}  // namespace gcz
