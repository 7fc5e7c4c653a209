// PowerSGD on the host: a float32 working matrix, float32 GEMMs through the CBLAS, float64
// Gram–Schmidt; the exactly specified float64 reconstruction is in powersgd_reconstruct.cpp.
// docs/codecs/powersgd.md states every step; the comments here say why.
#include "powersgd.h"

#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>

#include "blas_threads.h"
#include "gcz/codec_spec.h"
#include "gcz/convert.h"
#include "gcz/detail/float_bits.h"
#include "gcz/detail/powersgd_math.h"
#include "gcz/detail/value_codec.h"
#include "parallel.h"
#include "powersgd_host.h"

namespace gcz {
namespace {

using detail::ValueCodec;

constexpr std::string_view kName = "powersgd";
constexpr int64_t kMaxFactorRank = 1024;
constexpr int64_t kMaxIters = 64;
// CBLAS takes dimensions as int.
constexpr uint64_t kMaxBlasDim = INT_MAX;

struct Config {
  int64_t rank = 4;
  int64_t iters = 1;
  std::string view = "first";
  std::string factors;   // canonical one-stage value-codec spec
  std::optional<ValueCodec> factor_codec;  // made from it, once: P's and Q's (each level made once)
  double min_rate = 2.0;
  std::string fallback;  // canonical one-stage spec

  Params params() const {
    return {{"factors", factors}, {"fallback", fallback}, {"iters", iters},
            {"min_rate", min_rate}, {"rank", rank},       {"view", view}};
  }
};

// The fallback codec, checked and in canonical form: one element stage, not zstd, not powersgd.
Result<std::string> canonical_fallback(const Params& params) {
  auto it = params.find("fallback");
  const std::string text = it == params.end() ? std::string("fp16") : param_to_string(it->second);
  const std::string where = "codec 'powersgd': fallback='" + detail::spec_excerpt(text) + "'";
  // The fallback is a level of codec nesting too (CODECS.md, "Value codecs").
  if (const int depth = 1 + nested_codec_depth(text); depth > detail::kMaxValueCodecDepth) {
    return invalid_argument("codec 'powersgd': fallback: value codecs nest " + std::to_string(depth) +
                            " deep, more than " + std::to_string(detail::kMaxValueCodecDepth));
  }
  auto spec = parse_codec_spec(text);
  if (!spec) return spec.status().with_context(where);
  if (spec->stages.size() != 1 || spec->stages[0].name == "zstd") {
    return invalid_argument(where + ": the fallback is one codec stage (put zstd after powersgd: it applies to both)" +
                            detail::exponent_plus_hint(*spec));
  }
  if (spec->stages[0].name == kName) return invalid_argument(where + ": the fallback cannot be powersgd itself");
  auto codec = make_codec(spec->stages[0].name, spec->stages[0].params, Backend::kCpu);
  if (!codec) return Status(codec.status().code(), where + ": " + codec.status().message());
  CodecSpec canonical;
  canonical.stages.push_back({std::string((*codec)->name()), (*codec)->params()});
  return canonical.to_string();
}

Result<Config> parse_config(const Params& p) {
  GCZ_RETURN_IF_ERROR(check_param_keys(p, kName, {"factors", "fallback", "iters", "min_rate", "rank", "view"}));
  Config c;
  GCZ_ASSIGN_OR_RETURN(c.rank, get_int_param(p, kName, "rank", c.rank));
  if (c.rank < 1 || c.rank > kMaxFactorRank) {
    return invalid_argument("codec 'powersgd': rank must be 1.." + std::to_string(kMaxFactorRank) + ", got " +
                            std::to_string(c.rank));
  }
  GCZ_ASSIGN_OR_RETURN(c.iters, get_int_param(p, kName, "iters", c.iters));
  if (c.iters < 1 || c.iters > kMaxIters) {
    return invalid_argument("codec 'powersgd': iters must be 1.." + std::to_string(kMaxIters) + ", got " +
                            std::to_string(c.iters));
  }
  GCZ_ASSIGN_OR_RETURN(c.view, get_choice_param(p, kName, "view", {"first", "last"}, c.view));
  GCZ_ASSIGN_OR_RETURN(c.min_rate, get_number_param(p, kName, "min_rate", c.min_rate));
  if (!(c.min_rate >= 1.0) || !std::isfinite(c.min_rate)) {
    return invalid_argument("codec 'powersgd': min_rate must be a finite number >= 1, got " +
                            param_to_string(p.find("min_rate")->second));
  }
  GCZ_ASSIGN_OR_RETURN(ValueCodec factors, ValueCodec::make(kName, p, "factors", "fp32", Backend::kCpu));
  c.factors = factors.spec();
  c.factor_codec = std::move(factors);
  GCZ_ASSIGN_OR_RETURN(c.fallback, canonical_fallback(p));
  return c;
}

using Dims = detail::PowerSgdDims;

// The n × m matrix view of a tensor of at least 2 dimensions: M[i][j] = x[i·m + j] either way.
// (With a zero dimension a product may wrap; n·m is then 0 and the size rule sends it to the fallback.)
Dims matrix_dims(const Shape& s, const std::string& view) {
  const std::size_t split = view == "first" ? 1 : s.size() - 1;
  Dims d{1, 1};
  for (std::size_t k = 0; k < s.size(); ++k) (k < split ? d.n : d.m) *= s[k];
  if (d.n == 0 || d.m == 0) d = {0, 0};
  return d;
}

// Why `t` goes to the fallback codec; empty when PowerSGD takes it.
Result<std::string> fallback_reason(const TensorInfo& t, const Config& c) {
  GCZ_RETURN_IF_ERROR(t.numel().status());
  if (t.shape.size() < 2) return std::string("it has fewer than 2 dimensions");
  const Dims d = matrix_dims(t.shape, c.view);
  if (d.n > kMaxBlasDim || d.m > kMaxBlasDim) {
    return "its " + std::to_string(d.n) + " x " + std::to_string(d.m) + " matrix has a side above 2^31-1 (the BLAS limit)";
  }
  if (detail::powersgd_too_small(d.n, d.m, static_cast<uint64_t>(c.rank), dtype_size(t.dtype), c.min_rate)) {
    char rate[32];
    std::snprintf(rate, sizeof rate, "%g", c.min_rate);  // 1000, not the spec's exact 1e03
    return "rank-" + std::to_string(c.rank) + " factors of its " + std::to_string(d.n) + " x " + std::to_string(d.m) +
           " matrix would not make it min_rate=" + rate + " times smaller";
  }
  return std::string();
}

// x·2^k for n float32 values, rounded once as by ldexp; k is in [−127, 149] (the range −ilogb takes).
void scale_by_pow2(float* w, uint64_t n, int k) {
  if (k == 0) return;
  if (k <= 127) {  // 2^k is a float32 (subnormal for k = −127): one multiplication rounds once
    const float f = std::ldexp(1.0f, k);
    for (uint64_t i = 0; i < n; ++i) w[i] = w[i] * f;
    return;
  }
  // Only the values of a matrix whose largest magnitude is below 2^−127 get here: they only grow, so
  // both multiplications are exact.
  const float f1 = 0x1p64f, f2 = std::ldexp(1.0f, k - 64);
  for (uint64_t i = 0; i < n; ++i) w[i] = (w[i] * f1) * f2;
}

// The largest magnitude's bit pattern (magnitudes compare like their bit patterns); at least
// 0x7f800000 when a value is not finite.
uint32_t max_magnitude_bits(const float* w, uint64_t count) {
  uint32_t mx = 0;
  for (uint64_t i = 0; i < count; ++i) {
    const uint32_t a = detail::bit_cast<uint32_t>(w[i]) & 0x7fffffffu;
    mx = a > mx ? a : mx;
  }
  return mx;
}

// Sets non-finite values to +0 and returns the largest magnitude's bit pattern of the rest.
uint32_t zero_nonfinite(float* w, uint64_t count) {
  uint32_t mx = 0;
  for (uint64_t i = 0; i < count; ++i) {
    const uint32_t b = detail::bit_cast<uint32_t>(w[i]);
    const bool finite = (b & 0x7fffffffu) < 0x7f800000u;
    w[i] = detail::bit_cast<float>(finite ? b : 0u);
    const uint32_t a = finite ? b & 0x7fffffffu : 0u;
    mx = a > mx ? a : mx;
  }
  return mx;
}

// The working matrix M′ = ldexp(M, −e): the elements as float32 with non-finite ones set to +0 (one
// NaN would otherwise turn every factor into NaN). e = 0 when the largest magnitude a is 0 or in
// [2^−32, 2^32), where no float32 product or sum of the iterations can overflow or underflow;
// otherwise e = ilogb(a), bringing it to [1, 2). Scaling by 2^−e is exact, so e changes no stored
// bit outside the subnormal range. Float32 input that needs no change is used in place (no copy).
const float* working_matrix(DType dtype, const void* src, uint64_t count, std::vector<float>& buf, int& e) {
  const float* w = static_cast<const float*>(src);
  if (dtype != DType::kFloat32) {
    buf.resize(count);
    convert_elements(dtype, src, DType::kFloat32, buf.data(), count);
    w = buf.data();
  }
  uint32_t max_bits = max_magnitude_bits(w, count);
  const bool finite = max_bits < 0x7f800000u;
  if (!finite) {
    if (w != buf.data()) buf.assign(w, w + count);
    max_bits = zero_nonfinite(buf.data(), count);
    w = buf.data();
  }
  constexpr uint32_t kLow = 0x2f800000u, kHigh = 0x4f800000u;  // 2^−32 and 2^32
  e = max_bits == 0 || (max_bits >= kLow && max_bits < kHigh) ? 0 : std::ilogb(detail::bit_cast<float>(max_bits));
  if (e == 0) return w;
  if (w != buf.data()) buf.assign(w, w + count);
  scale_by_pow2(buf.data(), count, -e);
  return buf.data();
}

float column_max_abs(const float* a, uint64_t rows, uint64_t r, uint64_t c) {
  float mx = 0.0f;
  for (uint64_t i = 0; i < rows; ++i) mx = std::max(mx, std::fabs(a[i * r + c]));
  return mx;
}

// Orthonormalizes the columns of the row-major n × r matrix p in float64 (powersgd_orthonormalize),
// rounding the result back to float32.
void orthonormalize(std::vector<float>& p, uint64_t n, uint64_t r, std::vector<double>& cols) {
  cols.resize(n * r);
  for (uint64_t i = 0; i < n; ++i) {
    for (uint64_t c = 0; c < r; ++c) cols[c * n + i] = p[i * r + c];
  }
  detail::powersgd_orthonormalize(cols.data(), n, r);
  for (uint64_t i = 0; i < n; ++i) {
    for (uint64_t c = 0; c < r; ++c) p[i * r + c] = static_cast<float>(cols[c * n + i]);
  }
}

// The GEMMs go over groups of W's rows, one BLAS call per group, the groups on the codec's threads.
// How many groups depends on the shape alone, so the factors are the same for any thread count:
// one per kGroupRows rows, at most kMostGroups, and few enough that the groups' partial Wᵀ·P (m × r
// each, added in group order) take at most kMostPartialBytes.
constexpr uint64_t kGroupRows = 256;
constexpr uint64_t kMostGroups = 16;
constexpr uint64_t kMostPartialBytes = uint64_t{64} << 20;

uint64_t gemm_groups(Dims d, uint64_t r) {
  const uint64_t by_rows = std::clamp<uint64_t>(d.n / kGroupRows, 1, kMostGroups);
  const uint64_t by_memory = std::max<uint64_t>(1, kMostPartialBytes / (d.m * r * sizeof(float)));
  return std::min(by_rows, by_memory);
}

// `iters` power iterations from q (m × r): P = W·Q, orthonormalize P, Q = Wᵀ·P. All row-major.
void power_iterate(const float* w, Dims d, uint64_t r, int64_t iters, std::vector<float>& p, std::vector<float>& q,
                   unsigned threads) {
  const int m = static_cast<int>(d.m), ri = static_cast<int>(r);
  const uint64_t groups = gemm_groups(d, r);
#ifdef GCZ_HAVE_OPENBLAS
  const unsigned workers = detail::powersgd_workers(threads, groups, d, r);
#else
  // Another BLAS need not be safe to call from several threads at once: the same groups, in turn.
  (void)threads;
  const unsigned workers = 1;
#endif
  // f(g, first row, rows) for each group, on the workers.
  auto each_group = [&](const auto& f) {
    detail::run_pieces(workers, groups, 1, [&](unsigned, uint64_t g, uint64_t) {
      const uint64_t begin = detail::part_begin(static_cast<unsigned>(groups), d.n, 1, static_cast<unsigned>(g));
      const uint64_t end = detail::part_begin(static_cast<unsigned>(groups), d.n, 1, static_cast<unsigned>(g + 1));
      f(g, begin, static_cast<int>(end - begin));
    });
  };
  p.resize(d.n * r);
  std::vector<float> partial(groups > 1 ? groups * d.m * r : 0);
  std::vector<double> cols;
  for (int64_t it = 0; it < iters; ++it) {
    each_group([&](uint64_t, uint64_t begin, int rows) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, ri, m, 1.0f, w + begin * d.m, m, q.data(), ri, 0.0f,
                  p.data() + begin * r, ri);
    });
    orthonormalize(p, d.n, r, cols);
    each_group([&](uint64_t g, uint64_t begin, int rows) {
      float* out = groups > 1 ? partial.data() + g * d.m * r : q.data();
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, ri, rows, 1.0f, w + begin * d.m, m, p.data() + begin * r,
                  ri, 0.0f, out, ri);
    });
    if (groups > 1) {
      std::copy(partial.begin(), partial.begin() + d.m * r, q.begin());
      for (uint64_t g = 1; g < groups; ++g) {
        const float* add = partial.data() + g * d.m * r;
        for (uint64_t j = 0; j < d.m * r; ++j) q[j] = q[j] + add[j];
      }
    }
  }
}

// Puts the matrix's scale 2^e back into the factors, split per column pair by powersgd_balance_shift so
// that neither stored factor overflows or underflows. A pair with an all-zero side becomes all zeros.
void balance(int e, Dims d, uint64_t r, std::vector<float>& p, std::vector<float>& q) {
  for (uint64_t c = 0; c < r; ++c) {
    const float mp = column_max_abs(p.data(), d.n, r, c), mq = column_max_abs(q.data(), d.m, r, c);
    const bool zero = !(mp > 0.0f) || !(mq > 0.0f);
    const int k = zero ? 0 : detail::powersgd_balance_shift(e, std::ilogb(mp), std::ilogb(mq));
    for (uint64_t i = 0; i < d.n; ++i) p[i * r + c] = zero ? 0.0f : std::ldexp(p[i * r + c], k);
    for (uint64_t j = 0; j < d.m; ++j) q[j * r + c] = zero ? 0.0f : std::ldexp(q[j * r + c], e - k);
  }
}

class PowerSgdCodec final : public Codec {
 public:
  PowerSgdCodec(Config config, ValueCodec p, ValueCodec q)
      : c_(std::move(config)), r_(static_cast<uint64_t>(c_.rank)), p_(std::move(p)), q_(std::move(q)) {}

  std::string_view name() const override { return kName; }
  Params params() const override { return c_.params(); }
  uint64_t chunk_unit() const override { return 0; }

  std::vector<std::string> stream_names(const TensorInfo&) const override {
    std::vector<std::string> out = p_.stream_names();
    for (std::string& s : q_.stream_names()) out.push_back(std::move(s));
    return out;
  }
  bool exact_size(std::size_t s) const override {
    return s < p_.stream_count() ? p_.exact_size(s) : q_.exact_size(s - p_.stream_count());
  }
  Result<uint64_t> stream_size(const TensorInfo& t, std::size_t s, uint64_t, uint64_t) const override {
    GCZ_ASSIGN_OR_RETURN(Dims d, dims_for(t));
    if (s < p_.stream_count()) return p_.stream_size({d.n, r_}, s);
    if (s < p_.stream_count() + q_.stream_count()) return q_.stream_size({d.m, r_}, s - p_.stream_count());
    return internal_error("codec 'powersgd': no stream " + std::to_string(s));
  }

  // The warm start is kept as given and checked against the tensor when encode() uses it.
  Status set_state(const TensorInfo&, const CodecState& state) override {
    warm_ = state;
    return Status::ok();
  }
  std::optional<CodecState> state() const override { return last_; }

  Status encode(const TensorInfo& t, const void* src, uint64_t first, uint64_t count,
                std::vector<ByteBuffer>& out) override {
    GCZ_ASSIGN_OR_RETURN(Dims d, dims_for(t));
    GCZ_RETURN_IF_ERROR(check_call(d, first, count, out.size()));
    std::vector<float> buf, p;
    int e = 0;
    const float* w = working_matrix(t.dtype, src, count, buf, e);
    std::vector<float> q = start_q(d.m);
    power_iterate(w, d, r_, c_.iters, p, q, threads());
    balance(e, d, r_, p, q);
    GCZ_RETURN_IF_ERROR(p_.encode({d.n, r_}, p.data(), out.data(), context_).with_context("powersgd"));
    GCZ_RETURN_IF_ERROR(
        q_.encode({d.m, r_}, q.data(), out.data() + p_.stream_count(), context_).with_context("powersgd"));
    last_ = CodecState{{d.m, r_}, std::move(q)};
    return Status::ok();
  }

  Status decode(const TensorInfo& t, const std::vector<ByteSpan>& in, uint64_t first, uint64_t count,
                void* dst) override {
    GCZ_ASSIGN_OR_RETURN(Dims d, dims_for(t));
    GCZ_RETURN_IF_ERROR(check_call(d, first, count, in.size()));
    std::vector<float> p(d.n * r_), q(d.m * r_);
    GCZ_RETURN_IF_ERROR(p_.decode({d.n, r_}, in.data(), p.data(), context_).with_context("powersgd"));
    GCZ_RETURN_IF_ERROR(
        q_.decode({d.m, r_}, in.data() + p_.stream_count(), q.data(), context_).with_context("powersgd"));
    detail::powersgd_reconstruct(p, q, d, r_, t.dtype, dst, threads());
    return Status::ok();
  }

 private:
  // The matrix view, or why this tensor belongs to the fallback codec.
  Result<Dims> dims_for(const TensorInfo& t) const {
    GCZ_ASSIGN_OR_RETURN(std::string why, fallback_reason(t, c_));
    if (!why.empty()) {
      return invalid_argument("codec 'powersgd' does not take tensor '" + t.name + "' " + shape_to_string(t.shape) +
                              ": " + why + "; gcz gives such a tensor the fallback '" + c_.fallback +
                              "' where it chooses a tensor's codec, but a value codec (values=, factors=) has none");
    }
    return matrix_dims(t.shape, c_.view);
  }

  Status check_call(Dims d, uint64_t first, uint64_t count, std::size_t streams) const {
    if (first != 0 || count != d.n * d.m) return internal_error("codec 'powersgd' takes whole tensors (chunk_unit 0)");
    if (streams != p_.stream_count() + q_.stream_count()) return internal_error("codec 'powersgd': wrong stream count");
    return Status::ok();
  }

  // The starting Q (m × r): column c of the warm-start state when the state is m × r and that column
  // is finite and not all zero, scaled by a power of two to a largest magnitude in [1, 2); otherwise
  // column c of the seeded Gaussian Q0.
  std::vector<float> start_q(uint64_t m) const {
    std::vector<float> q(m * r_);
    const bool warm = warm_ && warm_->shape == Shape{m, r_} && warm_->values.size() == m * r_;
    const detail::Rng rng(context_.seed, context_.tensor_key, detail::kStreamPowerSgdInit);
    for (uint64_t c = 0; c < r_; ++c) {
      bool usable = warm;
      for (uint64_t j = 0; usable && j < m; ++j) usable = std::isfinite(warm_->values[j * r_ + c]);
      const float mx = usable ? column_max_abs(warm_->values.data(), m, r_, c) : 0.0f;
      for (uint64_t j = 0; j < m; ++j) {
        q[j * r_ + c] = mx > 0.0f ? std::ldexp(warm_->values[j * r_ + c], -std::ilogb(mx))
                                  : detail::powersgd_gaussian(rng, j * r_ + c);
      }
    }
    return q;
  }

  Config c_;
  uint64_t r_;
  ValueCodec p_, q_;
  std::optional<CodecState> warm_, last_;
};

}  // namespace

Result<std::unique_ptr<Codec>> make_powersgd_codec(const Params& params, Backend) {
  GCZ_ASSIGN_OR_RETURN(Config c, parse_config(params));
  // The same value codec twice, under the stream prefixes p and q (and their own random streams).
  ValueCodec p = c.factor_codec->with_key("p");
  ValueCodec q = c.factor_codec->with_key("q");
  detail::pin_blas_threads();
  return std::unique_ptr<Codec>(new PowerSgdCodec(std::move(c), std::move(p), std::move(q)));
}

Result<std::string> powersgd_plan_for(const TensorInfo& t, const Params& params) {
  GCZ_ASSIGN_OR_RETURN(Config c, parse_config(params));
  GCZ_ASSIGN_OR_RETURN(std::string why, fallback_reason(t, c));
  if (!why.empty()) return c.fallback;
  CodecSpec spec;
  spec.stages.push_back({std::string(kName), c.params()});
  return spec.to_string();
}

}  // namespace gcz
