// .npz archives: a zip file (via minizip) whose members NAME.npy each hold one array. Stored members are
// read straight from a memory map of the archive; deflated ones are decompressed as read() walks through
// them. Written with stored members (as numpy's savez does), zip64 where a member needs it.
#include <libdeflate.h>
#include <minizip/unzip.h>
#include <minizip/zip.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include "file_kind.h"
#include "gcz/detail/utf8.h"
#include "tensor_io_common.h"

namespace gcz::detail {
namespace {

constexpr uint64_t kZipChunk = uint64_t{1} << 30;  // minizip reads and writes at most an int per call
constexpr uint64_t kSkipChunk = uint64_t{1} << 16;
constexpr uint64_t kWholeChunk = uint64_t{1} << 26;  // growth step when buffering a whole member

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// One minizip handle shared by a reader and its sources. minizip has a single "current member" per
// handle, so `owner` records which source has it open; any other source repositions before reading.
struct ZipHandle {
  unzFile zip = nullptr;
  const void* owner = nullptr;
  ~ZipHandle() {
    if (!zip) return;
    if (owner) unzCloseCurrentFile(zip);
    unzClose(zip);
  }
};

// Reads up to n bytes of the current member; fewer only where the member ends.
Result<uint64_t> read_member(unzFile zip, void* dst, uint64_t n, const std::string& ctx) {
  auto* p = static_cast<char*>(dst);
  uint64_t done = 0;
  while (done < n) {
    const int r = unzReadCurrentFile(zip, p + done, static_cast<unsigned>(std::min(n - done, kZipChunk)));
    if (r < 0)
      return format_error(ctx + ": cannot decompress the zip member (minizip error " + std::to_string(r) + ")");
    if (r == 0) break;
    done += static_cast<uint64_t>(r);
  }
  return done;
}

struct Member {
  TensorInfo info;
  NpyHeader header;
  unz64_file_pos pos{};     // where the member's entry is, to reopen it
  bool stored = false;      // data readable straight from the map
  uint64_t map_offset = 0;  // stored: file offset of the array data
};

// Reads a deflated member in order. A read() behind the current position starts the member over; a
// Fortran-order member is decompressed whole on the first read, as its C-order elements are scattered.
class NpzStreamSource final : public TensorSource {
 public:
  NpzStreamSource(std::shared_ptr<ZipHandle> zip, std::shared_ptr<const MappedFile> file, Member m,
                  const std::string& path)
      : zip_(std::move(zip)),
        file_(std::move(file)),
        m_(std::move(m)),
        path_(path),
        ctx_(tensor_context(path, m_.info.name)),
        layout_(m_.header.layout()) {}
  ~NpzStreamSource() override { drop_member(); }
  const TensorInfo& info() const override { return m_.info; }
  // minizip reads the archive through a file of its own, opened by path just after the mapping: a
  // change in place shows in the version the mapping was opened at.
  Status check_unchanged() const override { return file_->check_unchanged(); }

  Status read(uint64_t first, uint64_t count, void* dst) override {
    GCZ_RETURN_IF_ERROR(check_read_range(path_, m_.info, m_.header.numel, first, count));
    if (count == 0) return Status::ok();
    const Status s = layout_.fortran_order ? load_whole() : stream_read(first, count, dst);
    if (!s.is_ok()) {
      drop_member();  // the stream position is unknown now: the next read starts over
      whole_ = {};
      return s;
    }
    if (layout_.fortran_order) copy_elements(layout_, whole_.data(), first, count, dst);
    return Status::ok();
  }

 private:
  Status stream_read(uint64_t first, uint64_t count, void* dst) {
    if (zip_->owner != this || first < next_) GCZ_RETURN_IF_ERROR(rewind());
    GCZ_RETURN_IF_ERROR(skip_to(first));
    GCZ_RETURN_IF_ERROR(read_exact(dst, count * layout_.item_size));
    next_ = first + count;
    if (layout_.byte_swapped) byte_swap_elements(dst, count, layout_.item_size);
    if (next_ == m_.header.numel) return finish_member();
    return Status::ok();
  }

  void drop_member() {
    if (zip_->owner != this) return;
    unzCloseCurrentFile(zip_->zip);
    zip_->owner = nullptr;
  }

  // Opens the member and positions the stream at its first element.
  Status rewind() {
    if (zip_->owner) unzCloseCurrentFile(zip_->zip);
    zip_->owner = nullptr;
    if (unzGoToFilePos64(zip_->zip, &m_.pos) != UNZ_OK || unzOpenCurrentFile(zip_->zip) != UNZ_OK) {
      return format_error(ctx_ + ": cannot reopen the zip member");
    }
    zip_->owner = this;
    next_ = 0;
    return skip_bytes(m_.header.data_offset);
  }

  Status skip_to(uint64_t element) {
    const uint64_t bytes = (element - next_) * layout_.item_size;
    next_ = element;
    return skip_bytes(bytes);
  }

  Status skip_bytes(uint64_t n) {
    std::vector<char> scratch(std::min(n, kSkipChunk));
    for (uint64_t left = n; left > 0;) {
      const uint64_t k = std::min(left, kSkipChunk);
      GCZ_RETURN_IF_ERROR(read_exact(scratch.data(), k));
      left -= k;
    }
    return Status::ok();
  }

  Status read_exact(void* dst, uint64_t n) {
    GCZ_ASSIGN_OR_RETURN(uint64_t got, read_member(zip_->zip, dst, n, ctx_));
    if (got != n) return format_error(ctx_ + ": the zip member ends before its npy header's shape does");
    return Status::ok();
  }

  // Closing after the last byte is when minizip checks the member's CRC-32.
  Status finish_member() {
    const int r = unzCloseCurrentFile(zip_->zip);
    zip_->owner = nullptr;
    if (r == UNZ_CRCERROR) return format_error(ctx_ + ": the zip member's CRC-32 does not match its data");
    if (r != UNZ_OK)
      return format_error(ctx_ + ": cannot close the zip member (minizip error " + std::to_string(r) + ")");
    return Status::ok();
  }

  // The buffer grows in steps as decompressed bytes actually arrive, so a member claiming a huge shape
  // cannot make us allocate much more than it really inflates to.
  Status load_whole() {
    if (loaded_) return Status::ok();
    GCZ_RETURN_IF_ERROR(rewind());
    const uint64_t total = m_.header.payload_bytes;
    for (uint64_t done = 0; done < total;) {
      const uint64_t k = std::min(total - done, kWholeChunk);
      whole_.resize(done + k);
      GCZ_RETURN_IF_ERROR(read_exact(whole_.data() + done, k));
      done += k;
    }
    GCZ_RETURN_IF_ERROR(finish_member());
    loaded_ = true;
    return Status::ok();
  }

  std::shared_ptr<ZipHandle> zip_;
  std::shared_ptr<const MappedFile> file_;
  Member m_;
  std::string path_;
  std::string ctx_;  // "PATH: tensor 'NAME'", for messages
  ElementLayout layout_;
  uint64_t next_ = 0;  // next element the open stream will deliver
  std::vector<std::byte> whole_;
  bool loaded_ = false;
};

class NpzReader final : public ReaderBase {
 public:
  NpzReader(const std::string& path, std::shared_ptr<const MappedFile> file, std::shared_ptr<ZipHandle> zip)
      : ReaderBase(path, TensorFileFormat::kNpz), file_(std::move(file)), zip_(std::move(zip)) {}

  Status list_members();

  Result<std::unique_ptr<TensorSource>> open(std::size_t i) override {
    GCZ_RETURN_IF_ERROR(check_index(i));
    const Member& m = members_[i];
    if (m.stored) {
      return std::unique_ptr<TensorSource>(
          new MappedTensorSource(file_, m.info, m.header.numel, m.map_offset, m.header.layout()));
    }
    return std::unique_ptr<TensorSource>(new NpzStreamSource(zip_, file_, m, path_));
  }

 private:
  Result<std::string> current_name(unz_file_info64& fi);
  Status add_member(const std::string& tensor_name, const unz_file_info64& fi);
  Result<NpyHeader> read_member_header(const std::string& ctx, const std::string& member_name, uint64_t& stream_pos);

  std::shared_ptr<const MappedFile> file_;
  std::shared_ptr<ZipHandle> zip_;
  std::vector<Member> members_;  // parallel to tensors_
};

Result<std::string> NpzReader::current_name(unz_file_info64& fi) {
  if (unzGetCurrentFileInfo64(zip_->zip, &fi, nullptr, 0, nullptr, 0, nullptr, 0) != UNZ_OK) {
    return format_error(path_ + ": damaged zip central directory entry");
  }
  std::string name(fi.size_filename, '\0');
  if (unzGetCurrentFileInfo64(zip_->zip, &fi, name.data(), static_cast<uLong>(name.size()), nullptr, 0, nullptr, 0) !=
      UNZ_OK) {
    return format_error(path_ + ": damaged zip central directory entry");
  }
  return name;
}

// Reads the member's npy header through the decompressed stream; also reports where the member's data
// starts in the archive (meaningful for stored members).
Result<NpyHeader> NpzReader::read_member_header(const std::string& ctx, const std::string& member_name,
                                                uint64_t& stream_pos) {
  if (unzOpenCurrentFile(zip_->zip) != UNZ_OK) return format_error(ctx + ": cannot open the zip member");
  zip_->owner = this;
  stream_pos = unzGetCurrentFileZStreamPos64(zip_->zip);
  const int extra_size = unzGetLocalExtrafield(zip_->zip, nullptr, 0);
  std::vector<std::byte> buf(kNpyPreambleMax);
  auto result = [&]() -> Result<NpyHeader> {
    // The member's local header repeats its name just before its extra field and data. minizip checks
    // that the two names have one length; the bytes must match too, as numpy's reader requires: a
    // name that differs would give the tensor a name other tools do not see.
    const uint64_t name_end = stream_pos - static_cast<uint64_t>(std::max(extra_size, 0));
    if (extra_size < 0 || stream_pos > file_->size() || name_end < member_name.size() ||
        std::memcmp(file_->data() + (name_end - member_name.size()), member_name.data(), member_name.size()) != 0) {
      return format_error(ctx + ": the zip member's local header names it differently from the central directory");
    }
    GCZ_ASSIGN_OR_RETURN(uint64_t got, read_member(zip_->zip, buf.data(), buf.size(), ctx));
    auto pre = parse_npy_preamble(buf.data(), got);
    if (!pre) return pre.status().with_context(ctx);
    if (got == buf.size() && pre->header_end > got) {
      buf.resize(pre->header_end);  // at most 1 MiB + 12, capped by parse_npy_preamble
      GCZ_ASSIGN_OR_RETURN(uint64_t more, read_member(zip_->zip, buf.data() + got, buf.size() - got, ctx));
      got += more;
    }
    auto header = parse_npy_header(buf.data(), got);
    if (!header) return header.status().with_context(ctx);
    return header;
  }();
  unzCloseCurrentFile(zip_->zip);  // before the end of the data: no CRC check yet, nothing to report
  zip_->owner = nullptr;
  return result;
}

Status NpzReader::add_member(const std::string& tensor_name, const unz_file_info64& fi) {
  const std::string ctx = tensor_context(path_, tensor_name);
  if (fi.flag & 1) {
    skipped_.push_back({tensor_name, "the zip member is encrypted"});
    return Status::ok();
  }
  if (fi.compression_method != 0 && fi.compression_method != Z_DEFLATED) {
    skipped_.push_back({tensor_name, "zip compression method " + std::to_string(fi.compression_method) +
                                         " is not supported (stored and deflated are)"});
    return Status::ok();
  }
  uint64_t stream_pos = 0;
  GCZ_ASSIGN_OR_RETURN(NpyHeader header, read_member_header(ctx, tensor_name + ".npy", stream_pos));
  if (!header.dtype) {
    skipped_.push_back({tensor_name, header.not_float_reason});
    return Status::ok();
  }
  const uint64_t needed = header.data_offset + header.payload_bytes;  // both bounded: no overflow
  if (fi.uncompressed_size != needed) {
    return format_error(ctx + ": the zip member holds " + std::to_string(fi.uncompressed_size) +
                        " bytes, but its npy header (shape " + shape_to_string(header.shape) + ", " + header.descr +
                        ") needs " + std::to_string(needed));
  }
  Member m;
  m.info = TensorInfo{tensor_name, *header.dtype, header.shape};
  m.stored = fi.compression_method == 0;
  if (m.stored) {
    if (fi.compressed_size != fi.uncompressed_size || stream_pos > file_->size() ||
        file_->size() - stream_pos < needed) {
      return format_error(ctx + ": the stored zip member runs past the end of the archive");
    }
    m.map_offset = stream_pos + header.data_offset;
    // minizip checks a member's CRC-32 only when it is read through to its end, which a stored
    // member read from the map never is: check it here, over the whole member, header and data.
    // libdeflate's CRC-32 (carry-less multiplication where the CPU has it) runs about as fast as
    // the bytes can be read; zlib's takes three times as long.
    const uint32_t crc = libdeflate_crc32(0, file_->data() + stream_pos, static_cast<std::size_t>(needed));
    if (crc != fi.crc) return format_error(ctx + ": the zip member's CRC-32 does not match its data");
  }
  if (unzGetFilePos64(zip_->zip, &m.pos) != UNZ_OK) return format_error(ctx + ": cannot locate the zip member");
  m.header = std::move(header);
  tensors_.push_back(m.info);
  members_.push_back(std::move(m));
  return Status::ok();
}

Status NpzReader::list_members() {
  std::set<std::string> seen;
  int r = unzGoToFirstFile(zip_->zip);
  for (; r == UNZ_OK; r = unzGoToNextFile(zip_->zip)) {
    unz_file_info64 fi{};
    GCZ_ASSIGN_OR_RETURN(std::string name, current_name(fi));
    if (ends_with(name, "/")) continue;  // a directory entry holds nothing
    if (!seen.insert(name).second) return format_error(path_ + ": zip member '" + name + "' appears twice");
    if (!ends_with(name, ".npy")) {
      skipped_.push_back({name, "not a .npy member"});
      continue;
    }
    GCZ_RETURN_IF_ERROR(add_member(name.substr(0, name.size() - 4), fi));
  }
  if (r != UNZ_END_OF_LIST_OF_FILE) return format_error(path_ + ": damaged zip central directory");
  return Status::ok();
}

class NpzWriter final : public SequentialWriter {
 public:
  NpzWriter(const std::string& path, const std::vector<TensorInfo>& tensors, bool widen, std::unique_ptr<TempPath> temp,
            zipFile zip)
      : SequentialWriter(path, tensors, widen), temp_(std::move(temp)), zip_(zip) {}
  ~NpzWriter() override {
    if (zip_) zipClose(zip_, nullptr);  // abandoned: close, then temp_ removes the file
  }

 protected:
  Status start_tensor(std::size_t, const TensorInfo& stored) override {
    const std::string header = make_npy_header(stored.dtype, stored.shape);
    const uint64_t member_bytes = header.size() + stored.byte_size().value();
    zip_fileinfo zi{};
    zi.tmz_date.tm_mday = 1;  // a fixed 1980-01-01 timestamp keeps the output reproducible
    zi.tmz_date.tm_year = 1980;
    const int zip64 = member_bytes >= 0xFFFFFFFFu ? 1 : 0;
    const std::string member = stored.name + ".npy";
    // General-purpose bit 11: the name is UTF-8 (without it, readers such as numpy take it as CP437).
    const bool ascii = std::all_of(member.begin(), member.end(), [](char c) { return (c & 0x80) == 0; });
    const uLong flags = !ascii && detail::is_utf8(member) ? 1u << 11 : 0;
    if (zipOpenNewFileInZip4_64(zip_, member.c_str(), &zi, nullptr, 0, nullptr, 0, nullptr, /*method=*/0, /*level=*/0,
                                /*raw=*/0, -MAX_WBITS, DEF_MEM_LEVEL, Z_DEFAULT_STRATEGY, /*password=*/nullptr,
                                /*crcForCrypting=*/0, /*versionMadeBy=*/0, flags, zip64) != ZIP_OK) {
      return io_error(tensor_context(path(), stored.name) + ": cannot add the zip member");
    }
    item_size_ = dtype_size(stored.dtype);
    name_ = stored.name;
    return write_bytes(header.data(), header.size());
  }
  Status write_elements(const void* src, uint64_t count) override { return write_bytes(src, count * item_size_); }
  Status end_tensor() override {
    if (zipCloseFileInZip(zip_) != ZIP_OK)
      return io_error(tensor_context(path(), name_) + ": cannot finish the zip member");
    return Status::ok();
  }
  Status finish_file() override {
    const int r = zipClose(zip_, nullptr);
    zip_ = nullptr;
    if (r != ZIP_OK) return io_error(path() + ": cannot write the zip central directory");
    return temp_->commit();
  }

 private:
  Status write_bytes(const void* src, uint64_t n) {
    const auto* p = static_cast<const char*>(src);
    for (uint64_t done = 0; done < n;) {
      const uint64_t k = std::min(n - done, kZipChunk);
      errno = 0;
      if (zipWriteInFileInZip(zip_, p + done, static_cast<unsigned>(k)) != ZIP_OK) {
        return io_error(tensor_context(path(), name_) + ": write failed" +
                        (errno != 0 ? std::string(": ") + std::strerror(errno) : std::string()));
      }
      done += k;
    }
    return Status::ok();
  }

  std::unique_ptr<TempPath> temp_;
  zipFile zip_;
  std::size_t item_size_ = 4;
  std::string name_;
};

}  // namespace

Result<std::unique_ptr<TensorFileReader>> open_npz_reader(const std::string& path) {
  GCZ_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> mapped, MappedFile::open(path));
  auto zip = std::make_shared<ZipHandle>();
  // An archive of no members (numpy's savez() with no arrays) is its end record alone, with no
  // comment; minizip does not open it.
  static constexpr unsigned char kEmptyZip[22] = {'P', 'K', 5, 6};
  if (mapped->size() == sizeof kEmptyZip && std::memcmp(mapped->data(), kEmptyZip, sizeof kEmptyZip) == 0) {
    return std::unique_ptr<TensorFileReader>(new NpzReader(path, std::move(mapped), std::move(zip)));
  }
  zip->zip = unzOpen64(path.c_str());
  if (!zip->zip) {
    return format_error(path + ": not a zip archive (no readable central directory)" +
                        tensor_input_note(sniff_file_kind(mapped->data(), mapped->size()), FileKind::kNpz));
  }
  auto reader = std::make_unique<NpzReader>(path, std::move(mapped), std::move(zip));
  GCZ_RETURN_IF_ERROR(reader->list_members());
  return std::unique_ptr<TensorFileReader>(std::move(reader));
}

WriterResult create_npz_writer(const std::string& path, const std::vector<TensorInfo>& tensors,
                               const WriteOptions& options) {
  GCZ_RETURN_IF_ERROR(check_bf16_storable(path, tensors, options, ".npz"));
  // Member NAME.npy: a name that climbs out of the archive's root ("../x", "/x") would be written
  // there by an unzip.
  for (const TensorInfo& t : tensors) GCZ_RETURN_IF_ERROR(check_path_like_name(path, t.name));
  auto temp = std::make_unique<TempPath>(path);
  zipFile zip = zipOpen64(temp->path().c_str(), APPEND_STATUS_CREATE);
  if (!zip) return io_error(path + ": cannot create: " + std::strerror(errno));
  return std::unique_ptr<TensorFileWriter>(new NpzWriter(path, tensors, options.widen_bf16, std::move(temp), zip));
}

}  // namespace gcz::detail
