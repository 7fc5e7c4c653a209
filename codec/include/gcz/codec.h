// gcz/codec.h — the codec interface every gradient codec implements, on every backend.
//
// A codec turns the elements of one tensor into a fixed list of named byte streams and back. Codecs
// that work element by element (casts, quantizers) take a tensor in chunks, so a tensor of any size is
// encoded in bounded memory; codecs that need the whole tensor (Top-K, PowerSGD) say so with
// chunk_unit() == 0. The container and the entropy stage (zstd) sit outside: a codec only sees raw
// stream bytes.
//
//   auto spec = gcz::parse_codec_spec("fp16+zstd:level=3");
//   auto codec = gcz::make_codec(spec->stages[0].name, spec->stages[0].params, gcz::Backend::kCpu);
//   std::vector<gcz::ByteBuffer> out(1);
//   (*codec)->encode(info, src, /*first=*/0, /*count=*/n, out);
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "gcz/backend.h"
#include "gcz/status.h"
#include "gcz/tensor.h"

namespace gcz {

using ByteBuffer = std::vector<std::byte>;
using ByteSpan = std::span<const std::byte>;

// One parameter value as written in a spec string and recorded in the .gcz index.
using ParamValue = std::variant<int64_t, double, std::string>;
using Params = std::map<std::string, ParamValue, std::less<>>;

std::string param_to_string(const ParamValue& v);

// Typed access to a parameter with a default; an error names the codec, key and expected type.
Result<int64_t> get_int_param(const Params& p, std::string_view codec, std::string_view key, int64_t def);

class Codec {
 public:
  virtual ~Codec() = default;

  // The name and parameters recorded in the index: together they are all a decoder needs.
  virtual std::string_view name() const = 0;
  virtual Params params() const = 0;

  // Names of the streams this codec writes for `t`, in the order they are laid out in the file.
  virtual std::vector<std::string> stream_names(const TensorInfo& t) const = 0;

  // Elements per chunk: encode() and decode() take [first, first + count) with first a multiple of this
  // and count a multiple of it except at the end of the tensor. 0 means the whole tensor at once.
  virtual uint64_t chunk_unit() const = 0;

  // Bytes stream `stream` (an index into stream_names) holds for elements [first, first + count).
  virtual Result<uint64_t> stream_size(const TensorInfo& t, std::size_t stream, uint64_t first,
                                       uint64_t count) const = 0;

  // Encodes elements [first, first + count) of `t`, given at `src` in t.dtype, appending the bytes of
  // stream i to out[i] (out has one buffer per stream).
  virtual Status encode(const TensorInfo& t, const void* src, uint64_t first, uint64_t count,
                        std::vector<ByteBuffer>& out) = 0;

  // Decodes elements [first, first + count) into `dst` (in t.dtype) from in[i], which holds exactly
  // stream_size(t, i, first, count) bytes of stream i.
  virtual Status decode(const TensorInfo& t, const std::vector<ByteSpan>& in, uint64_t first, uint64_t count,
                        void* dst) = 0;
};

// Names of the codecs this build knows (for --help and error messages).
std::vector<std::string> codec_names();

// Makes the codec `name` with `params` (from a spec string or from a file's index) on `backend`.
// Unknown names, unknown parameter keys and out-of-range values are errors.
Result<std::unique_ptr<Codec>> make_codec(std::string_view name, const Params& params, Backend backend);

}  // namespace gcz
