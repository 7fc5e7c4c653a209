// gcz/detail/cast_codec.h — the cast codecs (none, fp32, fp16, bf16), shared by the CPU and CUDA
// backends. A backend supplies only the element conversion; the stream layout lives here once.
//
// Stream layout (docs/CODECS.md): one stream "values" holding every element converted to the stored
// dtype (the input dtype for `none`), little-endian, in C order.
#pragma once

#include <optional>

#include "gcz/codec.h"

namespace gcz::detail {

class CastCodec : public Codec {
 public:
  // `name` is one of none, fp32, fp16, bf16; `target` is empty for none (store the input dtype).
  CastCodec(std::string name, std::optional<DType> target) : name_(std::move(name)), target_(target) {}

  std::string_view name() const override { return name_; }
  Params params() const override { return {}; }
  std::vector<std::string> stream_names(const TensorInfo&) const override { return {"values"}; }
  uint64_t chunk_unit() const override { return 1; }
  Result<uint64_t> stream_size(const TensorInfo& t, std::size_t stream, uint64_t first,
                               uint64_t count) const override;
  Status encode(const TensorInfo& t, const void* src, uint64_t first, uint64_t count,
                std::vector<ByteBuffer>& out) override;
  Status decode(const TensorInfo& t, const std::vector<ByteSpan>& in, uint64_t first, uint64_t count,
                void* dst) override;

  DType stored_dtype(const TensorInfo& t) const { return target_.value_or(t.dtype); }

 protected:
  // Converts n elements; the CPU backend calls convert_elements, the CUDA backend runs a kernel.
  virtual Status convert(DType from, const void* src, DType to, void* dst, uint64_t n);

 private:
  std::string name_;
  std::optional<DType> target_;
};

// Returns the stored dtype of cast codec `name` (nullopt inside for none), or nullopt if `name` is
// not a cast codec.
std::optional<std::optional<DType>> cast_codec_target(std::string_view name);

}  // namespace gcz::detail
