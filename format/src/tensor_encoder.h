// Internal: encoding one tensor into an open GczWriter, chunk by chunk, measuring what it lost.
#pragma once

#include <functional>
#include <optional>

#include "gcz/codec_spec.h"
#include "gcz/container.h"
#include "gcz/pipeline.h"
#include "scratch_buffer.h"

namespace gcz::detail {

// A tensor held in memory, as a TensorSource.
class MemorySource : public TensorSource {
 public:
  MemorySource(TensorInfo info, const std::byte* data) : info_(std::move(info)), data_(data) {}
  const TensorInfo& info() const override { return info_; }
  Status read(uint64_t first, uint64_t count, void* dst) override;
  const std::byte* view(uint64_t first, uint64_t count) override;

 private:
  TensorInfo info_;
  const std::byte* data_;
};

// The chunk unit of a whole-tensor codec that streams (Codec::streaming_unit) a tensor of `numel`
// elements in chunks of about `chunk_elements`: a whole number of its units and of metric blocks (so
// the threads inside it measure in pieces that append in order), and 0 where the tensor fits in one
// chunk or the codec does not stream. The encoder and decoder chunk it alike.
uint64_t streaming_chunk_unit(const Codec& codec, uint64_t numel, uint64_t chunk_elements);

// What encode() may do beyond the plain path (error feedback uses all of it).
struct EncodeExtras {
  // Metrics compare x̂ with this whole tensor (same dtype as the source) instead of the source.
  const std::byte* reference = nullptr;
  // Input bytes the report counts (default: the source's size).
  std::optional<uint64_t> bytes_in;
  // Called with each decoded chunk (first, count, x̂ in the source's dtype).
  std::function<void(uint64_t, uint64_t, const std::byte*)> on_decoded;
  // Warm start for codecs that carry state, and where to put their state afterwards.
  const CodecState* state_in = nullptr;
  std::optional<CodecState>* state_out = nullptr;
};

class TensorEncoder {
 public:
  // `threads` > 1 splits each chunk of a chunked codec over that many threads (CPU backend), in
  // pieces at fixed element boundaries, so the bytes and metrics are the same for any thread count.
  TensorEncoder(GczWriter& writer, Backend backend, uint64_t seed, uint64_t chunk_elements, unsigned threads = 1)
      : writer_(writer), backend_(backend), seed_(seed), chunk_elements_(chunk_elements),
        threads_(backend == Backend::kCpu && threads > 1 ? threads : 1) {}

  // Encodes src with `plan` into the writer, returning its report (codec, metrics). `progress` gets
  // input bytes as they are done.
  Result<TensorReport> encode(TensorSource& src, const EncodingPlan& plan, const std::function<void(uint64_t)>& progress,
                              const EncodeExtras& extras = {});

  // The metrics of every tensor so far, merged.
  const MetricsAccumulator& total() const { return total_; }

 private:
  // Encodes and decodes elements [first, first + count) (`chunk` holds the chunk from element
  // chunk_first) on codec `codec`, into `out` and xhat_, measuring into `acc`.
  Status encode_piece(Codec& codec, const TensorInfo& t, const std::byte* chunk, uint64_t chunk_first, uint64_t first,
                      uint64_t count, const std::byte* reference, std::vector<ByteBuffer>& out,
                      MetricsAccumulator& acc);

  GczWriter& writer_;
  Backend backend_;
  uint64_t seed_;
  uint64_t chunk_elements_;
  unsigned threads_;
  ScratchBuffer in_, xhat_;  // a chunk read from a source that has no view of it; its decoded values
  std::vector<ByteBuffer> wide_;  // a streamed codec's tensor-wide streams, from its first chunk
  MetricsAccumulator total_;
};

}  // namespace gcz::detail
