// QSGD on the CPU. A chunk is processed in spans of whole groups (about 8192 elements, so a span's
// input, uniforms and codes stay in L1/L2): first every group's scale, then the uniforms of the span
// from Philox (all four words of each block), then a branch-free quantize loop per group, then the
// bit packing, specialised per code width so the compiler unrolls it.
#include "codecs/qsgd.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "cuda_hooks.h"
#include "gcz/convert.h"
#include "gcz/detail/philox.h"
#include "gcz/detail/qsgd_math.h"

namespace gcz {
namespace detail {
namespace {

using namespace qsgd;

constexpr char kName[] = "qsgd";
constexpr uint64_t kSpanTarget = 8192;

uint64_t ceil_div(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

const char* scale_dtype_word(DType d) {
  return d == DType::kFloat16 ? "fp16" : d == DType::kBFloat16 ? "bf16" : "fp32";
}

// max over the group of |x| (finite elements only), exact.
float group_max(const float* x, uint64_t n) {
  uint32_t m = 0;
  for (uint64_t i = 0; i < n; ++i) m = std::max(m, finite_abs_bits(x[i]));
  return bit_cast<float>(m);
}

// ||x_G||_2 of the finite elements, rounded up to float32: squares summed in float64 in 8 lanes (lane
// k mod 8 for the group's element k, in order), lanes added as ((0+1)+(2+3))+((4+5)+(6+7)), sqrt in
// float64. Squares of float32 values are exact in float64.
float group_l2(const float* x, uint64_t n) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) {
      const double a = finite_abs(x[i + j]);
      acc[j] += a * a;
    }
  }
  for (int j = 0; i < n; ++i, ++j) {
    const double a = finite_abs(x[i]);
    acc[j] += a * a;
  }
  const double sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  return ceil_to_f32(std::sqrt(sum));
}

// Rounds the (floored) scale up to the stored dtype, writes its bytes and returns its float32 value:
// the value the decoder reads, which the encoder then quantizes with.
float store_scale(float scale, DType dtype, std::byte* out) {
  if (dtype == DType::kFloat32) {
    std::memcpy(out, &scale, 4);
    return scale;
  }
  const uint16_t h = scale == 0.0f ? 0 : dtype == DType::kFloat16 ? ceil_to_f16(scale) : ceil_to_bf16(scale);
  std::memcpy(out, &h, 2);
  return dtype == DType::kFloat16 ? f16_to_f32(h) : bf16_to_f32(h);
}

float load_scale(const std::byte* in, DType dtype) {
  if (dtype == DType::kFloat32) {
    float f;
    std::memcpy(&f, in, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, in, 2);
  return dtype == DType::kFloat16 ? f16_to_f32(h) : bf16_to_f32(h);
}

// Uniforms of elements [first, first + n), first a multiple of 4: draw i is word i mod 4 of block i / 4.
void fill_uniforms(const Rng& rng, uint64_t first, uint64_t n, float* u) {
  const uint64_t b0 = first / 4, blocks = ceil_div(n, 4);
  for (uint64_t b = 0; b < blocks; ++b) {
    const Philox4x32 w = rng.block(b0 + b);
    for (int j = 0; j < 4; ++j) u[4 * b + j] = Rng::to_uniform(w.v[j]);
  }
}

template <int B, bool kStochastic>
void quantize_run(const float* x, const float* u, uint8_t* c, uint64_t n, float inv, float s) {
  for (uint64_t i = 0; i < n; ++i) {
    c[i] = static_cast<uint8_t>(quantize<B, kStochastic>(x[i], inv, s, kStochastic ? u[i] : 0.0f));
  }
}

template <int B>
void dequantize_run(const uint8_t* c, uint64_t n, float step_value, float scale, float* y) {
  for (uint64_t i = 0; i < n; ++i) y[i] = dequantize<B>(c[i], step_value, scale);
}

// Packs n codes into ceil(n * B / 8) bytes; the last byte's unused high bits are zero.
template <int B>
void pack(const uint8_t* c, uint64_t n, uint8_t* out) {
  const uint64_t full = n / 8;
  for (uint64_t k = 0; k < full; ++k) pack8<B>(c + 8 * k, out + B * k);
  if (const uint64_t rem = n % 8) {
    uint8_t codes[8] = {0, 0, 0, 0, 0, 0, 0, 0}, bytes[8];
    std::memcpy(codes, c + 8 * full, rem);
    pack8<B>(codes, bytes);
    std::memcpy(out + B * full, bytes, ceil_div(rem * B, 8));
  }
}

// Unpacks n codes; false if the padding bits of a partial last byte are not zero.
template <int B>
bool unpack(const uint8_t* in, uint64_t n, uint8_t* c) {
  const uint64_t full = n / 8;
  for (uint64_t k = 0; k < full; ++k) unpack8<B>(in + B * k, c + 8 * k);
  if (const uint64_t rem = n % 8) {
    uint8_t bytes[8] = {0, 0, 0, 0, 0, 0, 0, 0}, codes[8];
    std::memcpy(bytes, in + B * full, ceil_div(rem * B, 8));
    unpack8<B>(bytes, codes);
    std::memcpy(c + 8 * full, codes, rem);
    for (uint64_t k = rem; k < 8; ++k) {
      if (codes[k] != 0) return false;
    }
  }
  return true;
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

namespace {

// The work of one span, specialised per code width and rounding.
template <int B, bool kStochastic>
void quantize_span(const float* x, const float* u, const float* inv, uint64_t len, uint64_t group, uint8_t* c) {
  const float s = static_cast<float>(levels(B));
  for (uint64_t g = 0, a = 0; a < len; ++g, a += group) {
    quantize_run<B, kStochastic>(x + a, u + a, c + a, std::min(group, len - a), inv[g], s);
  }
}

template <int B>
void quantize_span(bool stochastic, const float* x, const float* u, const float* inv, uint64_t len, uint64_t group,
                   uint8_t* scratch, uint8_t* out) {
  uint8_t* c = B == 8 ? out : scratch;  // 8-bit codes are their own packing
  if (stochastic) {
    quantize_span<B, true>(x, u, inv, len, group, c);
  } else {
    quantize_span<B, false>(x, u, inv, len, group, c);
  }
  if (B != 8) pack<B>(c, len, out);
}

template <int B>
bool dequantize_span(const uint8_t* in, const float* steps, const float* scales, uint64_t len, uint64_t group,
                     uint8_t* scratch, float* y) {
  const uint8_t* c = in;
  if (B != 8) {
    if (!unpack<B>(in, len, scratch)) return false;
    c = scratch;
  }
  for (uint64_t g = 0, a = 0; a < len; ++g, a += group) {
    dequantize_run<B>(c + a, std::min(group, len - a), steps[g], scales[g], y + a);
  }
  return true;
}

}  // namespace

void QsgdCodec::encode_span(const float* x, uint64_t first, uint64_t len, std::byte* codes, std::byte* scales) {
  const uint64_t groups = ceil_div(len, o_.group);
  const int s = levels(o_.bits);
  const std::size_t ssize = dtype_size(o_.scale_dtype);
  for (uint64_t g = 0; g < groups; ++g) {
    const float* xg = x + g * o_.group;
    const uint64_t n = std::min(o_.group, len - g * o_.group);
    const float raw = floor_scale(o_.l2_scale ? group_l2(xg, n) : group_max(xg, n));
    inv_[g] = inverse_step(store_scale(raw, o_.scale_dtype, scales + g * ssize), s);
  }
  if (o_.stochastic) fill_uniforms(Rng(context_.seed, context_.tensor_key, kStreamQsgdRounding), first, len, u_.data());
  auto* out = reinterpret_cast<uint8_t*>(codes);
  const float* u = u_.data();
  switch (o_.bits) {
    case 2: quantize_span<2>(o_.stochastic, x, u, inv_.data(), len, o_.group, codes_.data(), out); break;
    case 3: quantize_span<3>(o_.stochastic, x, u, inv_.data(), len, o_.group, codes_.data(), out); break;
    case 4: quantize_span<4>(o_.stochastic, x, u, inv_.data(), len, o_.group, codes_.data(), out); break;
    case 5: quantize_span<5>(o_.stochastic, x, u, inv_.data(), len, o_.group, codes_.data(), out); break;
    case 6: quantize_span<6>(o_.stochastic, x, u, inv_.data(), len, o_.group, codes_.data(), out); break;
    case 7: quantize_span<7>(o_.stochastic, x, u, inv_.data(), len, o_.group, codes_.data(), out); break;
    default: quantize_span<8>(o_.stochastic, x, u, inv_.data(), len, o_.group, codes_.data(), out); break;
  }
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
  x_.resize(t.dtype == DType::kFloat32 ? 0 : span_);
  u_.resize(span_ + 4);  // also when unused: the quantize loops index it
  inv_.resize(ceil_div(span_, o_.group));
  codes_.resize(o_.bits == 8 ? 0 : span_);
  const std::size_t esize = dtype_size(t.dtype), ssize = dtype_size(o_.scale_dtype);
  for (uint64_t a = 0; a < count; a += span_) {
    const uint64_t len = std::min(span_, count - a);
    const auto* in = static_cast<const std::byte*>(src) + a * esize;
    const float* x = reinterpret_cast<const float*>(in);
    if (t.dtype != DType::kFloat32) {
      convert_elements(t.dtype, in, DType::kFloat32, x_.data(), len);
      x = x_.data();
    }
    encode_span(x, first + a, len, out[0].data() + code_old + a * o_.bits / 8,
                out[1].data() + scale_old + a / o_.group * ssize);
  }
  return Status::ok();
}

bool QsgdCodec::read_steps(const std::byte* scales, uint64_t groups) {
  const int s = levels(o_.bits);
  const std::size_t ssize = dtype_size(o_.scale_dtype);
  bool ok = true;
  for (uint64_t g = 0; g < groups; ++g) {
    const float scale = load_scale(scales + g * ssize, o_.scale_dtype);
    ok = ok && scale >= 0.0f && scale <= kMaxFloat;
    step_[g] = step(scale, s);
    scale_[g] = scale;
  }
  return ok;
}

Status QsgdCodec::decode(const TensorInfo& t, const std::vector<ByteSpan>& in, uint64_t first, uint64_t count,
                         void* dst) {
  GCZ_ASSIGN_OR_RETURN(uint64_t code_bytes, stream_size(t, 0, first, count));
  GCZ_ASSIGN_OR_RETURN(uint64_t scale_bytes, stream_size(t, 1, first, count));
  if (in.size() != 2 || in[0].size() != code_bytes || in[1].size() != scale_bytes) {
    return format_error("codec 'qsgd': tensor '" + t.name + "': streams have the wrong size for its shape");
  }
  if (first % unit_ != 0) return internal_error("codec 'qsgd': chunk does not start at a chunk unit");
  y_.resize(t.dtype == DType::kFloat32 ? 0 : span_);
  step_.resize(ceil_div(span_, o_.group));
  scale_.resize(step_.size());
  codes_.resize(o_.bits == 8 ? 0 : span_);
  const std::size_t esize = dtype_size(t.dtype), ssize = dtype_size(o_.scale_dtype);
  for (uint64_t a = 0; a < count; a += span_) {
    const uint64_t len = std::min(span_, count - a);
    if (!read_steps(in[1].data() + a / o_.group * ssize, ceil_div(len, o_.group))) {
      return format_error("codec 'qsgd': tensor '" + t.name + "': a scale is negative or not finite");
    }
    auto* out = static_cast<std::byte*>(dst) + a * esize;
    float* y = t.dtype == DType::kFloat32 ? reinterpret_cast<float*>(out) : y_.data();
    const auto* c = reinterpret_cast<const uint8_t*>(in[0].data()) + a * o_.bits / 8;
    bool ok = true;
    switch (o_.bits) {
      case 2: ok = dequantize_span<2>(c, step_.data(), scale_.data(), len, o_.group, codes_.data(), y); break;
      case 3: ok = dequantize_span<3>(c, step_.data(), scale_.data(), len, o_.group, codes_.data(), y); break;
      case 4: ok = dequantize_span<4>(c, step_.data(), scale_.data(), len, o_.group, codes_.data(), y); break;
      case 5: ok = dequantize_span<5>(c, step_.data(), scale_.data(), len, o_.group, codes_.data(), y); break;
      case 6: ok = dequantize_span<6>(c, step_.data(), scale_.data(), len, o_.group, codes_.data(), y); break;
      case 7: ok = dequantize_span<7>(c, step_.data(), scale_.data(), len, o_.group, codes_.data(), y); break;
      default: ok = dequantize_span<8>(c, step_.data(), scale_.data(), len, o_.group, codes_.data(), y); break;
    }
    if (!ok) return format_error("codec 'qsgd': tensor '" + t.name + "': the last code byte has nonzero padding bits");
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
