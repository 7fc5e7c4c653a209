#include "hdf5_io_util.h"

#include <vector>

namespace gcz::detail {
namespace {

struct FloatLayout {
  DType dtype;
  std::size_t size;
  std::size_t exponent_bits;
  std::size_t mantissa_bits;
};

constexpr FloatLayout kLayouts[] = {
    {DType::kFloat16, 2, 5, 10},
    {DType::kBFloat16, 2, 8, 7},
    {DType::kFloat32, 4, 8, 23},
    {DType::kFloat64, 8, 11, 52},
};

herr_t take_innermost(unsigned n, const H5E_error2_t* err, void* data) {
  auto* text = static_cast<std::string*>(data);
  if (n == 0 && err->desc) *text = err->desc;
  return 0;
}

// Adds the hyperslabs covering C-order elements [first, first + count) of dims[d..], with the indices
// of dims[0..d) already fixed in `start` (and `block` 1 there).
Status add_range(hid_t space, const Shape& dims, std::vector<hsize_t>& start, std::vector<hsize_t>& block,
                 std::size_t d, uint64_t first, uint64_t count, bool& any) {
  auto select = [&]() -> Status {
    if (H5Sselect_hyperslab(space, any ? H5S_SELECT_OR : H5S_SELECT_SET, start.data(), nullptr, block.data(), nullptr) <
        0) {
      return internal_error("HDF5 hyperslab selection failed: " + hdf5_error_text());
    }
    any = true;
    return Status::ok();
  };
  if (d + 1 == dims.size()) {
    start[d] = first;
    block[d] = count;
    return select();
  }
  uint64_t inner = 1;
  for (std::size_t k = d + 1; k < dims.size(); ++k) inner *= dims[k];
  uint64_t row = first / inner;
  // A partial leading row, then whole rows in one hyperslab, then a partial trailing row.
  if (const uint64_t offset = first % inner; offset != 0) {
    const uint64_t take = std::min(count, inner - offset);
    start[d] = row++;
    block[d] = 1;
    GCZ_RETURN_IF_ERROR(add_range(space, dims, start, block, d + 1, offset, take, any));
    count -= take;
  }
  if (const uint64_t rows = count / inner; rows > 0) {
    start[d] = row;
    block[d] = rows;
    for (std::size_t k = d + 1; k < dims.size(); ++k) {
      start[k] = 0;
      block[k] = dims[k];
    }
    GCZ_RETURN_IF_ERROR(select());
    row += rows;
    count -= rows * inner;
  }
  if (count > 0) {
    start[d] = row;
    block[d] = 1;
    GCZ_RETURN_IF_ERROR(add_range(space, dims, start, block, d + 1, 0, count, any));
  }
  return Status::ok();
}

}  // namespace

void quiet_hdf5_errors() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

std::string hdf5_error_text() {
  std::string text;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, take_innermost, &text);
  return text.empty() ? "unknown HDF5 error" : text;
}

H5Id hdf5_float_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return H5Id(H5Tcopy(H5T_IEEE_F32LE));
    case DType::kFloat64: return H5Id(H5Tcopy(H5T_IEEE_F64LE));
    case DType::kFloat16:
    case DType::kBFloat16: break;
  }
  // Narrow a float32 description: sign at bit 15, exponent just below it, mantissa at bit 0.
  const bool half = dtype == DType::kFloat16;
  const std::size_t mantissa = half ? 10 : 7;
  const std::size_t exponent = half ? 5 : 8;
  H5Id t(H5Tcopy(H5T_IEEE_F32LE));
  if (!t.valid() || H5Tset_fields(t.get(), 15, mantissa, exponent, 0, mantissa) < 0 || H5Tset_size(t.get(), 2) < 0 ||
      H5Tset_ebias(t.get(), half ? 15 : 127) < 0) {
    return H5Id();
  }
  return t;
}

std::optional<DType> dtype_of_hdf5_float(hid_t type) {
  size_t spos = 0, epos = 0, esize = 0, mpos = 0, msize = 0;
  if (H5Tget_class(type) != H5T_FLOAT || H5Tget_fields(type, &spos, &epos, &esize, &mpos, &msize) < 0) {
    return std::nullopt;
  }
  const std::size_t size = H5Tget_size(type);
  for (const FloatLayout& l : kLayouts) {
    if (size == l.size && esize == l.exponent_bits && msize == l.mantissa_bits && mpos == 0 &&
        epos == l.mantissa_bits && spos == l.mantissa_bits + l.exponent_bits && H5Tget_offset(type) == 0 &&
        H5Tget_ebias(type) == (std::size_t{1} << (l.exponent_bits - 1)) - 1 && H5Tget_norm(type) == H5T_NORM_IMPLIED) {
      return l.dtype;
    }
  }
  return std::nullopt;
}

Status select_flat_range(hid_t space, const Shape& dims, uint64_t first, uint64_t count) {
  std::vector<hsize_t> start(dims.size(), 0), block(dims.size(), 1);
  bool any = false;
  return add_range(space, dims, start, block, 0, first, count, any);
}

}  // namespace gcz::detail
