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
#include <string>
#include <vector>

#include "gcz/backend.h"
#include "gcz/metrics.h"
#include "gcz/status.h"
#include "gcz/tensor.h"
#include "gcz/tensor_io.h"

namespace gcz {

// `--rule GLOB=SPEC`: tensors whose name matches GLOB (shell wildcards * ? [..]; * also matches '/')
// use SPEC instead of the default. The first matching rule wins.
struct CodecRule {
  std::string glob;
  std::string spec;
};

// Parses "GLOB=SPEC", split at the first '=' (a glob has none; a spec may); the spec is checked.
Result<CodecRule> parse_codec_rule(const std::string& text);

struct Progress {
  std::size_t tensor = 0;       // index of the tensor being processed
  std::size_t tensors = 0;      // how many there are
  uint64_t bytes_done = 0;      // input bytes processed so far
  uint64_t bytes_total = 0;
  const std::string* name = nullptr;
};
using ProgressFn = std::function<void(const Progress&)>;

struct EncodeOptions {
  std::string spec = "fp16";
  std::vector<CodecRule> rules;
  uint64_t min_numel = 0;  // tensors with fewer elements are stored with `none` (lossless)
  DeviceRequest device = DeviceRequest::kAuto;
  uint64_t seed = 0;
  std::map<std::string, std::string> metadata;
  ReadOptions read;
  uint64_t chunk_elements = uint64_t{1} << 24;  // elements per chunk for chunked codecs
  ProgressFn progress;
};

struct TensorReport {
  std::string name;
  DType dtype = DType::kFloat32;
  Shape shape;
  std::string codec;  // canonical chain text
  Metrics metrics;
};

struct EncodeReport {
  std::vector<TensorReport> tensors;
  std::vector<SkippedTensor> skipped;
  Metrics total;  // bytes_out is the whole file, header, index and padding included
  Backend backend = Backend::kCpu;
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

}  // namespace gcz
