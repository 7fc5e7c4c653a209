// gcz verify: every checksum, every zstd frame, every padding byte of one or more .gcz files.
#include <memory>

#include "commands.h"
#include "common.h"
#include "gcz/container.h"
#include "gcz/pipeline.h"
#include "report.h"

namespace gcz::cli {

RunFn add_verify_command(CLI::App& app) {
  auto inputs = std::make_shared<std::vector<std::string>>();
  CLI::App* cmd = app.add_subcommand(
      "verify",
      "Check .gcz files completely: structure, index and stream checksums, zstd frames, padding, and every "
      "tensor decoded through its codec");
  cmd->add_option("FILE", *inputs, "The .gcz files")->required();
  cmd->footer("Examples:\n  gcz verify grads.gcz\n  gcz verify checkpoints/*.gcz   # exit code of the first failure");
  return [inputs]() {
    int rc = kExitOk;
    for (const std::string& path : *inputs) {
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
        continue;
      }
      uint64_t streams = 0;
      for (const TensorRecord& t : (*reader)->index().tensors) streams += t.streams.size();
      std::printf("%s: ok (%s, %s, %s)\n", printable(path).c_str(),
                  count_of((*reader)->index().tensors.size(), "tensor").c_str(), count_of(streams, "stream").c_str(),
                  human_bytes((*reader)->file_size()).c_str());
    }
    return rc;
  };
}

}  // namespace gcz::cli
