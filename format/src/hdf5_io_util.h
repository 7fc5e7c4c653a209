// HDF5 helpers for the HDF5 tensor reader and writer: an owning identifier, quiet error handling with
// the error stack turned into text, the in-memory float types gcz uses, and the hyperslab selection of
// a C-order element range.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <optional>
#include <string>

#include "gcz/status.h"
#include "gcz/tensor.h"

namespace gcz::detail {

// Owns one HDF5 identifier of any kind (file, group, dataset, dataspace, datatype, property list);
// H5Idec_ref closes it once the last reference goes.
class H5Id {
 public:
  H5Id() = default;
  explicit H5Id(hid_t id) : id_(id) {}
  ~H5Id() { reset(); }
  H5Id(H5Id&& o) noexcept : id_(o.id_) { o.id_ = H5I_INVALID_HID; }
  H5Id& operator=(H5Id&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_;
      o.id_ = H5I_INVALID_HID;
    }
    return *this;
  }
  H5Id(const H5Id&) = delete;
  H5Id& operator=(const H5Id&) = delete;

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  // Gives up ownership (for calls such as H5Fclose that close the id themselves).
  hid_t release() {
    const hid_t id = id_;
    id_ = H5I_INVALID_HID;
    return id;
  }
  void reset() {
    if (id_ >= 0) H5Idec_ref(id_);
    id_ = H5I_INVALID_HID;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
};

// Stops HDF5 from printing its error stack to stderr: failures become Status values instead.
void quiet_hdf5_errors();
// The innermost message on HDF5's current error stack (e.g. "file signature not found"), or "".
std::string hdf5_error_text();

// The float type gcz keeps `dtype` in, little-endian; float16 and bfloat16 are built as IEEE-style
// types with 5/10 and 8/7 exponent/mantissa bits. Invalid id on failure.
H5Id hdf5_float_type(DType dtype);
// The gcz dtype an HDF5 float type holds, by its bit layout; nullopt for other layouts.
std::optional<DType> dtype_of_hdf5_float(hid_t type);

// Selects C-order elements [first, first + count) of the simple dataspace `space` (shape `dims`,
// count > 0) as a union of at most 2 * rank - 1 hyperslabs, which HDF5 visits in C order.
Status select_flat_range(hid_t space, const Shape& dims, uint64_t first, uint64_t count);

}  // namespace gcz::detail
