// Internal pieces shared by the tensor file readers and writers: the per-format factories that
// tensor_io.cpp dispatches to, argument checks with uniform messages, a reader base holding the tensor
// lists, a memory-mapped tensor source, a writer base that enforces the begin/write/end/finish protocol
// (and widens bfloat16 when asked), and a temporary path renamed into place on commit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "file_util.h"
#include "gcz/status.h"
#include "gcz/tensor.h"
#include "gcz/tensor_io.h"
#include "npy.h"

namespace gcz::detail {

// --- per-format factories ---------------------------------------------------------------------------
// A .npy of a non-floating array is opened with the array in skipped(), as other formats list theirs.
Result<std::unique_ptr<TensorFileReader>> open_npy_reader(const std::string& path);
Result<std::unique_ptr<TensorFileReader>> open_npz_reader(const std::string& path);
Result<std::unique_ptr<TensorFileReader>> open_safetensors_reader(const std::string& path);
Result<std::unique_ptr<TensorFileReader>> open_hdf5_reader(const std::string& path);
Result<std::unique_ptr<TensorFileReader>> open_raw_reader(const std::string& path, const ReadOptions& options);
Result<std::unique_ptr<TensorFileReader>> open_directory_reader(const std::string& path, const ReadOptions& options);
// The shards a NAME.safetensors.index.json names, read as one model (tensors named as in the shards).
Result<std::unique_ptr<TensorFileReader>> open_shard_index_reader(const std::string& path, const ReadOptions& options);
// Whether the file name ends in ".safetensors.index.json" (and has more before it).
bool is_shard_index_path(const std::string& path);

using WriterResult = Result<std::unique_ptr<TensorFileWriter>>;
// `durable`: flushed to disk before it is put in place (not for a file inside a directory output).
WriterResult create_npy_writer(const std::string& path, const std::vector<TensorInfo>& tensors,
                               const WriteOptions& options, bool durable = true);
WriterResult create_npz_writer(const std::string& path, const std::vector<TensorInfo>& tensors,
                               const WriteOptions& options);
WriterResult create_safetensors_writer(const std::string& path, const std::vector<TensorInfo>& tensors,
                                       const WriteOptions& options);
WriterResult create_hdf5_writer(const std::string& path, const std::vector<TensorInfo>& tensors,
                                const WriteOptions& options);
WriterResult create_raw_writer(const std::string& path, const std::vector<TensorInfo>& tensors,
                               const WriteOptions& options);
WriterResult create_directory_writer(const std::string& path, const std::vector<TensorInfo>& tensors,
                                     const WriteOptions& options);

// --- messages and argument checks ---------------------------------------------------------------------
// "PATH: tensor 'NAME'", the prefix of every per-tensor message.
std::string tensor_context(const std::string& path, const std::string& name);
// kIoError "PATH: cannot open: <strerror>" unless `path` can be opened for reading.
Status check_readable(const std::string& path);
// kInvalidArgument unless [first, first + count) lies within numel elements.
Status check_read_range(const std::string& path, const TensorInfo& info, uint64_t numel, uint64_t first,
                        uint64_t count);
// Tensors must have non-empty, distinct names and shapes within kMaxNumel.
Status check_tensor_list(const std::string& path, const std::vector<TensorInfo>& tensors);
// kInvalidArgument unless exactly one tensor is given (for .npy and raw output).
Status check_single_tensor(const std::string& path, const std::vector<TensorInfo>& tensors, const char* format_name);
// kUnsupported for a bfloat16 tensor when the format (`holder`, e.g. ".npy") cannot hold it and the
// options do not ask for widening.
Status check_bf16_storable(const std::string& path, const std::vector<TensorInfo>& tensors, const WriteOptions& options,
                           const char* holder);
// The description of a tensor as it is stored: bfloat16 becomes float32 when `widen_bf16`.
TensorInfo stored_info(const TensorInfo& info, bool widen_bf16);
// kInvalidArgument for names that hold a NUL character, are absolute or contain empty, "." or ".."
// components (names that become paths, zip members or HDF5 group paths).
Status check_path_like_name(const std::string& path, const std::string& name);

// --- readers --------------------------------------------------------------------------------------------
// Holds what every reader reports; a format's reader fills the lists and implements open().
class ReaderBase : public TensorFileReader {
 public:
  ReaderBase(std::string path, TensorFileFormat format) : path_(std::move(path)), format_(format) {}
  const std::string& path() const override { return path_; }
  TensorFileFormat format() const override { return format_; }
  const std::vector<TensorInfo>& tensors() const override { return tensors_; }
  const std::vector<SkippedTensor>& skipped() const override { return skipped_; }
  const std::map<std::string, std::string>& metadata() const override { return metadata_; }

 protected:
  Status check_index(std::size_t i) const;

  std::string path_;
  TensorFileFormat format_;
  std::vector<TensorInfo> tensors_;
  std::vector<SkippedTensor> skipped_;
  std::map<std::string, std::string> metadata_;
};

// A tensor whose stored elements lie in a memory-mapped file at `payload_offset`, laid out as `layout`
// says. Keeps the mapping alive, so it outlives its reader; drops pages behind the reader as it goes.
class MappedTensorSource : public TensorSource {
 public:
  MappedTensorSource(std::shared_ptr<const MappedFile> file, TensorInfo info, uint64_t numel, uint64_t payload_offset,
                     ElementLayout layout);
  ~MappedTensorSource() override;
  const TensorInfo& info() const override { return info_; }
  Status read(uint64_t first, uint64_t count, void* dst) override;
  // The mapped payload itself, for an in-range read of a C-order, native-endian payload whose
  // elements are aligned in memory.
  const std::byte* view(uint64_t first, uint64_t count) override;
  void release(uint64_t end) override;
  Status check_unchanged() const override { return file_->check_unchanged(); }

 private:
  std::shared_ptr<const MappedFile> file_;
  TensorInfo info_;
  uint64_t numel_;
  uint64_t payload_offset_;
  ElementLayout layout_;
};

// --- writers --------------------------------------------------------------------------------------------
// Enforces the writer protocol for every format: tensors begun in order, each written completely,
// begin/write/end balanced, and nothing accepted after a failure. bfloat16 input is converted to
// float32 in bounded chunks before it reaches the format when the writer was created to widen.
class SequentialWriter : public TensorFileWriter {
 public:
  Status begin(std::size_t index) final;
  Status write(const void* src, uint64_t count) final;
  Status end() final;
  Status finish() final;

 protected:
  SequentialWriter(std::string path, std::vector<TensorInfo> tensors, bool widen_bf16);
  // `stored` is the tensor as the format stores it (after widening).
  virtual Status start_tensor(std::size_t index, const TensorInfo& stored) = 0;
  // `src` holds count elements in the stored dtype.
  virtual Status write_elements(const void* src, uint64_t count) = 0;
  virtual Status end_tensor() = 0;
  virtual Status finish_file() = 0;

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& input_tensors() const { return tensors_; }

 private:
  Status fail(Status s);
  Status check_usable() const;

  std::string path_;
  std::vector<TensorInfo> tensors_;
  bool widen_bf16_;
  std::size_t next_ = 0;    // index of the next tensor to begin
  bool in_tensor_ = false;  // between begin() and end()
  uint64_t numel_ = 0;      // of the current tensor
  uint64_t written_ = 0;    // elements of the current tensor written so far
  bool finished_ = false;
  Status failure_;                // the first error; every later call repeats it
  std::vector<float> widen_buf_;  // bfloat16 -> float32 chunk
};

// A sibling temporary name for `target` ("TARGET.tmp-PID-N", registered: make_temp_path) for outputs
// that a library writes by path (minizip, HDF5, directories). commit() flushes a file (not a
// directory) and renames it onto `target`; otherwise the destructor removes whatever is at the
// temporary name (file or directory tree).
class TempPath {
 public:
  explicit TempPath(std::string target);
  ~TempPath();
  TempPath(const TempPath&) = delete;
  TempPath& operator=(const TempPath&) = delete;
  const std::string& path() const { return tmp_; }
  const std::string& target() const { return target_; }
  Status commit();

 private:
  std::string target_;
  std::string tmp_;
  bool committed_ = false;
};

// Writes every tensor's elements back to back into one file (raw, .safetensors after its header,
// .npy after its per-tensor header). `prefix` gives the bytes to write before each tensor, if any.
class ContiguousWriter final : public SequentialWriter {
 public:
  using Prefix = std::function<std::string(const TensorInfo& stored)>;
  ContiguousWriter(const std::string& path, const std::vector<TensorInfo>& tensors, bool widen_bf16,
                   std::unique_ptr<AtomicFile> file, Prefix prefix = {})
      : SequentialWriter(path, tensors, widen_bf16), file_(std::move(file)), prefix_(std::move(prefix)) {}

 protected:
  Status start_tensor(std::size_t, const TensorInfo& stored) override {
    item_size_ = dtype_size(stored.dtype);
    if (!prefix_) return Status::ok();
    const std::string bytes = prefix_(stored);
    return file_->write(bytes.data(), bytes.size());
  }
  Status write_elements(const void* src, uint64_t count) override { return file_->write(src, count * item_size_); }
  Status end_tensor() override { return Status::ok(); }
  Status finish_file() override { return file_->commit(); }

 private:
  std::unique_ptr<AtomicFile> file_;
  Prefix prefix_;
  std::size_t item_size_ = 4;
};

}  // namespace gcz::detail
