// randomk.h — the Random-K sparsifier (docs/codecs/randomk.md): keeps k elements chosen by the seeded
// RNG, optionally scaled by n/k so the result is unbiased. The indices are not stored: the decoder
// draws them again from (seed, tensor key), so the only streams are the value codec's `values.<inner>`.
//
//   auto c = gcz::make_codec("randomk", {{"k", int64_t{1000}}, {"scale", std::string("unbiased")}},
//                            gcz::Backend::kCpu);
#pragma once

#include <memory>

#include "gcz/codec.h"
#include "gcz/detail/value_codec.h"
#include "codecs/sparse_common.h"

namespace gcz::codecs {

class RandomKCodec : public Codec {
 public:
  RandomKCodec(SparseCount count, bool unbiased, detail::ValueCodec values)
      : count_(count), unbiased_(unbiased), values_(std::move(values)) {}

  std::string_view name() const override { return "randomk"; }
  Params params() const override;
  std::vector<std::string> stream_names(const TensorInfo&) const override { return values_.stream_names(); }
  uint64_t chunk_unit() const override { return 0; }
  bool exact_size(std::size_t stream) const override { return values_.exact_size(stream); }
  Result<uint64_t> stream_size(const TensorInfo& t, std::size_t stream, uint64_t first,
                               uint64_t count) const override;
  Status encode(const TensorInfo& t, const void* src, uint64_t first, uint64_t count,
                std::vector<ByteBuffer>& out) override;
  Status decode(const TensorInfo& t, const std::vector<ByteSpan>& in, uint64_t first, uint64_t count,
                void* dst) override;

 private:
  SparseCount count_;
  bool unbiased_;
  detail::ValueCodec values_;
};

// The indices, ascending, of the k smallest draws Rng(seed, tensor_key, kStreamRandomK).bits(i) over
// i < n, ties to the lower index. The draws and the selection go on up to `threads` threads; the
// result does not depend on it.
std::vector<uint64_t> select_random_k(const CodecContext& context, uint64_t n, uint64_t k, unsigned threads = 1);

// The scale applied to kept values: float32(n / k) with the division in float64 (unbiased), or 1.
float randomk_scale(uint64_t n, uint64_t k, bool unbiased);

// The factory in the codec registry; every backend gets this CPU implementation for now.
Result<std::unique_ptr<Codec>> make_randomk(const Params& params, Backend backend);

}  // namespace gcz::codecs
