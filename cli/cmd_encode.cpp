// gcz encode: tensor files in, one .gcz out, report on stdout.
#include <memory>

#include "commands.h"
#include "common.h"
#include "report.h"

namespace gcz::cli {

RunFn add_encode_command(CLI::App& app) {
  auto args = std::make_shared<EncodeArgs>();
  auto output = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand("encode", "Encode gradient dumps into a .gcz file and report ratio and error");
  add_encode_options(*cmd, *args);
  cmd->add_option("-o,--output", *output, "The .gcz file to write (replaced atomically; nothing is left on failure)")
      ->required();
  cmd->footer(
      "Examples:\n"
      "  gcz encode step_100.safetensors -o step_100.gcz                      # fp16, the default\n"
      "  gcz encode grads/ -o grads.gcz -c bf16+zstd:level=5 --rule '*.bias=none' --min-numel 1024\n"
      "  gcz encode dump.bin --dtype f32 --shape 4096,4096 -o dump.gcz --json");
  return [args, output]() {
    auto options = to_encode_options(*args);
    if (!options) return report_error(options.status());
    ProgressLine progress("encoding");
    options->progress = progress.callback();
    auto report = encode_files(args->inputs, *output, *options);
    progress.clear();
    if (!report) return report_error(report.status());
    if (!args->quiet) print_report(stdout, *report, args->report_format);
    print_warnings(*report);
    return static_cast<int>(kExitOk);
  };
}

RunFn add_eval_command(CLI::App& app) {
  auto args = std::make_shared<EncodeArgs>();
  CLI::App* cmd = app.add_subcommand(
      "eval", "Encode and decode in memory and report ratio and error; nothing is written");
  add_encode_options(*cmd, *args);
  cmd->footer(
      "Examples:\n"
      "  gcz eval grads.safetensors -c fp16\n"
      "  gcz eval grads.safetensors -c bf16 --rule 'embed.*=fp16' --csv > bf16.csv");
  return [args]() {
    auto options = to_encode_options(*args);
    if (!options) return report_error(options.status());
    ProgressLine progress("evaluating");
    options->progress = progress.callback();
    auto report = encode_files(args->inputs, "", *options);
    progress.clear();
    if (!report) return report_error(report.status());
    if (!args->quiet) print_report(stdout, *report, args->report_format);
    print_warnings(*report);
    return static_cast<int>(kExitOk);
  };
}

}  // namespace gcz::cli
