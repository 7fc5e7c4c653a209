// encode_files: tensor files in, .gcz out (or only measured), chunk by chunk in bounded memory.
#include <algorithm>
#include <filesystem>
#include <set>
#include <thread>

#include "error_feedback_step.h"
#include "file_util.h"
#include "gcz/codec_spec.h"
#include "gcz/container.h"
#include "gcz/detail/utf8.h"
#include "gcz/error_feedback.h"
#include "gcz/pipeline.h"
#include "tensor_encoder.h"

namespace gcz {
namespace {

// The codec plan for one tensor: the first matching rule, else the default; small tensors are stored
// losslessly. `uses` (one per rule) records what each rule did.
Result<EncodingPlan> plan_for(const TensorInfo& t, uint64_t numel, const EncodeOptions& o,
                              const EncodingPlan& default_plan, std::vector<RuleUse>& uses) {
  const CodecRule* rule = nullptr;
  for (std::size_t i = 0; i < o.rules.size(); ++i) {
    if (!glob_match(o.rules[i].glob, t.name)) continue;
    uses[i].matched = true;
    if (!rule) {
      rule = &o.rules[i];
      if (numel >= o.min_numel) uses[i].applied = true;  // for this tensor; other tensors' uses stay
    }
  }
  if (numel < o.min_numel) return parse_encoding_plan("none");
  EncodingPlan plan = default_plan;
  if (rule) {
    GCZ_ASSIGN_OR_RETURN(plan, parse_encoding_plan(rule->spec));
  }
  // The codec's own per-tensor choice (e.g. PowerSGD's fallback for 1-D tensors); zstd stays.
  auto stage = stage_for_tensor(t, plan.codec);
  if (!stage) return stage.status().with_context("tensor '" + t.name + "'");
  plan.codec = *stage;
  return plan;
}

// Whether the resolved path `p` is `dir` or lies below it.
bool lies_in(const std::filesystem::path& dir, const std::filesystem::path& p) {
  return std::mismatch(dir.begin(), dir.end(), p.begin(), p.end()).first == dir.end();
}

// Refuses an output that is `input`, or a tensor file inside the directory `input` (which that
// directory's reader opens: the rename into place would replace an input, or add one).
Status check_not_an_input(const std::string& output, const std::string& input) {
  if (output.empty()) return Status::ok();
  if (detail::same_file(input, output)) {
    return invalid_argument(output + ": the output is also an input; write it elsewhere");
  }
  std::error_code ec;
  if (!std::filesystem::is_directory(input, ec) || !tensor_format_from_path(output)) return Status::ok();
  if (!lies_in(detail::resolved_path(input), detail::resolved_path(output))) return Status::ok();
  return invalid_argument(output + ": the output would be a tensor file inside the input directory " + input +
                          "; write it elsewhere");
}

// Refuses an input inside a directory that is also an input: the directory's reader reads it already.
Status check_inputs_apart(const std::map<std::filesystem::path, std::string>& inputs) {
  std::error_code ec;
  for (const auto& [dir, dir_name] : inputs) {
    if (!std::filesystem::is_directory(dir, ec)) continue;
    for (const auto& [path, name] : inputs) {
      if (path != dir && lies_in(dir, path)) {
        return invalid_argument(name + ": inside the input directory " + dir_name +
                                ", which reads it already; give one or the other");
      }
    }
  }
  return Status::ok();
}

// The error for a state that holds residuals (`held`), but none for a tensor of this step: another
// model's or another run's, or the tensors have been renamed (a .npy's tensor takes its file's name).
Status foreign_state(const ErrorFeedback& ef, const std::vector<std::string>& held,
                     const std::map<std::string, std::string>& inputs) {
  auto listed = [](const auto& names, auto name_of) {
    std::string out;
    std::size_t k = 0;
    for (const auto& n : names) {
      if (k++ == 3) return out + ", ... (" + std::to_string(names.size()) + " in all)";
      out += (out.empty() ? "'" : ", '") + std::string(name_of(n)) + "'";
    }
    return out;
  };
  const std::string state = ef.path().empty() ? "the error-feedback state" : "the state " + ef.path();
  return invalid_argument(state + " holds residuals for " + listed(held, [](const std::string& n) { return n; }) +
                          " and none for this step's tensors " +
                          listed(inputs, [](const auto& kv) { return kv.first; }) +
                          ": another model's or run's state (start a new state file), or tensors renamed since (a "
                          ".npy's tensor is named after its file: keep one file name from step to step, e.g. "
                          "step_1/grad.npy, step_2/grad.npy)");
}

// Adaptive compression: the levels tried in turn, lightest first, each as the step would be written
// (a copy of the error-feedback state taking the step), until one fits the budget; the step is then
// encoded with it. A try draws the numbers the step draws, so the step's file has the bytes tried.
Result<EncodeReport> encode_adaptive(const std::vector<std::string>& inputs, const std::string& output,
                                     const EncodeOptions& options) {
  for (const std::string& level : options.levels) {
    GCZ_RETURN_IF_ERROR(check_encoding_plan(level).status().with_context("--adapt '" + level + "'"));
  }
  for (const std::string& input : inputs) GCZ_RETURN_IF_ERROR(check_not_an_input(output, input));  // before the tries
  AdaptiveChoice choice{options.budget, options.levels, options.levels.size() - 1, false, {}};
  EncodeOptions o = options;
  o.levels.clear();
  for (std::size_t i = 0; i < options.levels.size(); ++i) {
    o.spec = options.levels[i];
    if (options.progress) {
      o.progress = [&options, i](const Progress& p) {
        Progress tried = p;
        tried.level = &options.levels[i];
        options.progress(tried);
      };
    }
    std::optional<ErrorFeedback> trial;
    if (options.error_feedback) o.error_feedback = &trial.emplace(options.error_feedback->trial_copy());
    GCZ_ASSIGN_OR_RETURN(EncodeReport tried, encode_files(inputs, "", o));
    choice.bytes.push_back(tried.total.bytes_out);
    const bool last = i + 1 == options.levels.size();
    if (tried.total.bytes_out > options.budget && !last) continue;
    choice.level = i;
    choice.fits = tried.total.bytes_out <= options.budget;
    if (output.empty() && !options.error_feedback) {  // measured only, and nothing to carry: that was the step
      tried.adaptive = std::move(choice);
      return tried;
    }
    break;
  }
  o = options;
  o.levels.clear();
  o.spec = options.levels[choice.level];
  GCZ_ASSIGN_OR_RETURN(EncodeReport report, encode_files(inputs, output, o));
  report.adaptive = std::move(choice);
  return report;
}

}  // namespace

Result<CodecRule> parse_codec_rule(const std::string& text) {
  std::size_t eq = 0;  // the first '=' the glob does not escape
  while (eq < text.size() && text[eq] != '=') eq += text[eq] == '\\' ? 2 : 1;
  if (eq >= text.size()) eq = std::string::npos;
  if (eq == std::string::npos || eq == 0 || eq + 1 == text.size()) {
    return invalid_argument("--rule '" + text + "': expected GLOB=SPEC, e.g. '*.bias=none'");
  }
  CodecRule rule{text.substr(0, eq), text.substr(eq + 1)};
  auto plan = parse_encoding_plan(rule.spec);
  if (!plan) {
    // "a=b=none": an '=' before the spec's parameters is more likely the name's own.
    const bool name_eq = rule.spec.find('=') < rule.spec.find(':');
    return Status(plan.status().code(),
                  plan.status().message() + (name_eq ? " (a '=' in a tensor's name is written '\\=' in GLOB)" : ""))
        .with_context("--rule '" + text + "'");
  }
  return rule;
}

Result<EncodeReport> encode_files(const std::vector<std::string>& inputs, const std::string& output,
                                  const EncodeOptions& options) {
  if (inputs.empty()) return invalid_argument("no input files");
  if (!options.levels.empty()) return encode_adaptive(inputs, output, options);
  if (options.threads > kMaxThreads) {
    return invalid_argument("threads must be 0.." + std::to_string(kMaxThreads) + ", got " +
                            std::to_string(options.threads));
  }
  // Check every codec spec once before any work: a typo should fail at once, not after an hour. A
  // codec the user names that does not exist is a usage error here (in a file it is kUnsupported).
  GCZ_ASSIGN_OR_RETURN(EncodingPlan default_plan, check_encoding_plan(options.spec));
  for (const CodecRule& r : options.rules) {
    GCZ_RETURN_IF_ERROR(check_encoding_plan(r.spec).status().with_context("--rule '" + r.glob + "=" + r.spec + "'"));
  }
  EncodeReport report;
  GCZ_ASSIGN_OR_RETURN(report.backend, resolve_backend(options.device));

  // An input named twice would clash with itself, tensor by tensor: say so once.
  std::map<std::filesystem::path, std::string> input_files;
  for (const std::string& path : inputs) {
    auto [it, fresh] = input_files.emplace(detail::resolved_path(path), path);
    if (!fresh) {
      return invalid_argument(path + ": the same input is given twice" +
                              (it->second == path ? std::string() : " (as " + it->second + " too)"));
    }
  }
  GCZ_RETURN_IF_ERROR(check_inputs_apart(input_files));
  // Open every input first: names are checked for clashes and the progress total is known.
  std::vector<std::unique_ptr<TensorFileReader>> readers;
  std::size_t tensor_count = 0;
  std::map<std::string, std::string> seen;  // name -> file
  uint64_t bytes_total = 0;
  for (const std::string& path : inputs) {
    GCZ_RETURN_IF_ERROR(check_not_an_input(output, path));
    if (options.progress) options.progress(Progress{0, 0, 0, 0, &path});  // opening `path`
    GCZ_ASSIGN_OR_RETURN(auto reader, open_tensor_file(path, options.read));
    for (std::size_t i = 0; i < reader->tensors().size(); ++i) {
      const TensorInfo& t = reader->tensors()[i];
      const std::size_t most = options.error_feedback ? kMaxErrorFeedbackNameBytes : kMaxNameBytes;
      if (t.name.empty() || t.name.size() > most) {
        const std::string which = t.name.empty() ? "a tensor with an empty name"
                                                 : "tensor '" + std::string(detail::utf8_prefix(t.name, 64)) +
                                                       "...' (" + std::to_string(t.name.size()) + " bytes)";
        return unsupported(path + ": " + which + ": a .gcz tensor name is 1-" + std::to_string(kMaxNameBytes) +
                           " bytes (docs/FORMAT.md, 5.2)" +
                           (options.error_feedback ? ", and " + std::to_string(most) +
                                                         " with error feedback, whose state names it residual/NAME"
                                                   : std::string()));
      }
      if (!detail::is_utf8(t.name)) {
        // The index is UTF-8 JSON: such a name would be written with U+FFFD in place of its stray
        // bytes, a name the input does not have, and two of them could become one.
        return unsupported(path + ": tensor '" + t.name +
                           "': a .gcz tensor name is UTF-8 text (docs/FORMAT.md, 5.2), and this one has bytes that "
                           "are not; rename it");
      }
      auto [it, fresh] = seen.emplace(t.name, path);
      if (!fresh) {
        return invalid_argument("tensor '" + t.name + "' appears in both " + it->second + " and " + path +
                                " (steps of one model? encode each to a file of its own, or measure them with "
                                "gcz eval --steps)");
      }
      GCZ_ASSIGN_OR_RETURN(uint64_t bytes, t.byte_size());
      bytes_total += bytes;
      ++tensor_count;
    }
    for (const SkippedTensor& s : reader->skipped()) report.skipped.push_back({s.name, s.reason, path});
    readers.push_back(std::move(reader));
  }
  std::vector<std::string> unused;  // the state's residuals no tensor of the step takes
  if (const ErrorFeedback* ef = options.error_feedback) {
    // Against a state that holds residuals: the step's tensors it holds none for (all of them: refused
    // where asked), and the residuals no tensor of the step takes, which the report gives.
    const std::vector<std::string> held = ef->names();
    if (!held.empty()) {
      std::vector<std::string> fresh;
      for (const auto& [name, file] : seen) {
        if (!ef->find(name)) fresh.push_back(name);
      }
      if (options.refuse_foreign_state && fresh.size() == seen.size()) return foreign_state(*ef, held, seen);
      for (const std::string& name : held) {
        if (seen.count(name) == 0) unused.push_back(name);
      }
      if (ef->feedback()) {
        report.ef_new = std::move(fresh);
        report.ef_unused = unused.size();
      }
    }
  }
  if (tensor_count == 0) {
    // Nothing to encode is a mistake (an empty directory, a dump of integers), as for one .npy of them.
    const std::string where = inputs.size() == 1 ? inputs[0] : std::to_string(inputs.size()) + " inputs";
    std::string why;
    if (!report.skipped.empty()) {
      const SkippedTensor& first = report.skipped[0];
      const std::string name = first.file == where ? first.name : first.file + ": " + first.name;
      why = " (skipped: " + name + ", " + report.skipped[0].reason +
            (report.skipped.size() > 1 ? "; and " + std::to_string(report.skipped.size() - 1) + " more)" : ")");
    }
    return unsupported(where + ": no floating-point tensor to encode" + why);
  }

  GCZ_ASSIGN_OR_RETURN(auto writer, GczWriter::create(output));
  const unsigned threads = options.threads ? options.threads : std::max(1u, std::thread::hardware_concurrency());
  // With error feedback each step draws afresh: step s of the state uses seed + s (Random-K keeps
  // other indices, the quantizers' roundings are independent from step to step).
  report.seed = options.seed + (options.error_feedback ? options.error_feedback->steps() : 0);
  detail::TensorEncoder encoder(*writer, report.backend, report.seed, options.chunk_elements, threads);
  for (const CodecRule& r : options.rules) report.rules.push_back({r.glob + "=" + r.spec});
  std::optional<CumulativeError> cumulative;
  Progress progress{0, tensor_count, 0, bytes_total, nullptr};
  std::size_t k = 0;
  uint64_t bytes_in = 0;
  // A failure names its input (a reader's own errors already start with it, which with_context leaves,
  // or with a file in it).
  auto in_file = [&](const Status& s, std::string path) {
    path = detail::without_trailing_slashes(std::move(path));
    return s.message().rfind(path + "/", 0) == 0 ? s : s.with_context(path);
  };
  for (std::size_t r = 0; r < readers.size(); ++r) {
    TensorFileReader& reader = *readers[r];
    for (std::size_t i = 0; i < reader.tensors().size(); ++i, ++k) {
      const TensorInfo& t = reader.tensors()[i];
      GCZ_ASSIGN_OR_RETURN(auto src, reader.open(i));
      GCZ_ASSIGN_OR_RETURN(uint64_t numel, t.numel());
      // The codec's choices (PowerSGD's fallback by size) see the dtype the index will record.
      TensorInfo recorded = t;
      if (options.error_feedback) recorded.dtype = detail::encoded_dtype(t.dtype, *options.error_feedback);
      auto plan = plan_for(recorded, numel, options, default_plan, report.rules);
      if (!plan) return in_file(plan.status(), inputs[r]);
      progress.tensor = k;
      progress.name = &t.name;
      auto on_progress = [&](uint64_t done) {
        progress.bytes_done += done;
        if (options.progress) options.progress(progress);
      };
      Result<TensorReport> tr = internal_error("not encoded");
      try {
        tr = options.error_feedback
                 ? detail::encode_with_feedback(encoder, *src, *plan, *options.error_feedback, on_progress)
                 : encoder.encode(*src, *plan, on_progress);
      } catch (const std::bad_alloc&) {  // one tensor too large for the memory free now: say which
        tr = unsupported("tensor '" + t.name + "': out of memory encoding it (" +
                         std::to_string(numel * dtype_size(t.dtype)) + " bytes of input)");
      }
      // Before the tensor counts: elements of two versions of a file would be encoded without a word.
      // A read that failed because the file changed under it (a deflated member's CRC, an HDF5 chunk)
      // is reported as the change.
      if (Status s = src->check_unchanged(); !s) return in_file(s, inputs[r]);
      if (!tr) return in_file(tr.status(), inputs[r]);
      bytes_in += tr->metrics.bytes_in;
      if (tr->cumulative) {
        if (!cumulative) cumulative.emplace();
        cumulative->merge(*tr->cumulative);
      }
      report.tensors.push_back(std::move(*tr));
    }
  }
  // The inputs' own metadata (a safetensors __metadata__) as safetensors.KEY, for decode to give back;
  // the caller's keys, then the first input's, win.
  std::map<std::string, std::string> metadata = options.metadata;
  for (const auto& reader : readers) {
    for (const auto& [key, value] : reader->metadata()) metadata.emplace(kSafetensorsMetadataPrefix + key, value);
  }
  // Which step of its error-feedback sequence this file is (from 0), as the report gives it.
  if (options.error_feedback) metadata["gcz.ef_step"] = std::to_string(options.error_feedback->steps());
  const bool save_state = options.error_feedback && !options.ef_state_path.empty() && !output.empty();
  GCZ_ASSIGN_OR_RETURN(uint64_t file_bytes, writer->finish(metadata, /*in_place=*/!save_state));
  report.total = encoder.total().finish(bytes_in, file_bytes);
  report.cumulative = cumulative;
  if (options.error_feedback) {
    if (options.ef_prune) {
      for (const std::string& name : unused) options.error_feedback->erase(name);
      report.ef_pruned = unused.size();
    }
    options.error_feedback->count_step();
  }
  if (save_state) {
    ErrorFeedback& ef = *options.error_feedback;
    GCZ_ASSIGN_OR_RETURN(auto state, ef.write(options.ef_state_path, options.ef_codec));
    GCZ_RETURN_IF_ERROR(GczWriter::commit_together(*writer, *state));
    ef.saved(options.ef_state_path, *state);
  }
  return report;
}

}  // namespace gcz
