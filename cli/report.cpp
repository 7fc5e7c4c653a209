#include "report.h"

#include <cmath>

#include <nlohmann/json.hpp>

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

json num(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

json metrics_json(const Metrics& m) {
  return {{"numel", m.numel},          {"bytes_in", m.bytes_in},     {"bytes_out", m.bytes_out},
          {"ratio", num(m.ratio)},     {"bits_per_element", num(m.bits_per_element)},
          {"rel_l2", num(m.rel_l2)},   {"cosine", num(m.cosine)},    {"max_abs_error", num(m.max_abs_error)},
          {"snr_db", num(m.snr_db)},   {"norm_ratio", num(m.norm_ratio)},
          {"mean_error", num(m.mean_error)}, {"nonfinite", m.nonfinite}};
}

struct Row {
  std::string name, shape, dtype, codec;
  const Metrics* m;
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
          fmt("%.2f", m.bits_per_element),
          fmt("%.3e", m.rel_l2),
          fmt("%.6f", m.cosine),
          fmt("%.3e", m.max_abs_error),
          fmt("%.1f", m.snr_db),
          fmt("%.4f", m.norm_ratio),
          fmt("%+.2e", m.mean_error)};
}

void print_table(std::FILE* out, const std::vector<Row>& rows) {
  const std::vector<std::string> head = {"tensor", "shape", "dtype", "codec", "in", "out", "ratio", "bits/el",
                                         "rel_l2", "cosine", "max_abs_err", "snr_db", "norm_ratio", "mean_err"};
  std::vector<std::vector<std::string>> table = {head};
  for (const Row& r : rows) table.push_back(cells(r));
  std::vector<std::size_t> width(head.size(), 0);
  for (const auto& line : table) {
    for (std::size_t c = 0; c < line.size(); ++c) width[c] = std::max(width[c], line[c].size());
  }
  for (std::size_t i = 0; i < table.size(); ++i) {
    if (i + 1 == table.size() && table.size() > 2) {
      std::string rule;
      for (std::size_t c = 0; c < width.size(); ++c) rule += std::string(width[c], '-') + (c + 1 < width.size() ? "  " : "");
      std::fprintf(out, "%s\n", rule.c_str());
    }
    std::string line;
    for (std::size_t c = 0; c < table[i].size(); ++c) {
      const bool left = c < 4;
      const std::string& s = table[i][c];
      const std::string pad(width[c] - s.size(), ' ');
      line += left ? s + pad : pad + s;
      if (c + 1 < table[i].size()) line += "  ";
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    std::fprintf(out, "%s\n", line.c_str());
  }
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

void print_csv(std::FILE* out, const std::vector<Row>& rows) {
  std::fprintf(out, "tensor,shape,dtype,codec,numel,bytes_in,bytes_out,ratio,bits_per_element,rel_l2,cosine,"
                    "max_abs_error,snr_db,norm_ratio,mean_error,nonfinite\n");
  for (const Row& r : rows) {
    const Metrics& m = *r.m;
    std::fprintf(out, "%s,%s,%s,%s,%llu,%llu,%llu,%s,%s,%s,%s,%s,%s,%s,%s,%llu\n", csv_field(r.name).c_str(),
                 csv_field(r.shape).c_str(), r.dtype.c_str(), csv_field(r.codec).c_str(),
                 static_cast<unsigned long long>(m.numel), static_cast<unsigned long long>(m.bytes_in),
                 static_cast<unsigned long long>(m.bytes_out), fmt("%.6g", m.ratio).c_str(),
                 fmt("%.6g", m.bits_per_element).c_str(), fmt("%.9g", m.rel_l2).c_str(),
                 fmt("%.9g", m.cosine).c_str(), fmt("%.9g", m.max_abs_error).c_str(), fmt("%.6g", m.snr_db).c_str(),
                 fmt("%.9g", m.norm_ratio).c_str(), fmt("%.9g", m.mean_error).c_str(),
                 static_cast<unsigned long long>(m.nonfinite));
  }
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

void print_report(std::FILE* out, const EncodeReport& report, const std::string& format) {
  if (format == "json") {
    json tensors = json::array();
    for (const TensorReport& t : report.tensors) {
      tensors.push_back({{"name", t.name}, {"dtype", dtype_name(t.dtype)}, {"shape", t.shape},
                         {"codec", t.codec}, {"metrics", metrics_json(t.metrics)}});
    }
    json skipped = json::array();
    for (const SkippedTensor& s : report.skipped) skipped.push_back({{"name", s.name}, {"reason", s.reason}});
    json j = {{"backend", backend_name(report.backend)}, {"tensors", tensors}, {"total", metrics_json(report.total)},
              {"skipped", skipped}};
    std::fprintf(out, "%s\n", j.dump(2, ' ', false, json::error_handler_t::replace).c_str());
    return;
  }
  std::vector<Row> rows;
  for (const TensorReport& t : report.tensors) {
    rows.push_back({t.name, shape_to_string(t.shape), std::string(dtype_name(t.dtype)), t.codec, &t.metrics});
  }
  rows.push_back({"TOTAL", std::to_string(report.tensors.size()) + " tensors", "", "", &report.total});
  if (format == "csv") print_csv(out, rows);
  else print_table(out, rows);
}

void print_warnings(const EncodeReport& report) {
  for (const TensorReport& t : report.tensors) {
    const Metrics& m = t.metrics;
    if (m.nonfinite > 0) {
      std::fprintf(stderr, "gcz: warning: tensor '%s': %llu non-finite values (NaN/Inf) in the input, left out of "
                           "the error metrics\n", t.name.c_str(), static_cast<unsigned long long>(m.nonfinite));
    }
    if (m.norm_ratio < kNormRatioWarning) {
      std::fprintf(stderr, "gcz: warning: tensor '%s': norm ratio %.3f is below %.1f: the codec shrinks this "
                           "gradient (over-compression?)\n", t.name.c_str(), m.norm_ratio, kNormRatioWarning);
    }
  }
  for (const SkippedTensor& s : report.skipped) {
    std::fprintf(stderr, "gcz: note: skipped %s: %s\n", s.name.c_str(), s.reason.c_str());
  }
}

}  // namespace gcz::cli
