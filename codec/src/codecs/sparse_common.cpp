#include "codecs/sparse_common.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "gcz/detail/float_bits.h"

namespace gcz::codecs {

Result<SparseCount> SparseCount::parse(const Params& p, std::string_view codec) {
  const std::string name(codec);
  const bool has_ratio = p.count("ratio") != 0, has_k = p.count("k") != 0;
  if (has_ratio && has_k) {
    return invalid_argument("codec '" + name + "': give 'ratio' or 'k', not both");
  }
  SparseCount c;
  if (has_k) {
    GCZ_ASSIGN_OR_RETURN(int64_t k, get_int_param(p, codec, "k", 1));
    if (k < 1) {
      return invalid_argument("codec '" + name + "': parameter 'k' must be at least 1, got " + std::to_string(k));
    }
    c.k_ = static_cast<uint64_t>(k);
    return c;
  }
  GCZ_ASSIGN_OR_RETURN(double ratio, get_number_param(p, codec, "ratio", kDefaultRatio));
  if (!(ratio > 0.0 && ratio <= 1.0)) {
    return invalid_argument("codec '" + name + "': parameter 'ratio' must be in (0, 1], got " +
                            param_to_string(ratio));
  }
  c.ratio_ = ratio;
  return c;
}

uint64_t SparseCount::k(uint64_t n) const {
  if (n == 0) return 0;
  if (!ratio_) return std::min(k_, n);
  // n <= 2^48 is exact in float64; the product is rounded once, then floored.
  const double kept = std::floor(*ratio_ * static_cast<double>(n));
  const uint64_t k = kept < 1.0 ? 1 : static_cast<uint64_t>(kept);
  return std::min(k, n);
}

void SparseCount::add_params(Params& p) const {
  if (ratio_) {
    p["ratio"] = *ratio_;
  } else {
    p["k"] = static_cast<int64_t>(k_);
  }
}

Result<uint64_t> whole_tensor(const TensorInfo& t, uint64_t first, uint64_t count, std::string_view codec) {
  GCZ_ASSIGN_OR_RETURN(uint64_t n, t.numel());
  if (first != 0 || count != n) {
    return internal_error("codec '" + std::string(codec) + "' takes the whole tensor at once");
  }
  return n;
}

namespace {

float element_f32(DType dtype, const void* src, uint64_t i) {
  switch (dtype) {
    case DType::kFloat16: return detail::f16_to_f32(static_cast<const uint16_t*>(src)[i]);
    case DType::kBFloat16: return detail::bf16_to_f32(static_cast<const uint16_t*>(src)[i]);
    case DType::kFloat32: return static_cast<const float*>(src)[i];
    case DType::kFloat64: return detail::f64_to_f32(static_cast<const double*>(src)[i]);
  }
  return 0.0f;
}

}  // namespace

std::vector<float> gather_values(DType dtype, const void* src, std::span<const uint64_t> idx, float scale) {
  std::vector<float> out(idx.size());
  for (std::size_t j = 0; j < idx.size(); ++j) {
    float v = element_f32(dtype, src, idx[j]);
    if (scale != 1.0f) v = v * scale;
    out[j] = std::isfinite(v) ? v : 0.0f;
  }
  return out;
}

void scatter_values(DType dtype, std::span<const uint64_t> idx, const float* values, uint64_t n, void* dst) {
  std::memset(dst, 0, n * dtype_size(dtype));  // +0 is all-zero bits in every dtype
  for (std::size_t j = 0; j < idx.size(); ++j) {
    const uint64_t i = idx[j];
    switch (dtype) {
      case DType::kFloat16: static_cast<uint16_t*>(dst)[i] = detail::f32_to_f16(values[j]); break;
      case DType::kBFloat16: static_cast<uint16_t*>(dst)[i] = detail::f32_to_bf16(values[j]); break;
      case DType::kFloat32: static_cast<float*>(dst)[i] = values[j]; break;
      case DType::kFloat64: static_cast<double*>(dst)[i] = static_cast<double>(values[j]); break;
    }
  }
}

}  // namespace gcz::codecs
