#include "gcz/convert.h"

#include <bit>
#include <cstring>

#include "gcz/detail/float_bits.h"

static_assert(std::endian::native == std::endian::little, "gcz assumes a little-endian host");

namespace gcz {
namespace {

using detail::bf16_to_f32;
using detail::f16_to_f32;

// Widens any dtype to float (float16/bfloat16/float32) exactly; float64 is handled separately.
float narrow_to_f32(DType from, const void* src, std::size_t i) {
  switch (from) {
    case DType::kFloat16: return f16_to_f32(static_cast<const uint16_t*>(src)[i]);
    case DType::kBFloat16: return bf16_to_f32(static_cast<const uint16_t*>(src)[i]);
    case DType::kFloat32: return static_cast<const float*>(src)[i];
    case DType::kFloat64: return detail::f64_to_f32(static_cast<const double*>(src)[i]);
  }
  return 0.0f;
}

template <class Out, class F>
void map_elements(const void* src, void* dst, std::size_t n, F f) {
  Out* out = static_cast<Out*>(dst);
  for (std::size_t i = 0; i < n; ++i) out[i] = f(i);
  (void)src;
}

}  // namespace

double element_as_double(DType dtype, const void* data, std::size_t i) {
  if (dtype == DType::kFloat64) return static_cast<const double*>(data)[i];
  return static_cast<double>(narrow_to_f32(dtype, data, i));
}

void convert_elements(DType from, const void* src, DType to, void* dst, std::size_t n) {
  if (from == to) {
    if (src != dst && n != 0) std::memmove(dst, src, n * dtype_size(from));
    return;
  }
  const auto* f64 = static_cast<const double*>(src);
  switch (to) {
    case DType::kFloat64:
      map_elements<double>(src, dst, n, [&](std::size_t i) { return element_as_double(from, src, i); });
      return;
    case DType::kFloat32:
      map_elements<float>(src, dst, n, [&](std::size_t i) { return narrow_to_f32(from, src, i); });
      return;
    case DType::kFloat16:
      if (from == DType::kFloat64) {
        map_elements<uint16_t>(src, dst, n, [&](std::size_t i) { return detail::f64_to_f16(f64[i]); });
      } else {
        map_elements<uint16_t>(src, dst, n,
                               [&](std::size_t i) { return detail::f32_to_f16(narrow_to_f32(from, src, i)); });
      }
      return;
    case DType::kBFloat16:
      if (from == DType::kFloat64) {
        map_elements<uint16_t>(src, dst, n, [&](std::size_t i) { return detail::f64_to_bf16(f64[i]); });
      } else {
        map_elements<uint16_t>(src, dst, n,
                               [&](std::size_t i) { return detail::f32_to_bf16(narrow_to_f32(from, src, i)); });
      }
      return;
  }
}

}  // namespace gcz
