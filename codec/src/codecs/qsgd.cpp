// QSGD on the CPU: parameters, stream sizes, and the chunk loop. A chunk is processed in spans of whole
// groups, about 1536 elements: the span's coarse draw bytes from Philox (fill_coarse8), then the span
// loops of qsgd_span.cpp (scales, a branch-free quantize loop per group, the rare fine draws, bit
// packing specialised per code width, qsgd_pack.h).
//
// Why spans this small: a span's input is first read by its scales, a quick pass, which a long span
// leaves waiting on memory. A span of 6 KiB of input is in cache by then (on the EPYC the hardware
// prefetcher, it seems, fetched that far ahead while the previous span was quantized; where it does
// not keep up, the scales' own prefetch 16 KiB ahead does: qsgd_span.cpp). On 256 MiB of float32 that is 3% (8 bits) to
// 10% (4 bits) faster than spans of 8192 elements with prefetches; spans above about 2048 elements lose it; in cache
// the difference is within 4% either way (docs/PERFORMANCE.md, "Short QSGD spans").
#include "codecs/qsgd.h"

#include <algorithm>
#include <numeric>

#include "codecs/qsgd_span.h"
#include "codecs/quant_uniforms.h"
#include "cuda_hooks.h"
#include "gcz/convert.h"
#include "gcz/detail/philox.h"

namespace gcz {
namespace detail {
namespace {

constexpr char kName[] = "qsgd";
constexpr uint64_t kSpanTarget = 1536;

uint64_t ceil_div(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

const char* scale_dtype_word(DType d) {
  return d == DType::kFloat16 ? "fp16" : d == DType::kBFloat16 ? "bf16" : "fp32";
}

}  // namespace

Result<QsgdOptions> parse_qsgd_options(const Params& params) {
  GCZ_RETURN_IF_ERROR(check_param_keys(params, kName, {"bits", "group", "scale", "rounding", "scale_dtype"}));
  QsgdOptions o;
  GCZ_ASSIGN_OR_RETURN(int64_t bits, get_int_param(params, kName, "bits", 8));
  if (bits < 2 || bits > 8) {
    return invalid_argument("codec 'qsgd': parameter 'bits' must be 2..8, got " + std::to_string(bits));
  }
  GCZ_ASSIGN_OR_RETURN(int64_t group, get_int_param(params, kName, "group", 128));
  if (group < 1 || static_cast<uint64_t>(group) > kQsgdMaxGroup) {
    return invalid_argument("codec 'qsgd': parameter 'group' must be 1..16777216, got " + std::to_string(group));
  }
  GCZ_ASSIGN_OR_RETURN(std::string scale, get_choice_param(params, kName, "scale", {"max", "l2"}, "max"));
  GCZ_ASSIGN_OR_RETURN(std::string rounding,
                       get_choice_param(params, kName, "rounding", {"stochastic", "nearest"}, "stochastic"));
  GCZ_ASSIGN_OR_RETURN(std::string sd,
                       get_choice_param(params, kName, "scale_dtype", {"fp32", "fp16", "bf16"}, "fp32"));
  o.bits = static_cast<int>(bits);
  o.group = static_cast<uint64_t>(group);
  o.l2_scale = scale == "l2";
  o.stochastic = rounding == "stochastic";
  o.scale_dtype = sd == "fp16" ? DType::kFloat16 : sd == "bf16" ? DType::kBFloat16 : DType::kFloat32;
  return o;
}

QsgdCodec::QsgdCodec(const QsgdOptions& o) : o_(o), unit_(std::lcm(o.group, uint64_t{8})) {
  span_ = unit_ * std::max<uint64_t>(1, kSpanTarget / unit_);
}

Params QsgdCodec::params() const {
  return {{"bits", int64_t{o_.bits}},
          {"group", static_cast<int64_t>(o_.group)},
          {"scale", std::string(o_.l2_scale ? "l2" : "max")},
          {"rounding", std::string(o_.stochastic ? "stochastic" : "nearest")},
          {"scale_dtype", std::string(scale_dtype_word(o_.scale_dtype))}};
}

Result<uint64_t> QsgdCodec::stream_size(const TensorInfo&, std::size_t stream, uint64_t, uint64_t count) const {
  if (stream == 0) return ceil_div(count * static_cast<uint64_t>(o_.bits), 8);  // count <= 2^48
  if (stream == 1) return ceil_div(count, o_.group) * dtype_size(o_.scale_dtype);
  return internal_error("codec 'qsgd' has two streams");
}

Status QsgdCodec::encode(const TensorInfo& t, const void* src, uint64_t first, uint64_t count,
                         std::vector<ByteBuffer>& out) {
  if (out.size() != 2) return internal_error("codec 'qsgd' expects two output streams");
  if (first % unit_ != 0) return internal_error("codec 'qsgd': chunk does not start at a chunk unit");
  GCZ_ASSIGN_OR_RETURN(uint64_t code_bytes, stream_size(t, 0, first, count));
  GCZ_ASSIGN_OR_RETURN(uint64_t scale_bytes, stream_size(t, 1, first, count));
  const std::size_t code_old = out[0].size(), scale_old = out[1].size();
  out[0].resize(code_old + code_bytes);
  out[1].resize(scale_old + scale_bytes);
  // Scratch for the largest span of this chunk (a big group on a small tensor needs little).
  const uint64_t most = std::min(span_, count);
  x_.resize(t.dtype == DType::kFloat32 ? 0 : most);
  u_.resize(most + 32);  // also when unused: the quantize loops read it, up to 32 bytes past an element
  ties_.resize(o_.stochastic ? tie_room(most, o_.group) : 0);
  scale_.resize(ceil_div(most, o_.group));
  finite_.resize(scale_.size());
  codes_.resize(most);
  const std::size_t esize = dtype_size(t.dtype), ssize = dtype_size(o_.scale_dtype);
  for (uint64_t a = 0; a < count; a += span_) {
    const uint64_t len = std::min(span_, count - a);
    const auto* in = static_cast<const std::byte*>(src) + a * esize;
    const float* x = reinterpret_cast<const float*>(in);
    if (t.dtype != DType::kFloat32) {
      convert_elements(t.dtype, in, DType::kFloat32, x_.data(), len);
      x = x_.data();
    }
    if (o_.stochastic) {
      fill_coarse8(context_.seed, context_.tensor_key, kStreamQsgdRounding, first + a, len, u_.data());
    }
    const FineDraws fine{context_.seed, context_.tensor_key, kStreamQsgdRounding, first + a};
    qsgd_encode_span(o_.bits, {x, u_.data(), fine, len, o_.group, o_.l2_scale, o_.stochastic, o_.scale_dtype,
                               out[1].data() + scale_old + a / o_.group * ssize, scale_.data(), finite_.data(),
                               codes_.data(), ties_.data(),
                               reinterpret_cast<uint8_t*>(out[0].data() + code_old + a * o_.bits / 8)});
  }
  return Status::ok();
}

Status QsgdCodec::decode(const TensorInfo& t, const std::vector<ByteSpan>& in, uint64_t first, uint64_t count,
                         void* dst) {
  GCZ_ASSIGN_OR_RETURN(uint64_t code_bytes, stream_size(t, 0, first, count));
  GCZ_ASSIGN_OR_RETURN(uint64_t scale_bytes, stream_size(t, 1, first, count));
  if (in.size() != 2 || in[0].size() != code_bytes || in[1].size() != scale_bytes) {
    return format_error("codec 'qsgd': streams have the wrong size for its shape");
  }
  if (first % unit_ != 0) return internal_error("codec 'qsgd': chunk does not start at a chunk unit");
  const uint64_t most = std::min(span_, count);
  y_.resize(t.dtype == DType::kFloat32 ? 0 : most);
  step_.resize(ceil_div(most, o_.group));
  scale_.resize(step_.size());
  codes_.resize(most + 8);
  const std::size_t esize = dtype_size(t.dtype), ssize = dtype_size(o_.scale_dtype);
  for (uint64_t a = 0; a < count; a += span_) {
    const uint64_t len = std::min(span_, count - a);
    auto* out = static_cast<std::byte*>(dst) + a * esize;
    float* y = t.dtype == DType::kFloat32 ? reinterpret_cast<float*>(out) : y_.data();
    const QsgdSpanError e = qsgd_decode_span(
        o_.bits, {reinterpret_cast<const uint8_t*>(in[0].data()) + a * o_.bits / 8, in[1].data() + a / o_.group * ssize,
                  len, o_.group, o_.scale_dtype, step_.data(), scale_.data(), codes_.data(), y});
    if (e == QsgdSpanError::kBadScale) {
      return format_error("codec 'qsgd': a scale is negative or not finite");
    }
    if (e == QsgdSpanError::kPadding) {
      return format_error("codec 'qsgd': the last code byte has nonzero padding bits");
    }
    if (t.dtype != DType::kFloat32) convert_elements(DType::kFloat32, y, t.dtype, out, len);
  }
  return Status::ok();
}

}  // namespace detail

Result<std::unique_ptr<Codec>> make_qsgd_codec(const Params& params, Backend backend) {
  GCZ_ASSIGN_OR_RETURN(detail::QsgdOptions o, detail::parse_qsgd_options(params));
  if (backend == Backend::kCuda) {
    // A CUDA implementation writes the same bytes; until one exists the CPU code serves both.
    auto made = cuda::make_codec("qsgd", params);
    if (made || made.status().code() != StatusCode::kUnsupported) return made;
  }
  return std::unique_ptr<Codec>(new detail::QsgdCodec(o));
}

}  // namespace gcz
