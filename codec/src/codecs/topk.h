// topk.h — the Top-K sparsifier (docs/codecs/topk.md): keeps the k elements of largest magnitude,
// ties to the lower index, and stores their indices (stream `indices`) and their values through a
// value codec (streams `values.<inner>`).
//
//   auto c = gcz::make_codec("topk", {{"ratio", 0.01}, {"values", std::string("fp16")}}, gcz::Backend::kCpu);
#pragma once

#include <memory>

#include "gcz/codec.h"
#include "gcz/detail/value_codec.h"
#include "codecs/sparse_common.h"

namespace gcz::codecs {

class TopKCodec : public Codec {
 public:
  TopKCodec(SparseCount count, detail::ValueCodec values) : count_(count), values_(std::move(values)) {}

  std::string_view name() const override { return "topk"; }
  Params params() const override;
  std::vector<std::string> stream_names(const TensorInfo& t) const override;
  uint64_t chunk_unit() const override { return 0; }
  bool exact_size(std::size_t stream) const override { return stream != 0 && values_.exact_size(stream - 1); }
  Result<uint64_t> stream_size(const TensorInfo& t, std::size_t stream, uint64_t first,
                               uint64_t count) const override;
  Status encode(const TensorInfo& t, const void* src, uint64_t first, uint64_t count,
                std::vector<ByteBuffer>& out) override;
  Status decode(const TensorInfo& t, const std::vector<ByteSpan>& in, uint64_t first, uint64_t count,
                void* dst) override;

 private:
  SparseCount count_;
  detail::ValueCodec values_;
};

// The indices, ascending, of the k elements of src (n elements of `dtype`) with the largest
// magnitude, ties to the lower index, non-finite elements after every finite one. The passes over src
// go on up to `threads` threads; the result does not depend on it.
std::vector<uint64_t> select_top_k(DType dtype, const void* src, uint64_t n, uint64_t k, unsigned threads = 1);

// The factory in the codec registry. There are no CUDA kernels yet: every backend gets this CPU
// implementation (the bytes do not depend on the backend).
Result<std::unique_ptr<Codec>> make_topk(const Params& params, Backend backend);

}  // namespace gcz::codecs
