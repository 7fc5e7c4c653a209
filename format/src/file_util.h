// Internal file helpers shared by the container and tensor I/O: a read-only mapping whose pages can be
// dropped after use, the memory bounds, and the check that an input was not rewritten in place while
// read (mapped_file.cpp); output paths checked before any work (output_paths.cpp); and an output file
// written under a temporary name and renamed on commit (file_util.cpp).
#pragma once

#include <sys/stat.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gcz/container.h"
#include "gcz/status.h"

namespace gcz::detail {

// The version of a file that fstat or stat describes.
FileVersion version_of(const struct stat& st);
// kIoError where `path` still names the input file `opened` (its device and inode) but its size or
// change time differ: it was rewritten in place since it was opened, and what was read of it may mix
// two versions. (No tool sets the change time back, as `cp -p` or `rsync --inplace -t` do the
// modification time.) A file removed, or replaced by another under its name, is not an error: an
// open file or a mapping keeps the one opened.
Status check_input_unchanged(const std::string& path, const FileVersion& opened);

// A read-only memory map of a whole file (empty files map to nothing).
class MappedFile {
 public:
  static Result<std::unique_ptr<MappedFile>> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Drops the resident pages of [begin, end) (page-rounded inward); they are read again if touched.
  void release(uint64_t begin, uint64_t end) const;
  // kIoError where the file at path() is still the one mapped but its size or change time has
  // changed since (rewritten in place, read perhaps half old, half new): check_input_unchanged.
  Status check_unchanged() const { return check_input_unchanged(path_, version_); }

 private:
  MappedFile() = default;
  std::string path_;
  std::byte* data_ = nullptr;
  uint64_t size_ = 0;
  FileVersion version_;   // as opened
  void* slot_ = nullptr;  // its entry in the table mapped_input_at reads (none when the table is full)
};

// The error for an input that is not a regular file (a pipe, a device, a socket).
Status not_a_regular_file(const std::string& path);

// The machine's physical memory in bytes (0 when unknown).
uint64_t physical_memory_bytes();
// The most memory this process may hold: the physical memory, or less where a limit says so: of its
// address space or data segment (ulimit -v, -d), or of its cgroup or one above it (cgroup v2's
// memory.max, v1's memory.limit_in_bytes; read once), as the numpy reader bounds it. 0 when none is known.
uint64_t memory_limit_bytes();
// kUnsupported where reading something would take `bytes` of memory, more than half of what this
// process may use (the rest is for the work it describes); `where` names it ("grads.gcz: the index"),
// e.g. a JSON text's tree (JsonShape::dom_bytes).
Status check_memory_to_read(uint64_t bytes, const std::string& where);

// `path` made absolute, with what exists of it resolved ("s.gcz" and "./s.gcz" give the same).
std::filesystem::path resolved_path(const std::string& path);
// Whether two paths name the same file, whether or not it exists yet.
bool same_file(const std::string& a, const std::string& b);

// `path` without the slashes that end it ("out/" is "out"; "/" stays "/"): a directory's own name.
std::string without_trailing_slashes(std::string path);

// The directory that holds `path` ("." for a bare name).
std::filesystem::path directory_of(const std::string& path);

// Refuses an output path that is empty or "-", or that exists and is not a regular file (a directory,
// a symbolic link, a device, a pipe): the rename that puts an output in place would replace it.
Status check_output_file(const std::string& path);

// Refuses "-", which names standard output to many tools, and would be a file named "-" here.
Status check_output_spelling(const std::string& path);

// The directory an output (a file, or a directory named with or without a trailing '/') goes into
// exists and this process may create and rename entries in it: io_error naming it otherwise. The
// output's name and path leave room for the temporary suffix (invalid_argument otherwise).
Status check_output_parent(const std::string& path);

// The most bytes make_temp_path adds to a name (".tmp-PID-N"), and the most a name (255 on common file
// systems) and a path (4096 with its NUL on Linux) may have.
inline constexpr std::size_t kTempSuffixBytes = 23, kMostNameBytes = 255, kMostPathBytes = 4095;

// Temporary paths of outputs not yet in place (files or directories), registered so that
// remove_unfinished_outputs() (gcz/pipeline.h) can remove them for a program stopped by a signal.
// make_temp_path names one beside `target` ("TARGET.tmp-PID-N") and registers it; rename_temp_path
// puts it in place, with the permission bits of the regular file it replaces, and forgets it (0, or
// the errno; ENOENT once remove_unfinished_outputs took it; with `replaces`, EEXIST when `dest` is no
// longer that version); forget_temp_path forgets one that was removed or never made.
std::string make_temp_path(const std::string& target);
int rename_temp_path(const std::string& tmp, const std::string& dest, const std::optional<FileVersion>& replaces = {});
// rename_temp_path for two, with no removal by remove_unfinished_outputs between them: `first`
// (whose `replaces` must be empty) goes in place keeping the file it replaces, then `second`; if
// `second` cannot, `first`'s destination is put back as it was (the old file exchanged back, or the
// new one removed). A file system that cannot exchange two names (renameat2 RENAME_EXCHANGE) gets
// `second` first, then `first`. `second`'s `replaces` is checked before anything moves, and `first`
// is taken back only while its destination holds this run's file. Returns {0, 0}, or which failed
// and the errno: 1 `first` (nothing changed), 2 `second` (nothing changed), 3 `first` after `second`
// went in place (no exchange), 4 `second`, with `first` in place and not taken back, 5 the same, the
// file `first` replaced kept at its temporary name, 6 and 7 as 4 and 5 but with another process's
// file at `first`'s destination since. Where nothing was at `first`'s destination, nothing there is
// overwritten (a no-replace rename, where the file system has one).
struct TempRename {
  std::string tmp, dest;
  std::optional<FileVersion> replaces;
};
std::pair<int, int> rename_temp_pair(const TempRename& first, const TempRename& second);
void forget_temp_path(const std::string& tmp);

// fsync of a file written and closed elsewhere (best effort).
void sync_file(const std::string& path);

// Writes `path` via a temporary file in the same directory; commit() flushes it to disk (unless not
// `durable`: a file inside a directory output, which is put in place as a whole) and renames it into
// place, if `path` is still the version `replaces` names (GczWriter::create). Destroying an
// uncommitted AtomicFile removes the temporary, so a failed write leaves nothing behind.
class AtomicFile {
 public:
  static Result<std::unique_ptr<AtomicFile>> create(const std::string& path, bool durable = true,
                                                    std::optional<FileVersion> replaces = std::nullopt);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  Status write(const void* data, std::size_t n);  // appends
  Status write_zeros(std::size_t n);
  uint64_t position() const { return pos_; }
  // Flushes (when durable) and closes the temporary file: what commit() does before its rename.
  Status close();
  Status commit();
  // Commits two files, `first` (which must not have `replaces`) then `second`, with no signal cleanup
  // between the renames (rename_temp_pair): a program stopped by SIGINT, SIGTERM or SIGHUP leaves
  // both in place or neither, and when either cannot be put in place neither is, except on a file
  // system that cannot exchange two names, where `second` goes first and an error then says so.
  static Status commit_together(AtomicFile& first, AtomicFile& second);
  const FileVersion& version() const { return version_; }  // once committed: the file in place
  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return tmp_path_; }  // where it is written until in place

 private:
  AtomicFile() = default;
  Status rename_error(int err) const;
  Status placed();  // after the rename: records the file in place
  std::string path_;
  std::string tmp_path_;
  int fd_ = -1;
  int kept_ = -1;  // once closed, until in place: a descriptor of the file, to name its version
  uint64_t pos_ = 0;
  static constexpr uint64_t kWriteBehindBytes = uint64_t{32} << 20;
  uint64_t written_behind_ = 0;  // the bytes before this were handed to the disk (durable files)
  bool durable_ = true;
  bool committed_ = false;
  std::optional<FileVersion> replaces_;
  FileVersion version_;
};

// Reads the whole file into a string, refusing files larger than max_bytes.
Result<std::string> read_small_file(const std::string& path, uint64_t max_bytes);

}  // namespace gcz::detail
