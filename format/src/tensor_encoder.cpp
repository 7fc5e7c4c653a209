#include "tensor_encoder.h"

#include <algorithm>
#include <numeric>
#include <thread>
#include <cstring>

#include "parallel.h"

namespace gcz::detail {

Status MemorySource::read(uint64_t first, uint64_t count, void* dst) {
  const std::size_t esize = dtype_size(info_.dtype);
  if (count) std::memcpy(dst, data_ + first * esize, count * esize);
  return Status::ok();
}

const std::byte* MemorySource::view(uint64_t first, uint64_t count) {
  const std::size_t esize = dtype_size(info_.dtype);
  const std::byte* p = data_ + first * esize;
  return count != 0 && reinterpret_cast<uintptr_t>(p) % esize == 0 ? p : nullptr;
}

uint64_t streaming_chunk_unit(const Codec& codec, uint64_t numel, uint64_t chunk_elements) {
  const uint64_t s = codec.streaming_unit();
  if (s == 0) return 0;
  const uint64_t u = std::lcm(s, MetricsAccumulator::kBlock);
  return numel > std::max(u, chunk_elements / u * u) ? u : 0;
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

  // Chunks are whole codec units. Thread pieces after the first start at multiples of L, whole units
  // and whole metric blocks, so their metrics can be appended in order. A whole-tensor codec takes
  // the threads inside its one call instead; its metrics are then measured in pieces on the threads.
  // One that streams (Codec::streaming_unit) takes a tensor of more than one chunk in chunks, after a
  // first pass over it (prepare), and its threads inside each (streaming_chunk_unit).
  const bool whole = codec.chunk_unit() == 0;
  uint64_t unit = codec.chunk_unit();
  if (const uint64_t s = streaming_chunk_unit(codec, numel, chunk_elements_); s != 0) unit = s;
  const uint64_t L = whole ? 0 : std::lcm(unit, MetricsAccumulator::kBlock);
  const uint64_t chunk = unit == 0 ? std::max<uint64_t>(numel, 1) : std::max(unit, chunk_elements_ / unit * unit);
  const unsigned threads = whole ? 1u : threads_;
  if (whole) codec.set_threads(threads_);
  const std::size_t esize = dtype_size(t.dtype);
  if (whole && unit != 0) {
    const uint64_t p = codec.prepare_unit();
    const uint64_t slice = std::max(p, chunk_elements_ / p * p);
    for (uint64_t first = 0; first < numel; first += slice) {
      const uint64_t count = std::min(slice, numel - first);
      const std::byte* x = src.view(first, count);
      if (x == nullptr) {
        in_.resize(count * esize);
        GCZ_RETURN_IF_ERROR(src.read(first, count, in_.data()));
        x = in_.data();
      }
      GCZ_RETURN_IF_ERROR(codec.prepare(t, x, first, count).with_context(where));
      src.release(first + count);
    }
  }
  wide_.assign(rec.streams.size(), {});
  std::vector<std::unique_ptr<Codec>> extra;  // one codec per extra thread
  for (unsigned k = 1; k < threads; ++k) {
    GCZ_ASSIGN_OR_RETURN(auto c, make_codec(plan.codec.name, plan.codec.params, backend_));
    c->set_context(codec.context());
    extra.push_back(std::move(c));
  }
  xhat_.resize(std::min(chunk, numel) * esize);
  const std::size_t nstreams = rec.streams.size();
  std::vector<std::vector<ByteBuffer>> outs(threads, std::vector<ByteBuffer>(nstreams));
  MetricsAccumulator acc;
  for (uint64_t first = 0; first < numel; first += chunk) {
    const uint64_t count = std::min(chunk, numel - first);
    // The chunk in place where the source holds it so (a mapped file, memory), else a copy.
    const std::byte* x = src.view(first, count);
    if (x == nullptr) {
      in_.resize(xhat_.size());
      GCZ_RETURN_IF_ERROR(src.read(first, count, in_.data()));
      x = in_.data();
    }
    // Pieces: inner boundaries at multiples of L, so each thread's output is what one pass would write
    // there. The first piece measures into `acc` directly; the others into their own accumulators.
    std::vector<uint64_t> bounds = {first};
    for (unsigned k = 1; k < threads; ++k) {
      const uint64_t b = (first + count * k / threads) / L * L;
      if (b > bounds.back() && b < first + count) bounds.push_back(b);
    }
    bounds.push_back(first + count);
    const std::size_t pieces = bounds.size() - 1;
    std::vector<MetricsAccumulator> accs;
    for (std::size_t k = 1; k < pieces; ++k) accs.emplace_back(bounds[k]);
    std::vector<Status> status(pieces);
    auto work = [&](std::size_t k) {
      Codec& c = k == 0 ? codec : *extra[k - 1];
      MetricsAccumulator& a = k == 0 ? acc : accs[k - 1];
      for (ByteBuffer& b : outs[k]) b.clear();
      status[k] = encode_piece(c, t, x, first, bounds[k], bounds[k + 1] - bounds[k], extras.reference, outs[k], a);
    };
    std::vector<std::thread> pool;
    for (std::size_t k = 1; k < pieces; ++k) detail::start_or_run(pool, [&work, k] { work(k); });
    work(0);
    for (std::thread& th : pool) th.join();
    for (const Status& st : status) GCZ_RETURN_IF_ERROR(st.with_context(where));
    // One append per stream and chunk, whatever the thread count (zstd decides on the first append).
    for (std::size_t s = 0; s < nstreams; ++s) {
      for (std::size_t k = 1; k < pieces; ++k) outs[0][s].insert(outs[0][s].end(), outs[k][s].begin(), outs[k][s].end());
      GCZ_RETURN_IF_ERROR(writer_.append(s, outs[0][s]));
    }
    for (MetricsAccumulator& a : accs) acc.append(std::move(a));
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

Status TensorEncoder::encode_piece(Codec& codec, const TensorInfo& t, const std::byte* chunk, uint64_t chunk_first,
                                   uint64_t first, uint64_t count, const std::byte* reference,
                                   std::vector<ByteBuffer>& out, MetricsAccumulator& acc) {
  const std::size_t esize = dtype_size(t.dtype);
  const std::byte* x = chunk + (first - chunk_first) * esize;
  std::byte* xhat = xhat_.data() + (first - chunk_first) * esize;
  GCZ_RETURN_IF_ERROR(codec.encode(t, x, first, count, out));
  // Decode what was just encoded, to measure what it lost. A tensor-wide stream, written with the
  // first chunk, is decoded with every chunk.
  std::vector<ByteSpan> spans(out.begin(), out.end());
  for (std::size_t s = 0; s < spans.size(); ++s) {
    if (!codec.tensor_wide(s) || count == *t.numel()) continue;
    if (first == 0) wide_[s] = out[s];
    spans[s] = wide_[s];
  }
  GCZ_RETURN_IF_ERROR(codec.decode(t, spans, first, count, xhat));
  const std::byte* ref = reference ? reference + first * esize : x;
  const unsigned parts = codec.chunk_unit() == 0 ? parts_for(threads_, count, MetricsAccumulator::kBlock) : 1u;
  std::vector<MetricsAccumulator> accs;
  for (unsigned k = 1; k < parts; ++k) {
    accs.emplace_back(first + part_begin(parts, count, MetricsAccumulator::kBlock, k));
  }
  run_parts(parts, count, MetricsAccumulator::kBlock, [&](unsigned k, uint64_t a, uint64_t b) {
    (k == 0 ? acc : accs[k - 1]).add(t.dtype, ref + a * esize, xhat + a * esize, b - a);
  });
  for (MetricsAccumulator& a : accs) acc.append(std::move(a));
  return Status::ok();
}

}  // namespace gcz::detail
