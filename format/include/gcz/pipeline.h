// gcz/pipeline.h — the file-level operations behind the CLI: encode dumps into a .gcz (or only
// measure, for eval), decode a .gcz into tensor files. The CLI parses arguments and prints; everything
// else happens here.
//
//   gcz::EncodeOptions opt;
//   opt.spec = "bf16+zstd";
//   opt.rules.push_back({"*.bias", "none"});
//   gcz::Result<gcz::EncodeReport> r = gcz::encode_files({"grads.safetensors"}, "grads.gcz", opt);
//   r->total.ratio; r->tensors[0].metrics.rel_l2;
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gcz/backend.h"
#include "gcz/container.h"
#include "gcz/error_feedback.h"
#include "gcz/metrics.h"
#include "gcz/status.h"
#include "gcz/tensor.h"
#include "gcz/tensor_io.h"

namespace gcz {

// Whether the whole of `name` matches the shell pattern `glob`, as POSIX fnmatch without flags
// does, but by characters of UTF-8 rather than bytes: `*` any run (also across '/'), `?` one
// character, `[...]` one of a set (ranges by code point, `!` or `^` first to negate, `]` first to
// include it), `\` makes the next character plain. A byte of no valid UTF-8 sequence is a character
// of its own; a `[` with no closing `]` is plain. --rule and decode's -t use it.
bool glob_match(std::string_view glob, std::string_view name);

// `--rule GLOB=SPEC`: tensors whose name matches GLOB (glob_match) use SPEC instead of the default.
// The first matching rule wins.
struct CodecRule {
  std::string glob;
  std::string spec;
};

// Parses "GLOB=SPEC", split at the first '=' not escaped as "\=" (a glob's own '=' is; a spec may
// hold more); the spec is checked.
Result<CodecRule> parse_codec_rule(const std::string& text);

struct Progress {
  std::size_t tensor = 0;       // index of the tensor being processed
  std::size_t tensors = 0;      // how many there are; 0 while the inputs are opened (name: the input)
  uint64_t bytes_done = 0;      // input bytes processed so far
  uint64_t bytes_total = 0;
  const std::string* name = nullptr;
  const std::string* level = nullptr;  // adaptive compression: the level being tried (null otherwise)
};
using ProgressFn = std::function<void(const Progress&)>;

// The most CPU threads an operation may be given.
inline constexpr unsigned kMaxThreads = 1024;

// encode_files keeps an input's own metadata (a safetensors __metadata__ KEY) in the .gcz's metadata
// under this prefix; decode_file gives those entries back to a .safetensors output.
inline constexpr const char* kSafetensorsMetadataPrefix = "safetensors.";

struct EncodeOptions {
  std::string spec = "fp16";
  std::vector<CodecRule> rules;
  uint64_t min_numel = 0;  // tensors with fewer elements are stored with `none` (lossless)
  DeviceRequest device = DeviceRequest::kAuto;
  // Seed of the codecs that draw random numbers. With error feedback, a state that has seen s steps
  // encodes the next with seed + s (mod 2^64), so that every step draws afresh.
  uint64_t seed = 0;
  std::map<std::string, std::string> metadata;
  ReadOptions read;
  uint64_t chunk_elements = uint64_t{1} << 24;  // elements per chunk for chunked codecs
  // CPU threads for chunked codecs, 0..kMaxThreads; 0 = one per core. The bytes do not depend on it.
  unsigned threads = 0;
  ProgressFn progress;
  // Error feedback (gcz/error_feedback.h): residuals are added before encoding and updated after, and
  // the state counts the step. Tensors are then encoded as float32 (float64 stays float64), whole, in
  // memory.
  ErrorFeedback* error_feedback = nullptr;
  // With error_feedback and an output: the state file to save it to after the step (empty: not saved)
  // and the residuals' codec. The state is written after the output, and the two are put in place
  // together (GczWriter::commit_together, the output first): where another process has updated the
  // state meanwhile, or either rename fails, neither is; a run stopped by SIGINT, SIGTERM or SIGHUP
  // leaves both or neither.
  std::string ef_state_path;
  std::string ef_codec = "none";
  // Adaptive compression (docs/CLI.md): with `levels`, codec specs from the lightest to the strongest,
  // `spec` is not used: the step is encoded with the first level whose file (rules and min_numel
  // applied, as it would be written) takes at most `budget` bytes, or with the last when none does.
  // Each level is tried on a copy of the error-feedback state; EncodeReport::adaptive says which won.
  std::vector<std::string> levels;
  uint64_t budget = 0;
  // With error_feedback: refuse (kInvalidArgument, before any output) inputs none of whose tensors the
  // state holds a residual for, when it holds any: another model's state, or tensors renamed.
  bool refuse_foreign_state = false;
  // With error_feedback: after the step, drop the state's residuals (and codec states) that no tensor
  // of the step took: tensors renamed, or gone from the model for good. EncodeReport::ef_pruned
  // counts them.
  bool ef_prune = false;
};

// With error feedback and tracked sums: how far the sum of decoded steps is from the sum of true
// gradients, ||Σx̂ − Σx||² and ||Σx||² over the steps so far.
struct CumulativeError {
  double err_sq = 0;
  double ref_sq = 0;
  double max_err = 0;  // the largest |Σx̂ − Σx| and |Σx|: whether the float64 squares held
  double max_ref = 0;
  // sqrt(err_sq / ref_sq); 0 where every Σx̂ equals its Σx; NaN (not measured) where magnitudes leave
  // what float64 squares hold, as for the per-step metrics (docs/CLI.md, "The report").
  double rel_l2() const;
  void merge(const CumulativeError& o);
};

struct TensorReport {
  std::string name;
  DType dtype = DType::kFloat32;
  Shape shape;
  std::string codec;  // canonical chain text
  Metrics metrics;    // with error feedback: x̂ against this step's true gradient x
  std::optional<CumulativeError> cumulative;
};

// What a rule did in a run: whether its glob matched a tensor, and whether it chose a tensor's codec
// (it does not when an earlier rule matches first, or the tensor is below min_numel).
struct RuleUse {
  std::string rule;  // GLOB=SPEC
  bool matched = false;
  bool applied = false;
};

// Which level of EncodeOptions::levels encoded a step, and what the levels tried before it took.
struct AdaptiveChoice {
  uint64_t budget = 0;
  std::vector<std::string> levels;  // as given, lightest first
  std::size_t level = 0;            // the one that encoded the step
  bool fits = false;                // false: no level fits the budget, and the last encoded the step
  std::vector<uint64_t> bytes;      // the file's bytes at each level tried, levels[0] first
};

struct EncodeReport {
  std::vector<TensorReport> tensors;
  std::vector<SkippedTensor> skipped;
  Metrics total;  // bytes_out is the whole file, header, index and padding included
  std::optional<CumulativeError> cumulative;
  Backend backend = Backend::kCpu;
  uint64_t seed = 0;           // the seed recorded for every tensor (see EncodeOptions)
  std::vector<RuleUse> rules;  // one per EncodeOptions::rules, in order
  std::optional<AdaptiveChoice> adaptive;  // with EncodeOptions::levels
  // With error feedback from a state that held residuals: this step's tensors it held none for (they
  // start from zero: new, or renamed since), in name order, and how many of its residuals no tensor
  // of this step took (kept for a later step).
  std::vector<std::string> ef_new;
  uint64_t ef_unused = 0;
  uint64_t ef_pruned = 0;  // with EncodeOptions::ef_prune: the residuals dropped
};

// Encodes every floating tensor of `inputs` (files or directories) into `output`; with an empty
// `output`, encodes and measures without writing anything (gcz eval). Tensor names must be unique
// across inputs.
Result<EncodeReport> encode_files(const std::vector<std::string>& inputs, const std::string& output,
                                  const EncodeOptions& options);

struct DecodeOptions {
  std::vector<std::string> names;  // tensors to decode (globs); empty = all
  WriteOptions write;
  DeviceRequest device = DeviceRequest::kAuto;
  ProgressFn progress;
};

// Decodes `input` (.gcz) into `output`, a tensor file whose format follows its extension.
Status decode_file(const std::string& input, const std::string& output, const DecodeOptions& options);

// Decodes tensor `index` through its codec and discards the result: checks what checksums cannot,
// that the streams' contents follow the codec's rules (FORMAT.md §6, bad-stream-data).
Status check_tensor_data(const GczReader& reader, std::size_t index);

// Decodes tensor `index` of an open file into memory: its elements in its dtype, C order.
Result<ByteBuffer> decode_tensor(const GczReader& reader, std::size_t index, DeviceRequest device = DeviceRequest::kCpu);

// Checks, before any work, that `path` can take an output file: not empty, in an existing directory
// that this process may write in, and not an existing directory, symbolic link, device or pipe (an
// output is written to a temporary file and renamed over a regular file only).
Status check_output_path(const std::string& path);

// What gcz encode checks before any work, so that a mistake does not cost a whole encode: OUTPUT and,
// with error feedback, the state file pass check_output_path, carry no tensor format's extension
// (.npz, .safetensors, ...) and are not one file, the state is not one of `inputs` either, and the
// residual codec spec passes check_encoding_plan. Messages name the options (-o, --ef-state, --ef-codec).
Status check_encode_outputs(const std::vector<std::string>& inputs, const std::string& output,
                            const std::string& ef_state = "", const std::string& ef_codec = "none");

// Removes the temporary files and directories of outputs that are being written and not yet in place:
// for a program stopped by a signal (the gcz CLI calls it on SIGINT, SIGTERM and SIGHUP), so that no
// partial output is left behind. With `for_good` (the program ends next), no output is started or
// put in place afterwards: a thread that tries waits for the end instead of failing and exiting on
// its own. Thread-safe; not async-signal-safe (call it from a thread that waits for the signal, not
// from a handler).
void remove_unfinished_outputs(bool for_good = false);

}  // namespace gcz
