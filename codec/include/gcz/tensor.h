// gcz/tensor.h — floating-point element types, shapes and tensor descriptions.
//
// gcz handles floating tensors only: float16, bfloat16, float32 and float64, little-endian, C order.
//
//   gcz::TensorInfo t{"layer1.weight", gcz::DType::kFloat32, {256, 128}};
//   gcz::Result<uint64_t> bytes = t.byte_size();   // 131072, or an error if the shape overflows
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gcz/status.h"

namespace gcz {

enum class DType : uint8_t { kFloat16, kBFloat16, kFloat32, kFloat64 };

// Canonical names used in the .gcz index: "float16", "bfloat16", "float32", "float64".
std::string_view dtype_name(DType dtype);
// Accepts the canonical names and the short forms f16 bf16 f32 f64 (also fp16 fp32 fp64 half double; not
// "float", which is float32 in C and float64 in numpy).
std::optional<DType> parse_dtype(std::string_view name);
constexpr std::size_t dtype_size(DType dtype) {
  return dtype == DType::kFloat64 ? 8 : dtype == DType::kFloat32 ? 4 : 2;
}

using Shape = std::vector<uint64_t>;

// Largest element count gcz accepts in one tensor (2^48): larger shapes are rejected as absurd before
// any size is computed from them.
inline constexpr uint64_t kMaxNumel = uint64_t{1} << 48;
// Largest number of dimensions gcz accepts.
inline constexpr std::size_t kMaxRank = 32;

// Product of the dimensions, or an error if the product of the nonzero ones exceeds kMaxNumel (an empty
// tensor too) or the rank exceeds kMaxRank.
// A 0-d shape has one element; a shape with a zero dimension has none.
Result<uint64_t> checked_numel(const Shape& shape);
std::string shape_to_string(const Shape& shape);  // "[256, 128]"

struct TensorInfo {
  std::string name;
  DType dtype = DType::kFloat32;
  Shape shape;

  Result<uint64_t> numel() const { return checked_numel(shape); }
  Result<uint64_t> byte_size() const;
};

// Overflow-checked helpers for size arithmetic on untrusted values.
std::optional<uint64_t> checked_mul(uint64_t a, uint64_t b);
std::optional<uint64_t> checked_add(uint64_t a, uint64_t b);

}  // namespace gcz
