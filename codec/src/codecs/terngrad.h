// TernGrad (Wen et al. 2017) on the CPU: each element becomes one of {-s, 0, +s}, s = max|clip(x)| per
// tensor (the paper) or per group, x clipped to ±c·sigma first; rounding stochastic (unbiased within the
// clip) or deterministic; trits packed five per byte (base 3) or four per byte (2 bits). The math is in
// gcz/detail/terngrad_math.h, the layout in docs/codecs/terngrad.md.
//
//   auto c = gcz::make_terngrad_codec({{"scale", std::string("group")}}, gcz::Backend::kCpu);
//   (*c)->stream_names(t);   // {"trits", "scales"}
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "codecs/terngrad_span.h"
#include "gcz/codec.h"

namespace gcz {

// Makes the `terngrad` codec from its spec parameters (clip, scale, group, rounding, packing).
Result<std::unique_ptr<Codec>> make_terngrad_codec(const Params& params, Backend backend);

namespace detail {

struct TernGradOptions {
  double clip = 2.5;        // c: clip to ±c·sigma; 0 = no clipping
  bool group_scale = false; // one scale per group of `group` elements instead of per tensor
  uint64_t group = 128;     // 1..kTernGradMaxGroup, with group_scale only
  bool stochastic = true;   // unbiased Bernoulli rounding, else deterministic (|x|/s >= 0.5)
  bool base3 = true;        // 5 trits per byte, else 4 (2 bits each)
};

inline constexpr uint64_t kTernGradMaxGroup = uint64_t{1} << 24;

// The smallest tensor a tensor scale encodes in one pass (TernGradCodec::encode_one_pass), 64 MiB of
// float32: below it the second pass may find the tensor in the last-level cache (on a 2-core Xeon,
// 32 MiB took two passes at 7.3 GB/s and one at 5.8; 64 MiB 3.9 and 5.0).
inline constexpr uint64_t kTernGradOnePassMin = uint64_t{1} << 24;
// Testing: the smallest tensor that takes the one-pass encode (kTernGradOnePassMin by default,
// UINT64_MAX for none), and, when lo and hi are not 0, a bracket forced to [lo c sigma, hi c sigma]
// around the sample's guess instead of the guess's own. Not thread-safe: set it before encoding.
void terngrad_one_pass_for_testing(uint64_t min_elements, double lo = 0.0, double hi = 0.0);

Result<TernGradOptions> parse_terngrad_options(const Params& params);

class TernGradCodec : public Codec {
 public:
  explicit TernGradCodec(const TernGradOptions& o);

  std::string_view name() const override { return "terngrad"; }
  Params params() const override;
  std::vector<std::string> stream_names(const TensorInfo&) const override { return {"trits", "scales"}; }
  uint64_t chunk_unit() const override { return unit_; }
  // How the last encode of a whole tensor with a tensor scale went (for tests and benchmarks).
  enum class Path {
    kTwoPasses,  // the moments, then the trits
    kOnePass,    // the trits with the moments, the pending ones settled after
    kMissed,     // one pass, but the scale fell outside the bracket: the trits made again
    kGaveUp,     // one pass, but too many elements were pending: the trits made again
  };
  Path last_path() const { return path_; }
  // A tensor scale streams: the moments are gathered by prepare(), in super-blocks of the summation
  // order, and the chunks are whole spans; the scale is the tensor-wide stream.
  uint64_t streaming_unit() const override { return o_.group_scale ? 0 : span_; }
  uint64_t prepare_unit() const override;
  Status prepare(const TensorInfo& t, const void* src, uint64_t first, uint64_t count) override;
  bool tensor_wide(std::size_t stream) const override { return !o_.group_scale && stream == 1; }
  Result<uint64_t> stream_size(const TensorInfo& t, std::size_t stream, uint64_t first,
                               uint64_t count) const override;
  Status encode(const TensorInfo& t, const void* src, uint64_t first, uint64_t count,
                std::vector<ByteBuffer>& out) override;
  Status decode(const TensorInfo& t, const std::vector<ByteSpan>& in, uint64_t first, uint64_t count,
                void* dst) override;

 private:
  // One thread's buffers: a span as float32 (other dtypes), its draws, trits and scales, decoded values.
  struct Scratch {
    std::vector<float> x, y, s;
    std::vector<uint8_t> u, trits;
    std::vector<uint32_t> ties;
  };
  // The span [a, a + len) of the input as float32 (converted into buf unless already float32).
  static const float* span_values(const TensorInfo& t, const void* src, uint64_t a, uint64_t len,
                                  std::vector<float>& buf);
  // A tensor scale: s, and whether every element is finite (the moments count them).
  struct TensorScale {
    float s = 0.0f;
    bool finite = true;
  };
  // The moments of a tensor scale gathered so far: the shift K (from the first finite element), and
  // the totals of each super-block of the summation order, in order.
  struct SuperBlockSums {
    double s1, s2;
    uint64_t finite;
    int32_t max_bits;
    static SuperBlockSums of(const TernGradMoments& m) { return {m.s1.total(), m.s2.total(), m.finite, m.max_bits}; }
  };
  struct Gathered {
    TernGradMoments shift;  // only K: every super-block's moments start from a copy
    std::vector<SuperBlockSums> sums;
    uint64_t next = 0;  // elements gathered
  };
  // Adds elements [first, first + count) at src to `g`, in `parts` parts: first is a multiple of
  // kSuperBlock, and so is count unless it reaches the end of the tensor.
  void gather(const TensorInfo& t, const void* src, uint64_t first, uint64_t count, unsigned parts, Gathered& g);
  // The scale from all of a tensor's moments.
  TensorScale scale_of(const Gathered& g, uint64_t numel) const;
  // The whole tensor's scale from its moments, computed in `parts` parts.
  TensorScale tensor_scale(const TensorInfo& t, const void* src, uint64_t count, unsigned parts);
  // Encodes elements [a, b) of the chunk at src (a a multiple of span_) into the chunk's streams.
  void encode_spans(const TensorInfo& t, const void* src, uint64_t first, uint64_t a, uint64_t b,
                    const TensorScale& whole, std::byte* trits, std::byte* scales, Scratch& w);
  // Decodes elements [a, b) of the chunk; false on an invalid trit byte or padding.
  Status decode_spans(const TensorInfo& t, const std::vector<ByteSpan>& in, uint64_t a, uint64_t b, void* dst,
                      Scratch& w);
  // Parts for one call: a tensor scale's codec splits the tensor over its threads.
  unsigned parts(uint64_t count) const;
  // Sets the shift K of g from the first finite element of elements [0, count) at src.
  void find_shift(const TensorInfo& t, const void* src, uint64_t count, Gathered& g);

  // The one-pass encode of a whole tensor with a tensor scale: a bracket [lo, hi] that the scale is
  // expected to fall in, guessed from a sample (none where the scale may be max|x|, or where the
  // sample says the bracket would leave too many elements pending), then one pass that makes the
  // moments and the trits under the bracket together, and settles the pending elements once the
  // scale is known.
  struct Bracket {
    float lo, hi;
  };
  std::optional<Bracket> guess_bracket(const TensorInfo& t, const void* src, uint64_t count);
  // The pass: sets `whole`, and returns kOnePass if the trits are done too.
  Path encode_one_pass(const TensorInfo& t, const void* src, uint64_t count, unsigned parts, const Bracket& b,
                       std::byte* trits, TensorScale& whole);

  TernGradOptions o_;
  uint64_t unit_;  // 0 (tensor scale) or lcm(group, trits per byte)
  uint64_t span_;  // elements per span: a multiple of the unit, or kSpanTarget for a tensor scale
  uint64_t piece_; // elements per scale within a span: group, or span_ for a tensor scale
  std::vector<Scratch> scratch_;  // one per part
  Gathered gathered_;             // prepare()'s moments, for a tensor encoded in chunks
  std::optional<TensorScale> streamed_;  // their scale, once the first chunk needed it
  // The one-pass encode's pending elements: piece p's at pending_[p * room, ...), room per piece, and
  // pending_count_[p] of them. Kept from one tensor to the next, so that their pages are touched once.
  std::unique_ptr<TernGradPending[]> pending_;
  uint64_t pending_size_ = 0;
  std::vector<uint64_t> pending_count_;
  Path path_ = Path::kTwoPasses;
};

}  // namespace detail
}  // namespace gcz
