// run_bench: codec throughput against memcpy, measured in the same process and run.
#include "gcz/bench.h"

#include <zstd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <new>
#include <random>
#include <string>
#include <system_error>
#include <thread>

#include "cpu_features.h"
#include "file_util.h"
#include "gcz/codec.h"
#include "gcz/codec_spec.h"
#include "parallel.h"

namespace gcz {
namespace {


struct Tensor {
  TensorInfo info;
  ByteBuffer data;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Best wall time of `repeats` runs of f, after one untimed run that touches every buffer (so no
// timed run pays for first-touch page faults).
template <class F>
Result<double> best_time(int repeats, F f) {
  GCZ_RETURN_IF_ERROR(f());
  double best = INFINITY;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    GCZ_RETURN_IF_ERROR(f());
    best = std::min(best, seconds_since(t0));
  }
  return best;
}

Result<std::vector<Tensor>> load_inputs(const BenchOptions& o) {
  std::vector<Tensor> out;
  if (o.inputs.empty()) {
    const uint64_t cols = kBenchSyntheticColumns, rows = std::max<uint64_t>(1, o.synthetic_bytes / 4 / cols);
    Tensor t{{"synthetic", DType::kFloat32, {rows, cols}}, ByteBuffer(rows * cols * 4)};
    bench_synthetic_fill(reinterpret_cast<float*>(t.data.data()), rows);
    out.push_back(std::move(t));
    return out;
  }
  for (const std::string& path : o.inputs) {
    GCZ_ASSIGN_OR_RETURN(auto reader, open_tensor_file(path, o.read));
    for (std::size_t i = 0; i < reader->tensors().size(); ++i) {
      Tensor t{reader->tensors()[i], {}};
      GCZ_ASSIGN_OR_RETURN(uint64_t bytes, t.info.byte_size());
      t.data.resize(bytes);
      GCZ_ASSIGN_OR_RETURN(auto src, reader->open(i));
      GCZ_RETURN_IF_ERROR(src->read(0, *t.info.numel(), t.data.data()));
      out.push_back(std::move(t));
    }
  }
  if (out.empty()) return unsupported("no floating-point tensor to measure in the inputs");
  return out;
}

// Encoded form of one tensor: its streams, each possibly zstd-compressed.
struct Encoded {
  std::vector<ByteBuffer> streams;
  std::vector<bool> zstd;
};

Status zstd_stage(int level, Encoded& e, ZSTD_CCtx* cctx) {
  for (std::size_t s = 0; s < e.streams.size(); ++s) {
    ByteBuffer out(ZSTD_compressBound(e.streams[s].size()));
    const std::size_t n = ZSTD_compressCCtx(cctx, out.data(), out.size(), e.streams[s].data(), e.streams[s].size(), level);
    if (ZSTD_isError(n)) return internal_error(ZSTD_getErrorName(n));
    e.zstd[s] = n < e.streams[s].size();
    if (e.zstd[s]) {
      out.resize(n);
      e.streams[s] = std::move(out);
    }
  }
  return Status::ok();
}

// A codec stage as it encodes some of the tensors, one object per thread: the spec's codec, or the
// fallback it hands the tensors it does not suit (as gcz encode would).
struct StageCodecs {
  std::string text;  // canonical, to tell stages apart
  std::vector<std::unique_ptr<Codec>> per_thread;
};

// A range of one tensor that one thread encodes and decodes on its own, with stage `stage`.
struct Piece {
  std::size_t tensor;
  std::size_t stage;
  uint64_t first;
  uint64_t count;
  Encoded encoded;
  ByteBuffer decoded;
};

// The stage of every tensor (stage_of[i] indexes stages), each distinct stage made once per thread.
Status plan_stages(const std::vector<Tensor>& tensors, const StageSpec& asked, Backend backend, unsigned threads,
                   std::vector<StageCodecs>& stages, std::vector<std::size_t>& stage_of) {
  for (const Tensor& t : tensors) {
    auto stage = stage_for_tensor(t.info, asked);
    if (!stage) return stage.status().with_context("tensor '" + t.info.name + "'");
    const std::string text = CodecSpec{{*stage}}.to_string();
    std::size_t s = 0;
    while (s < stages.size() && stages[s].text != text) ++s;
    if (s == stages.size()) {
      StageCodecs made{text, {}};
      for (unsigned k = 0; k < threads; ++k) {
        GCZ_ASSIGN_OR_RETURN(auto c, make_codec(stage->name, stage->params, backend));
        made.per_thread.push_back(std::move(c));
      }
      stages.push_back(std::move(made));
    }
    stage_of.push_back(s);
  }
  return Status::ok();
}

// Splits every tensor into `threads` pieces at multiples of its codec's unit (whole-tensor codecs
// keep one piece per tensor); tensors with no elements have nothing to measure and get none.
std::vector<Piece> make_pieces(const std::vector<Tensor>& tensors, const std::vector<StageCodecs>& stages,
                               const std::vector<std::size_t>& stage_of, unsigned threads) {
  std::vector<Piece> pieces;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t n = *tensors[i].info.numel();
    const uint64_t unit = stages[stage_of[i]].per_thread[0]->chunk_unit();
    const unsigned parts = unit == 0 ? 1 : threads;
    uint64_t first = 0;
    for (unsigned k = 1; k <= parts; ++k) {
      const uint64_t end = k == parts ? n : (n * k / parts) / unit * unit;
      if (end > first) pieces.push_back({i, stage_of[i], first, end - first, {}, {}});
      first = std::max(first, end);
    }
  }
  return pieces;
}

// Runs f(k) for k = 0 .. n - 1: f(0) on the calling thread, the others on threads of their own. A
// thread that cannot be started is an error, returned once the threads that did start are joined.
template <class F>
Status on_threads(unsigned n, const F& f) {
  std::vector<std::thread> pool;
  Status started;
  try {
    for (unsigned k = 1; k < n; ++k) pool.emplace_back([&f, k] { f(k); });  // not run here: it is timed
  } catch (const std::system_error& e) {
    started = internal_error("cannot start benchmark thread " + std::to_string(pool.size() + 1) + " of " +
                             std::to_string(n) + ": " + e.what());
  }
  if (started) f(0u);
  for (std::thread& t : pool) t.join();
  return started;
}

// Runs f(piece, thread) over the pieces on `threads` threads, each taking a contiguous share; with
// fewer pieces than threads, one thread per piece (the calling thread taking the first), so that no
// thread is started only to wait.
Status run_threads(std::vector<Piece>& pieces, unsigned threads, const std::function<Status(Piece&, unsigned)>& f) {
  threads = static_cast<unsigned>(std::min<std::size_t>(threads, std::max<std::size_t>(pieces.size(), 1)));
  std::vector<Status> status(threads);
  GCZ_RETURN_IF_ERROR(on_threads(threads, [&](unsigned k) {
    const std::size_t lo = pieces.size() * k / threads, hi = pieces.size() * (k + 1) / threads;
    for (std::size_t p = lo; p < hi && status[k]; ++p) status[k] = f(pieces[p], k);
  }));
  for (const Status& st : status) GCZ_RETURN_IF_ERROR(st);
  return Status::ok();
}

Result<BenchRow> bench_spec(const std::string& spec, std::vector<Tensor>& tensors, Backend backend, int repeats,
                            uint64_t input_bytes, unsigned threads) {
  GCZ_ASSIGN_OR_RETURN(EncodingPlan plan, parse_encoding_plan(spec));
  std::vector<StageCodecs> stages;
  std::vector<std::size_t> stage_of;
  GCZ_RETURN_IF_ERROR(plan_stages(tensors, plan.codec, backend, threads, stages, stage_of));
  std::vector<Piece> pieces = make_pieces(tensors, stages, stage_of, threads);
  // A whole-tensor codec keeps one piece per tensor: with fewer pieces than threads, it uses the
  // threads left over inside its calls.
  if (pieces.size() < threads) {
    for (StageCodecs& st : stages) {
      for (auto& c : st.per_thread) {
        if (c->chunk_unit() == 0) c->set_threads(threads / static_cast<unsigned>(pieces.size()));
      }
    }
  }
  std::vector<ZSTD_CCtx*> cctx(threads);
  std::vector<ZSTD_DCtx*> dctx(threads);
  for (unsigned k = 0; k < threads; ++k) {
    cctx[k] = ZSTD_createCCtx();
    dctx[k] = ZSTD_createDCtx();
    if (!cctx[k] || !dctx[k]) throw std::bad_alloc();  // out of memory (status.h)
  }
  auto encode_piece = [&](Piece& p, unsigned k) -> Status {
    const Tensor& t = tensors[p.tensor];
    Codec& c = *stages[p.stage].per_thread[k];
    c.set_context({0, tensor_key(t.info.name)});
    Encoded& e = p.encoded;
    // The stream buffers keep their memory from one run to the next, as the decoded buffer does (and
    // as an encoder in a training loop would): the runs time the codec, not page faults.
    e.streams.resize(c.stream_names(t.info).size());
    for (ByteBuffer& b : e.streams) b.clear();
    e.zstd.assign(e.streams.size(), false);
    const std::byte* src = t.data.data() + p.first * dtype_size(t.info.dtype);
    GCZ_RETURN_IF_ERROR(
        c.encode(t.info, src, p.first, p.count, e.streams).with_context("tensor '" + t.info.name + "'"));
    if (plan.zstd_level) GCZ_RETURN_IF_ERROR(zstd_stage(*plan.zstd_level, e, cctx[k]));
    return Status::ok();
  };
  auto decode_piece = [&](Piece& p, unsigned k) -> Status {
    const Tensor& t = tensors[p.tensor];
    Codec& c = *stages[p.stage].per_thread[k];
    c.set_context({0, tensor_key(t.info.name)});
    Encoded& e = p.encoded;
    std::vector<ByteBuffer> unzstd(e.streams.size());
    std::vector<ByteSpan> spans;
    for (std::size_t s = 0; s < e.streams.size(); ++s) {
      if (!e.zstd[s]) {
        spans.emplace_back(e.streams[s]);
        continue;
      }
      const std::size_t n = ZSTD_getFrameContentSize(e.streams[s].data(), e.streams[s].size());
      unzstd[s].resize(n);
      const std::size_t got = ZSTD_decompressDCtx(dctx[k], unzstd[s].data(), n, e.streams[s].data(), e.streams[s].size());
      if (ZSTD_isError(got) || got != n) return internal_error("zstd round trip failed in the benchmark");
      spans.emplace_back(unzstd[s]);
    }
    p.decoded.resize(p.count * dtype_size(t.info.dtype));
    return c.decode(t.info, spans, p.first, p.count, p.decoded.data()).with_context("tensor '" + t.info.name + "'");
  };
  BenchRow row{spec, threads};
  auto enc = best_time(repeats, [&] { return run_threads(pieces, threads, encode_piece); });
  auto dec = enc ? best_time(repeats, [&] { return run_threads(pieces, threads, decode_piece); })
                 : Result<double>(enc.status());
  for (unsigned k = 0; k < threads; ++k) {
    ZSTD_freeCCtx(cctx[k]);
    ZSTD_freeDCtx(dctx[k]);
  }
  if (!dec) return dec.status();
  uint64_t stored = 0;
  for (const Piece& p : pieces) {
    for (const ByteBuffer& b : p.encoded.streams) stored += b.size();
  }
  row.encode_gbps = static_cast<double>(input_bytes) / *enc / 1e9;
  row.decode_gbps = static_cast<double>(input_bytes) / *dec / 1e9;
  row.ratio = stored ? static_cast<double>(input_bytes) / static_cast<double>(stored) : 0.0;
  return row;
}

// XOR of the bytes p[0, n) taken as 8-byte words (the last one padded with zeros), in eight
// independent lanes so that the loop is bound by the loads.
uint64_t xor_words(const std::byte* p, std::size_t n) {
  uint64_t lane[8] = {};
  std::size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    for (int k = 0; k < 8; ++k) {
      uint64_t w;
      std::memcpy(&w, p + i + 8 * k, 8);
      lane[k] ^= w;
    }
  }
  for (int k = 0; i < n; i += 8, ++k) {
    uint64_t w = 0;
    std::memcpy(&w, p + i, std::min<std::size_t>(8, n - i));
    lane[k] ^= w;
  }
  uint64_t all = 0;
  for (uint64_t w : lane) all ^= w;
  return all;
}

// memcpy of src[0, n) to dst, and a read of src, by `threads` threads taking contiguous shares (no
// more threads than 64-byte shares). The read's XOR has to match the single-threaded one in every
// run: that is what keeps the compiler from dropping the reads.
Result<BenchYardstick> measure_yardstick(const std::byte* src, std::byte* dst, std::size_t n, unsigned threads,
                                         int repeats) {
  BenchYardstick y{threads};
  const unsigned shares = static_cast<unsigned>(std::clamp<std::size_t>(n / 64, 1, threads));
  GCZ_ASSIGN_OR_RETURN(double copy, best_time(repeats, [&] {
                         return on_threads(shares, [&](unsigned k) {
                           const uint64_t lo = detail::part_begin(shares, n, 64, k);
                           const uint64_t hi = detail::part_begin(shares, n, 64, k + 1);
                           std::memcpy(dst + lo, src + lo, hi - lo);
                         });
                       }));
  const uint64_t expect = xor_words(src, n);
  std::vector<uint64_t> part(shares);
  GCZ_ASSIGN_OR_RETURN(double read, best_time(repeats, [&]() -> Status {
                         GCZ_RETURN_IF_ERROR(on_threads(shares, [&](unsigned k) {
                           const uint64_t lo = detail::part_begin(shares, n, 64, k);
                           const uint64_t hi = detail::part_begin(shares, n, 64, k + 1);
                           part[k] = xor_words(src + lo, hi - lo);
                         }));
                         uint64_t all = 0;
                         for (uint64_t w : part) all ^= w;
                         if (all != expect) return internal_error("the benchmark's read yardstick lost bytes");
                         return Status::ok();
                       }));
  y.memcpy_gbps = static_cast<double>(n) / copy / 1e9;
  y.read_gbps = static_cast<double>(n) / read / 1e9;
  return y;
}

}  // namespace

void bench_synthetic_fill(float* p, uint64_t rows) {
  const uint64_t cols = kBenchSyntheticColumns;
  std::mt19937_64 rng(42);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> decade(-6.0f, -2.0f);
  for (uint64_t r = 0; r < rows; ++r) {
    const bool dead = rng() % 20 == 0;
    const float scale = std::pow(10.0f, decade(rng));
    for (uint64_t c = 0; c < cols; ++c) p[r * cols + c] = dead ? 0.0f : scale * normal(rng);
  }
}

uint64_t bench_max_synthetic_bytes() {
  const uint64_t memory = detail::memory_limit_bytes();
  return memory > 0 ? memory / 5 : uint64_t{1} << 44;
}

Result<BenchResult> run_bench(const std::vector<std::string>& specs, const BenchOptions& options) {
  // The options first: a typo fails at once, before the inputs are read and minutes are measured.
  if (options.repeats < 1) {
    return invalid_argument("repeats must be at least 1, got " + std::to_string(options.repeats));
  }
  if (options.threads.empty()) return invalid_argument("no thread counts to measure");
  for (unsigned threads : options.threads) {
    if (threads < 1 || threads > kBenchMaxThreads) {
      return invalid_argument("thread counts must be 1.." + std::to_string(kBenchMaxThreads) + ", got " +
                              std::to_string(threads));
    }
  }
  if (options.inputs.empty() && options.synthetic_bytes > bench_max_synthetic_bytes()) {
    return invalid_argument(
        "synthetic data of " + std::to_string(options.synthetic_bytes >> 20) +
        " MiB is more than this machine allows, " + std::to_string(bench_max_synthetic_bytes() >> 20) +
        " MiB (a fifth of the memory this process may use: the run holds about five copies of the data)");
  }
  BenchResult result;
  GCZ_ASSIGN_OR_RETURN(result.backend, resolve_backend(options.device));
  result.cpu_code = detail::cpu_has_avx512() ? CpuCode::kAvx512
                    : detail::cpu_has_avx2() ? CpuCode::kAvx2
                                             : CpuCode::kPortable;
  for (const std::string& spec : specs) {
    GCZ_ASSIGN_OR_RETURN(EncodingPlan plan, check_encoding_plan(spec));
    if (result.backend != Backend::kCpu) {
      auto codec = make_codec(plan.codec.name, plan.codec.params, result.backend);
      if (!codec) return codec.status().with_context("codec spec '" + spec + "'");
    }
  }
  // The thread counts of the rows: each once, in the order given; one for a GPU backend.
  std::vector<unsigned>& row_threads = result.row_threads;
  for (unsigned threads : options.threads) {
    const unsigned t = result.backend == Backend::kCpu ? threads : 1u;
    if (std::find(row_threads.begin(), row_threads.end(), t) == row_threads.end()) row_threads.push_back(t);
  }

  GCZ_ASSIGN_OR_RETURN(std::vector<Tensor> tensors, load_inputs(options));
  for (const Tensor& t : tensors) result.input_bytes += t.data.size();
  result.tensors = tensors.size();
  if (result.input_bytes == 0) {
    std::string names;
    for (const std::string& path : options.inputs) names += (names.empty() ? "" : ", ") + path;
    return invalid_argument("nothing to measure: no elements in " + (names.empty() ? "the synthetic data" : names));
  }

  // The yardsticks: the input's bytes copied to a buffer that is already resident, and read, on one
  // thread (what 'x memcpy' divides by) and on every thread count of the rows. Several tensors are
  // first put end to end; one is used where it is.
  ByteBuffer joined, copy(result.input_bytes);
  const std::byte* src = tensors.size() == 1 ? tensors[0].data.data() : nullptr;
  if (src == nullptr) {
    joined.resize(result.input_bytes);
    std::size_t off = 0;
    for (const Tensor& t : tensors) {
      std::memcpy(joined.data() + off, t.data.data(), t.data.size());
      off += t.data.size();
    }
    src = joined.data();
  }
  std::memset(copy.data(), 1, copy.size());
  std::vector<unsigned> counts = row_threads;
  counts.push_back(1);
  std::sort(counts.begin(), counts.end());
  counts.erase(std::unique(counts.begin(), counts.end()), counts.end());
  for (unsigned threads : counts) {
    GCZ_ASSIGN_OR_RETURN(BenchYardstick y,
                         measure_yardstick(src, copy.data(), result.input_bytes, threads, options.repeats));
    result.yardsticks.push_back(y);
  }
  result.memcpy_gbps = result.yardsticks[0].memcpy_gbps;
  if (result.backend == Backend::kCuda) {
    auto rates = cuda_kernel_rates(kBenchDeviceElements, options.repeats);
    if (!rates) return rates.status().with_context("timing the GPU's kernels");
    result.device_kernels = std::move(*rates);
  }
  if (options.progress) options.progress(result);

  for (const std::string& spec : specs) {
    for (unsigned threads : row_threads) {
      auto row = bench_spec(spec, tensors, result.backend, options.repeats, result.input_bytes, threads);
      if (!row) return row.status().with_context("spec '" + spec + "'");
      result.rows.push_back(*row);
      if (options.progress) options.progress(result);
    }
  }
  return result;
}

}  // namespace gcz
