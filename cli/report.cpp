#include "report.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>

#include "common.h"
#include "gcz/codec_spec.h"
#include "gcz/detail/utf8.h"

namespace gcz::cli {
namespace {

using json = nlohmann::json;

std::string fmt(const char* f, double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// Two decimals, or two significant digits where those would show a nonzero value as 0.00 (the bits
// per element of a Top-K of one element in millions).
std::string fmt_small(double v) { return v != 0 && std::fabs(v) < 0.005 ? fmt("%.1e", v) : fmt("%.2f", v); }

json num(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

json metrics_json(const Metrics& m) {
  return {{"numel", m.numel},          {"bytes_in", m.bytes_in},     {"bytes_out", m.bytes_out},
          {"ratio", num(m.ratio)},     {"bits_per_element", num(m.bits_per_element)},
          {"rel_l2", num(m.rel_l2)},   {"cosine", num(m.cosine)},    {"max_abs_error", num(m.max_abs_error)},
          {"snr_db", num(m.snr_db)},   {"norm_ratio", num(m.norm_ratio)},
          {"mean_error", num(m.mean_error)}, {"nonfinite", m.nonfinite},
          {"decoded_nonfinite", m.decoded_nonfinite}};
}

struct Row {
  std::string name, shape, dtype, codec;
  const Metrics* m;
  std::optional<CumulativeError> cumulative;
};

std::vector<std::string> cells(const Row& r) {
  const Metrics& m = *r.m;
  return {r.name,
          r.shape,
          r.dtype,
          r.codec,
          human_bytes(m.bytes_in),
          human_bytes(m.bytes_out),
          fmt("%.2f", m.ratio),
          fmt_small(m.bits_per_element),
          fmt("%.3e", m.rel_l2),
          fmt("%.6f", m.cosine),
          fmt("%.3e", m.max_abs_error),
          fmt("%.1f", m.snr_db),
          fmt("%.4f", m.norm_ratio),
          fmt("%+.2e", m.mean_error),
          r.cumulative ? fmt("%.3e", r.cumulative->rel_l2()) : std::string()};
}

bool any_cumulative(const std::vector<Row>& rows) {
  for (const Row& r : rows) {
    if (r.cumulative) return true;
  }
  return false;
}

void print_table(std::FILE* out, const std::vector<Row>& rows) {
  std::vector<std::string> head = {"tensor", "shape", "dtype", "codec", "in", "out", "ratio", "bits/el",
                                   "rel_l2", "cosine", "max_abs_err", "snr_db", "norm_ratio", "mean_err", "sum_rel_l2"};
  const bool cumulative = any_cumulative(rows);
  if (!cumulative) head.pop_back();
  std::vector<std::vector<std::string>> table = {head};
  for (const Row& r : rows) {
    table.push_back(cells(r));
    table.back()[3] = brief_spec(r.codec);  // parameters at their defaults left out (JSON, CSV: all)
    for (std::string& cell : table.back()) cell = printable(cell);
    table.back()[0] = table_cell(table.back()[0]);  // a long name in part (JSON, CSV: whole)
    if (!cumulative) table.back().pop_back();
  }
  print_columns(out, table, 4, /*rule_before_last=*/true);
}

// A CSV field: UTF-8, each byte that is not (a path's) written as U+FFFD, as the JSON report does; quoted
// where it holds a comma, quote or line break.
std::string csv_field(const std::string& text) {
  std::string s;
  s.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const auto [c, n] = detail::utf8_char(text, i);
    if (detail::is_stray_byte(c)) {
      s += "\xEF\xBF\xBD";
    } else {
      s.append(text, i, n);
    }
    i += n;
  }
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

// `prefix` is put before every data row (the step columns of --steps), `prefix_head` before the header.
void print_csv(std::FILE* out, const std::vector<Row>& rows, const std::string& prefix_head = "",
               const std::string& prefix = "", bool header = true) {
  if (header) {
    std::fprintf(out,
                 "%stensor,shape,dtype,codec,numel,bytes_in,bytes_out,ratio,bits_per_element,rel_l2,cosine,"
                 "max_abs_error,snr_db,norm_ratio,mean_error,nonfinite,decoded_nonfinite,sum_rel_l2\n",
                 prefix_head.c_str());
  }
  for (const Row& r : rows) {
    const Metrics& m = *r.m;
    // Written whole (a name may hold a NUL, which a printf %s would end at).
    const std::string line =
        prefix + csv_field(r.name) + "," + csv_field(r.shape) + "," + r.dtype + "," + csv_field(r.codec) + "," +
        std::to_string(m.numel) + "," + std::to_string(m.bytes_in) + "," + std::to_string(m.bytes_out) + "," +
        fmt("%.6g", m.ratio) + "," + fmt("%.6g", m.bits_per_element) + "," + fmt("%.9g", m.rel_l2) + "," +
        fmt("%.9g", m.cosine) + "," + fmt("%.9g", m.max_abs_error) + "," + fmt("%.6g", m.snr_db) + "," +
        fmt("%.9g", m.norm_ratio) + "," + fmt("%.9g", m.mean_error) + "," + std::to_string(m.nonfinite) + "," +
        std::to_string(m.decoded_nonfinite) + "," + (r.cumulative ? fmt("%.9g", r.cumulative->rel_l2()) : "") + "\n";
    std::fwrite(line.data(), 1, line.size(), out);
  }
}

// The sort keys: "name", and each metric by its JSON name.
const std::vector<std::pair<std::string, double (*)(const TensorReport&)>>& sort_keys() {
  static const std::vector<std::pair<std::string, double (*)(const TensorReport&)>> keys = {
      {"numel", [](const TensorReport& t) { return static_cast<double>(t.metrics.numel); }},
      {"bytes_in", [](const TensorReport& t) { return static_cast<double>(t.metrics.bytes_in); }},
      {"bytes_out", [](const TensorReport& t) { return static_cast<double>(t.metrics.bytes_out); }},
      {"ratio", [](const TensorReport& t) { return t.metrics.ratio; }},
      {"bits_per_element", [](const TensorReport& t) { return t.metrics.bits_per_element; }},
      {"rel_l2", [](const TensorReport& t) { return t.metrics.rel_l2; }},
      {"cosine", [](const TensorReport& t) { return t.metrics.cosine; }},
      {"max_abs_error", [](const TensorReport& t) { return t.metrics.max_abs_error; }},
      {"snr_db", [](const TensorReport& t) { return t.metrics.snr_db; }},
      {"norm_ratio", [](const TensorReport& t) { return t.metrics.norm_ratio; }},
      {"mean_error", [](const TensorReport& t) { return t.metrics.mean_error; }},
      {"nonfinite", [](const TensorReport& t) { return static_cast<double>(t.metrics.nonfinite); }},
      {"decoded_nonfinite", [](const TensorReport& t) { return static_cast<double>(t.metrics.decoded_nonfinite); }},
      {"sum_rel_l2", [](const TensorReport& t) { return t.cumulative ? t.cumulative->rel_l2() : std::nan(""); }},
  };
  return keys;
}

// The tensors a view shows, in its order.
std::vector<const TensorReport*> shown(const EncodeReport& report, const ReportView& view) {
  std::vector<const TensorReport*> out;
  for (const TensorReport& t : report.tensors) out.push_back(&t);
  if (view.key == "name") {
    std::stable_sort(out.begin(), out.end(), [&](const TensorReport* a, const TensorReport* b) {
      return view.ascending ? a->name < b->name : b->name < a->name;
    });
  } else if (!view.key.empty()) {
    double (*value)(const TensorReport&) = nullptr;
    for (const auto& [k, f] : sort_keys()) value = k == view.key ? f : value;
    std::stable_sort(out.begin(), out.end(), [&](const TensorReport* a, const TensorReport* b) {
      const double x = value(*a), y = value(*b);
      if (std::isnan(x) || std::isnan(y)) return std::isnan(x) && !std::isnan(y);  // not measured: first
      return view.ascending ? x < y : y < x;
    });
  }
  if (view.top != 0 && out.size() > view.top) out.resize(view.top);
  return out;
}

std::vector<Row> rows_of(const EncodeReport& report, const ReportView& view) {
  std::vector<Row> rows;
  for (const TensorReport* t : shown(report, view)) {
    rows.push_back(
        {t->name, shape_to_string(t->shape), std::string(dtype_name(t->dtype)), t->codec, &t->metrics, t->cumulative});
  }
  rows.push_back({"TOTAL", count_of(report.tensors.size(), "tensor"), "", "", &report.total, report.cumulative});
  return rows;
}

json report_json(const EncodeReport& report, const ReportView& view) {
  json tensors = json::array();
  for (const TensorReport* t : shown(report, view)) {
    json m = metrics_json(t->metrics);
    if (t->cumulative) m["sum_rel_l2"] = num(t->cumulative->rel_l2());
    tensors.push_back(
        {{"name", t->name}, {"dtype", dtype_name(t->dtype)}, {"shape", t->shape}, {"codec", t->codec}, {"metrics", m}});
  }
  json skipped = json::array();
  for (const SkippedTensor& s : report.skipped) {
    skipped.push_back({{"file", s.file}, {"name", s.name}, {"reason", s.reason}});
  }
  json total = metrics_json(report.total);
  if (report.cumulative) total["sum_rel_l2"] = num(report.cumulative->rel_l2());
  json out = {{"backend", backend_name(report.backend)},
              {"seed", report.seed},
              {"tensors", tensors},
              {"total", total},
              {"skipped", skipped}};
  if (const auto& a = report.adaptive) {
    json tried = json::array();
    for (std::size_t i = 0; i < a->bytes.size(); ++i)
      tried.push_back({{"codec", a->levels[i]}, {"bytes", a->bytes[i]}});
    out["adaptive"] = {{"budget", a->budget},
                       {"level", a->level},
                       {"codec", a->levels[a->level]},
                       {"fits", a->fits},
                       {"tried", tried}};
  }
  return out;
}

// "adaptive: budget 204800 bytes (200.0 KiB): level 2 of 3, 'qsgd:bits=4', 159811 bytes; over it:
// 'fp16' 547613 bytes": the table's line for a step encoded by adaptive compression (exact bytes, for
// a level a byte over the budget).
std::string adaptive_line(const AdaptiveChoice& a) {
  std::string line = "adaptive: budget " + count_of(a.budget, "byte") + " (" + human_bytes(a.budget) + "): level " +
                     std::to_string(a.level + 1) + " of " + std::to_string(a.levels.size()) + ", '" +
                     printable(a.levels[a.level]) + "', " + count_of(a.bytes[a.level], "byte");
  std::string over;
  for (std::size_t i = 0; i < a.bytes.size(); ++i) {
    if (a.bytes[i] > a.budget && i != a.level)
      over += (over.empty() ? "" : ", ") + ("'" + printable(a.levels[i]) + "' " + count_of(a.bytes[i], "byte"));
  }
  if (!over.empty()) line += "; over it: " + over;
  if (!a.fits) line += " (no level fits: the strongest is used)";
  return line;
}

}  // namespace

std::string human_bytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0) std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  else std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

std::string count_of(uint64_t n, const std::string& noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

Result<ReportView> parse_report_view(const std::string& sort, uint64_t top, bool steps) {
  ReportView view;
  view.top = top;
  if (sort.empty()) return view;
  const std::size_t colon = sort.find(':');
  view.key = sort.substr(0, colon);
  const std::string order = colon == std::string::npos ? "" : sort.substr(colon + 1);
  if (colon != std::string::npos && order != "asc" && order != "desc") {
    return invalid_argument("--sort '" + sort + "': the order after ':' is asc or desc");
  }
  // The table's own headers name the same columns.
  for (const auto& [header, key] : {std::pair<const char*, const char*>{"in", "bytes_in"},
                                    {"out", "bytes_out"},
                                    {"bits/el", "bits_per_element"},
                                    {"max_abs_err", "max_abs_error"},
                                    {"mean_err", "mean_error"},
                                    {"tensor", "name"}}) {
    if (view.key == header) view.key = key;
  }
  view.ascending = order.empty() ? view.key == "name" : order == "asc";
  if (view.key == "sum_rel_l2" && !steps) {
    return invalid_argument("--sort '" + sort + "': sum_rel_l2 is a column of gcz eval --steps only");
  }
  std::string known = "name";
  for (const auto& [k, f] : sort_keys()) {
    if (k == view.key) return view;
    known += ", " + k;
  }
  if (view.key == "name") return view;
  return invalid_argument("--sort '" + sort + "': no such column (known: " + known +
                          "; or the table's headers in, out, bits/el, max_abs_err, mean_err)");
}

void print_json(std::FILE* out, const json& j) {
  std::fprintf(out, "%s\n", j.dump(2, ' ', false, json::error_handler_t::replace).c_str());
}

void print_report(std::FILE* out, const EncodeReport& report, const std::string& format, const ReportView& view,
                  std::optional<uint64_t> ef_step) {
  if (format == "json") {
    json j = report_json(report, view);
    if (ef_step) j["step"] = *ef_step;
    print_json(out, j);
  } else if (format == "csv") {
    print_csv(out, rows_of(report, view));
  } else {
    print_table(out, rows_of(report, view));
    if (report.adaptive) std::fprintf(out, "\n%s\n", adaptive_line(*report.adaptive).c_str());
  }
}

void print_steps(std::FILE* out, const std::vector<StepReport>& steps, const std::string& format, bool feedback,
                 const ReportView& view) {
  if (format == "json") {
    json j = {{"error_feedback", feedback}, {"steps", json::array()}};
    for (const StepReport& s : steps) {
      json r = report_json(s.report, view);
      r["step"] = s.step;
      r["file"] = s.file;
      j["steps"].push_back(r);
    }
    print_json(out, j);
    return;
  }
  if (format == "csv") {
    for (std::size_t k = 0; k < steps.size(); ++k) {
      print_csv(out, rows_of(steps[k].report, view), "step,file,",
                std::to_string(steps[k].step) + "," + csv_field(steps[k].file) + ",", k == 0);
    }
    return;
  }
  std::vector<std::vector<std::string>> summary = {{"step", "file", "ratio", "rel_l2", "cosine", "norm_ratio", "sum_rel_l2"}};
  for (std::size_t k = 0; k < steps.size(); ++k) {
    const EncodeReport& r = steps[k].report;
    std::fprintf(out, "== step %llu: %s (%zu of %zu)\n", static_cast<unsigned long long>(steps[k].step),
                 printable(steps[k].file).c_str(), k + 1, steps.size());
    if (r.adaptive) std::fprintf(out, "%s\n", adaptive_line(*r.adaptive).c_str());
    print_table(out, rows_of(r, view));
    std::fprintf(out, "\n");
    summary.push_back({std::to_string(steps[k].step), printable(steps[k].file), fmt("%.2f", r.total.ratio),
                       fmt("%.3e", r.total.rel_l2), fmt("%.6f", r.total.cosine), fmt("%.4f", r.total.norm_ratio),
                       r.cumulative ? fmt("%.3e", r.cumulative->rel_l2()) : std::string("-")});
    // With adaptive compression, the level each step took, after its file.
    if (r.adaptive) summary.back().insert(summary.back().begin() + 2, printable(r.adaptive->levels[r.adaptive->level]));
  }
  const bool adaptive = !steps.empty() && steps[0].report.adaptive;
  if (adaptive) summary[0].insert(summary[0].begin() + 2, "adapt");
  std::fprintf(out, "== summary (error feedback %s; sum_rel_l2 = ||sum of decoded - sum of true|| / ||sum of true||)\n",
               feedback ? "on" : "off");
  print_columns(out, summary, adaptive ? 3 : 2);
}

void print_warnings(const EncodeReport& report, bool rules, const std::string& step) {
  const std::string at = step.empty() ? std::string() : printable(step) + ": ";
  if (!report.ef_new.empty()) {  // a model grown, or some tensors renamed (all renamed is refused)
    std::string names;
    for (std::size_t k = 0; k < report.ef_new.size() && k < 3; ++k) {
      names += (k ? ", '" : "'") + printable(report.ef_new[k]) + "'";
    }
    if (report.ef_new.size() > 3) names += ", ... (" + std::to_string(report.ef_new.size()) + " in all)";
    std::string unused;
    if (report.ef_pruned > 0) {
      unused = "; it dropped " + count_of(report.ef_pruned, "residual") + " no tensor of this step took (--ef-prune)";
    } else if (report.ef_unused > 0) {
      unused = "; it keeps " + count_of(report.ef_unused, "residual") + " no tensor of this step took";
    }
    std::fprintf(stderr,
                 "gcz: note: %sthe error-feedback state holds no residual for %s, which start%s from zero (new, or "
                 "renamed since)%s\n",
                 at.c_str(), names.c_str(), report.ef_new.size() == 1 ? "s" : "", unused.c_str());
  } else if (report.ef_pruned > 0) {
    std::fprintf(stderr, "gcz: note: %sthe error-feedback state dropped %s no tensor of this step took (--ef-prune)\n",
                 at.c_str(), count_of(report.ef_pruned, "residual").c_str());
  }
  if (report.adaptive && !report.adaptive->fits) {
    const AdaptiveChoice& a = *report.adaptive;
    std::fprintf(stderr, "gcz: warning: %sno --adapt level fits the budget of %s: the strongest, '%s', takes %llu\n",
                 at.c_str(), count_of(a.budget, "byte").c_str(), printable(a.levels[a.level]).c_str(),
                 static_cast<unsigned long long>(a.bytes[a.level]));
  }
  // A codec that shrinks every tensor (Top-K at 1%) would name them all: the first few are named,
  // the rest counted; a step of eval --steps gets one line, naming the lowest.
  const std::size_t most_named = step.empty() ? 5 : 0;
  std::size_t low_norm = 0;
  const TensorReport* lowest = nullptr;
  for (const TensorReport& t : report.tensors) {
    const Metrics& m = t.metrics;
    const std::string name = printable(t.name);
    if (m.nonfinite > 0) {
      std::fprintf(stderr, "gcz: warning: %stensor '%s': %s (NaN/Inf) in the input, left out of the error metrics\n",
                   at.c_str(), name.c_str(), count_of(m.nonfinite, "non-finite value").c_str());
    }
    if (m.decoded_nonfinite > 0) {
      // float16, the narrowest type a codec stores or decodes to, is the one that overflows first.
      const bool half = t.dtype == DType::kFloat16 || t.codec.find("fp16") != std::string::npos;
      std::fprintf(
          stderr,
          "gcz: warning: %stensor '%s': %s infinite or NaN where the input is finite: "
          "%s overflowed a type it stores or decodes to%s; they are in the error metrics\n",
          at.c_str(), name.c_str(),
          (count_of(m.decoded_nonfinite, "decoded value") + (m.decoded_nonfinite == 1 ? " is" : " are")).c_str(),
          printable(t.codec).c_str(), half ? " (float16 ends at 65504)" : "");
    }
    if (!(m.norm_ratio < kNormRatioWarning)) continue;
    if (!lowest || m.norm_ratio < lowest->metrics.norm_ratio) lowest = &t;
    if (++low_norm <= most_named) {
      std::fprintf(stderr,
                   "gcz: warning: %stensor '%s': norm ratio %.3f is below %.1f: the codec shrinks this "
                   "gradient (over-compression?)\n",
                   at.c_str(), name.c_str(), m.norm_ratio, kNormRatioWarning);
    }
  }
  if (most_named == 0 && low_norm > 0) {
    std::fprintf(stderr,
                 "gcz: warning: %s%zu tensor%s a norm ratio below %.1f, the lowest '%s' at %.3f: the codec shrinks "
                 "these gradients (over-compression?)\n",
                 at.c_str(), low_norm, low_norm == 1 ? " has" : "s have", kNormRatioWarning,
                 printable(lowest->name).c_str(), lowest->metrics.norm_ratio);
  } else if (low_norm > most_named) {
    const std::size_t more = low_norm - most_named;
    std::fprintf(stderr,
                 "gcz: warning: %s%zu more tensor%s a norm ratio below %.1f (the report's norm_ratio column has "
                 "every tensor's)\n",
                 at.c_str(), more, more == 1 ? " has" : "s have", kNormRatioWarning);
  }
  for (const SkippedTensor& s : report.skipped) {
    std::fprintf(stderr, "gcz: note: skipped %s: %s: %s\n", printable(s.file).c_str(), printable(s.name).c_str(),
                 printable(s.reason).c_str());
  }
  if (rules) print_rule_warnings(report.rules);
}

void print_rule_warnings(const std::vector<RuleUse>& rules) {
  for (const RuleUse& r : rules) {
    if (!r.matched) {
      std::fprintf(stderr,
                   "gcz: warning: --rule '%s' matched no tensor (gcz eval lists the names; in a "
                   "directory they start with the file's relative path)\n",
                   printable(r.rule).c_str());
    } else if (!r.applied) {
      std::fprintf(stderr,
                   "gcz: warning: --rule '%s' chose no tensor's codec: each tensor it matches takes an "
                   "earlier rule or is below --min-numel\n",
                   printable(r.rule).c_str());
    }
  }
}

}  // namespace gcz::cli
