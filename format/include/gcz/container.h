// gcz/container.h — the .gcz container (docs/FORMAT.md): a streaming writer and a validating reader.
//
// The writer appends tensors one at a time, each as the named streams its codec produces, and writes
// the JSON index and trailer at the end; the file appears under its name only when finish() succeeds.
// The reader checks every structural rule of FORMAT.md §6 when it opens a file, and each stream's
// checksum before handing out its bytes.
//
//   auto w = gcz::GczWriter::create("out.gcz");
//   (*w)->begin_tensor(record);           // record: info, codec chain, stream names
//   (*w)->append(0, bytes);                                    // stream 0, as many times as needed
//   (*w)->end_tensor();
//   (*w)->finish({});
//
//   auto r = gcz::GczReader::open("out.gcz");
//   for (const gcz::TensorRecord& t : (*r)->index().tensors) { ... (*r)->open_stream(i, s) ... }
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gcz/codec.h"
#include "gcz/metrics.h"
#include "gcz/status.h"
#include "gcz/tensor.h"

namespace gcz {

inline constexpr uint16_t kFormatVersionMajor = 1;
inline constexpr uint16_t kFormatVersionMinor = 2;
inline constexpr uint64_t kStreamAlignment = 64;
inline constexpr uint64_t kMaxIndexBytes = uint64_t{64} << 20;
inline constexpr std::size_t kMaxIndexDepth = 512;  // arrays and objects nested in the index, at most
inline constexpr std::size_t kMaxNameBytes = 4096;
inline constexpr const char* kRngName = "philox4x32-10";

enum class StreamEncoding { kRaw, kZstd };
const char* stream_encoding_name(StreamEncoding e);

struct StreamRecord {
  std::string name;
  StreamEncoding encoding = StreamEncoding::kRaw;
  uint64_t offset = 0;
  uint64_t length = 0;  // stored bytes
  uint64_t size = 0;    // bytes after undoing the encoding
  uint64_t xxh3 = 0;    // of the stored bytes
};

struct CodecStage {
  std::string name;
  Params params;
};

struct TensorRecord {
  TensorInfo info;
  std::vector<CodecStage> chain;  // element codec first, then stream stages (zstd)
  uint64_t seed = 0;
  std::string rng = kRngName;
  std::vector<StreamRecord> streams;
  std::optional<Metrics> metrics;
};

struct FileIndex {
  uint16_t version_minor = kFormatVersionMinor;
  std::string producer;
  std::map<std::string, std::string> metadata;
  std::vector<TensorRecord> tensors;
};

// The canonical spec text of a chain, e.g. "fp16+zstd:level=3".
std::string chain_to_string(const std::vector<CodecStage>& chain);
// The index as FORMAT.md §5 writes it (JSON text).
std::string index_to_json(const FileIndex& index);

// Which file a path named when it was read: for a writer that must not replace a file changed since
// (another process's update would be lost without a word). The inode's change time and size are
// part of it, as a file system may give a new file the inode number of the one it replaced.
struct FileVersion {
  bool exists = false;  // false: the path named no file
  uint64_t device = 0, inode = 0, size = 0;
  int64_t change_ns = 0;  // st_ctim in nanoseconds
  bool operator==(const FileVersion&) const = default;
  static Result<FileVersion> of(const std::string& path);  // kIoError only when the path cannot be examined
};

class GczWriter {
 public:
  // Writes to a temporary file next to `path`; an empty path counts bytes without writing (for eval).
  // With `replaces`, finish() puts the file in place only if `path` still names that version (no
  // file, or the same file), checked and renamed under a lock; otherwise it fails with kIoError and
  // leaves `path` as it found it.
  static Result<std::unique_ptr<GczWriter>> create(const std::string& path,
                                                   std::optional<FileVersion> replaces = std::nullopt);
  ~GczWriter();

  // Calls out of order (append with no tensor open, finish with one open, ...) are kInvalidArgument.

  // Starts a tensor. `record` gives info, chain, seed and the stream names (offsets etc. are filled
  // in here); a name that is not UTF-8, or that the file has already, is kInvalidArgument. When the
  // chain has a zstd stage, each stream is compressed if that makes its first chunk smaller
  // (CODECS.md).
  Status begin_tensor(const TensorRecord& record);
  // Appends raw (pre-zstd) bytes to stream `stream` of the current tensor.
  Status append(std::size_t stream, ByteSpan bytes);
  // Completes the current tensor. Returns its stored record (streams with offsets, lengths, checksums).
  Result<const TensorRecord*> end_tensor();
  // Records metrics for the tensor last completed (written into the index as informative data).
  void attach_metrics(const Metrics& metrics);
  // Writes the index and trailer and renames the file into place. Returns the file size. With
  // `in_place` false the file is complete (and flushed to disk) but left under its temporary name,
  // for commit_together. The index is first checked as GczReader::open checks it: a record that
  // breaks a rule of the format (a codec parameter or stream the reader refuses, a stream of the
  // wrong size, a shape) fails, kInvalidArgument (a codec gcz does not know, kUnsupported), with
  // nothing written. After a failed finish() the writer takes no more calls.
  Result<uint64_t> finish(const std::map<std::string, std::string>& metadata, bool in_place = true);
  // Puts a file finished with `in_place` false in place.
  Status commit();
  // Puts two files finished with `in_place` false in place, `first` (created without `replaces`)
  // then `second`, with no signal cleanup between them: a gcz stopped by SIGINT, SIGTERM or SIGHUP
  // leaves both or neither, and when either cannot be put in place (`second`'s `replaces` changed by
  // another process, a directory that refuses the rename) neither is: `first`'s path gets back the
  // file it held. A file system that cannot exchange two names (renameat2) gets `second` first.
  static Status commit_together(GczWriter& first, GczWriter& second);
  // Once the file is in place: the file, as FileVersion::of would name it then.
  FileVersion version() const;

  // Bytes the current tensor's index entry takes (without metrics), for the report.
  uint64_t index_entry_bytes(const TensorRecord& record) const;

 private:
  struct Impl;
  explicit GczWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Sequential access to the decoded bytes of one stream; it reads the file of the GczReader that made
// it, which must outlive it.
class StreamCursor {
 public:
  virtual ~StreamCursor() = default;
  // Copies the next n decoded bytes to dst; reading past the stream's size is an error.
  virtual Status read(void* dst, uint64_t n) = 0;
};

class GczReader {
 public:
  // Opens and validates `path` (every rule of FORMAT.md §6 except those checked on read).
  static Result<std::unique_ptr<GczReader>> open(const std::string& path);
  ~GczReader();

  const std::string& path() const;
  uint64_t file_size() const;
  const FileIndex& index() const;
  // The tensor named `name`, or nullptr.
  const TensorRecord* find(const std::string& name) const;

  // Checks the checksum of stream `stream` of tensor `tensor`, then returns a cursor over its
  // decoded bytes (zstd decompressed on the fly; the frame's size is checked at the end). Indices
  // out of range are kInvalidArgument.
  Result<std::unique_ptr<StreamCursor>> open_stream(std::size_t tensor, std::size_t stream) const;

  // Everything: every stream checksum, every zstd frame decoded to its declared size, zero padding.
  // progress(done_bytes, total_bytes) is called as it goes, if set.
  Status verify(const std::function<void(uint64_t, uint64_t)>& progress) const;

 private:
  struct Impl;
  explicit GczReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gcz
