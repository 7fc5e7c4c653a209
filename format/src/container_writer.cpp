// The streaming .gcz writer (FORMAT.md §§2-5).
#include <xxhash.h>
#include <zstd.h>

#include <cstring>
#include <new>
#include <set>

#include "file_util.h"
#include "gcz/codec_spec.h"
#include "gcz/container.h"
#include "gcz/detail/utf8.h"
#include "index_json.h"
#include "layout.h"

namespace gcz {

const char* stream_encoding_name(StreamEncoding e) { return e == StreamEncoding::kZstd ? "zstd" : "raw"; }

std::string chain_to_string(const std::vector<CodecStage>& chain) {
  CodecSpec spec;
  for (const CodecStage& st : chain) spec.stages.push_back({st.name, st.params});
  return spec.to_string();
}

namespace {

// One stream of the tensor being written: its stored bytes go to the file (stream 0) or to a
// buffer that is written after the streams before it.
struct StreamState {
  bool decided = false;
  ZSTD_CCtx* cctx = nullptr;
  XXH3_state_t* hash = nullptr;
  StreamRecord record;
  ByteBuffer pending;

  StreamState() : hash(XXH3_createState()) {
    if (!hash) throw std::bad_alloc();  // out of memory (status.h)
    XXH3_64bits_reset(hash);
  }
  ~StreamState() {
    ZSTD_freeCCtx(cctx);
    XXH3_freeState(hash);
  }
  StreamState(const StreamState&) = delete;
  StreamState& operator=(const StreamState&) = delete;
};

}  // namespace

struct GczWriter::Impl {
  std::string path;
  std::unique_ptr<detail::AtomicFile> file;  // null: count bytes only
  uint64_t pos = 0;
  FileIndex index;
  bool in_tensor = false;
  bool finished = false;
  bool failed = false;  // finish() failed: the file can only be dropped
  std::set<std::string, std::less<>> names;
  TensorRecord current;
  std::optional<int> zstd_level;
  std::vector<std::unique_ptr<StreamState>> streams;

  Status write(const void* data, std::size_t n) {
    pos += n;
    return file ? file->write(data, n) : Status::ok();
  }
  Status pad_to_alignment() {
    const uint64_t pad = detail::align_up(pos) - pos;
    pos += pad;
    return file ? file->write_zeros(pad) : Status::ok();
  }

  // Stored bytes of stream s: hashed, then to the file (stream 0) or held until its turn.
  Status emit(std::size_t s, const void* data, std::size_t n) {
    StreamState& st = *streams[s];
    XXH3_64bits_update(st.hash, data, n);
    st.record.length += n;
    if (s == 0) return write(data, n);
    const auto* p = static_cast<const std::byte*>(data);
    st.pending.insert(st.pending.end(), p, p + n);
    return Status::ok();
  }

  Status compress(std::size_t s, ByteSpan in, ZSTD_EndDirective mode) {
    StreamState& st = *streams[s];
    ByteBuffer out(ZSTD_CStreamOutSize());
    ZSTD_inBuffer ib{in.data(), in.size(), 0};
    for (;;) {
      ZSTD_outBuffer ob{out.data(), out.size(), 0};
      const std::size_t left = ZSTD_compressStream2(st.cctx, &ob, &ib, mode);
      if (ZSTD_isError(left)) return internal_error(std::string("zstd: ") + ZSTD_getErrorName(left));
      GCZ_RETURN_IF_ERROR(emit(s, out.data(), ob.pos));
      const bool done = mode == ZSTD_e_continue ? ib.pos == ib.size : left == 0;
      if (done) return Status::ok();
    }
  }

  // Decides raw or zstd on a stream's first bytes: zstd only if it made them smaller.
  Status first_chunk(std::size_t s, ByteSpan bytes) {
    StreamState& st = *streams[s];
    st.decided = true;
    if (!zstd_level) return emit(s, bytes.data(), bytes.size());
    st.cctx = ZSTD_createCCtx();
    if (!st.cctx) throw std::bad_alloc();
    if (ZSTD_isError(ZSTD_CCtx_setParameter(st.cctx, ZSTD_c_compressionLevel, *zstd_level))) {
      return internal_error("zstd refused compression level " + std::to_string(*zstd_level));
    }
    ByteBuffer out(ZSTD_compressBound(bytes.size()) + 64);
    ZSTD_inBuffer ib{bytes.data(), bytes.size(), 0};
    ZSTD_outBuffer ob{out.data(), out.size(), 0};
    std::size_t left = ZSTD_compressStream2(st.cctx, &ob, &ib, ZSTD_e_flush);
    if (ZSTD_isError(left) || left != 0 || ib.pos != ib.size) {
      return internal_error("zstd could not compress a chunk into its bound");
    }
    if (ob.pos >= bytes.size()) {
      ZSTD_freeCCtx(st.cctx);
      st.cctx = nullptr;
      return emit(s, bytes.data(), bytes.size());
    }
    st.record.encoding = StreamEncoding::kZstd;
    return emit(s, out.data(), ob.pos);
  }

  Status finish_stream(std::size_t s) {
    StreamState& st = *streams[s];
    if (st.cctx) GCZ_RETURN_IF_ERROR(compress(s, {}, ZSTD_e_end));
    st.record.offset = pos - (s == 0 ? st.record.length : 0);
    if (s != 0) GCZ_RETURN_IF_ERROR(write(st.pending.data(), st.pending.size()));
    st.record.xxh3 = XXH3_64bits_digest(st.hash);
    return pad_to_alignment();
  }
};

GczWriter::GczWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GczWriter::~GczWriter() = default;

Result<std::unique_ptr<GczWriter>> GczWriter::create(const std::string& path, std::optional<FileVersion> replaces) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->index.producer = std::string("gcz ") + GCZ_VERSION;
  if (!path.empty()) {
    GCZ_ASSIGN_OR_RETURN(impl->file, detail::AtomicFile::create(path, /*durable=*/true, replaces));
  }
  const auto header = detail::encode_header();
  GCZ_RETURN_IF_ERROR(impl->write(header.data(), header.size()));
  return std::unique_ptr<GczWriter>(new GczWriter(std::move(impl)));
}

Status GczWriter::begin_tensor(const TensorRecord& record) {
  Impl& w = *impl_;
  if (w.in_tensor || w.finished || w.failed) {
    return invalid_argument("begin_tensor out of order: a tensor is open, or the file finished");
  }
  if (!detail::is_utf8(record.info.name)) {  // the index would hold another name (U+FFFD for the bytes)
    return invalid_argument(w.path + ": tensor '" + std::string(detail::utf8_prefix(record.info.name, 64)) +
                            "': a .gcz tensor name is UTF-8 text (docs/FORMAT.md, 5.2)");
  }
  if (!w.names.insert(record.info.name).second) {  // before its streams are written, not at finish()
    return invalid_argument(w.path + ": tensor '" + std::string(detail::utf8_prefix(record.info.name, 64)) +
                            "': the file has a tensor of this name already (docs/FORMAT.md, 5.2)");
  }
  w.in_tensor = true;
  w.current = record;
  w.current.metrics.reset();
  w.zstd_level.reset();
  for (std::size_t i = 1; i < record.chain.size(); ++i) {
    const CodecStage& st = record.chain[i];
    if (st.name != "zstd") return internal_error("stage '" + st.name + "' cannot follow a codec");
    auto level = get_int_param(st.params, "zstd", "level", kDefaultZstdLevel);
    if (!level) return level.status();
    w.zstd_level = static_cast<int>(*level);
  }
  w.streams.clear();
  for (const StreamRecord& s : record.streams) {
    auto st = std::make_unique<StreamState>();
    st->record.name = s.name;
    w.streams.push_back(std::move(st));
  }
  return Status::ok();
}

Status GczWriter::append(std::size_t stream, ByteSpan bytes) {
  Impl& w = *impl_;
  if (!w.in_tensor || stream >= w.streams.size()) {
    return invalid_argument("append to no stream: no tensor is open, or it has no stream " + std::to_string(stream));
  }
  StreamState& st = *w.streams[stream];
  st.record.size += bytes.size();
  if (bytes.empty()) return Status::ok();
  if (!st.decided) return w.first_chunk(stream, bytes);
  if (st.cctx) return w.compress(stream, bytes, ZSTD_e_continue);
  return w.emit(stream, bytes.data(), bytes.size());
}

Result<const TensorRecord*> GczWriter::end_tensor() {
  Impl& w = *impl_;
  if (!w.in_tensor) return invalid_argument("end_tensor without begin_tensor");
  for (std::size_t s = 0; s < w.streams.size(); ++s) GCZ_RETURN_IF_ERROR(w.finish_stream(s));
  w.current.streams.clear();
  for (const auto& st : w.streams) w.current.streams.push_back(st->record);
  w.streams.clear();
  w.in_tensor = false;
  w.index.tensors.push_back(std::move(w.current));
  return &w.index.tensors.back();
}

void GczWriter::attach_metrics(const Metrics& metrics) {
  if (!impl_->index.tensors.empty()) impl_->index.tensors.back().metrics = metrics;
}

std::string index_to_json(const FileIndex& index) { return detail::serialize_index(index); }

uint64_t GczWriter::index_entry_bytes(const TensorRecord& record) const {
  return detail::tensor_entry_bytes(record);
}

Result<uint64_t> GczWriter::finish(const std::map<std::string, std::string>& metadata, bool in_place) {
  Impl& w = *impl_;
  if (w.in_tensor || w.finished || w.failed) {
    return invalid_argument("finish out of order: a tensor is open, or finish() was called already");
  }
  w.failed = true;  // until the file is written whole (a failed write may leave part of an index)
  for (const auto& [key, value] : metadata) {
    if (!detail::is_utf8(key) || !detail::is_utf8(value)) {
      return invalid_argument(w.path + ": metadata '" + key + "': not UTF-8 text, which a .gcz's metadata is " +
                              "(docs/FORMAT.md, 5)");
    }
  }
  w.index.metadata = metadata;
  const uint64_t index_offset = w.pos;  // already aligned
  const std::string text = detail::serialize_index(w.index);
  if (text.size() > kMaxIndexBytes) {
    return unsupported(w.path + ": the index would exceed 64 MiB (too many tensors for one file)");
  }
  // The index checked as GczReader::open checks it (the index's rules; each tensor's codec, streams and
  // sizes): a record that breaks a rule is refused here, before the index is written, not by the file's
  // next reader. A broken rule is the caller's record (kInvalidArgument); a codec gcz does not know
  // stays kUnsupported, as does an index that would take more memory to read than this process may use.
  const std::string where = w.path.empty() ? std::string("the .gcz") : w.path;
  if (auto back = detail::check_index(text, index_offset, where); !back) {
    std::string why = back.status().message();
    if (why.rfind(where + ": ", 0) == 0) why.erase(0, where.size() + 2);
    const StatusCode code =
        back.status().code() == StatusCode::kFormatError ? StatusCode::kInvalidArgument : back.status().code();
    return Status(code, where + ": what was written would not be read back: " + why);
  }
  GCZ_RETURN_IF_ERROR(w.write(text.data(), text.size()));
  const auto trailer = detail::encode_trailer(index_offset, text.size(), XXH3_64bits(text.data(), text.size()));
  GCZ_RETURN_IF_ERROR(w.write(trailer.data(), trailer.size()));
  if (w.file) GCZ_RETURN_IF_ERROR(in_place ? w.file->commit() : w.file->close());
  w.failed = false;
  w.finished = true;
  return w.pos;
}

Status GczWriter::commit() {
  Impl& w = *impl_;
  if (!w.finished || !w.file) {
    return invalid_argument("commit out of order: the file is not finished with in_place false, or was put in place");
  }
  return w.file->commit();
}

Status GczWriter::commit_together(GczWriter& first, GczWriter& second) {
  Impl& a = *first.impl_;
  Impl& b = *second.impl_;
  if (!a.finished || !b.finished || !a.file || !b.file) {
    return invalid_argument(
        "commit_together out of order: both files must be finished with in_place false, and not put in place");
  }
  return detail::AtomicFile::commit_together(*a.file, *b.file);
}

FileVersion GczWriter::version() const { return impl_->file ? impl_->file->version() : FileVersion{}; }

}  // namespace gcz
