// gcz verify: every checksum, every zstd frame, every padding byte of one or more .gcz files.
#include <memory>

#include "commands.h"
#include "common.h"
#include "gcz/container.h"
#include "gcz/pipeline.h"
#include "report.h"

namespace gcz::cli {

RunFn add_verify_command(CLI::App& app) {
  struct Args {
    std::vector<std::string> inputs;
    bool json = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "verify",
      "Check .gcz files completely: structure, index and stream checksums, zstd frames, padding, and every "
      "tensor decoded through its codec");
  cmd->add_option("FILE", a->inputs, "The .gcz files")->required();
  cmd->add_flag("--json", a->json,
                "Print one JSON document instead of the 'FILE: ok' lines: per file its path, whether it is ok, "
                "and its counts or its error and exit code (errors still go to stderr too)");
  cmd->footer(
      "Examples:\n  gcz verify grads.gcz\n  gcz verify checkpoints/*.gcz   # exit code of the first failure\n"
      "  gcz verify checkpoints/*.gcz --json | jq -r '.files[] | select(.ok | not) | .path'");
  return [a]() {
    int rc = kExitOk;
    nlohmann::json files = nlohmann::json::array();
    for (const std::string& path : a->inputs) {
      auto reader = GczReader::open(path);
      Status s = reader ? Status::ok() : reader.status();
      ProgressLine progress("verifying");
      if (s) {
        auto cb = progress.callback();
        s = (*reader)->verify([&](uint64_t done, uint64_t total) {
          if (cb) cb(Progress{0, 1, done, total, &path});
        });
      }
      // Then every tensor through its codec: stream contents must follow the codec's rules.
      for (std::size_t t = 0; s && t < (*reader)->index().tensors.size(); ++t) s = check_tensor_data(**reader, t);
      progress.clear();
      if (!s) {
        const int code = report_error(s);
        if (rc == kExitOk) rc = code;
        files.push_back({{"path", path}, {"ok", false}, {"error", s.message()}, {"exit_code", code}});
        continue;
      }
      const std::size_t tensors = (*reader)->index().tensors.size();
      uint64_t streams = 0;
      for (const TensorRecord& t : (*reader)->index().tensors) streams += t.streams.size();
      files.push_back({{"path", path},
                       {"ok", true},
                       {"tensors", tensors},
                       {"streams", streams},
                       {"file_size", (*reader)->file_size()}});
      if (!a->json) {
        std::printf("%s: ok (%s, %s, %s)\n", printable(path).c_str(), count_of(tensors, "tensor").c_str(),
                    count_of(streams, "stream").c_str(), human_bytes((*reader)->file_size()).c_str());
      }
    }
    if (a->json) print_json(stdout, {{"ok", rc == kExitOk}, {"files", files}});
    return rc;
  };
}

}  // namespace gcz::cli
