// Printing an EncodeReport: a human table (default), JSON or CSV, plus warnings on stderr.
#pragma once

#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "gcz/pipeline.h"

namespace gcz::cli {

// `j` indented by two, and a newline, on `out`. Bytes that are not UTF-8 (a path may hold any) are
// written as U+FFFD: the document stays valid JSON.
void print_json(std::FILE* out, const nlohmann::json& j);

// Which tensors' rows a report shows, in which order: sorted by `key` (a metric's JSON name, or
// "name"), largest first or, with `ascending`, smallest first (NaN, not measured, first either way:
// it is no tensor to leave out of a --top; ties in file order); the first `top` (0: all). The TOTAL
// row is always every tensor's.
struct ReportView {
  std::string key;
  bool ascending = false;
  uint64_t top = 0;
};
// From --sort KEY[:asc|:desc] and --top N; an unknown key is a usage error listing the known ones, and
// so is sum_rel_l2 without `steps` (eval --steps), the only report that has it.
Result<ReportView> parse_report_view(const std::string& sort, uint64_t top, bool steps);

// format: "table", "json" or "csv". `ef_step`: with `encode --ef-state`, the step this was (from 0),
// which JSON gives as `step` (the table's line for it is the command's).
void print_report(std::FILE* out, const EncodeReport& report, const std::string& format, const ReportView& view = {},
                  std::optional<uint64_t> ef_step = std::nullopt);

// One step of `gcz eval --steps`.
struct StepReport {
  std::string file;
  EncodeReport report;
  uint64_t step = 0;  // from 0, or from the step count of the state the run started from
};
// Every step's per-tensor report, then a summary line per step (table); one JSON document; or one CSV
// with `step` and `file` columns first.
void print_steps(std::FILE* out, const std::vector<StepReport>& steps, const std::string& format, bool feedback,
                 const ReportView& view = {});
// Norm-ratio, non-finite and skipped-tensor notes, and (unless told not to) the rules that chose no
// tensor's codec, on stderr; with `step` (eval --steps: the step's file), each tensor's warning names it.
void print_warnings(const EncodeReport& report, bool rules = true, const std::string& step = "");
// A warning for each rule that matched no tensor, or that chose no tensor's codec.
void print_rule_warnings(const std::vector<RuleUse>& rules);
// "1.5 MiB"
std::string human_bytes(uint64_t bytes);
// "1 tensor", "2 tensors": `noun` with an s unless n is 1.
std::string count_of(uint64_t n, const std::string& noun);

}  // namespace gcz::cli
