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
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "gcz/backend.h"
#include "gcz/status.h"
#include "gcz/tensor.h"

namespace gcz {

// The allocator of ByteBuffer: growing a buffer (resize(n), or constructing it with n bytes) leaves
// the new bytes uninitialised instead of zeroing them, so that an encoder writes each byte of its
// output once, not twice (zeroing QSGD's 8-bit codes first cost 5% of its encode, a cast's 20%).
// Code that wants zeros asks for them: resize(n, std::byte{0}).
template <class T>
struct DefaultInitAllocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = DefaultInitAllocator<U>;
  };
  DefaultInitAllocator() = default;
  template <class U>
  DefaultInitAllocator(const DefaultInitAllocator<U>&) noexcept {}
  template <class U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

using ByteBuffer = std::vector<std::byte, DefaultInitAllocator<std::byte>>;
using ByteSpan = std::span<const std::byte>;

// One parameter value as written in a spec string and recorded in the .gcz index.
using ParamValue = std::variant<int64_t, double, std::string>;
using Params = std::map<std::string, ParamValue, std::less<>>;

std::string param_to_string(const ParamValue& v);

// Typed access to a parameter with a default; an error names the codec, key and expected type.
Result<int64_t> get_int_param(const Params& p, std::string_view codec, std::string_view key, int64_t def);
// A number (integer or not) parameter.
Result<double> get_number_param(const Params& p, std::string_view codec, std::string_view key, double def);
// A word parameter that must be one of `allowed`.
Result<std::string> get_choice_param(const Params& p, std::string_view codec, std::string_view key,
                                     const std::vector<std::string>& allowed, std::string_view def);
// Fails naming the first key of `p` not in `known` (a typo must not be ignored).
Status check_param_keys(const Params& p, std::string_view codec, const std::vector<std::string>& known);

// What a codec's random draws are keyed by (docs/CODECS.md, "Randomness").
struct CodecContext {
  uint64_t seed = 0;        // --seed, recorded in each tensor's index entry
  uint64_t tensor_key = 0;  // tensor_key(name)
};
// XXH3-64 (seed 0) of the tensor name's UTF-8 bytes.
uint64_t tensor_key(std::string_view name);

// State a codec carries from one step to the next (PowerSGD's Q), saved in the error-feedback file.
struct CodecState {
  Shape shape;
  std::vector<float> values;
};

class Codec {
 public:
  virtual ~Codec() = default;

  // The seed and tensor identity for random draws; set before encode() and decode().
  void set_context(const CodecContext& context) { context_ = context; }
  const CodecContext& context() const { return context_; }

  // Threads a whole-tensor codec (chunk_unit() == 0) may use inside one encode() or decode(); the bytes
  // do not depend on it. Chunked codecs ignore it: their callers split a tensor over threads instead.
  void set_threads(unsigned threads) { threads_ = threads > 1 ? threads : 1; }
  unsigned threads() const { return threads_; }

  // Whether stream `stream` always has exactly stream_size() bytes. A stream whose size depends on
  // the data (Top-K's indices) returns false, and stream_size() is then an upper bound; only
  // whole-tensor codecs (chunk_unit() == 0) may have such streams.
  virtual bool exact_size(std::size_t stream) const {
    (void)stream;
    return true;
  }

  // Carried state: the codec's state after the last encode() (nullopt when it keeps none), and the
  // state to start the next encode() from (a warm start; one whose shape or size does not fit the
  // tensor is not used: the encode starts cold).
  virtual std::optional<CodecState> state() const { return std::nullopt; }
  virtual Status set_state(const TensorInfo& t, const CodecState& state) {
    (void)t;
    (void)state;
    return Status::ok();
  }

  // The name and parameters recorded in the index: together they are all a decoder needs.
  virtual std::string_view name() const = 0;
  virtual Params params() const = 0;

  // Names of the streams this codec writes for `t`, in the order they are laid out in the file.
  virtual std::vector<std::string> stream_names(const TensorInfo& t) const = 0;

  // Elements per chunk: encode() and decode() take [first, first + count) with first a multiple of this
  // and count a multiple of it except at the end of the tensor. 0 means the whole tensor at once.
  virtual uint64_t chunk_unit() const = 0;

  // Streaming a whole-tensor codec. One whose chunks depend on the whole tensor only through a little
  // it can gather first (TernGrad's tensor scale, from the moments of every element) may also take the
  // tensor in chunks, so that neither side holds it whole. Then:
  //  - streaming_unit() is the chunk unit for that (0: the codec cannot);
  //  - before encoding, the caller hands prepare() the whole tensor in order, in slices whose counts
  //    are multiples of prepare_unit() except the last; encode() then takes chunks of fewer than all
  //    elements on this one codec object, which splits each over its threads (set_threads);
  //  - a tensor_wide() stream belongs to the tensor, not to a chunk: stream_size() gives its whole
  //    size for any range, encode() writes it with the chunk at first = 0 only, and decode() gets all
  //    of it with every chunk.
  // One encode() or decode() call on the whole tensor needs none of this, and makes the same bytes.
  virtual uint64_t streaming_unit() const { return 0; }
  virtual uint64_t prepare_unit() const { return 1; }
  virtual Status prepare(const TensorInfo& t, const void* src, uint64_t first, uint64_t count) {
    (void)t, (void)src, (void)first, (void)count;
    return Status::ok();
  }
  virtual bool tensor_wide(std::size_t stream) const {
    (void)stream;
    return false;
  }

  // Bytes stream `stream` (an index into stream_names) holds for elements [first, first + count).
  virtual Result<uint64_t> stream_size(const TensorInfo& t, std::size_t stream, uint64_t first,
                                       uint64_t count) const = 0;

  // Encodes elements [first, first + count) of `t`, given at `src` in t.dtype, appending the bytes of
  // stream i to out[i] (out has one buffer per stream). A ByteBuffer grows uninitialised: the codec
  // writes every byte it appends. The caller's part, which a codec need not check: `t` is a valid
  // tensor (what a reader of any input gives), the range lies within it on chunk_unit() boundaries
  // (or streaming_unit()'s, after prepare(): above), and src holds its count elements.
  virtual Status encode(const TensorInfo& t, const void* src, uint64_t first, uint64_t count,
                        std::vector<ByteBuffer>& out) = 0;

  // Decodes elements [first, first + count) into `dst` (in t.dtype) from in[i], which holds exactly
  // stream_size(t, i, first, count) bytes of stream i.
  virtual Status decode(const TensorInfo& t, const std::vector<ByteSpan>& in, uint64_t first, uint64_t count,
                        void* dst) = 0;

 protected:
  CodecContext context_;
  unsigned threads_ = 1;
};

// Names of the codecs this build knows (for --help and error messages).
std::vector<std::string> codec_names();

// Makes the codec `name` with `params` (from a spec string or from a file's index) on `backend`.
// Unknown names, unknown parameter keys and out-of-range values are errors. Making a `powersgd` codec
// pins OpenBLAS to one thread for the whole process, once: its bytes must not depend on the cores.
Result<std::unique_ptr<Codec>> make_codec(std::string_view name, const Params& params, Backend backend);

// Pins OpenBLAS to one thread, as making a `powersgd` codec does, and stops the worker threads its
// pthreads build starts when it is loaded, one per core: they poll for work for about a tenth of a
// second first, taking a core from the codecs' own threads. For a program that uses the BLAS only
// through gcz, called early (the gcz command calls it first); elsewhere, leave the BLAS to its owner.
void release_blas_threads();

}  // namespace gcz
