// decode_file: a .gcz in, tensor files out, chunk by chunk.
#include <algorithm>
#include <thread>

#include "file_util.h"
#include "gcz/container.h"
#include "gcz/pipeline.h"
#include "scratch_buffer.h"
#include "tensor_encoder.h"

namespace gcz {
namespace {

// Indices of the tensors to decode: all, or those matching any of the globs (each glob must match).
Result<std::vector<std::size_t>> select_tensors(const GczReader& reader, const std::vector<std::string>& globs) {
  const auto& tensors = reader.index().tensors;
  std::vector<std::size_t> out;
  std::vector<bool> used(globs.size(), false);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    bool take = globs.empty();
    for (std::size_t g = 0; g < globs.size(); ++g) {
      if (glob_match(globs[g], tensors[i].info.name)) take = used[g] = true;
    }
    if (take) out.push_back(i);
  }
  for (std::size_t g = 0; g < globs.size(); ++g) {
    if (!used[g]) {
      return invalid_argument(reader.path() + ": no tensor matches '" + globs[g] +
                              "' (a GLOB matches the whole name; gcz info " + reader.path() + " lists the names)");
    }
  }
  return out;
}

// decode_chunks' loop, with the codec made and the streams open.
Status decode_in_chunks(Codec& codec, const TensorRecord& rec, std::vector<std::unique_ptr<StreamCursor>>& cursors,
                        bool whole, uint64_t chunk, const std::function<Status(const std::byte*, uint64_t)>& sink,
                        const std::function<void(uint64_t)>& progress, const std::string& where) {
  const TensorInfo& t = rec.info;
  GCZ_ASSIGN_OR_RETURN(uint64_t numel, t.numel());
  const std::size_t esize = dtype_size(t.dtype);
  detail::ScratchBuffer xhat;
  xhat.resize(std::min(chunk, numel) * esize);
  std::vector<detail::ScratchBuffer> in(rec.streams.size());
  for (uint64_t first = 0; first < numel; first += chunk) {
    const uint64_t count = std::min(chunk, numel - first);
    std::vector<ByteSpan> spans;
    for (std::size_t s = 0; s < in.size(); ++s) {
      if (first != 0 && codec.tensor_wide(s)) {  // read with the first chunk
        spans.emplace_back(in[s].data(), in[s].size());
        continue;
      }
      // A whole-tensor codec's streams are read whole (their size may depend on the data).
      GCZ_ASSIGN_OR_RETURN(uint64_t n,
                           whole ? Result<uint64_t>(rec.streams[s].size) : codec.stream_size(t, s, first, count));
      in[s].resize(n);
      GCZ_RETURN_IF_ERROR(cursors[s]->read(in[s].data(), n));
      spans.emplace_back(in[s].data(), n);
    }
    Status decoded = codec.decode(t, spans, first, count, xhat.data());
    if (decoded.code() == StatusCode::kFormatError) {
      // The stream passed its checksum but its contents break the codec's rules (FORMAT.md §6).
      return Status(StatusCode::kFormatError, where + ": bad-stream-data: " + decoded.message());
    }
    GCZ_RETURN_IF_ERROR(decoded.with_context(where));
    GCZ_RETURN_IF_ERROR(sink(xhat.data(), count));
    progress(count * esize);
  }
  return Status::ok();
}

// Decodes tensor `index` chunk by chunk, handing each chunk (count elements of its dtype) to `sink`.
Status decode_chunks(const GczReader& reader, std::size_t index, Backend backend,
                     const std::function<Status(const std::byte*, uint64_t)>& sink,
                     const std::function<void(uint64_t)>& progress) {
  const TensorRecord& rec = reader.index().tensors[index];
  const TensorInfo& t = rec.info;
  const std::string where = reader.path() + ": tensor '" + t.name + "'";
  auto made = make_codec(rec.chain[0].name, rec.chain[0].params, backend);
  if (!made) return made.status().with_context(where);
  Codec& codec = **made;
  codec.set_context({rec.seed, tensor_key(t.name)});
  std::vector<std::unique_ptr<StreamCursor>> cursors;
  for (std::size_t s = 0; s < rec.streams.size(); ++s) {
    GCZ_ASSIGN_OR_RETURN(auto c, reader.open_stream(index, s));
    cursors.push_back(std::move(c));
  }
  GCZ_ASSIGN_OR_RETURN(uint64_t numel, t.numel());
  // A whole-tensor codec that streams (Codec::streaming_unit) decodes a tensor of more than one chunk
  // in chunks, the encoder's (streaming_chunk_unit), its tensor-wide streams read once and handed to
  // every chunk.
  constexpr uint64_t kChunkElements = uint64_t{1} << 24;
  uint64_t unit = codec.chunk_unit();
  if (const uint64_t s = detail::streaming_chunk_unit(codec, numel, kChunkElements); s != 0) unit = s;
  const bool whole = unit == 0;
  // A whole-tensor codec may split its one call over the cores (PowerSGD's product does); the bytes
  // do not depend on it.
  if (whole) codec.set_threads(std::max(1u, std::thread::hardware_concurrency()));
  const uint64_t chunk = whole ? std::max<uint64_t>(numel, 1) : std::max(unit, kChunkElements / unit * unit);
  const std::size_t esize = dtype_size(t.dtype);
  // A whole-tensor codec decodes the tensor at once: a file can claim more than the machine holds
  // (a few bytes of Top-K stand for any number of zeros).
  const uint64_t at_once = std::min(chunk, numel) * esize, memory = detail::memory_limit_bytes();
  if (memory > 0 && at_once > memory) {
    return unsupported(where + ": its codec " + rec.chain[0].name + " decodes the tensor whole, in " +
                       std::to_string(at_once) + " bytes of memory, more than this process may use (" +
                       std::to_string(memory) + ")");
  }
  // Within that, the memory free now may still fall short: then say which tensor, and how much.
  try {
    return decode_in_chunks(codec, rec, cursors, whole, chunk, sink, progress, where);
  } catch (const std::bad_alloc&) {
    return unsupported(where + ": out of memory decoding it (" + std::to_string(at_once) +
                       " bytes at once, besides its streams)");
  }
}

}  // namespace

Status decode_file(const std::string& input, const std::string& output, const DecodeOptions& options) {
  GCZ_ASSIGN_OR_RETURN(auto reader, GczReader::open(input));
  GCZ_ASSIGN_OR_RETURN(Backend backend, resolve_backend(options.device));
  GCZ_ASSIGN_OR_RETURN(std::vector<std::size_t> selected, select_tensors(*reader, options.names));
  std::vector<TensorInfo> infos;
  uint64_t bytes_total = 0;
  for (std::size_t i : selected) {
    infos.push_back(reader->index().tensors[i].info);
    bytes_total += *infos.back().byte_size();
  }
  WriteOptions write = options.write;
  for (const auto& [key, value] : reader->index().metadata) {
    if (key.rfind(kSafetensorsMetadataPrefix, 0) == 0) {
      write.safetensors_metadata.emplace(key.substr(std::string(kSafetensorsMetadataPrefix).size()), value);
    }
  }
  GCZ_ASSIGN_OR_RETURN(auto writer, create_tensor_file(output, infos, write));
  Progress progress{0, selected.size(), 0, bytes_total, nullptr};
  for (std::size_t k = 0; k < selected.size(); ++k) {
    progress.tensor = k;
    progress.name = &infos[k].name;
    GCZ_RETURN_IF_ERROR(writer->begin(k));
    // Memory the output's writer runs out of is not the decode's (decode_chunks says that of its own).
    auto sink = [&](const std::byte* data, uint64_t count) -> Status {
      try {
        return writer->write(data, count);
      } catch (const std::bad_alloc&) {
        return unsupported(input + ": tensor '" + infos[k].name + "': out of memory writing it to " + output);
      }
    };
    GCZ_RETURN_IF_ERROR(decode_chunks(*reader, selected[k], backend, sink, [&](uint64_t done) {
      progress.bytes_done += done;
      if (options.progress) options.progress(progress);
    }));
    GCZ_RETURN_IF_ERROR(writer->end());
  }
  return writer->finish();
}

Result<ByteBuffer> decode_tensor(const GczReader& reader, std::size_t index, DeviceRequest device) {
  if (index >= reader.index().tensors.size()) return invalid_argument("no tensor " + std::to_string(index));
  GCZ_ASSIGN_OR_RETURN(Backend backend, resolve_backend(device));
  GCZ_ASSIGN_OR_RETURN(uint64_t bytes, reader.index().tensors[index].info.byte_size());
  const std::string where = reader.path() + ": tensor '" + reader.index().tensors[index].info.name + "'";
  if (const uint64_t memory = detail::memory_limit_bytes(); memory > 0 && bytes > memory) {
    return unsupported(where + ": " + std::to_string(bytes) + " bytes decoded, more than this process may use (" +
                       std::to_string(memory) + ")");
  }
  ByteBuffer out;
  try {
    out.reserve(bytes);
  } catch (const std::bad_alloc&) {
    return unsupported(where + ": out of memory for its " + std::to_string(bytes) + " bytes decoded");
  }
  auto sink = [&](const std::byte* data, uint64_t count) {
    const std::size_t n = count * dtype_size(reader.index().tensors[index].info.dtype);
    out.insert(out.end(), data, data + n);
    return Status::ok();
  };
  GCZ_RETURN_IF_ERROR(decode_chunks(reader, index, backend, sink, [](uint64_t) {}));
  return out;
}

Status check_tensor_data(const GczReader& reader, std::size_t index) {
  if (index >= reader.index().tensors.size()) return invalid_argument("no tensor " + std::to_string(index));
  auto discard = [](const std::byte*, uint64_t) { return Status::ok(); };
  return decode_chunks(reader, index, Backend::kCpu, discard, [](uint64_t) {});
}

}  // namespace gcz
