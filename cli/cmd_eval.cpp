// gcz eval: encode and decode in memory, report, write nothing. With --steps, the inputs are
// consecutive training steps and error feedback can be carried across them.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "commands.h"
#include "common.h"
#include "gcz/error_feedback.h"
#include "report.h"

namespace gcz::cli {

RunFn add_eval_command(CLI::App& app) {
  struct Args {
    EncodeArgs encode;
    bool steps = false, ef = false;
    std::string ef_state;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "eval", "Encode and decode in memory and report ratio and error; nothing is written");
  add_encode_options(*cmd, a->encode);
  cmd->get_option("--seed")->description(
      "Seed for codecs that draw random numbers; with --steps, step s (from 0) uses SEED + s, plus the steps "
      "that an --ef-state has seen, as a chain of gcz encode --ef-state runs does");
  cmd->add_flag("--steps", a->steps,
                "The inputs are consecutive training steps (same tensor names): report each step, and how far "
                "the sum of decoded steps drifts from the sum of true gradients (sum_rel_l2)");
  cmd->add_flag("--ef", a->ef, "With --steps: carry error feedback (residuals, PowerSGD's Q) from step to step");
  cmd->add_option("--ef-state", a->ef_state,
                  "With --steps --ef: start from the residuals (and step count) in this state file, which must "
                  "exist; it is not written");
  cmd->footer(
      "Examples:\n"
      "  gcz eval grads.safetensors -c fp16\n"
      "  gcz eval grads.safetensors -c bf16 --rule 'embed.*=fp16' --csv > bf16.csv\n"
      "  gcz eval --steps step_000?.safetensors -c 'topk:ratio=0.01' --ef     # watch the gap close\n"
      "  gcz eval --steps step_000?.safetensors --adapt fp16 --adapt 'topk:ratio=0.01' --budget 1MiB,64KiB,1MiB "
      "--ef\n" +
      std::string(kCodecParametersHelp));
  return [a]() {
    auto options = to_encode_options(a->encode);
    if (!options) return report_error(options.status());
    auto budgets = budgets_for(a->encode, a->steps ? a->encode.inputs.size() : 0);
    if (!budgets) return report_error(budgets.status());
    if (!budgets->empty()) options->budget = budgets->front();
    auto view = parse_report_view(a->encode.sort, a->encode.top, a->steps);
    if (!view) return report_error(view.status());
    if ((a->ef || !a->ef_state.empty()) && !a->steps) {
      return report_error(invalid_argument(
          "--ef and --ef-state need --steps, with the step files in order (one file is a run of one step; gcz "
          "encode --ef-state carries residuals from one run to the next)"));
    }
    if (!a->ef_state.empty() && !a->ef) {
      return report_error(invalid_argument("--ef-state needs --ef: its residuals are only used to feed back"));
    }
    note_unused_raw_options(a->encode.raw_dtype, a->encode.raw_shape, a->encode.inputs);
    ProgressLine progress("evaluating");
    options->progress = progress.callback();
    if (!a->steps) {
      auto report = encode_files(a->encode.inputs, "", *options);
      progress.clear();
      if (!report) return report_error(report.status());
      if (!a->encode.quiet) print_report(stdout, *report, a->encode.report_format, *view);
      print_warnings(*report);
      return static_cast<int>(kExitOk);
    }
    // Every step's input is opened before the first step runs: a missing or unreadable file should
    // not cost the steps before it.
    std::vector<std::pair<std::string, std::vector<TensorInfo>>> step_tensors;
    for (const std::string& input : a->encode.inputs) {
      auto reader = open_tensor_file(input, options->read);
      if (!reader) return report_error(reader.status());
      step_tensors.emplace_back(input, (*reader)->tensors());
    }
    ErrorFeedback ef;
    if (!a->ef_state.empty()) {
      std::error_code ec;
      if (!std::filesystem::exists(a->ef_state, ec)) {
        return report_error(
            io_error("--ef-state " + a->ef_state + ": no such file (gcz eval reads a state and never writes one)"));
      }
      auto loaded = ErrorFeedback::load(a->ef_state);
      if (!loaded) return report_error(loaded.status());
      ef = std::move(*loaded);
    }
    ef.set_feedback(a->ef);
    ef.set_track_sums(true);
    // With feedback, a tensor whose shape or dtype changes is an error: found before any step runs.
    if (Status st = ef.check_steps(step_tensors); !st) return report_error(st);
    options->error_feedback = &ef;
    // A state given must be this model's, as encode --ef-state requires: it holds residuals for some of
    // the first step's tensors, or none at all (later steps are warned of below when they share no name).
    options->refuse_foreign_state = !a->ef_state.empty();
    std::vector<StepReport> steps;
    std::vector<RuleUse> rules;  // what each rule did in any step
    std::map<std::string, Shape> shapes;  // each tensor's shape when last seen
    for (const std::string& input : a->encode.inputs) {
      progress.set_verb("evaluating step " + std::to_string(steps.size() + 1) + "/" +
                        std::to_string(a->encode.inputs.size()) + ":");
      const uint64_t step = ef.steps();  // the state's count, as a chain of encode --ef-state runs numbers it
      if (!budgets->empty()) options->budget = (*budgets)[steps.size()];
      auto report = encode_files({input}, "", *options);
      options->refuse_foreign_state = false;
      progress.clear();
      if (!report) return report_error(report.status());
      print_warnings(*report, /*rules=*/false, input);
      // Without feedback a tensor may change shape (with it, that is an error): its sums start again.
      for (const TensorReport& t : report->tensors) {
        auto [it, fresh] = shapes.emplace(t.name, t.shape);
        if (fresh || it->second == t.shape) continue;
        std::fprintf(stderr, "gcz: warning: %s: tensor '%s': shape %s, %s before: its sum_rel_l2 starts again\n",
                     printable(input).c_str(), printable(t.name).c_str(), shape_to_string(t.shape).c_str(),
                     shape_to_string(it->second).c_str());
        it->second = t.shape;
      }
      if (!steps.empty()) {
        // Steps of one model share their names: none shared says the inputs are not such steps.
        std::set<std::string> before;
        for (const TensorReport& t : steps.back().report.tensors) before.insert(t.name);
        if (std::none_of(report->tensors.begin(), report->tensors.end(),
                         [&](const TensorReport& t) { return before.count(t.name) > 0; })) {
          std::fprintf(stderr,
                       "gcz: warning: %s: no tensor of this step is named as one of the step before, so "
                       "%s again for every tensor (steps of one model share their names; a .npy's tensor is named "
                       "after its file: keep one file name from step to step, e.g. step_1/grad.npy, "
                       "step_2/grad.npy)\n",
                       printable(input).c_str(), a->ef ? "sum_rel_l2 and the residuals start" : "sum_rel_l2 starts");
        }
      }
      if (rules.empty()) rules = report->rules;
      for (std::size_t i = 0; i < rules.size(); ++i) {
        rules[i].matched |= report->rules[i].matched;
        rules[i].applied |= report->rules[i].applied;
      }
      steps.push_back({input, std::move(*report), step});
    }
    print_rule_warnings(rules);
    if (!a->encode.quiet) print_steps(stdout, steps, a->encode.report_format, a->ef, *view);
    return static_cast<int>(kExitOk);
  };
}

}  // namespace gcz::cli
