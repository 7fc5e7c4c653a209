// The .npy array header (numpy format versions 1.0, 2.0 and 3.0) and the element layouts it can
// describe, shared by the .npy, .npz and directory readers and writers.
//
// Layout of a .npy file: "\x93NUMPY", major and minor version bytes, the header length (uint16 LE in
// version 1, uint32 LE in 2 and 3), then the header: a Python dict literal with exactly the keys
// 'descr', 'fortran_order' and 'shape', padded with spaces and ended by '\n'. The array data follows.
//
//   GCZ_ASSIGN_OR_RETURN(NpyPreamble pre, parse_npy_preamble(bytes, n));   // needs kNpyPreambleMax bytes
//   GCZ_ASSIGN_OR_RETURN(NpyHeader h, parse_npy_header(bytes, pre.header_end));
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "gcz/status.h"
#include "gcz/tensor.h"

namespace gcz::detail {

// Bytes that always suffice to read the magic, version and header length.
inline constexpr std::size_t kNpyPreambleMax = 12;
// Largest header accepted: numpy itself writes a few hundred bytes; anything bigger is hostile.
inline constexpr uint64_t kNpyMaxHeaderBytes = uint64_t{1} << 20;

struct NpyPreamble {
  int major = 0;
  int minor = 0;
  uint64_t header_end = 0;  // offset of the array data: preamble plus header
};

// Reads the magic, version and header length from the first `size` bytes (at least kNpyPreambleMax
// unless the file is shorter). Errors (kFormatError, kUnsupported for unknown versions) carry no file
// name; callers add it.
Result<NpyPreamble> parse_npy_preamble(const std::byte* data, uint64_t size);

// How a payload stores its elements relative to what a TensorSource hands out (C order, little-endian).
struct ElementLayout {
  std::size_t item_size = 4;
  bool byte_swapped = false;   // big-endian payload
  bool fortran_order = false;  // column-major payload (only set when it differs from C order)
  Shape shape;                 // needed for Fortran order
};

struct NpyHeader {
  std::string descr;             // as written, for messages ("<f4"; "structured" for a list)
  std::optional<DType> dtype;    // set when the array holds a supported floating type
  std::string not_float_reason;  // when !dtype: e.g. "dtype <i8 is not floating"
  bool big_endian = false;
  bool fortran_order = false;
  Shape shape;
  uint64_t numel = 0;          // checked against kMaxNumel
  uint64_t data_offset = 0;    // where the array data starts
  uint64_t payload_bytes = 0;  // numel * item size (floating arrays only)

  ElementLayout layout() const;
};

// Parses the whole header; `data` starts at the magic and holds at least the preamble's header_end
// bytes. Errors carry no file name.
Result<NpyHeader> parse_npy_header(const std::byte* data, uint64_t size);

// The complete header (magic to '\n') numpy would write for a C-order little-endian array: version 1.0
// padded so the data starts on a 64-byte boundary, or 2.0 when the header exceeds 65535 bytes.
std::string make_npy_header(DType dtype, const Shape& shape);

// "<f2", "<f4" or "<f8" (bfloat16 has no numpy descr: callers widen it first).
const char* npy_descr(DType dtype);

// Copies C-order elements [first, first + count) of a payload laid out as `layout` to dst, gathering
// from a Fortran-order payload and byte-swapping a big-endian one.
void copy_elements(const ElementLayout& layout, const std::byte* payload, uint64_t first, uint64_t count, void* dst);
// Reverses the bytes of each of count items in place.
void byte_swap_elements(void* data, uint64_t count, std::size_t item_size);

}  // namespace gcz::detail
