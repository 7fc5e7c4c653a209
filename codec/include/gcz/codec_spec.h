// gcz/codec_spec.h — the codec spec string: how a user names a codec chain.
//
//   spec   := stage ( '+' stage )*
//   stage  := name [ ':' key '=' value ( ',' key '=' value )* ]
//   value  := integer | number | word | '(' spec ')'
//
// The first stage is the codec that turns elements into streams; later stages act on the byte streams
// (in format v1: `zstd[:level=N]`). A parenthesised value carries a nested spec for codecs that take a
// value codec. Examples: "fp16", "bf16+zstd", "none+zstd:level=19".
//
//   gcz::Result<gcz::CodecSpec> s = gcz::parse_codec_spec("fp16+zstd:level=3");
//   s->stages[1].name == "zstd";  std::get<int64_t>(s->stages[1].params.at("level")) == 3;
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gcz/codec.h"

namespace gcz {

struct StageSpec {
  std::string name;
  Params params;
};

struct CodecSpec {
  std::vector<StageSpec> stages;
  std::string to_string() const;  // canonical text: parameters in key order
};

Result<CodecSpec> parse_codec_spec(std::string_view text);

// How deep codec-valued parameters (values, factors, fallback) nest inside `text`, in parentheses or
// bare: "topk:values=(topk:values=(fp16))" and "topk:values=(topk:values=fp16)" are 2,
// "qsgd:scale=(max)" 0. Counted before anything recurses.
int nested_codec_depth(std::string_view text);

// `text` with every parameter left out that has its default, in nested value codecs too
// ("topk:k=5,values=(qsgd:bits=8,group=128,...)" gives "topk:k=5,values=qsgd"): the same codec, in
// words a table has room for. `text` itself where it is not a spec gcz can make.
std::string brief_spec(std::string_view text);

// A spec split into what the encoder does: the element codec, then an optional zstd stage on every
// stream (stored compressed only where that makes the stream smaller).
struct EncodingPlan {
  StageSpec codec;
  std::optional<int> zstd_level;
  std::string text;  // canonical spec text, for reports
};

inline constexpr int kDefaultZstdLevel = 3;
inline constexpr int kMaxZstdLevel = 22;  // FORMAT.md §5.3: a zstd stage's level is 1..22

// Checks the stage names and the zstd stage's parameters. Codec parameters are checked by make_codec.
// Its errors say what is wrong; parse_encoding_plan's also start with the spec as typed.
Result<EncodingPlan> plan_from_spec(const CodecSpec& spec);
Result<EncodingPlan> parse_encoding_plan(std::string_view text);
// parse_encoding_plan, then the codec made once on the CPU to check its parameters: what a command
// does with a spec the user typed, before any work. Every error, an unknown codec too, is
// kInvalidArgument (a usage error; an unknown codec in a file is kUnsupported) and names the spec.
Result<EncodingPlan> check_encoding_plan(std::string_view text);

// The stage that really encodes tensor `t` when `stage` is asked for: a codec may hand tensors it does
// not suit to its fallback (PowerSGD: 1-D tensors and matrices its factors would not shrink), so that
// the index names the codec that wrote the bytes. Otherwise `stage` itself.
Result<StageSpec> stage_for_tensor(const TensorInfo& t, const StageSpec& stage);

}  // namespace gcz
