// run_bench: codec throughput against memcpy, measured in the same process and run.
#include "gcz/bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>

#include <zstd.h>

#include "gcz/codec.h"
#include "gcz/codec_spec.h"

namespace gcz {
namespace {

struct Tensor {
  TensorInfo info;
  ByteBuffer data;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Best wall time of `repeats` runs of f.
template <class F>
Result<double> best_time(int repeats, F f) {
  double best = INFINITY;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    GCZ_RETURN_IF_ERROR(f());
    best = std::min(best, seconds_since(t0));
  }
  return best;
}

// Gradient-like synthetic data: Gaussian values with per-row scales spanning four decades and 5%
// dead rows, seeded.
Tensor synthetic(uint64_t bytes) {
  const uint64_t cols = 1024, rows = std::max<uint64_t>(1, bytes / 4 / cols);
  Tensor t{{"synthetic", DType::kFloat32, {rows, cols}}, ByteBuffer(rows * cols * 4)};
  auto* p = reinterpret_cast<float*>(t.data.data());
  std::mt19937_64 rng(42);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> decade(-6.0f, -2.0f);
  for (uint64_t r = 0; r < rows; ++r) {
    const bool dead = rng() % 20 == 0;
    const float scale = std::pow(10.0f, decade(rng));
    for (uint64_t c = 0; c < cols; ++c) p[r * cols + c] = dead ? 0.0f : scale * normal(rng);
  }
  return t;
}

Result<std::vector<Tensor>> load_inputs(const BenchOptions& o) {
  std::vector<Tensor> out;
  if (o.inputs.empty()) {
    out.push_back(synthetic(o.synthetic_bytes));
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

Result<BenchRow> bench_spec(const std::string& spec, std::vector<Tensor>& tensors, Backend backend, int repeats,
                            uint64_t input_bytes) {
  GCZ_ASSIGN_OR_RETURN(EncodingPlan plan, parse_encoding_plan(spec));
  GCZ_ASSIGN_OR_RETURN(auto codec, make_codec(plan.codec.name, plan.codec.params, backend));
  std::vector<Encoded> encoded(tensors.size());
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  ZSTD_DCtx* dctx = ZSTD_createDCtx();
  auto encode_all = [&]() -> Status {
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      Encoded& e = encoded[i];
      e.streams.assign(codec->stream_names(tensors[i].info).size(), {});
      e.zstd.assign(e.streams.size(), false);
      GCZ_RETURN_IF_ERROR(codec->encode(tensors[i].info, tensors[i].data.data(), 0, *tensors[i].info.numel(), e.streams));
      if (plan.zstd_level) GCZ_RETURN_IF_ERROR(zstd_stage(*plan.zstd_level, e, cctx));
    }
    return Status::ok();
  };
  std::vector<ByteBuffer> decoded(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) decoded[i].resize(tensors[i].data.size());
  std::vector<ByteBuffer> unzstd;
  auto decode_all = [&]() -> Status {
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      Encoded& e = encoded[i];
      std::vector<ByteSpan> spans;
      unzstd.resize(e.streams.size());
      for (std::size_t s = 0; s < e.streams.size(); ++s) {
        if (!e.zstd[s]) {
          spans.emplace_back(e.streams[s]);
          continue;
        }
        GCZ_ASSIGN_OR_RETURN(uint64_t n, codec->stream_size(tensors[i].info, s, 0, *tensors[i].info.numel()));
        unzstd[s].resize(n);
        const std::size_t got = ZSTD_decompressDCtx(dctx, unzstd[s].data(), n, e.streams[s].data(), e.streams[s].size());
        if (ZSTD_isError(got) || got != n) return internal_error("zstd round trip failed in the benchmark");
        spans.emplace_back(unzstd[s]);
      }
      GCZ_RETURN_IF_ERROR(codec->decode(tensors[i].info, spans, 0, *tensors[i].info.numel(), decoded[i].data()));
    }
    return Status::ok();
  };
  BenchRow row{spec};
  auto enc = best_time(repeats, encode_all);
  auto dec = enc ? best_time(repeats, decode_all) : Result<double>(enc.status());
  ZSTD_freeCCtx(cctx);
  ZSTD_freeDCtx(dctx);
  if (!dec) return dec.status();
  uint64_t stored = 0;
  for (const Encoded& e : encoded) {
    for (const ByteBuffer& b : e.streams) stored += b.size();
  }
  row.encode_gbps = static_cast<double>(input_bytes) / *enc / 1e9;
  row.decode_gbps = static_cast<double>(input_bytes) / *dec / 1e9;
  row.ratio = stored ? static_cast<double>(input_bytes) / static_cast<double>(stored) : 0.0;
  return row;
}

}  // namespace

Result<BenchResult> run_bench(const std::vector<std::string>& specs, const BenchOptions& options) {
  if (options.repeats < 1) return invalid_argument("--repeat must be at least 1");
  BenchResult result;
  GCZ_ASSIGN_OR_RETURN(result.backend, resolve_backend(options.device));
  GCZ_ASSIGN_OR_RETURN(std::vector<Tensor> tensors, load_inputs(options));
  for (const Tensor& t : tensors) result.input_bytes += t.data.size();
  result.tensors = tensors.size();
  if (result.input_bytes == 0) return invalid_argument("the benchmark inputs hold no elements");

  // The yardstick: the same bytes copied between two buffers that are already resident.
  ByteBuffer a(result.input_bytes), b(result.input_bytes);
  std::size_t off = 0;
  for (const Tensor& t : tensors) {
    std::memcpy(a.data() + off, t.data.data(), t.data.size());
    off += t.data.size();
  }
  std::memset(b.data(), 1, b.size());
  GCZ_ASSIGN_OR_RETURN(double copy, best_time(options.repeats, [&] {
                         std::memcpy(b.data(), a.data(), a.size());
                         return Status::ok();
                       }));
  result.memcpy_gbps = static_cast<double>(result.input_bytes) / copy / 1e9;

  for (const std::string& spec : specs) {
    auto row = bench_spec(spec, tensors, result.backend, options.repeats, result.input_bytes);
    if (!row) return row.status().with_context("spec '" + spec + "'");
    result.rows.push_back(*row);
  }
  return result;
}

}  // namespace gcz
