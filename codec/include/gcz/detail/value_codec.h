// gcz/detail/value_codec.h — a codec applied to float32 values inside another codec: Top-K's and
// Random-K's kept values, PowerSGD's factors. The parameter holding it is a one-stage spec string
// ("fp16", "qsgd:bits=8"); its streams are named "<slot>.<inner stream>" in the outer codec's list.
//
//   auto v = ValueCodec::make("topk", params, "values", "fp32", backend);
//   v->encode({k}, kept.data(), out, context);      // appends to out[0 .. v->stream_count())
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gcz/codec.h"
#include "gcz/codec_spec.h"
#include "gcz/detail/utf8.h"

namespace gcz::detail {

// Value codecs nest at most this deep below a tensor's codec (topk:values=(topk:values=(fp16)): 2).
inline constexpr int kMaxValueCodecDepth = 64;
// A codec writes at most this many streams, its value codecs' included: PowerSGD's two factors double
// them at each level, so depth alone does not bound them (CODECS.md, "Value codecs").
inline constexpr std::size_t kMaxCodecStreams = 1024;

// `text` for a message: whole up to 80 bytes, else its first 64 (whole UTF-8 characters) and "...", so
// that messages quoting each level of a deep spec stay short.
inline std::string spec_excerpt(std::string_view text) {
  return text.size() <= 80 ? std::string(text) : std::string(utf8_prefix(text, 64)) + "...";
}

// For a spec whose later stage begins with a digit, the likely cause: a '+' in a number's exponent
// (1e+30), which the grammar reads as a stage separator. Empty otherwise.
inline std::string exponent_plus_hint(const CodecSpec& spec) {
  for (std::size_t i = 1; i < spec.stages.size(); ++i) {
    const std::string& name = spec.stages[i].name;
    if (!name.empty() && name[0] >= '0' && name[0] <= '9') {
      return " (a '+' separates stages: write an exponent without it, 1e30 for 1e+30)";
    }
  }
  return {};
}

class ValueCodec {
 public:
  // The codec named by parameter `key` of codec `outer` (default `def`); it must be a single stage
  // that takes float32 input (not zstd, which applies to the whole tensor), with at most
  // kMaxValueCodecDepth - 1 levels of value codecs inside it.
  static Result<ValueCodec> make(std::string_view outer, const Params& params, const std::string& key,
                                 std::string_view def, Backend backend);

  // The same codec under another parameter name: streams prefixed "<key>.", draws keyed by it. The
  // two share the inner codec, so they must not encode or decode at the same time.
  ValueCodec with_key(std::string key) const;

  const std::string& spec() const { return spec_; }  // canonical, as recorded in the index
  std::size_t stream_count() const { return names_.size(); }
  // The inner streams, prefixed "<key>.".
  std::vector<std::string> stream_names() const;
  Result<uint64_t> stream_size(const Shape& shape, std::size_t stream) const;
  bool exact_size(std::size_t stream) const { return inner_->exact_size(stream); }

  // Encodes prod(shape) float32 values, appending to out[0 .. stream_count()).
  Status encode(const Shape& shape, const float* values, ByteBuffer* out, const CodecContext& outer) const;
  // Decodes into `values` from in[0 .. stream_count()).
  Status decode(const Shape& shape, const ByteSpan* in, float* values, const CodecContext& outer) const;

 private:
  TensorInfo info(const Shape& shape) const { return {key_, DType::kFloat32, shape}; }
  CodecContext inner_context(const CodecContext& outer) const;

  std::string key_;
  std::string spec_;
  std::vector<std::string> names_;
  std::shared_ptr<Codec> inner_;
};

}  // namespace gcz::detail
