// TernGrad on the CPU: parameters, stream sizes and the chunk loop. With a tensor scale the codec takes
// the whole tensor (chunk_unit 0) and makes two passes in spans of ~8K elements: the moments (max|x|,
// sigma), then the trits. With a group scale a span holds whole groups: each group's moments (in
// cache), then the span's 16-bit draws from Philox and the loops of terngrad_span.cpp (trits, packing).
#include "codecs/terngrad.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "codecs/quant_uniforms.h"
#include "codecs/terngrad_span.h"
#include "cuda_hooks.h"
#include "gcz/convert.h"
#include "gcz/detail/philox.h"
#include "gcz/detail/terngrad_math.h"

namespace gcz {
namespace detail {
namespace {

constexpr char kName[] = "terngrad";
constexpr uint64_t kSpanTarget = 8200;     // a multiple of 40 = lcm(5, 4, 8)
constexpr uint64_t kMomentSpan = 8192;     // a multiple of kSumBlock

uint64_t ceil_div(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

}  // namespace

Result<TernGradOptions> parse_terngrad_options(const Params& params) {
  GCZ_RETURN_IF_ERROR(check_param_keys(params, kName, {"clip", "scale", "group", "rounding", "packing"}));
  TernGradOptions o;
  GCZ_ASSIGN_OR_RETURN(o.clip, get_number_param(params, kName, "clip", 2.5));
  if (!(o.clip >= 0.0) || !std::isfinite(o.clip)) {
    return invalid_argument("codec 'terngrad': parameter 'clip' must be a finite number >= 0 (0 = no clipping), got " +
                            param_to_string(params.at("clip")));
  }
  GCZ_ASSIGN_OR_RETURN(std::string scale, get_choice_param(params, kName, "scale", {"tensor", "group"}, "tensor"));
  o.group_scale = scale == "group";
  if (!o.group_scale && params.count("group") != 0) {
    return invalid_argument("codec 'terngrad': parameter 'group' applies only with scale=group");
  }
  GCZ_ASSIGN_OR_RETURN(int64_t group, get_int_param(params, kName, "group", 128));
  if (group < 1 || static_cast<uint64_t>(group) > kTernGradMaxGroup) {
    return invalid_argument("codec 'terngrad': parameter 'group' must be 1..16777216, got " + std::to_string(group));
  }
  o.group = static_cast<uint64_t>(group);
  GCZ_ASSIGN_OR_RETURN(std::string rounding,
                       get_choice_param(params, kName, "rounding", {"stochastic", "deterministic"}, "stochastic"));
  o.stochastic = rounding == "stochastic";
  GCZ_ASSIGN_OR_RETURN(std::string packing, get_choice_param(params, kName, "packing", {"base3", "2bit"}, "base3"));
  o.base3 = packing == "base3";
  return o;
}

TernGradCodec::TernGradCodec(const TernGradOptions& o)
    : o_(o), unit_(o.group_scale ? std::lcm(o.group, uint64_t{o.base3 ? 5u : 4u}) : 0) {
  span_ = o_.group_scale ? unit_ * std::max<uint64_t>(1, kSpanTarget / unit_) : kSpanTarget;
  piece_ = o_.group_scale ? o_.group : span_;
}

Params TernGradCodec::params() const {
  Params p{{"clip", o_.clip},
           {"scale", std::string(o_.group_scale ? "group" : "tensor")},
           {"rounding", std::string(o_.stochastic ? "stochastic" : "deterministic")},
           {"packing", std::string(o_.base3 ? "base3" : "2bit")}};
  if (o_.group_scale) p["group"] = static_cast<int64_t>(o_.group);
  return p;
}

Result<uint64_t> TernGradCodec::stream_size(const TensorInfo&, std::size_t stream, uint64_t, uint64_t count) const {
  if (stream == 0) return ceil_div(count, o_.base3 ? 5 : 4);
  if (stream == 1) return (o_.group_scale ? ceil_div(count, o_.group) : (count > 0 ? 1 : 0)) * 4;
  return internal_error("codec 'terngrad' has two streams");
}

const float* TernGradCodec::span_values(const TensorInfo& t, const void* src, uint64_t a, uint64_t len) {
  const auto* in = static_cast<const std::byte*>(src) + a * dtype_size(t.dtype);
  if (t.dtype == DType::kFloat32) return reinterpret_cast<const float*>(in);
  convert_elements(t.dtype, in, DType::kFloat32, x_.data(), len);
  return x_.data();
}

float TernGradCodec::tensor_scale(const TensorInfo& t, const void* src, uint64_t count) {
  TernGradMoments m;
  for (uint64_t a = 0; a < count; a += kMomentSpan) {
    const uint64_t len = std::min(kMomentSpan, count - a);
    terngrad_add_moments(span_values(t, src, a, len), len, m);
  }
  return terngrad::scale_from_stats(m.max_abs(), o_.clip > 0.0 ? m.sigma() : 0.0, o_.clip);
}

void TernGradCodec::group_scales(const float* x, uint64_t len, std::byte* out) {
  for (uint64_t g = 0, b = 0; b < len; ++g, b += o_.group) {
    TernGradMoments m;
    terngrad_add_moments(x + b, std::min(o_.group, len - b), m);
    s_[g] = terngrad::scale_from_stats(m.max_abs(), o_.clip > 0.0 ? m.sigma() : 0.0, o_.clip);
    std::memcpy(out + 4 * g, &s_[g], 4);
  }
}

Status TernGradCodec::encode(const TensorInfo& t, const void* src, uint64_t first, uint64_t count,
                             std::vector<ByteBuffer>& out) {
  if (out.size() != 2) return internal_error("codec 'terngrad' expects two output streams");
  if (unit_ == 0 ? first != 0 : first % unit_ != 0) {
    return internal_error("codec 'terngrad': chunk does not start at a chunk unit");
  }
  GCZ_ASSIGN_OR_RETURN(uint64_t trit_bytes, stream_size(t, 0, first, count));
  GCZ_ASSIGN_OR_RETURN(uint64_t scale_bytes, stream_size(t, 1, first, count));
  const std::size_t trit_old = out[0].size(), scale_old = out[1].size();
  out[0].resize(trit_old + trit_bytes);
  out[1].resize(scale_old + scale_bytes);
  // Scratch for the largest span of this chunk (a big group on a small tensor needs little).
  const uint64_t most = std::min(span_, count);
  x_.resize(t.dtype == DType::kFloat32 ? 0 : std::max(most, std::min(kMomentSpan, count)));
  u_.resize(most);  // also when unused: the trit loops read it
  trits_.resize(most + 5);
  s_.resize(std::max<uint64_t>(1, ceil_div(most, piece_)));
  if (!o_.group_scale && count > 0) {
    s_[0] = tensor_scale(t, src, count);
    std::memcpy(out[1].data() + scale_old, &s_[0], 4);
  }
  const uint64_t per_byte = o_.base3 ? 5 : 4;
  for (uint64_t a = 0; a < count; a += span_) {
    const uint64_t len = std::min(span_, count - a);
    const float* x = span_values(t, src, a, len);
    if (o_.group_scale) group_scales(x, len, out[1].data() + scale_old + a / o_.group * 4);
    if (o_.stochastic) fill_draws16(context_.seed, context_.tensor_key, kStreamTernGrad, first + a, len, u_.data(), x);
    terngrad_encode_span({x, u_.data(), len, piece_, s_.data(), o_.stochastic, o_.base3, trits_.data(),
                          reinterpret_cast<uint8_t*>(out[0].data() + trit_old + a / per_byte)});
  }
  return Status::ok();
}

Status TernGradCodec::decode(const TensorInfo& t, const std::vector<ByteSpan>& in, uint64_t first, uint64_t count,
                             void* dst) {
  GCZ_ASSIGN_OR_RETURN(uint64_t trit_bytes, stream_size(t, 0, first, count));
  GCZ_ASSIGN_OR_RETURN(uint64_t scale_bytes, stream_size(t, 1, first, count));
  if (in.size() != 2 || in[0].size() != trit_bytes || in[1].size() != scale_bytes) {
    return format_error("codec 'terngrad': tensor '" + t.name + "': streams have the wrong size for its shape");
  }
  if (unit_ == 0 ? first != 0 : first % unit_ != 0) {
    return internal_error("codec 'terngrad': chunk does not start at a chunk unit");
  }
  const uint64_t most = std::min(span_, count);
  y_.resize(t.dtype == DType::kFloat32 ? 0 : most);
  trits_.resize(most + 5);
  s_.resize(ceil_div(most, piece_));
  const std::size_t esize = dtype_size(t.dtype);
  const uint64_t per_byte = o_.base3 ? 5 : 4;
  for (uint64_t a = 0; a < count; a += span_) {
    const uint64_t len = std::min(span_, count - a);
    const uint64_t groups = ceil_div(len, piece_);
    for (uint64_t g = 0; g < groups; ++g) {
      std::memcpy(&s_[g], in[1].data() + (o_.group_scale ? (a / o_.group + g) * 4 : 0), 4);
      if (!(s_[g] >= 0.0f && s_[g] <= 3.40282346638528859812e+38f)) {
        return format_error("codec 'terngrad': tensor '" + t.name + "': a scale is negative or not finite");
      }
    }
    auto* out = static_cast<std::byte*>(dst) + a * esize;
    float* y = t.dtype == DType::kFloat32 ? reinterpret_cast<float*>(out) : y_.data();
    if (!terngrad_decode_span({reinterpret_cast<const uint8_t*>(in[0].data()) + a / per_byte, len, piece_, s_.data(),
                               o_.base3, trits_.data(), y})) {
      return format_error("codec 'terngrad': tensor '" + t.name + "': invalid trit byte or nonzero padding");
    }
    if (t.dtype != DType::kFloat32) convert_elements(DType::kFloat32, y, t.dtype, out, len);
  }
  return Status::ok();
}

}  // namespace detail

Result<std::unique_ptr<Codec>> make_terngrad_codec(const Params& params, Backend backend) {
  GCZ_ASSIGN_OR_RETURN(detail::TernGradOptions o, detail::parse_terngrad_options(params));
  if (backend == Backend::kCuda) {
    // A CUDA implementation writes the same bytes; until one exists the CPU code serves both.
    auto made = cuda::make_codec("terngrad", params);
    if (made || made.status().code() != StatusCode::kUnsupported) return made;
  }
  return std::unique_ptr<Codec>(new detail::TernGradCodec(o));
}

}  // namespace gcz
