// HDF5 helpers for the HDF5 tensor reader and writer: an owning identifier, quiet error handling with
// the error stack turned into text, the in-memory float types gcz uses, and the hyperslab selection of
// a C-order element range.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <functional>
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
// The innermost message on HDF5's current error stack that says what went wrong (e.g. "file
// signature not found", "required filter 'lzf' is not registered"; the plugin search's own entries
// are passed over), or "unknown HDF5 error". Take it right after the failing call: every HDF5 call
// that succeeds, a close included, empties the stack.
std::string hdf5_error_text();
// `what` + ": " + hdf5_error_text(), as kUnsupported where the failure is this HDF5 library's limit
// (a filter it lacks), else as kFormatError (a "bad version" may be damage or a newer format: the
// message says both).
Status hdf5_read_error(const std::string& what);

// The float type gcz keeps `dtype` in, little-endian; float16 and bfloat16 are built as IEEE-style
// types with 5/10 and 8/7 exponent/mantissa bits. Invalid id on failure.
H5Id hdf5_float_type(DType dtype);
// The gcz dtype an HDF5 float type holds, by its bit layout; nullopt for other layouts.
std::optional<DType> dtype_of_hdf5_float(hid_t type);

// Reads (write = false) or writes C-order elements [first, first + count) of `dataset` (a simple
// dataspace of shape `dims`, count > 0) from or to `buf`, in `mem_type`: one transfer per box of the
// range (at most 2 · rank − 1: a partial leading row, whole rows, a partial trailing row, at each
// level), each with a memory space of the box's own shape. (With one 1-D memory space for them all,
// HDF5 read a chunked dataset 25× slower.) On a failure, returns failed(), called while HDF5's error
// stack still says why.
Status transfer_flat_range(hid_t dataset, hid_t mem_type, const Shape& dims, uint64_t first, uint64_t count, void* buf,
                           bool write, const std::function<Status()>& failed);

}  // namespace gcz::detail
