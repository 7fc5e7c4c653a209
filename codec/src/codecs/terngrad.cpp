// TernGrad on the CPU: parameters, stream sizes and the chunk loop. With a tensor scale the codec takes
// the whole tensor (chunk_unit 0) and makes two passes in spans of ~64K elements, handed out to the
// codec's threads a piece at a time: the moments (max|x|, sigma), then the trits; or, for a large
// tensor encoded whole, one pass that makes both (encode_one_pass). With a group scale a span holds
// whole groups: their scales (in cache), then the span's coarse draw bytes from Philox and the loops
// of terngrad_span.cpp (trits, packing, the rare fine draws).
#include "codecs/terngrad.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <numeric>

#include "codecs/quant_uniforms.h"
#include "codecs/terngrad_span.h"
#include "cuda_hooks.h"
#include "gcz/convert.h"
#include "gcz/detail/philox.h"
#include "gcz/detail/terngrad_math.h"
#include "parallel.h"

namespace gcz {
namespace detail {
namespace {

constexpr char kName[] = "terngrad";
// Spans hold whole rounds of base3 packing (160 elements, 32 bytes) and start on a Philox block (16
// coarse draws). Longer spans ran faster up to this length (fewer per-span costs; 256 MiB encode
// 0.75 ns per element at 8200, 0.71 here), and a span's input and draws still fit in L2.
constexpr uint64_t kSpanTarget = 65280;
constexpr uint64_t kMomentSpan = 8192;     // a multiple of kSumBlock
constexpr uint64_t kSuperBlock = kSumBlock << 10;   // a power of two of blocks, a multiple of kMomentSpan
constexpr uint64_t kSpansPerPiece = 4;              // spans per piece of work handed to a thread (~1 MiB)

// The one-pass encode's pieces of work: whole super-blocks (a thread makes each of their moments
// alone), and whole chunks (below).
constexpr uint64_t kOnePassPiece = 5 * kSuperBlock;
static_assert(kOnePassPiece % 160 == 0 && kOnePassPiece <= kTernGradPendingReach, "one-pass pieces");
// The pass goes through a piece in chunks, each from memory to its trits while it is in L1: its coarse
// draws, its moments (which read it from memory, prefetching ahead), then its trits. Whole base-3
// rounds (160 elements, on a Philox block) and whole blocks of the moments' summation; on a 2-core
// Xeon chunks of 2560 made the pass 9% faster than spans of 65280, whose trits came from L2.
constexpr uint64_t kOnePassChunk = 2560;
static_assert(kOnePassChunk % 160 == 0 && kOnePassChunk % kSumBlock == 0 && kOnePassPiece % kOnePassChunk == 0,
              "one-pass chunks");
// A piece gives up its trits (the encode makes them again in a second pass) once more than one
// element in kPendingShare is pending: the sample misled (kMaxPending below), and settling them all
// would cost about as much as that pass.
constexpr uint64_t kPendingShare = 16;
// The bracket's sample: blocks of kSampleBlock elements (a cache line of float32) spread evenly over
// the tensor, one per kSampleEvery elements but at least kSampleMin and at most kSampleMax of them.
// Many short blocks, not a few long ones: neighbours are often alike (a row of a gradient), so the
// error of the guess falls with the number of blocks more than with their length.
constexpr uint64_t kSampleBlock = 16, kSampleEvery = 2048, kSampleMin = 2048, kSampleMax = 16384;
constexpr uint64_t kSampleAhead = 32;
// Its half-width, relative to the guessed c sigma: kWidthErrors standard errors of the sample's
// sigma, at least kMinWidth. A bracket that would leave more than kMaxPending of the elements
// pending (as the sample predicts) is not guessed at all.
constexpr double kWidthErrors = 3.0, kMinWidth = 0.004, kMaxPending = 0.025;

uint64_t ceil_div(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

struct OnePassTesting {
  uint64_t min_elements = kTernGradOnePassMin;
  double lo = 0.0, hi = 0.0;
};
OnePassTesting g_one_pass;

}  // namespace

void terngrad_one_pass_for_testing(uint64_t min_elements, double lo, double hi) { g_one_pass = {min_elements, lo, hi}; }

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

const float* TernGradCodec::span_values(const TensorInfo& t, const void* src, uint64_t a, uint64_t len,
                                        std::vector<float>& buf) {
  const auto* in = static_cast<const std::byte*>(src) + a * dtype_size(t.dtype);
  if (t.dtype == DType::kFloat32) return reinterpret_cast<const float*>(in);
  buf.resize(std::max<std::size_t>(buf.size(), len));
  convert_elements(t.dtype, in, DType::kFloat32, buf.data(), len);
  return buf.data();
}

unsigned TernGradCodec::parts(uint64_t count) const {
  return unit_ == 0 ? parts_for(threads_, count, kMinPartElements) : 1u;
}

// The blocks of the summation order are summed in super-blocks of kSuperBlock elements, each with its
// own TernGradMoments (all starting from the tensor's K), and the super-blocks' totals are combined
// pairwise again. With a power of two of blocks per super-block this is the tree of one PairwiseSum
// over all the blocks: the largest power of two below any block count above a super-block is a
// whole number of super-blocks, so every split of the tree falls between super-blocks. Threads then
// take super-blocks without changing a bit.
//
// Gathered in slices (prepare), the same: the shift is the first finite element's wherever it lies
// (a super-block before it holds no finite element, so no sum depends on it), and the super-blocks'
// totals are kept in order until the last.
void TernGradCodec::find_shift(const TensorInfo& t, const void* src, uint64_t count, Gathered& g) {
  for (uint64_t a = 0; a < count && !g.shift.has_shift; a += kMomentSpan) {
    const uint64_t len = std::min(kMomentSpan, count - a);
    terngrad_find_shift(span_values(t, src, a, len, scratch_[0].x), len, g.shift);
  }
}

void TernGradCodec::gather(const TensorInfo& t, const void* src, uint64_t first, uint64_t count, unsigned parts,
                           Gathered& g) {
  find_shift(t, src, count, g);
  const uint64_t supers = ceil_div(count, kSuperBlock), b0 = first / kSuperBlock;
  g.sums.resize(b0 + supers);
  run_pieces(std::min<uint64_t>(parts, supers), supers, 1, [&](unsigned k, uint64_t begin, uint64_t end) {
    for (uint64_t b = begin; b < end; ++b) {
      TernGradMoments m = g.shift;
      for (uint64_t a = b * kSuperBlock; a < std::min(count, (b + 1) * kSuperBlock); a += kMomentSpan) {
        const uint64_t len = std::min(kMomentSpan, count - a);
        terngrad_add_moments(span_values(t, src, a, len, scratch_[k].x), len, m);
      }
      g.sums[b0 + b] = SuperBlockSums::of(m);
    }
  });
  g.next = first + count;
}

TernGradCodec::TensorScale TernGradCodec::scale_of(const Gathered& g, uint64_t numel) const {
  TernGradMoments total = g.shift;
  for (const SuperBlockSums& b : g.sums) {
    total.s1.add(b.s1);
    total.s2.add(b.s2);
    total.finite += b.finite;
    total.max_bits = std::max(total.max_bits, b.max_bits);
  }
  return {total.scale(o_.clip), total.finite == numel};
}

TernGradCodec::TensorScale TernGradCodec::tensor_scale(const TensorInfo& t, const void* src, uint64_t count,
                                                       unsigned parts) {
  Gathered g;
  gather(t, src, 0, count, parts, g);
  return scale_of(g, count);
}

std::optional<TernGradCodec::Bracket> TernGradCodec::guess_bracket(const TensorInfo& t, const void* src,
                                                                   uint64_t count) {
  // The one pass makes trits in base 3 (where the scale may be max|x|, with no clip, no bracket would
  // hold it), on a tensor too large for the second pass to find it in cache.
  if (!o_.base3 || !(o_.clip > 0.0) || count < g_one_pass.min_elements || count < kSampleMin * kSampleBlock) {
    return std::nullopt;
  }
  const uint64_t blocks = std::clamp(count / kSampleEvery, kSampleMin, kSampleMax);
  // The blocks lie far apart, each a cache miss and a TLB miss: a first loop copies them out, doing
  // nothing else, so that many misses are in flight at once (fetched kSampleAhead blocks ahead); with
  // the arithmetic below in the same loop it took three times as long.
  std::vector<float> sample(blocks * kSampleBlock);
  {
    const std::size_t esize = dtype_size(t.dtype);
    // Block b at floor(b (count - kSampleBlock) / (blocks - 1)), rounded down to a cache line's
    // worth, computed without the product, which could overflow.
    const uint64_t step = (count - kSampleBlock) / (blocks - 1), rest = (count - kSampleBlock) % (blocks - 1);
    std::vector<uint64_t> at(blocks);
    for (uint64_t b = 0; b < blocks; ++b) at[b] = (b * step + b * rest / (blocks - 1)) / kSampleBlock * kSampleBlock;
    for (uint64_t b = 0; b < blocks; ++b) {
      if (b + kSampleAhead < blocks)
        __builtin_prefetch(static_cast<const std::byte*>(src) + at[b + kSampleAhead] * esize);
      std::memcpy(sample.data() + b * kSampleBlock, span_values(t, src, at[b], kSampleBlock, scratch_[0].x),
                  kSampleBlock * sizeof(float));
    }
  }
  // Each block's finite count and sums of d and d^2, d = x - K0 (K0 the sample's first finite element).
  std::vector<double> c1(blocks), c2(blocks), n(blocks);
  double k0 = 0.0, total_n = 0.0, total_c1 = 0.0, total_c2 = 0.0;
  bool has_k0 = false;
  float max_abs = 0.0f;
  for (uint64_t b = 0; b < blocks; ++b) {
    for (uint64_t i = 0; i < kSampleBlock; ++i) {
      const float x = sample[b * kSampleBlock + i];
      if (!std::isfinite(x)) continue;
      if (!has_k0) {
        k0 = x;
        has_k0 = true;
      }
      const double d = static_cast<double>(x) - k0;
      c1[b] += d;
      c2[b] += d * d;
      n[b] += 1.0;
      max_abs = std::max(max_abs, std::fabs(x));
    }
    total_n += n[b];
    total_c1 += c1[b];
    total_c2 += c2[b];
  }
  if (total_n < 0.5 * static_cast<double>(blocks * kSampleBlock)) return std::nullopt;
  const double mean = total_c1 / total_n, var = total_c2 / total_n - mean * mean;
  if (!(var > 0.0)) return std::nullopt;
  // The standard error of var from the spread of the blocks' own (each block one draw: neighbours
  // within a block may be alike), and sigma's relative error half var's.
  double spread = 0.0, used = 0.0;
  for (uint64_t b = 0; b < blocks; ++b) {
    if (n[b] == 0.0) continue;
    const double r = (c2[b] - 2.0 * mean * c1[b]) / n[b] + mean * mean - var;
    spread += r * r;
    used += 1.0;
  }
  const double error = 0.5 * std::sqrt(spread / (used - 1.0) / used) / var;
  const double width = std::max(kMinWidth, kWidthErrors * error);
  const double centre = o_.clip * std::sqrt(var);
  double lo = 1.0 - width, hi = 1.0 + width;
  if (g_one_pass.lo != 0.0) {
    lo = g_one_pass.lo;
    hi = g_one_pass.hi;
  } else {
    // The share of elements the bracket would leave pending (too many, and the one pass would cost
    // about what it saves). With p = min(|x|, s) / s: stochastic, an element is pending for about
    // 256 p (1 / lo - 1 / hi) + 1 of the 256 coarse draw bytes; deterministic, when 1/2 lies between
    // |x| / (hi c sigma) and |x| / (lo c sigma).
    double share = 0.0;
    for (float x : sample) {
      if (!std::isfinite(x)) continue;
      const double a = std::fabs(x);
      share += o_.stochastic ? std::min(a, centre) / centre * (1.0 / lo - 1.0 / hi) + 1.0 / 256.0
                             : (a >= 0.5 * lo * centre && a < 0.5 * hi * centre ? 1.0 : 0.0);
    }
    if (!(share / total_n <= kMaxPending)) return std::nullopt;
  }
  if (!(centre * hi < 3.4e38)) return std::nullopt;  // the bracket in float32, finite
  const Bracket b{static_cast<float>(centre * lo), static_cast<float>(centre * hi)};
  // The scale is min(max|x|, c sigma): with an element above the bracket it is c sigma (if in it).
  if (!(max_abs > b.hi) || !terngrad_bracket_supported(b.lo)) return std::nullopt;
  return b;
}

TernGradCodec::Path TernGradCodec::encode_one_pass(const TensorInfo& t, const void* src, uint64_t count, unsigned parts,
                                                   const Bracket& bracket, std::byte* trits, TensorScale& whole) {
  Gathered g;
  find_shift(t, src, count, g);
  g.sums.resize(ceil_div(count, kSuperBlock));
  // A piece's pending elements: kPendingShare of its elements, and room for one more chunk.
  const uint64_t pieces = ceil_div(count, kOnePassPiece), room = kOnePassPiece / kPendingShare + kOnePassChunk;
  if (pending_size_ < pieces * room) {
    pending_.reset(new TernGradPending[pieces * room]);  // not initialised: untouched pages cost nothing
    pending_size_ = pieces * room;
  }
  pending_count_.assign(pieces, 0);
  std::atomic<bool> gave_up{false};
  run_pieces(parts, count, kOnePassPiece, [&](unsigned k, uint64_t a, uint64_t b) {
    Scratch& w = scratch_[k];
    TernGradPending* pending = pending_.get() + a / kOnePassPiece * room;
    uint64_t& pending_count = pending_count_[a / kOnePassPiece];
    w.u.resize(kOnePassChunk + 32);
    w.ties.resize(tie_room(kOnePassChunk, kOnePassChunk));
    TernGradMoments m = g.shift;
    for (uint64_t at = a; at < b; at += kOnePassChunk) {
      const uint64_t len = std::min(kOnePassChunk, b - at);
      const float* x = span_values(t, src, at, len, w.x);
      const bool trits_too = !gave_up.load(std::memory_order_relaxed);
      if (trits_too && o_.stochastic) {
        fill_coarse8(context_.seed, context_.tensor_key, kStreamTernGrad, at, len, w.u.data());
      }
      uint64_t finite = 0;
      for (uint64_t c = at; c < at + len;) {  // the moments, a super-block's apart from the next's
        const uint64_t super = c / kSuperBlock, end = std::min(at + len, (super + 1) * kSuperBlock);
        const uint64_t before = m.finite;
        terngrad_add_moments(x + (c - at), end - c, m);
        finite += m.finite - before;
        if (end % kSuperBlock == 0 || end == count) {
          g.sums[super] = SuperBlockSums::of(m);
          m = g.shift;
        }
        c = end;
      }
      if (trits_too) {
        terngrad_bracket_span({x, w.u.data(), len, at - a, finite == len, o_.stochastic, bracket.lo, bracket.hi,
                               w.ties.data(), reinterpret_cast<uint8_t*>(trits) + at / 5},
                              pending, pending_count);
        if (pending_count > (b - a) / kPendingShare) gave_up.store(true, std::memory_order_relaxed);
      }
    }
  });
  whole = scale_of(g, count);
  Path path = Path::kOnePass;
  if (gave_up.load()) {
    path = Path::kGaveUp;
  } else if (!(whole.s >= bracket.lo && whole.s <= bracket.hi)) {
    path = Path::kMissed;
  } else {
    run_pieces(parts, pieces, 1, [&](unsigned, uint64_t p, uint64_t) {
      const FineDraws fine{context_.seed, context_.tensor_key, kStreamTernGrad, p * kOnePassPiece};
      terngrad_settle_pending(pending_.get() + p * room, pending_count_[p], whole.s, fine,
                              reinterpret_cast<uint8_t*>(trits) + p * kOnePassPiece / 5, o_.stochastic);
    });
  }
  return path;
}

uint64_t TernGradCodec::prepare_unit() const { return kSuperBlock; }

Status TernGradCodec::prepare(const TensorInfo& t, const void* src, uint64_t first, uint64_t count) {
  if (o_.group_scale) return Status::ok();
  GCZ_ASSIGN_OR_RETURN(uint64_t numel, t.numel());
  if (first == 0) {
    gathered_ = {};
    streamed_.reset();
  }
  if (first != gathered_.next || first % kSuperBlock != 0 || first + count > numel) {
    return internal_error("codec 'terngrad': prepare() out of order");
  }
  scratch_.resize(std::max<std::size_t>(scratch_.size(), parts(count)));
  gather(t, src, first, count, parts(count), gathered_);
  return Status::ok();
}

void TernGradCodec::encode_spans(const TensorInfo& t, const void* src, uint64_t first, uint64_t a, uint64_t b,
                                 const TensorScale& whole, std::byte* trits, std::byte* scales, Scratch& w) {
  const uint64_t most = std::min(span_, b - a);
  w.u.resize(most + 32);  // also when unused: the trit loops read it, up to 32 bytes past an element
  w.ties.resize(o_.stochastic ? tie_room(most, piece_) : 0);
  w.trits.resize(most + 5);
  w.s.resize(std::max<uint64_t>(1, ceil_div(most, piece_)));
  if (!o_.group_scale) w.s[0] = whole.s;
  const uint64_t per_byte = o_.base3 ? 5 : 4;
  for (; a < b; a += span_) {
    const uint64_t len = std::min(span_, b - a);
    const float* x = span_values(t, src, a, len, w.x);
    bool finite = whole.finite;
    if (o_.group_scale) {
      finite = terngrad_group_scales(x, len, o_.group, o_.clip, w.s.data());
      std::memcpy(scales + a / o_.group * 4, w.s.data(), ceil_div(len, o_.group) * 4);
    }
    if (o_.stochastic) {  // the draws prefetch x as they go, unless the group scales have just read it
      const float* touch = o_.group_scale ? nullptr : x;
      fill_coarse8(context_.seed, context_.tensor_key, kStreamTernGrad, first + a, len, w.u.data(), touch);
    }
    const FineDraws fine{context_.seed, context_.tensor_key, kStreamTernGrad, first + a};
    terngrad_encode_span({x, w.u.data(), fine, len, piece_, w.s.data(), o_.stochastic, o_.base3, finite,
                          w.trits.data(), w.ties.data(), reinterpret_cast<uint8_t*>(trits + a / per_byte)});
  }
}

Status TernGradCodec::encode(const TensorInfo& t, const void* src, uint64_t first, uint64_t count,
                             std::vector<ByteBuffer>& out) {
  if (out.size() != 2) return internal_error("codec 'terngrad' expects two output streams");
  GCZ_ASSIGN_OR_RETURN(uint64_t numel, t.numel());
  // A tensor scale takes the whole tensor, or chunks of whole spans once prepare() has seen all of it.
  const bool streamed = !o_.group_scale && count < numel;
  const bool aligned = o_.group_scale ? first % unit_ == 0
                       : streamed     ? first % span_ == 0 && gathered_.next == numel
                                      : first == 0;
  if (!aligned) return internal_error("codec 'terngrad': chunk does not start at a chunk unit, or was not prepared");
  GCZ_ASSIGN_OR_RETURN(uint64_t trit_bytes, stream_size(t, 0, first, count));
  GCZ_ASSIGN_OR_RETURN(uint64_t scale_bytes, stream_size(t, 1, first, count));
  if (streamed && first != 0) scale_bytes = 0;  // the tensor-wide scale goes with the first chunk
  const std::size_t trit_old = out[0].size(), scale_old = out[1].size();
  out[0].resize(trit_old + trit_bytes);
  out[1].resize(scale_old + scale_bytes);
  const unsigned n = parts(count);
  scratch_.resize(std::max<std::size_t>(scratch_.size(), n));
  TensorScale whole;
  Path path = Path::kTwoPasses;
  if (!o_.group_scale && count > 0) {
    if (streamed) {
      if (!streamed_) streamed_ = scale_of(gathered_, numel);
      whole = *streamed_;
    } else if (const std::optional<Bracket> bracket = guess_bracket(t, src, count)) {
      path = encode_one_pass(t, src, count, n, *bracket, out[0].data() + trit_old, whole);
    } else {
      whole = tensor_scale(t, src, count, n);
    }
    if (scale_bytes != 0) std::memcpy(out[1].data() + scale_old, &whole.s, 4);
  }
  if (!streamed) path_ = path;
  if (path == Path::kOnePass) return Status::ok();
  run_pieces(n, count, kSpansPerPiece * span_, [&](unsigned k, uint64_t a, uint64_t b) {
    encode_spans(t, src, first, a, b, whole, out[0].data() + trit_old, out[1].data() + scale_old, scratch_[k]);
  });
  return Status::ok();
}

Status TernGradCodec::decode_spans(const TensorInfo& t, const std::vector<ByteSpan>& in, uint64_t a, uint64_t b,
                                   void* dst, Scratch& w) {
  const uint64_t most = std::min(span_, b - a);
  w.y.resize(t.dtype == DType::kFloat32 ? 0 : most);
  w.trits.resize(most + 5);
  w.s.resize(std::max<uint64_t>(1, ceil_div(most, piece_)));
  const std::size_t esize = dtype_size(t.dtype);
  const uint64_t per_byte = o_.base3 ? 5 : 4;
  for (; a < b; a += span_) {
    const uint64_t len = std::min(span_, b - a);
    const uint64_t groups = ceil_div(len, piece_);
    for (uint64_t g = 0; g < groups; ++g) {
      std::memcpy(&w.s[g], in[1].data() + (o_.group_scale ? (a / o_.group + g) * 4 : 0), 4);
      if (!(w.s[g] >= 0.0f && w.s[g] <= 3.40282346638528859812e+38f)) {
        return format_error("codec 'terngrad': a scale is negative or not finite");
      }
    }
    auto* out = static_cast<std::byte*>(dst) + a * esize;
    float* y = t.dtype == DType::kFloat32 ? reinterpret_cast<float*>(out) : w.y.data();
    if (!terngrad_decode_span({reinterpret_cast<const uint8_t*>(in[0].data()) + a / per_byte, len, piece_,
                               w.s.data(), o_.base3, w.trits.data(), y})) {
      return format_error("codec 'terngrad': invalid trit byte or nonzero padding");
    }
    if (t.dtype != DType::kFloat32) convert_elements(DType::kFloat32, y, t.dtype, out, len);
  }
  return Status::ok();
}

Status TernGradCodec::decode(const TensorInfo& t, const std::vector<ByteSpan>& in, uint64_t first, uint64_t count,
                             void* dst) {
  GCZ_ASSIGN_OR_RETURN(uint64_t trit_bytes, stream_size(t, 0, first, count));
  GCZ_ASSIGN_OR_RETURN(uint64_t scale_bytes, stream_size(t, 1, first, count));
  if (in.size() != 2 || in[0].size() != trit_bytes || in[1].size() != scale_bytes) {
    return format_error("codec 'terngrad': streams have the wrong size for its shape");
  }
  // A tensor scale decodes any whole spans (the scale is tensor-wide); a group scale, whole units.
  if (first % (unit_ ? unit_ : span_) != 0) {
    return internal_error("codec 'terngrad': chunk does not start at a chunk unit");
  }
  const unsigned n = parts(count);
  scratch_.resize(std::max<std::size_t>(scratch_.size(), n));
  const uint64_t piece = kSpansPerPiece * span_;
  std::vector<Status> status(ceil_div(count, piece));  // the first bad piece's error is the one reported
  run_pieces(n, count, piece, [&](unsigned k, uint64_t a, uint64_t b) {
    status[a / piece] = decode_spans(t, in, a, b, dst, scratch_[k]);
  });
  for (const Status& s : status) GCZ_RETURN_IF_ERROR(s);
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
