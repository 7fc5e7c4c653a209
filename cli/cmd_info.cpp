// gcz info: what a .gcz file holds.
#include <memory>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"
#include "gcz/codec_spec.h"
#include "gcz/container.h"
#include "report.h"

namespace gcz::cli {
namespace {

// Input bytes over stored bytes, two decimals; "-" when nothing is stored.
std::string ratio_text(uint64_t input, uint64_t stored) {
  char text[32] = "-";
  if (stored) std::snprintf(text, sizeof text, "%.2f", static_cast<double>(input) / static_cast<double>(stored));
  return text;
}

void print_table(const GczReader& r) {
  const FileIndex& idx = r.index();
  std::printf("file      %s\n", printable(r.path()).c_str());
  std::printf("format    gcz %u.%u, written by %s\n", kFormatVersionMajor, idx.version_minor,
              printable(idx.producer).c_str());
  std::printf("size      %s (%llu bytes), %s\n", human_bytes(r.file_size()).c_str(),
              static_cast<unsigned long long>(r.file_size()), count_of(idx.tensors.size(), "tensor").c_str());
  for (const auto& [k, v] : idx.metadata) std::printf("metadata  %s=%s\n", printable(k).c_str(), printable(v).c_str());
  std::vector<std::vector<std::string>> rows = {{"tensor", "dtype", "shape", "codec", "streams", "stored", "ratio"}};
  bool widened = false;  // a tensor encoded in a wider dtype than its input's (error feedback's float32)
  uint64_t total_input = 0, total_stored = 0;
  for (const TensorRecord& t : idx.tensors) {
    uint64_t stored = 0;
    std::string streams;
    for (const StreamRecord& s : t.streams) {
      stored += s.length;
      streams += (streams.empty() ? "" : " ") + s.name + ":" + stream_encoding_name(s.encoding);
    }
    // The ratio is to the input's bytes, as the writing run's report gave it, where the index records them.
    const uint64_t held = *t.info.byte_size();
    const uint64_t input = t.metrics && t.metrics->bytes_in > 0 ? t.metrics->bytes_in : held;
    const bool wider = input < held;
    widened = widened || wider;
    total_input += input;
    total_stored += stored;
    rows.push_back({table_cell(printable(t.info.name)), std::string(dtype_name(t.info.dtype)) + (wider ? "*" : ""),
                    shape_to_string(t.info.shape), printable(brief_spec(chain_to_string(t.chain))), printable(streams),
                    human_bytes(stored), ratio_text(input, stored)});
  }
  if (idx.tensors.size() > 1) {
    rows.push_back({"TOTAL", "", count_of(idx.tensors.size(), "tensor"), "", "", human_bytes(total_stored),
                    ratio_text(total_input, total_stored)});
  }
  std::printf("\n");
  print_columns(stdout, rows, 5, /*rule_before_last=*/idx.tensors.size() > 1);
  if (widened) {
    std::printf(
        "\n* encoded wider than its input (error feedback encodes float16 and bfloat16 as float32); its ratio is "
        "to the input's bytes, as the writing run reported it\n");
  }
}

}  // namespace

RunFn add_info_command(CLI::App& app) {
  struct Args {
    std::string input;
    bool json = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("info", "Show the tensors, codecs and streams of a .gcz file");
  cmd->add_option("FILE", a->input, "The .gcz file")->required();
  cmd->add_flag("--json", a->json,
                "Print the file's index (FORMAT.md §5) as JSON, with path, file_size and version_minor added");
  cmd->footer("Examples:\n  gcz info grads.gcz\n  gcz info grads.gcz --json | jq '.tensors[].name'");
  return [a]() {
    auto reader = GczReader::open(a->input);
    if (!reader) return report_error(reader.status());
    if (a->json) {
      nlohmann::json j = nlohmann::json::parse(index_to_json((*reader)->index()));
      j["path"] = a->input;
      j["file_size"] = (*reader)->file_size();
      j["version_minor"] = (*reader)->index().version_minor;
      print_json(stdout, j);
    } else {
      print_table(**reader);
    }
    return static_cast<int>(kExitOk);
  };
}

}  // namespace gcz::cli
