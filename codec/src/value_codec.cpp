#include "gcz/detail/value_codec.h"

#include "gcz/codec_spec.h"

namespace gcz::detail {

Result<ValueCodec> ValueCodec::make(std::string_view outer, const Params& params, const std::string& key,
                                    std::string_view def, Backend backend) {
  auto it = params.find(key);
  const std::string text = it == params.end() ? std::string(def) : param_to_string(it->second);
  const std::string where = "codec '" + std::string(outer) + "': " + key + "='" + spec_excerpt(text) + "'";
  // Bound the depth before anything recurses.
  if (const int depth = 1 + nested_codec_depth(text); depth > kMaxValueCodecDepth) {
    return invalid_argument("codec '" + std::string(outer) + "': " + key + ": value codecs nest " +
                            std::to_string(depth) + " deep, more than " + std::to_string(kMaxValueCodecDepth));
  }
  auto spec = parse_codec_spec(text);
  if (!spec) return spec.status().with_context(where);
  if (spec->stages.size() != 1 || spec->stages[0].name == "zstd") {
    return invalid_argument(where + ": a value codec is one stage (zstd applies to the whole tensor)" +
                            exponent_plus_hint(*spec));
  }
  auto inner = make_codec(spec->stages[0].name, spec->stages[0].params, backend);
  if (!inner) return Status(inner.status().code(), where + ": " + inner.status().message());
  ValueCodec v;
  v.key_ = key;
  v.inner_ = std::move(*inner);
  CodecSpec canonical;
  canonical.stages.push_back({std::string(v.inner_->name()), v.inner_->params()});
  v.spec_ = canonical.to_string();
  v.names_ = v.inner_->stream_names(v.info({0}));
  return v;
}

ValueCodec ValueCodec::with_key(std::string key) const {
  ValueCodec v = *this;
  v.key_ = std::move(key);
  return v;
}

std::vector<std::string> ValueCodec::stream_names() const {
  std::vector<std::string> out;
  for (const std::string& n : names_) out.push_back(key_ + "." + n);
  return out;
}

Result<uint64_t> ValueCodec::stream_size(const Shape& shape, std::size_t stream) const {
  const TensorInfo t = info(shape);
  GCZ_ASSIGN_OR_RETURN(uint64_t n, t.numel());
  return inner_->stream_size(t, stream, 0, n);
}

CodecContext ValueCodec::inner_context(const CodecContext& outer) const {
  return {outer.seed, outer.tensor_key ^ tensor_key(key_)};
}

Status ValueCodec::encode(const Shape& shape, const float* values, ByteBuffer* out, const CodecContext& outer) const {
  const TensorInfo t = info(shape);
  GCZ_ASSIGN_OR_RETURN(uint64_t n, t.numel());
  std::vector<ByteBuffer> streams(names_.size());
  inner_->set_context(inner_context(outer));
  GCZ_RETURN_IF_ERROR(inner_->encode(t, values, 0, n, streams));
  for (std::size_t i = 0; i < streams.size(); ++i) out[i].insert(out[i].end(), streams[i].begin(), streams[i].end());
  return Status::ok();
}

Status ValueCodec::decode(const Shape& shape, const ByteSpan* in, float* values, const CodecContext& outer) const {
  const TensorInfo t = info(shape);
  GCZ_ASSIGN_OR_RETURN(uint64_t n, t.numel());
  std::vector<ByteSpan> streams(in, in + names_.size());
  inner_->set_context(inner_context(outer));
  return inner_->decode(t, streams, 0, n, values).with_context(key_);  // which level of a nested spec
}

}  // namespace gcz::detail
