#include "gcz/detail/cast_codec.h"

#include "gcz/convert.h"

namespace gcz::detail {

std::optional<std::optional<DType>> cast_codec_target(std::string_view name) {
  if (name == "none") return std::optional<std::optional<DType>>(std::in_place);  // a known codec, no cast
  if (name == "fp32") return std::optional<DType>{DType::kFloat32};
  if (name == "fp16") return std::optional<DType>{DType::kFloat16};
  if (name == "bf16") return std::optional<DType>{DType::kBFloat16};
  return std::nullopt;
}

Result<uint64_t> CastCodec::stream_size(const TensorInfo& t, std::size_t stream, uint64_t, uint64_t count) const {
  if (stream != 0) return internal_error("cast codec has one stream");
  auto bytes = checked_mul(count, dtype_size(stored_dtype(t)));
  if (!bytes) return format_error("stream size overflows");
  return *bytes;
}

Status CastCodec::encode(const TensorInfo& t, const void* src, uint64_t, uint64_t count,
                         std::vector<ByteBuffer>& out) {
  if (out.size() != 1) return internal_error("cast codec expects one output stream");
  const DType stored = stored_dtype(t);
  ByteBuffer& values = out[0];
  const std::size_t old = values.size();
  values.resize(old + count * dtype_size(stored));
  return convert(t.dtype, src, stored, values.data() + old, count);
}

Status CastCodec::decode(const TensorInfo& t, const std::vector<ByteSpan>& in, uint64_t first, uint64_t count,
                         void* dst) {
  GCZ_ASSIGN_OR_RETURN(uint64_t expect, stream_size(t, 0, first, count));
  if (in.size() != 1 || in[0].size() != expect) {
    return format_error("stream 'values' has the wrong size for its shape");
  }
  return convert(stored_dtype(t), in[0].data(), t.dtype, dst, count);
}

Status CastCodec::convert(DType from, const void* src, DType to, void* dst, uint64_t n) {
  convert_elements(from, src, to, dst, n);
  return Status::ok();
}

}  // namespace gcz::detail
