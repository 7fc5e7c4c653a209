// gcz encode: tensor files in, one .gcz out, report on stdout.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "common.h"
#include "gcz/error_feedback.h"
#include "report.h"

namespace gcz::cli {

RunFn add_encode_command(CLI::App& app) {
  struct Args {
    EncodeArgs encode;
    std::string output, ef_state, ef_codec = "none";
    bool ef_resume = false, ef_prune = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("encode", "Encode gradient dumps into a .gcz file and report ratio and error");
  cmd->add_option("-o,--output", a->output, "The .gcz file to write (replaced atomically; nothing is left on failure)")
      ->required();
  add_encode_options(*cmd, a->encode);
  cmd->add_option("--meta", a->encode.meta,
                  "Free-form KEY=VALUE metadata stored in the file; repeatable, each key once. Example: --meta "
                  "step=1200")
      ->allow_extra_args(false);  // one KEY=VALUE each time: an input after it stays an input
  cmd->add_option("--ef-state", a->ef_state,
                  "Error feedback: add the residuals stored in this .gcz to the gradients before encoding, then "
                  "rewrite it with the new residuals and PowerSGD's Q; OUTPUT and the state are put in place "
                  "together, so a failed run leaves both as they were. Created if missing; a tensor whose shape "
                  "changes needs a new one");
  cmd->add_flag("--ef-resume", a->ef_resume,
                "The --ef-state file must exist: this step continues its sequence, and a missing one (a mistyped "
                "name, a state not yet copied) is an error instead of a new state from zero residuals");
  cmd->add_flag("--ef-prune", a->ef_prune,
                "Drop from the --ef-state file the residuals no tensor of this step took (tensors renamed, or gone "
                "from the model for good), instead of keeping them for a later step; a note counts them");
  CLI::Option* ef_codec =
      cmd->add_option("--ef-codec", a->ef_codec,
                      "Codec for the residuals in the --ef-state file; a lossy one loses for good what it drops "
                      "from them")
          ->capture_default_str();
  cmd->footer(
      "Examples:\n"
      "  gcz encode step_100.safetensors -o step_100.gcz                      # fp16, the default\n"
      "  gcz encode grads/ -o grads.gcz -c bf16+zstd:level=5 --rule '*.bias=none' --min-numel 1024\n"
      "  gcz encode step_101.safetensors -o s101.gcz -c 'topk:ratio=0.01' --ef-state ef.gcz --ef-resume\n"
      "  gcz encode step_102.safetensors -o s102.gcz --adapt fp16 --adapt 'qsgd:bits=4' --budget 64MiB --ef-state "
      "ef.gcz\n"
      "  gcz encode dump.bin --dtype f32 --shape 4096,4096 -o dump.gcz --json\n" +
      std::string(kCodecParametersHelp));
  return [a, ef_codec]() {
    auto options = to_encode_options(a->encode);
    if (!options) return report_error(options.status());
    auto budgets = budgets_for(a->encode, 0);
    if (!budgets) return report_error(budgets.status());
    if (!budgets->empty()) options->budget = budgets->front();
    auto view = parse_report_view(a->encode.sort, a->encode.top, /*steps=*/false);
    if (!view) return report_error(view.status());
    for (const std::string* named : {&a->output, &a->ef_state}) {
      if (Status s = check_output_option(*named); !s) return report_error(s);
    }
    if (Status s = check_encode_outputs(a->encode.inputs, a->output, a->ef_state, a->ef_codec); !s) {
      return report_error(s);
    }
    if (a->ef_state.empty() && ef_codec->count() > 0) {
      return report_error(invalid_argument(
          "--ef-codec is the codec of the --ef-state file's residuals, and no --ef-state is given (error feedback "
          "needs one)"));
    }
    for (const auto& [flag, given] : {std::pair{"--ef-resume", a->ef_resume}, std::pair{"--ef-prune", a->ef_prune}}) {
      if (a->ef_state.empty() && given) {
        return report_error(invalid_argument(std::string(flag) + " acts on an --ef-state, and no --ef-state is given"));
      }
    }
    std::optional<ErrorFeedback> ef;
    bool new_state = false;  // said when done: a mistyped name would otherwise start a new state unseen
    if (!a->ef_state.empty()) {
      std::error_code ec;
      new_state = !std::filesystem::exists(a->ef_state, ec);
      if (new_state && a->ef_resume) {
        return report_error(io_error("--ef-state " + a->ef_state +
                                     ": no such file, and --ef-resume continues an existing state (without "
                                     "--ef-resume a missing state starts step 0 from zero residuals)"));
      }
      auto loaded = ErrorFeedback::load(a->ef_state);
      if (!loaded) return report_error(loaded.status().with_context("--ef-state"));
      ef = std::move(*loaded);
      options->error_feedback = &*ef;
      options->ef_state_path = a->ef_state;
      options->ef_codec = a->ef_codec;
      options->refuse_foreign_state = true;
      options->ef_prune = a->ef_prune;
    }
    note_unused_raw_options(a->encode.raw_dtype, a->encode.raw_shape, a->encode.inputs);
    ProgressLine progress("encoding");
    options->progress = progress.callback();
    auto report = encode_files(a->encode.inputs, a->output, *options);
    progress.clear();
    if (!report) return report_error(report.status());
    // ef counts this step: it was step steps() - 1, from 0.
    const std::optional<uint64_t> step = ef ? std::optional<uint64_t>(ef->steps() - 1) : std::nullopt;
    if (!a->encode.quiet) print_report(stdout, *report, a->encode.report_format, *view, step);
    if (ef && !a->encode.quiet && a->encode.report_format == "table") {
      std::printf("\nerror feedback: step %llu of %s, drawn with seed %llu\n", static_cast<unsigned long long>(*step),
                  printable(a->ef_state).c_str(), static_cast<unsigned long long>(report->seed));
    }
    print_warnings(*report);
    if (new_state) {
      std::fprintf(stderr, "gcz: note: --ef-state %s did not exist: this was step 0, from zero residuals\n",
                   printable(a->ef_state).c_str());
    }
    return static_cast<int>(kExitOk);
  };
}

}  // namespace gcz::cli
