#include "gcz/tensor.h"

#include <algorithm>

namespace gcz {

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
  }
  return "unknown";
}

std::optional<DType> parse_dtype(std::string_view name) {
  if (name == "float16" || name == "f16" || name == "fp16" || name == "half") return DType::kFloat16;
  if (name == "bfloat16" || name == "bf16") return DType::kBFloat16;
  // Not "float": float32 in C, float64 in numpy and Python.
  if (name == "float32" || name == "f32" || name == "fp32") return DType::kFloat32;
  if (name == "float64" || name == "f64" || name == "fp64" || name == "double") return DType::kFloat64;
  return std::nullopt;
}

std::optional<uint64_t> checked_mul(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

std::optional<uint64_t> checked_add(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

Result<uint64_t> checked_numel(const Shape& shape) {
  if (shape.size() > kMaxRank) {
    return format_error("rank " + std::to_string(shape.size()) + " exceeds the limit of " +
                        std::to_string(kMaxRank) + " dimensions");
  }
  // The nonzero dimensions' product is bounded even where a zero dimension makes the tensor empty:
  // no tensor of elements could have such dimensions, and numpy cannot make an empty array of them.
  const bool empty = std::find(shape.begin(), shape.end(), uint64_t{0}) != shape.end();
  uint64_t n = 1;
  for (uint64_t d : shape) {
    if (d == 0) continue;
    auto m = checked_mul(n, d);
    if (!m || *m > kMaxNumel) {
      return format_error(
          "shape " + shape_to_string(shape) +
          (empty ? ": the product of its nonzero dimensions exceeds 2^48" : " has more than 2^48 elements"));
    }
    n = *m;
  }
  if (empty) return uint64_t{0};
  return n;
}

std::string shape_to_string(const Shape& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

Result<uint64_t> TensorInfo::byte_size() const {
  GCZ_ASSIGN_OR_RETURN(uint64_t n, numel());
  return n * dtype_size(dtype);  // n <= 2^48, so no overflow
}

}  // namespace gcz
