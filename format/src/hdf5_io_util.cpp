#include "hdf5_io_util.h"

#include <vector>

#include "gcz/tensor_io.h"

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

// Walking upward, the first entry with a description that is not the plugin search's (which fails
// in its own words before the filter's "is not registered").
herr_t take_innermost(unsigned, const H5E_error2_t* err, void* data) {
  auto* text = static_cast<std::string*>(data);
  if (text->empty() && err->desc && *err->desc && err->maj_num != H5E_PLUGIN) *text = err->desc;
  return 0;
}

struct Box {
  std::vector<hsize_t> start, block;
};

// Appends the boxes covering C-order elements [first, first + count) of dims[d..], in order, with the
// indices of dims[0..d) fixed in `at.start` (and `at.block` 1 there): a partial leading row, the
// whole rows in one box, a partial trailing row.
void add_boxes(const Shape& dims, Box& at, std::size_t d, uint64_t first, uint64_t count, std::vector<Box>& out) {
  if (d + 1 == dims.size()) {
    at.start[d] = first;
    at.block[d] = count;
    out.push_back(at);
    return;
  }
  uint64_t inner = 1;
  for (std::size_t k = d + 1; k < dims.size(); ++k) inner *= dims[k];
  uint64_t row = first / inner;
  if (const uint64_t offset = first % inner; offset != 0) {
    const uint64_t take = std::min(count, inner - offset);
    at.start[d] = row++;
    at.block[d] = 1;
    add_boxes(dims, at, d + 1, offset, take, out);
    count -= take;
  }
  if (const uint64_t rows = count / inner; rows > 0) {
    at.start[d] = row;
    at.block[d] = rows;
    for (std::size_t k = d + 1; k < dims.size(); ++k) {
      at.start[k] = 0;
      at.block[k] = dims[k];
    }
    out.push_back(at);
    row += rows;
    count -= rows * inner;
  }
  if (count > 0) {
    at.start[d] = row;
    at.block[d] = 1;
    add_boxes(dims, at, d + 1, 0, count, out);
  }
}

}  // namespace

void quiet_hdf5_errors() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

std::string hdf5_error_text() {
  std::string text;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, take_innermost, &text);
  if (text.empty()) return "unknown HDF5 error";
  // The file driver's "file write failed: time = ..., errno = 28, error message = 'No space left on
  // device', buf = 0x..., ..." says what matters in its message.
  const std::string tag = ", error message = '";
  const std::size_t at = text.find(tag), cut = text.find(": time = ");
  if (at != std::string::npos && cut != std::string::npos && cut < at) {
    const std::size_t end = text.find('\'', at + tag.size());
    if (end != std::string::npos) {
      return text.substr(0, cut) + ": " + text.substr(at + tag.size(), end - at - tag.size());
    }
  }
  return text;
}

Status hdf5_read_error(const std::string& what) {
  const std::string text = hdf5_error_text();
  const std::string library = "HDF5 " + std::to_string(H5_VERS_MAJOR) + "." + std::to_string(H5_VERS_MINOR) + "." +
                              std::to_string(H5_VERS_RELEASE);
  if (text.find("is not registered") != std::string::npos) {
    return unsupported(what + ": " + text + " (gcz's " + library + " lacks that filter)");
  }
  if (text.find("version") != std::string::npos) {  // damaged, or newer than this library: HDF5 cannot tell
    return format_error(what + ": " + text + " (the file is damaged, or in a newer HDF5 format than gcz's " + library +
                        " reads)");
  }
  return format_error(what + ": " + text);
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

Status transfer_flat_range(hid_t dataset, hid_t mem_type, const Shape& dims, uint64_t first, uint64_t count, void* buf,
                           bool write, const std::function<Status()>& failed) {
  std::vector<Box> boxes;
  Box at{std::vector<hsize_t>(dims.size(), 0), std::vector<hsize_t>(dims.size(), 1)};
  add_boxes(dims, at, 0, first, count, boxes);
  const std::size_t esize = H5Tget_size(mem_type);
  auto* p = static_cast<std::byte*>(buf);
  H5Id file_space(H5Dget_space(dataset));
  if (!file_space.valid()) return failed();
  for (const Box& box : boxes) {
    if (H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, box.start.data(), nullptr, box.block.data(), nullptr) <
        0) {
      return failed();
    }
    H5Id mem_space(H5Screate_simple(static_cast<int>(dims.size()), box.block.data(), nullptr));
    if (!mem_space.valid()) return failed();
    // Failures are reported before the spaces close: a successful close empties HDF5's error stack.
    const herr_t r = write ? H5Dwrite(dataset, mem_type, mem_space.get(), file_space.get(), H5P_DEFAULT, p)
                           : H5Dread(dataset, mem_type, mem_space.get(), file_space.get(), H5P_DEFAULT, p);
    if (r < 0) return failed();
    uint64_t n = 1;
    for (hsize_t b : box.block) n *= b;
    p += n * esize;
  }
  return Status::ok();
}

}  // namespace gcz::detail

namespace gcz {

// Before the library's first call (it is not initialized by this one), else it has no effect.
void skip_hdf5_cleanup_at_exit() { H5dont_atexit(); }

}  // namespace gcz
