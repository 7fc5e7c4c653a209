#include "tensor_encoder.h"

#include <algorithm>
#include <cstring>

namespace gcz::detail {

Status MemorySource::read(uint64_t first, uint64_t count, void* dst) {
  const std::size_t esize = dtype_size(info_.dtype);
  if (count) std::memcpy(dst, data_ + first * esize, count * esize);
  return Status::ok();
}

Result<ByteBuffer> read_whole(TensorSource& src) {
  GCZ_ASSIGN_OR_RETURN(uint64_t bytes, src.info().byte_size());
  ByteBuffer out(bytes);
  GCZ_RETURN_IF_ERROR(src.read(0, *src.info().numel(), out.data()));
  return out;
}

Result<TensorReport> TensorEncoder::encode(TensorSource& src, const EncodingPlan& plan,
                                           const std::function<void(uint64_t)>& progress, const EncodeExtras& extras) {
  const TensorInfo& t = src.info();
  const std::string where = "tensor '" + t.name + "'";
  GCZ_ASSIGN_OR_RETURN(uint64_t numel, t.numel());
  auto made = make_codec(plan.codec.name, plan.codec.params, backend_);
  if (!made) return made.status().with_context(where);
  Codec& codec = **made;
  codec.set_context({seed_, tensor_key(t.name)});
  if (extras.state_in) GCZ_RETURN_IF_ERROR(codec.set_state(t, *extras.state_in).with_context(where));

  TensorRecord rec;
  rec.info = t;
  rec.chain.push_back({std::string(codec.name()), codec.params()});
  if (plan.zstd_level) rec.chain.push_back({"zstd", {{"level", int64_t{*plan.zstd_level}}}});
  rec.seed = seed_;
  for (const std::string& n : codec.stream_names(t)) rec.streams.push_back({.name = n});
  GCZ_RETURN_IF_ERROR(writer_.begin_tensor(rec));

  const uint64_t unit = codec.chunk_unit();
  const uint64_t chunk = unit == 0 ? std::max<uint64_t>(numel, 1) : std::max(unit, chunk_elements_ / unit * unit);
  const std::size_t esize = dtype_size(t.dtype);
  in_.resize(std::min(chunk, numel) * esize);
  xhat_.resize(in_.size());
  std::vector<ByteBuffer> out(rec.streams.size());
  MetricsAccumulator acc;
  for (uint64_t first = 0; first < numel; first += chunk) {
    const uint64_t count = std::min(chunk, numel - first);
    GCZ_RETURN_IF_ERROR(src.read(first, count, in_.data()));
    for (ByteBuffer& b : out) b.clear();
    GCZ_RETURN_IF_ERROR(codec.encode(t, in_.data(), first, count, out).with_context(where));
    std::vector<ByteSpan> spans;
    for (std::size_t s = 0; s < out.size(); ++s) {
      GCZ_RETURN_IF_ERROR(writer_.append(s, out[s]));
      spans.emplace_back(out[s]);
    }
    // Decode what was just written, to measure what it lost.
    GCZ_RETURN_IF_ERROR(codec.decode(t, spans, first, count, xhat_.data()).with_context(where));
    const std::byte* x = extras.reference ? extras.reference + first * esize : in_.data();
    acc.add(t.dtype, x, xhat_.data(), count);
    if (extras.on_decoded) extras.on_decoded(first, count, xhat_.data());
    src.release(first + count);
    progress(count * esize);
  }
  if (extras.state_out) *extras.state_out = codec.state();
  GCZ_ASSIGN_OR_RETURN(const TensorRecord* stored, writer_.end_tensor());
  uint64_t bytes_out = writer_.index_entry_bytes(*stored);
  for (const StreamRecord& s : stored->streams) bytes_out += s.length;
  TensorReport report{t.name, t.dtype, t.shape, chain_to_string(stored->chain),
                      acc.finish(extras.bytes_in.value_or(numel * esize), bytes_out), std::nullopt};
  writer_.attach_metrics(report.metrics);
  total_.merge(acc);
  return report;
}

}  // namespace gcz::detail
