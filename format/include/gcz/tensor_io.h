// gcz/tensor_io.h — reading and writing gradient dumps: .npy, .npz, .safetensors, HDF5, raw binary, and
// directories of such files.
//
// Readers list the floating tensors of a file and hand out each one as a TensorSource that reads
// element ranges on demand (pread/mmap), so a dump larger than memory is never loaded whole. Tensors of
// other dtypes (integers, bools, complex, strings) are listed in skipped() with the reason, never misread.
// Writers stream tensors out in the order announced at creation and write to a temporary name that is
// renamed into place only by finish(): a failed or abandoned write leaves no partial file.
//
//   auto in = gcz::open_tensor_file("grads.safetensors", {});
//   for (std::size_t i = 0; i < (*in)->tensors().size(); ++i) {
//     auto src = (*in)->open(i);                    // Result<std::unique_ptr<TensorSource>>
//     std::vector<float> buf(n);
//     (*src)->read(0, n, buf.data());               // elements [0, n) in the tensor's own dtype
//   }
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gcz/status.h"
#include "gcz/tensor.h"

namespace gcz {

enum class TensorFileFormat { kNpy, kNpz, kSafetensors, kHdf5, kRaw, kDirectory };

const char* tensor_file_format_name(TensorFileFormat f);
// By extension: .npy .npz .safetensors .h5 .hdf5 .bin .raw; a directory (existing, or a path ending
// in '/') is kDirectory. nullopt when the extension is unknown.
std::optional<TensorFileFormat> tensor_format_from_path(const std::string& path);

// One tensor's elements, read in ranges. Elements come in C order and the tensor's own dtype
// (little-endian), whatever the file's layout (Fortran order, big-endian .npy) was.
class TensorSource {
 public:
  virtual ~TensorSource() = default;
  virtual const TensorInfo& info() const = 0;
  // Copies elements [first, first + count) to dst (count * dtype_size bytes).
  virtual Status read(uint64_t first, uint64_t count, void* dst) = 0;
  // Elements [first, first + count) where they already lie in memory, exactly as read() would copy
  // them (native byte order, in order) and aligned to their size; nullptr when the source does not
  // hold them so (then read() them). Valid until release() passes them or the source goes away.
  virtual const std::byte* view(uint64_t first, uint64_t count) {
    (void)first;
    (void)count;
    return nullptr;
  }
  // Hints that elements before `end` will not be read again, so their pages can leave memory.
  virtual void release(uint64_t end) { (void)end; }
  // After the reads: kIoError where the file they came from was changed in place since it was opened
  // (the elements read may then mix two versions of it); one replaced by a rename was read whole.
  virtual Status check_unchanged() const { return Status::ok(); }
};

struct SkippedTensor {
  std::string name;
  std::string reason;  // e.g. "dtype int64 is not floating"
  std::string file = {};  // the input it is in, where a report gathers several (encode_files)
};

struct ReadOptions {
  // For raw binary input (and required there): element dtype and shape.
  std::optional<DType> raw_dtype;
  std::optional<Shape> raw_shape;
};

class TensorFileReader {
 public:
  virtual ~TensorFileReader() = default;
  virtual const std::string& path() const = 0;
  virtual TensorFileFormat format() const = 0;
  virtual const std::vector<TensorInfo>& tensors() const = 0;
  virtual const std::vector<SkippedTensor>& skipped() const = 0;
  // Free-form strings the file carries about itself: a safetensors file's __metadata__ (in a directory
  // or a sharded checkpoint, the first file's value of each key). Empty for the other formats.
  virtual const std::map<std::string, std::string>& metadata() const = 0;
  // A reader for tensor i (an index into tensors()).
  virtual Result<std::unique_ptr<TensorSource>> open(std::size_t i) = 0;
};

// Opens `path` (format from its extension, or raw when options give raw_dtype/raw_shape). Every header
// is validated before use: a truncated or hostile file is a kFormatError naming the file and rule.
// Tensor names: the names inside the file; for a single .npy or raw file, the file's stem; inside a
// directory, the relative path without extension, joined to inner names with '/'.
//
// Errors: kIoError "PATH: cannot open: <reason>" for a missing or unreadable path; kUnsupported for an
// unknown extension, or a lone .npy holding a non-floating array; kFormatError for a file breaking its
// format's rules (truncated, header fields out of range, offsets outside the file or overlapping);
// kInvalidArgument for raw input without both raw_dtype and raw_shape.
// Notes: given raw_dtype and raw_shape, any file is read as raw (in a directory: its .bin/.raw files,
// which are otherwise skipped). A Fortran-order array in a deflated .npz member is decompressed whole
// on its first read(); every other source reads only the requested range.
Result<std::unique_ptr<TensorFileReader>> open_tensor_file(const std::string& path, const ReadOptions& options);

struct WriteOptions {
  // Formats that cannot hold bfloat16 (.npy, .npz, HDF5, directories of .npy) refuse it unless this
  // is set, in which case bfloat16 tensors are written as float32 (exactly).
  bool widen_bf16 = false;
  // A .safetensors output's __metadata__ (left out when empty); the other formats have none.
  std::map<std::string, std::string> safetensors_metadata;
};

class TensorFileWriter {
 public:
  virtual ~TensorFileWriter() = default;  // without finish(): removes the temporary file
  // Starts the next tensor (in the order given to create); then write() its elements in order.
  virtual Status begin(std::size_t index) = 0;
  // Appends count elements (in the tensor's dtype, C order) to the current tensor.
  virtual Status write(const void* src, uint64_t count) = 0;
  virtual Status end() = 0;
  // Checks every tensor was written completely, flushes, and renames into place.
  virtual Status finish() = 0;
};

// Creates a writer for `tensors` at `path`, format from the extension (a directory writes one .npy per
// tensor, names with '/' becoming subdirectories). A single-tensor format (.npy, raw) given several
// tensors, or bfloat16 without widen_bf16 where the format cannot hold it, is an error naming the rule.
// Names must be non-empty and distinct; for HDF5 and directories, where they become paths, they may not
// be absolute or contain empty, "." or ".." components. A directory target must not exist or be empty.
// .npz members are stored uncompressed (as numpy's savez does); safetensors keeps bfloat16 as BF16.
Result<std::unique_ptr<TensorFileWriter>> create_tensor_file(const std::string& path,
                                                             const std::vector<TensorInfo>& tensors,
                                                             const WriteOptions& options);

// For a program that owns its process (the gcz command calls it first): tells HDF5 not to run its
// clean-up at exit. Where a write ran out of disk space, HDF5 (1.10) cannot close the file, and its
// clean-up would then crash the process on its way out; gcz has closed, or given up and removed,
// every file by then. A program that leaves HDF5 files of its own open for that clean-up to close
// must not call it.
void skip_hdf5_cleanup_at_exit();

// The path of the input file gcz has mapped into memory at `address`, or nullptr: for a SIGBUS
// handler, which is how a mapped file that shrinks while it is read (rewritten in place) is felt.
// Async-signal-safe; the path lives as long as the mapping, which the faulting thread is still in.
const char* mapped_input_at(const void* address);

}  // namespace gcz
