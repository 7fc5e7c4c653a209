// The validating .gcz reader (FORMAT.md §6).
#include <xxhash.h>
#include <zstd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <new>

#include "file_kind.h"
#include "file_util.h"
#include "gcz/codec_spec.h"
#include "gcz/container.h"
#include "index_json.h"
#include "layout.h"

namespace gcz {
namespace {

using detail::rule_error;

constexpr uint64_t kMaxZstdExpansion = 65536;

// A fuzzing build (GCZ_BUILD_FUZZERS) takes every checksum for right: a mutated byte then reaches the
// index parser and the codecs' decoders instead of stopping at the first checksum.
#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
constexpr bool kCheckChecksums = false;
#else
constexpr bool kCheckChecksums = true;
#endif

std::string hex(uint64_t v) {
  char buf[19];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

class RawCursor : public StreamCursor {
 public:
  RawCursor(const detail::MappedFile& file, const StreamRecord& s, std::string where)
      : file_(file), s_(s), where_(std::move(where)) {}
  Status read(void* dst, uint64_t n) override {
    if (n > s_.length - pos_) return format_error(where_ + ": read past the end of the stream");
    if (n == 0) return Status::ok();  // dst may be null then (an empty buffer's data())
    std::memcpy(dst, file_.data() + s_.offset + pos_, n);
    pos_ += n;
    file_.release(s_.offset, s_.offset + pos_);
    return Status::ok();
  }

 private:
  const detail::MappedFile& file_;
  const StreamRecord& s_;
  std::string where_;
  uint64_t pos_ = 0;
};

class ZstdCursor : public StreamCursor {
 public:
  ZstdCursor(const detail::MappedFile& file, const StreamRecord& s, std::string path, std::string tensor)
      : file_(file), s_(s), path_(std::move(path)), tensor_(std::move(tensor)), dctx_(ZSTD_createDCtx()) {
    if (!dctx_) throw std::bad_alloc();  // out of memory (status.h)
    in_ = {file.data() + s.offset, s.length, 0};
  }
  ~ZstdCursor() override { ZSTD_freeDCtx(dctx_); }

  // Also called with n == 0 on an empty stream, to check its frame.
  Status read(void* dst, uint64_t n) override {
    if (n > s_.size - produced_) return frame_error("read past the declared size");
    if (n == 0) return produced_ == s_.size ? check_end() : Status::ok();
    ZSTD_outBuffer out{dst, n, 0};
    while (out.pos < out.size) {
      const std::size_t before_in = in_.pos, before_out = out.pos;
      last_ = ZSTD_decompressStream(dctx_, &out, &in_);
      if (ZSTD_isError(last_)) return frame_error(ZSTD_getErrorName(last_));
      if (in_.pos == before_in && out.pos == before_out) return frame_error("the frame ends before its declared size");
      if (last_ == 0 && out.pos < out.size) {
        return frame_error(in_.pos < in_.size ? "the frame ends before its declared size, and bytes follow it "
                                                "(a stream is one frame)"
                                              : "the frame ends before its declared size");
      }
    }
    produced_ += n;
    file_.release(s_.offset, s_.offset + in_.pos);
    if (produced_ == s_.size) return check_end();
    return Status::ok();
  }

 private:
  Status frame_error(const std::string& what) const {
    return rule_error(StatusCode::kFormatError, path_, tensor_, "zstd-frame", "stream '" + s_.name + "': " + what);
  }
  // After the declared size: the frame must be complete and be all the stored bytes.
  Status check_end() {
    if (last_ != 0) {
      char extra;
      ZSTD_outBuffer out{&extra, 1, 0};
      last_ = ZSTD_decompressStream(dctx_, &out, &in_);
      if (ZSTD_isError(last_) || out.pos != 0 || last_ != 0) {
        return frame_error("the frame holds more than its declared size or is incomplete");
      }
    }
    if (in_.pos != in_.size) return frame_error("bytes follow the zstd frame");
    return Status::ok();
  }

  const detail::MappedFile& file_;
  const StreamRecord& s_;
  std::string path_, tensor_;
  ZSTD_DCtx* dctx_;
  ZSTD_inBuffer in_;
  uint64_t produced_ = 0;
  std::size_t last_ = 1;
};

}  // namespace

struct GczReader::Impl {
  std::unique_ptr<detail::MappedFile> file;
  FileIndex index;
  std::map<std::string, std::size_t, std::less<>> by_name;

  const std::string& path() const { return file->path(); }
  Status fail(const std::string& rule, const std::string& detail, StatusCode code = StatusCode::kFormatError,
              const std::string& tensor = "") const {
    return rule_error(code, path(), tensor, rule, detail);
  }

  Status check_header(uint64_t& index_offset, uint64_t& index_length) const;
};

Status GczReader::Impl::check_header(uint64_t& index_offset, uint64_t& index_length) const {
  const auto* b = reinterpret_cast<const uint8_t*>(file->data());
  const uint64_t size = file->size();
  if (size < detail::kHeaderBytes + detail::kTrailerBytes) {
    return fail("too-small", "the file has " + std::to_string(size) + " bytes, fewer than the 96 of an empty .gcz");
  }
  if (std::memcmp(b, detail::kMagic.data(), 8) != 0) {
    return fail("bad-magic", "not a .gcz file (wrong magic bytes)" +
                                 detail::gcz_input_note(detail::sniff_file_kind(file->data(), file->size())));
  }
  const uint64_t major = detail::get_le(b + 8, 2);
  if (major != kFormatVersionMajor) {
    return fail("bad-version", "format version " + std::to_string(major) + " is not supported (this gcz reads 1)",
                StatusCode::kUnsupported);
  }
  for (std::size_t i = 12; i < detail::kHeaderBytes; ++i) {
    if (b[i] != 0) return fail("reserved-nonzero", "header byte " + std::to_string(i) + " must be zero");
  }
  const uint8_t* t = b + size - detail::kTrailerBytes;
  if (std::memcmp(t + 24, detail::kEndMagic.data(), 8) != 0) {
    return fail("bad-end-magic",
                "the trailer's magic is wrong (file truncated, not closed, or with bytes after its end)");
  }
  index_offset = detail::get_le(t, 8);
  index_length = detail::get_le(t + 8, 8);
  if (index_length == 0 || index_length > kMaxIndexBytes) {
    return fail("index-too-large", "index length " + std::to_string(index_length) + " is outside 1..64 MiB");
  }
  auto end = checked_add(index_offset, index_length);
  if (index_offset < detail::kHeaderBytes || index_offset % kStreamAlignment != 0 || !end ||
      *end != size - detail::kTrailerBytes) {
    return fail("index-out-of-range", "index offset " + std::to_string(index_offset) + " and length " +
                                          std::to_string(index_length) + " do not end at the trailer");
  }
  const uint64_t stored = detail::get_le(t + 16, 8);
  const uint64_t actual = XXH3_64bits(b + index_offset, index_length);
  if (kCheckChecksums && stored != actual) {
    return fail("index-checksum", "index XXH3 is " + hex(actual) + ", the trailer says " + hex(stored),
                StatusCode::kChecksumMismatch);
  }
  return Status::ok();
}

namespace {

// The rules of one tensor's index entry that need its codec (FORMAT.md §6): the chain, the streams
// the codec writes and their sizes, and offsets that tile the data section from `expected_offset`
// (advanced past the tensor) to no further than `data_end`.
Status check_tensor(const TensorRecord& t, uint64_t& expected_offset, uint64_t data_end, const std::string& path) {
  const std::string& name = t.info.name;
  auto fail = [&](const std::string& rule, const std::string& detail, StatusCode code, const std::string& tensor) {
    return rule_error(code, path, tensor, rule, detail);
  };
  auto codec_fail = [&](const std::string& detail) {
    return fail("unknown-codec", detail, StatusCode::kUnsupported, name);
  };
  if (t.rng != kRngName) return codec_fail("unknown rng '" + t.rng + "' (the format has " + kRngName + ")");
  if (t.chain.size() > 2) return codec_fail("the chain has more than one stage after the element codec");
  if (t.chain.size() == 2) {
    const CodecStage& st = t.chain[1];
    if (st.name != "zstd") return codec_fail("stage '" + st.name + "' cannot follow the element codec");
    auto level = st.params.find("level");
    const bool ok = st.params.size() == 1 && level != st.params.end() &&
                    std::holds_alternative<int64_t>(level->second) && std::get<int64_t>(level->second) >= 1 &&
                    std::get<int64_t>(level->second) <= kMaxZstdLevel;
    if (!ok) {
      return codec_fail("the zstd stage needs exactly one parameter, an integer level 1.." +
                        std::to_string(kMaxZstdLevel));
    }
  }
  auto codec = make_codec(t.chain[0].name, t.chain[0].params, Backend::kCpu);
  if (!codec) return codec_fail(codec.status().message());
  const bool has_zstd = t.chain.size() > 1;
  const std::vector<std::string> names = (*codec)->stream_names(t.info);
  bool same = names.size() == t.streams.size();
  for (std::size_t i = 0; same && i < names.size(); ++i) same = names[i] == t.streams[i].name;
  if (!same) {
    std::string want;  // up to 16 names: value codecs may write up to kMaxCodecStreams
    for (std::size_t i = 0; i < names.size() && i < 16; ++i) want += (want.empty() ? "" : ", ") + names[i];
    if (names.size() > 16) want += ", ... (" + std::to_string(names.size()) + " in all)";
    return fail("bad-streams", "codec '" + t.chain[0].name + "' writes streams [" + want + "]", StatusCode::kFormatError,
                name);
  }
  const uint64_t numel = *t.info.numel();  // checked by parse_index
  for (std::size_t i = 0; i < t.streams.size(); ++i) {
    const StreamRecord& s = t.streams[i];
    const std::string where = "stream '" + s.name + "'";
    if (s.offset != expected_offset) {
      return fail("stream-out-of-range", where + " is at offset " + std::to_string(s.offset) + ", expected " +
                                             std::to_string(expected_offset), StatusCode::kFormatError, name);
    }
    auto end = checked_add(s.offset, s.length);
    if (!end || *end > data_end) {
      return fail("stream-out-of-range", where + " runs past the data section", StatusCode::kFormatError, name);
    }
    expected_offset = detail::align_up(*end);
    if (s.encoding == StreamEncoding::kZstd && !has_zstd) {
      return fail("bad-encoding", where + " is zstd but the chain has no zstd stage", StatusCode::kFormatError, name);
    }
    // Exact streams must have the codec's size; data-dependent ones at most its bound.
    // A codec that gives no size does not take the tensor (PowerSGD's fallback tensors): no stream fits.
    auto want = (*codec)->stream_size(t.info, i, 0, numel);
    if (!want) return fail("stream-size", where + ": " + want.status().message(), StatusCode::kFormatError, name);
    const bool exact = (*codec)->exact_size(i);
    if (exact ? *want != s.size : s.size > *want) {
      return fail("stream-size",
                  where + " size " + std::to_string(s.size) + (exact ? " differs from" : " exceeds") + " the codec's " +
                      std::to_string(*want),
                  StatusCode::kFormatError, name);
    }
    if (s.encoding == StreamEncoding::kZstd && s.length == 0) {
      return fail("zstd-frame", where + " is empty, so it holds no zstd frame", StatusCode::kFormatError, name);
    }
    // size > 65536 × length, without the product: length < ceil(size / 65536).
    const uint64_t least_length = s.size / kMaxZstdExpansion + (s.size % kMaxZstdExpansion != 0);
    const bool bad = s.encoding == StreamEncoding::kRaw ? s.length != s.size : s.length < least_length;
    if (bad) {
      return fail("stream-size", where + " length " + std::to_string(s.length) + " cannot hold " +
                                     std::to_string(s.size) + " bytes", StatusCode::kFormatError, name);
    }
  }
  return Status::ok();
}

}  // namespace

namespace detail {

Result<FileIndex> check_index(const std::string& text, uint64_t index_offset, const std::string& path) {
  GCZ_ASSIGN_OR_RETURN(FileIndex index, parse_index(text, kFormatVersionMajor, path));
  uint64_t expected = kHeaderBytes;
  for (const TensorRecord& t : index.tensors) GCZ_RETURN_IF_ERROR(check_tensor(t, expected, index_offset, path));
  if (expected != index_offset) {
    return rule_error(
        StatusCode::kFormatError, path, "", "stream-out-of-range",
        "the data section has " + std::to_string(index_offset - expected) + " bytes no stream accounts for");
  }
  return index;
}

}  // namespace detail

GczReader::GczReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GczReader::~GczReader() = default;

Result<std::unique_ptr<GczReader>> GczReader::open(const std::string& path) {
  auto impl = std::make_unique<Impl>();
  GCZ_ASSIGN_OR_RETURN(impl->file, detail::MappedFile::open(path));
  uint64_t index_offset = 0, index_length = 0;
  GCZ_RETURN_IF_ERROR(impl->check_header(index_offset, index_length));
  const auto* b = reinterpret_cast<const char*>(impl->file->data());
  const uint16_t minor = static_cast<uint16_t>(detail::get_le(reinterpret_cast<const uint8_t*>(b) + 10, 2));
  GCZ_ASSIGN_OR_RETURN(impl->index,
                       detail::check_index(std::string(b + index_offset, index_length), index_offset, path));
  impl->index.version_minor = minor;
  for (std::size_t i = 0; i < impl->index.tensors.size(); ++i) {
    impl->by_name.emplace(impl->index.tensors[i].info.name, i);
  }
  return std::unique_ptr<GczReader>(new GczReader(std::move(impl)));
}

const std::string& GczReader::path() const { return impl_->path(); }
uint64_t GczReader::file_size() const { return impl_->file->size(); }
const FileIndex& GczReader::index() const { return impl_->index; }

const TensorRecord* GczReader::find(const std::string& name) const {
  auto it = impl_->by_name.find(name);
  return it == impl_->by_name.end() ? nullptr : &impl_->index.tensors[it->second];
}

Result<std::unique_ptr<StreamCursor>> GczReader::open_stream(std::size_t tensor, std::size_t stream) const {
  const auto& tensors = impl_->index.tensors;
  if (tensor >= tensors.size() || stream >= tensors[tensor].streams.size()) {
    return invalid_argument(impl_->path() + ": no stream " + std::to_string(stream) + " of tensor " +
                            std::to_string(tensor) + " (the file has " + std::to_string(tensors.size()) + " tensors)");
  }
  const TensorRecord& t = tensors[tensor];
  const StreamRecord& s = t.streams[stream];
  // Hash in slices, dropping each from memory after it, so checking a large stream stays small.
  XXH3_state_t* state = XXH3_createState();
  if (!state) throw std::bad_alloc();
  XXH3_64bits_reset(state);
  constexpr uint64_t kSlice = uint64_t{32} << 20;
  for (uint64_t done = 0; done < s.length; done += kSlice) {
    const uint64_t n = std::min(kSlice, s.length - done);
    XXH3_64bits_update(state, impl_->file->data() + s.offset + done, n);
    impl_->file->release(s.offset + done, s.offset + done + n);
  }
  const uint64_t actual = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  if (kCheckChecksums && actual != s.xxh3) {
    return impl_->fail("stream-checksum", "stream '" + s.name + "' XXH3 is " + hex(actual) + ", the index says " +
                                              hex(s.xxh3), StatusCode::kChecksumMismatch, t.info.name);
  }
  if (s.encoding == StreamEncoding::kRaw) {
    return std::unique_ptr<StreamCursor>(
        new RawCursor(*impl_->file, s, path() + ": tensor '" + t.info.name + "': stream '" + s.name + "'"));
  }
  auto cursor = std::make_unique<ZstdCursor>(*impl_->file, s, path(), t.info.name);
  if (s.size == 0) GCZ_RETURN_IF_ERROR(cursor->read(nullptr, 0));  // nothing will be read: check the frame now
  return std::unique_ptr<StreamCursor>(std::move(cursor));
}

Status GczReader::verify(const std::function<void(uint64_t, uint64_t)>& progress) const {
  const auto* b = reinterpret_cast<const uint8_t*>(impl_->file->data());
  uint64_t total = 0, done = 0;
  for (const TensorRecord& t : impl_->index.tensors) {
    for (const StreamRecord& s : t.streams) total += s.length;
  }
  ByteBuffer scratch(std::size_t{1} << 20);
  uint64_t prev_end = detail::kHeaderBytes;
  auto check_padding = [&](uint64_t from, uint64_t to, const std::string& tensor) -> Status {
    for (uint64_t i = from; i < to; ++i) {
      if (b[i] != 0) {
        return impl_->fail("nonzero-padding", "padding byte at offset " + std::to_string(i) + " is not zero",
                           StatusCode::kFormatError, tensor);
      }
    }
    return Status::ok();
  };
  for (std::size_t ti = 0; ti < impl_->index.tensors.size(); ++ti) {
    const TensorRecord& t = impl_->index.tensors[ti];
    for (std::size_t si = 0; si < t.streams.size(); ++si) {
      const StreamRecord& s = t.streams[si];
      GCZ_RETURN_IF_ERROR(check_padding(prev_end, s.offset, t.info.name));
      prev_end = s.offset + s.length;
      GCZ_ASSIGN_OR_RETURN(auto cursor, open_stream(ti, si));
      for (uint64_t left = s.size; left > 0;) {
        const uint64_t n = std::min<uint64_t>(left, scratch.size());
        GCZ_RETURN_IF_ERROR(cursor->read(scratch.data(), n));
        left -= n;
      }
      done += s.length;
      if (progress) progress(done, total);
    }
  }
  const uint64_t index_offset = impl_->file->size() - detail::kTrailerBytes -
                                detail::get_le(b + impl_->file->size() - detail::kTrailerBytes + 8, 8);
  return check_padding(prev_end, index_offset, "");
}

}  // namespace gcz
