// gcz — encode gradient dumps into .gcz files with the codecs of distributed training, and report what
// the compression costs and loses. This file only dispatches to the subcommands (cli/cmd_*.cpp).
#include <cstdio>
#include <map>

#include "commands.h"
#include "common.h"
#include "gcz/backend.h"

int main(int argc, char** argv) {
  using namespace gcz::cli;
  CLI::App app{"gcz: compress gradient tensors with the codecs of distributed training (fp16/bf16, QSGD, TernGrad,\n"
               "Top-K, Random-K, PowerSGD, hybrids, error feedback) into .gcz files, and report the compression\n"
               "ratio and the reconstruction error.",
               "gcz"};
  app.footer(
      "Examples:\n"
      "  gcz eval grads.safetensors -c fp16            # measure, write nothing\n"
      "  gcz encode grads.safetensors -o grads.gcz -c bf16+zstd --rule '*.bias=none'\n"
      "  gcz info grads.gcz\n"
      "  gcz verify grads.gcz\n"
      "  gcz decode grads.gcz -o restored.safetensors\n"
      "  gcz bench -c fp16 -c bf16                     # throughput against memcpy\n"
      "Run 'gcz COMMAND --help' for each command's options. Exit codes are listed in docs/CLI.md.");
  app.set_version_flag("--version", std::string("gcz ") + GCZ_CLI_VERSION +
                                        (gcz::built_with_cuda() ? " (CUDA backend built in)" : " (CPU only)"));
  app.require_subcommand(1);
  std::map<CLI::App*, RunFn> runs;
  auto add = [&](RunFn (*fn)(CLI::App&)) {
    const std::size_t before = app.get_subcommands({}).size();
    RunFn run = fn(app);
    runs[app.get_subcommands({})[before]] = std::move(run);
  };
  add(add_encode_command);
  add(add_eval_command);
  add(add_decode_command);
  add(add_info_command);
  add(add_verify_command);
  add(add_bench_command);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitUsage;
  }
  for (const auto& [sub, run] : runs) {
    if (sub->parsed()) return run();
  }
  return kExitUsage;
}
