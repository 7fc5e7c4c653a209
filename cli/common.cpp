#include "common.h"

#include <locale.h>
#include <unistd.h>
#include <wchar.h>
#include <wctype.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <utility>

#include "gcz/codec.h"
#include "gcz/detail/utf8.h"
#include "gcz/tensor_io.h"

namespace gcz::cli {

int exit_code_for(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return kExitOk;
    case StatusCode::kInvalidArgument: return kExitUsage;
    case StatusCode::kIoError: return kExitIo;
    case StatusCode::kFormatError: return kExitBadInput;
    case StatusCode::kUnsupported: return kExitUnsupported;
    case StatusCode::kChecksumMismatch: return kExitChecksum;
    case StatusCode::kDeviceError: return kExitDevice;
    case StatusCode::kInternal: return kExitInternal;
  }
  return kExitInternal;
}

namespace {

// The C library's tables of which characters print and how many columns each takes, from its
// built-in UTF-8 locale; null where it has none (then every character from U+00A0 up prints, one
// column wide).
locale_t utf8_locale() {
  static const locale_t loc = newlocale(LC_CTYPE_MASK, "C.UTF-8", locale_t{});
  return loc;
}

// Unicode's format characters (category Cf), which the C library calls printable: they show nothing,
// or reorder the text around them (the bidirectional controls), so that two names could look alike.
constexpr std::pair<char32_t, char32_t> kFormatCharacters[] = {
    {0x00AD, 0x00AD},   {0x0600, 0x0605},   {0x061C, 0x061C},   {0x06DD, 0x06DD},   {0x070F, 0x070F},
    {0x0890, 0x0891},   {0x08E2, 0x08E2},   {0x180E, 0x180E},   {0x200B, 0x200F},   {0x202A, 0x202E},
    {0x2060, 0x2064},   {0x2066, 0x206F},   {0xFEFF, 0xFEFF},   {0xFFF9, 0xFFFB},   {0x110BD, 0x110BD},
    {0x110CD, 0x110CD}, {0x13430, 0x1343F}, {0x1BCA0, 0x1BCA3}, {0x1D173, 0x1D17A}, {0xE0001, 0xE0001},
    {0xE0020, 0xE007F}};

bool prints_as_itself(char32_t c) {
  if (c < 0x20 || (c >= 0x7f && c < 0xa0)) return false;  // C0 and C1 controls, DEL
  if (detail::is_stray_byte(c)) return false;             // a byte that is not UTF-8
  for (const auto& [first, last] : kFormatCharacters) {
    if (c >= first && c <= last) return false;
  }
  const locale_t loc = utf8_locale();
  return loc == locale_t{} || iswprint_l(static_cast<wint_t>(c), loc) != 0;
}

// The terminal columns of each character of printable UTF-8 text, with the byte where it starts: two
// for a wide (East Asian) character, none for a combining one.
std::vector<std::pair<std::size_t, std::size_t>> char_widths(const std::string& s) {
  const locale_t loc = utf8_locale();
  const locale_t before = loc == locale_t{} ? locale_t{} : uselocale(loc);
  std::vector<std::pair<std::size_t, std::size_t>> out;
  for (std::size_t i = 0; i < s.size();) {
    const auto [c, n] = detail::utf8_char(s, i);
    const int w = loc == locale_t{} ? 1 : wcwidth(static_cast<wchar_t>(c));
    out.emplace_back(i, w < 0 ? 1 : static_cast<std::size_t>(w));
    i += n;
  }
  if (loc != locale_t{}) uselocale(before);
  return out;
}

std::size_t display_width(const std::string& s) {
  std::size_t width = 0;
  for (const auto& [at, w] : char_widths(s)) width += w;
  return width;
}

}  // namespace

std::string table_cell(const std::string& text, std::size_t most) {
  const auto chars = char_widths(text);
  std::size_t width = 0;
  for (const auto& [at, w] : chars) width += w;
  if (width <= most) return text;
  // The first third of the columns and the rest, cut between whole characters and outside
  // printable()'s \xNN escapes (ASCII, one column a byte).
  auto escape_at = [&](std::size_t i) {  // the start of an escape that byte i falls inside, or npos
    for (std::size_t j = i >= 3 ? i - 3 : 0; j < i; ++j) {
      if (text[j] == '\\' && j + 1 < text.size() && text[j + 1] == 'x') return j;
    }
    return std::string::npos;
  };
  most = std::max<std::size_t>(most, 6);
  const std::size_t head_most = (most - 3) / 3, tail_most = most - 3 - head_most;
  std::size_t k = 0;  // the first character left out
  for (std::size_t used = 0; k < chars.size() && used + chars[k].second <= head_most; ++k) used += chars[k].second;
  std::size_t j = chars.size();  // the first character of the tail
  for (std::size_t used = 0; j > k && used + chars[j - 1].second <= tail_most; --j) used += chars[j - 1].second;
  // An escape cut in two goes whole to the "...", as does a combining mark whose base was cut off (a
  // backslash that printable() kept may look like an escape: the cut still falls between characters).
  auto at = [&](std::size_t c) { return c < chars.size() ? chars[c].first : text.size(); };
  if (const std::size_t e = escape_at(at(k)); e != std::string::npos) {
    while (k > 0 && at(k) > e) --k;
  }
  if (const std::size_t e = escape_at(at(j)); e != std::string::npos) {
    while (j < chars.size() && at(j) < e + 4) ++j;
  }
  while (j < chars.size() && chars[j].second == 0) ++j;
  return text.substr(0, at(k)) + "..." + text.substr(at(j));
}

std::string printable(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const auto [c, n] = detail::utf8_char(text, i);
    if (prints_as_itself(c)) {
      out.append(text, i, n);
    } else {
      for (std::size_t k = i; k < i + n; ++k) {
        char esc[8];
        std::snprintf(esc, sizeof esc, "\\x%02x", static_cast<unsigned char>(text[k]));
        out += esc;
      }
    }
    i += n;
  }
  return out;
}

namespace {
std::string g_command = "gcz";  // the command running, for the --help that a usage error points to
}  // namespace

void set_command_for_usage_errors(const std::string& command) { g_command = command; }

std::string see_help(const std::string& command) { return " (see '" + command + " --help')"; }

int report_error(const Status& status) {
  const std::string help = status.code() == StatusCode::kInvalidArgument ? see_help(g_command) : std::string();
  std::fprintf(stderr, "gcz: error: %s%s\n", printable(status.message()).c_str(), help.c_str());
  return exit_code_for(status.code());
}

void print_columns(std::FILE* out, const std::vector<std::vector<std::string>>& rows, std::size_t left,
                   bool rule_before_last) {
  std::vector<std::size_t> width;
  for (const auto& row : rows) {
    width.resize(std::max(width.size(), row.size()), 0);
    for (std::size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], display_width(row[c]));
  }
  for (std::size_t i = 0; i < rows.size(); ++i) {
    std::string line;
    if (rule_before_last && i + 1 == rows.size() && rows.size() > 2) {
      for (std::size_t c = 0; c < width.size(); ++c) line += std::string(width[c], '-') + "  ";
      if (!line.empty()) line.resize(line.size() - 2);
      std::fprintf(out, "%s\n", line.c_str());
      line.clear();
    }
    for (std::size_t c = 0; c < rows[i].size(); ++c) {
      const std::string pad(width[c] - display_width(rows[i][c]), ' ');
      line += c < left ? rows[i][c] + pad : pad + rows[i][c];
      if (c + 1 < rows[i].size()) line += "  ";
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    std::fprintf(out, "%s\n", line.c_str());
  }
}

namespace {
double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}
}  // namespace

ProgressLine::ProgressLine(std::string verb) : verb_(std::move(verb)), enabled_(::isatty(STDERR_FILENO) == 1) {}
ProgressLine::~ProgressLine() { clear(); }

void ProgressLine::clear() {
  if (drawn_) std::fprintf(stderr, "\r\033[K");
  drawn_ = false;
}

ProgressFn ProgressLine::callback() {
  if (!enabled_) return {};
  return [this](const Progress& p) {
    const std::string trying = p.level ? "(trying " + table_cell(printable(*p.level), 40) + ") " : "";
    if (p.tensors == 0) {  // still opening the inputs (a directory of many files, an index of many tensors)
      show(trying + "(opening " + table_cell(printable(p.name ? *p.name : std::string()), 60) + ")");
      return;
    }
    const double t = now_seconds();
    if (t - last_ < 0.1 && p.bytes_done < p.bytes_total) return;
    last_ = t;
    const double pct = p.bytes_total ? 100.0 * static_cast<double>(p.bytes_done) / static_cast<double>(p.bytes_total) : 100.0;
    char text[160];
    std::snprintf(text, sizeof text, "%zu/%zu %5.1f%% %.1f/%.1f MiB  ", p.tensor + 1, p.tensors, pct,
                  static_cast<double>(p.bytes_done) / 1048576.0, static_cast<double>(p.bytes_total) / 1048576.0);
    show(trying + text + table_cell(printable(p.name ? *p.name : std::string()), 60));  // a file's name, escaped
  };
}

void ProgressLine::show(const std::string& text) {
  if (!enabled_) return;
  std::fprintf(stderr, "\r\033[K%s %s", verb_.c_str(), text.c_str());
  std::fflush(stderr);
  drawn_ = true;
}

Result<DeviceRequest> parse_device(const std::string& text) {
  auto d = parse_device_request(text);
  if (!d) return invalid_argument("--device '" + text + "': expected cpu, cuda (or gpu) or auto");
  return *d;
}

// The parts of a comma-separated list, empty ones included ("4," gives "4" and "").
static std::vector<std::string> comma_parts(const std::string& text) {
  std::vector<std::string> parts;
  for (std::size_t pos = 0; pos <= text.size();) {
    const std::size_t comma = std::min(text.find(',', pos), text.size());
    parts.push_back(text.substr(pos, comma - pos));
    pos = comma + 1;
  }
  return parts;
}

Status check_output_option(const std::string& path) {
  if (path.empty() || path[0] != '=') return Status::ok();
  return invalid_argument(path + ": an output named with a leading '=', as -o=NAME gives; write -o NAME (or " +
                          "--output=NAME), or ./" + path + " for that name");
}

// What is wrong with `v` as a whole number in least..most: nothing (empty), or the rule it breaks.
static std::string whole_number_problem(const std::string& v, uint64_t most, uint64_t least) {
  errno = 0;
  const bool digits = !v.empty() && v.find_first_not_of("0123456789") == std::string::npos;
  const unsigned long long n = digits ? std::strtoull(v.c_str(), nullptr, 10) : 0;
  if (digits && errno == 0 && n >= least && n <= most) return {};
  return "'" + v + "' is not a whole number in " + std::to_string(least) + ".." + std::to_string(most);
}

CLI::Validator whole_number(uint64_t most, uint64_t least) {
  return CLI::Validator([most, least](std::string& v) { return whole_number_problem(v, most, least); }, "");
}

CLI::Validator whole_number_list(uint64_t most, uint64_t least) {
  return CLI::Validator(
      [most, least](std::string& v) -> std::string {
        const std::vector<std::string> parts = comma_parts(v);
        for (std::size_t i = 0; i < parts.size(); ++i) {
          std::string problem = whole_number_problem(parts[i], most, least);
          if (problem.empty()) continue;
          if (parts.size() > 1) problem += " (item " + std::to_string(i + 1) + " of '" + v + "')";
          return problem;
        }
        return {};
      },
      "");
}

std::vector<unsigned> whole_numbers(const std::string& list) {
  std::vector<unsigned> numbers;
  for (const std::string& part : comma_parts(list)) numbers.push_back(static_cast<unsigned>(std::stoul(part)));
  return numbers;
}

const char* const kCodecParametersHelp =
    "Codec parameters, the default first (docs/CLI.md, 'Codec specs', and docs/CODECS.md explain them):\n"
    "  qsgd      bits=8 (2..8), group=128, scale=max|l2, rounding=stochastic|nearest, scale_dtype=fp32|fp16|bf16\n"
    "  terngrad  clip=2.5 (0: none), scale=tensor|group, group=128 (with scale=group),\n"
    "            rounding=stochastic|deterministic, packing=base3|2bit\n"
    "  topk      ratio=0.01 or k=N, values=fp32 (a codec for the kept values, e.g. values=(qsgd:bits=4))\n"
    "  randomk   ratio=0.01 or k=N, scale=none|unbiased, values=fp32\n"
    "  powersgd  rank=4, iters=1, view=first|last, factors=fp32, min_rate=2, fallback=fp16\n"
    "  zstd      level=3 (1..22), as the last stage: CODEC+zstd\n"
    "  none, fp32, fp16, bf16 take none.";

void add_encode_options(CLI::App& app, EncodeArgs& a) {
  std::string codecs;
  for (const auto& n : codec_names()) codecs += (codecs.empty() ? "" : ", ") + n;
  app.add_option("INPUT", a.inputs,
                 "Gradient dumps: .npy .npz .safetensors .h5/.hdf5, raw .bin/.raw (with --dtype and --shape), "
                 "directories of them, or a sharded checkpoint's NAME.safetensors.index.json")
      ->required();
  CLI::Option* codec =
      app.add_option("-c,--codec", a.spec,
                     "Codec spec for every tensor: CODEC[:k=v,...][+zstd[:level=N]]. Codecs: " + codecs +
                         ". Example: -c bf16+zstd")
          ->capture_default_str();
  app.add_option("--adapt", a.levels,
                 "Adaptive compression, instead of -c: a codec spec per level, lightest first; repeatable. Each "
                 "step is encoded at the lightest level whose .gcz fits --budget (the strongest when none does). "
                 "Example: --adapt fp16 --adapt 'qsgd:bits=4' --adapt 'topk:ratio=0.01' --budget 1MiB")
      ->allow_extra_args(false);  // one SPEC each time: an input after it stays an input
  CLI::Option* budget = app.add_option(
      "--budget", a.budget,
      "With --adapt: the most bytes a step's .gcz may take: bytes, or with KiB MiB GiB (also K M G) or "
      "kB MB GB; with eval --steps one per step, comma-separated, or one for all. Example: --budget 2MiB");
  app.add_option("--rule", a.rules,
                 "Per-tensor override GLOB=SPEC, first match wins; repeatable. GLOB matches the whole name, '*' "
                 "also matches '/'; --min-numel comes first. Example: --rule '*.bias=none' --rule '*embed.*=bf16'")
      ->allow_extra_args(false);  // one GLOB=SPEC each time: an input after it stays an input
  app.add_option("--min-numel", a.min_numel,
                 "Store tensors with fewer elements than N losslessly (codec none). Example: --min-numel 4096")
      ->check(whole_number())
      ->capture_default_str();
  app.add_option("--device", a.device, "Where codecs run: cpu, cuda (or gpu) or auto (CUDA when a GPU is usable)")
      ->capture_default_str();
  app.add_option("--seed", a.seed,
                 "Seed for codecs that draw random numbers (recorded in the file); with --ef-state, step s of the "
                 "state uses SEED + s")
      ->check(whole_number())
      ->capture_default_str();
  app.add_option("--threads", a.threads,
                 "CPU threads (element-wise codecs, tensor-scale terngrad, Top-K's selection, Random-K's draws, "
                 "PowerSGD's products, error measurement), 0.." +
                     std::to_string(kMaxThreads) + "; 0 = one per core. The output is the same for any count")
      ->check(whole_number(kMaxThreads))
      ->capture_default_str();
  add_raw_input_options(app, a.raw_dtype, a.raw_shape);
  CLI::Option* report = app.add_option("--report", a.report_format,
                                       "Report format: table, json or csv (the last of --report, --json, --csv "
                                       "wins)")
                            ->check(CLI::IsMember({"table", "json", "csv"}))
                            ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
                            ->capture_default_str();
  CLI::Option* json = app.add_flag("--json")->description("Same as --report json");
  CLI::Option* csv = app.add_flag("--csv")->description("Same as --report csv");
  // CLI11 runs no option's callback in the order typed: the format is settled once parsing is done.
  app.parse_complete_callback([&app, &a, report, json, csv, codec, budget] {
    a.spec_given = codec->count() > 0;
    a.budget_given = budget->count() > 0;
    const auto& order = app.parse_order();
    const auto last = std::find_if(order.rbegin(), order.rend(),
                                   [&](const CLI::Option* o) { return o == report || o == json || o == csv; });
    if (last != order.rend() && *last != report) a.report_format = *last == json ? "json" : "csv";
  });
  app.add_option("--sort", a.sort,
                 "Order the report's tensor rows by a column, largest first: rel_l2, cosine, norm_ratio, ratio, "
                 "bits_per_element, snr_db, max_abs_error, mean_error, bytes_in, bytes_out, numel, nonfinite, "
                 "decoded_nonfinite, sum_rel_l2 (eval --steps only), or name (A to Z), or the table's headers in, out, "
                 "bits/el, max_abs_err, mean_err; ':asc' or ':desc' after it sets the "
                 "order; tensors not measured (nan) come first. Example: --sort rel_l2 --top 20 (the 20 worst)");
  app.add_option(
         "--top", a.top,
         "Show only the first N tensor rows (after --sort; 0, the default: all); TOTAL still counts every tensor")
      ->check(whole_number(UINT64_MAX));
  app.add_flag("-q,--quiet", a.quiet, "Print no report (errors and warnings still go to stderr)");
}

void add_raw_input_options(CLI::App& app, std::string& dtype, std::string& shape) {
  app.add_option("--dtype", dtype,
                 "Element type of raw binary input: f16, bf16, f32, f64 (also float16, bfloat16, float32, float64, "
                 "fp16, fp32, fp64, half, double). Example: --dtype f32");
  app.add_option("--shape", shape, "Shape of raw binary input, comma-separated. Example: --shape 4096,1024")
      ->check(CLI::Validator(
          [](std::string& v) { return v.empty() ? "expected comma-separated sizes, e.g. 4096,1024" : std::string(); },
          ""));
}

void note_unused_raw_options(const std::string& dtype, const std::string& shape,
                             const std::vector<std::string>& inputs) {
  if (dtype.empty() && shape.empty()) return;
  for (const std::string& input : inputs) {
    const auto format = tensor_format_from_path(input);
    // Read as raw bytes, or a directory that may hold such files: the options are used.
    if (!format || *format == TensorFileFormat::kRaw || *format == TensorFileFormat::kDirectory) return;
  }
  std::fprintf(stderr,
               "gcz: note: --dtype and --shape apply to raw binary input only, and no input is raw (.npy, .npz, "
               ".safetensors and .h5 files are read as what they are)\n");
}

namespace {

// A size in bytes: digits, then nothing or B, a binary multiple (K, KiB, M, MiB, G, GiB) or a decimal
// one (kB, MB, GB; not KB, which some read as 1024).
Result<uint64_t> parse_size(const std::string& text) {
  const std::size_t digits = std::min(text.find_first_not_of("0123456789"), text.size());
  static const std::map<std::string, uint64_t> kUnits = {{"", 1},           {"B", 1},
                                                         {"K", 1ull << 10}, {"KiB", 1ull << 10},
                                                         {"M", 1ull << 20}, {"MiB", 1ull << 20},
                                                         {"G", 1ull << 30}, {"GiB", 1ull << 30},
                                                         {"kB", 1000},      {"MB", 1000000},
                                                         {"GB", 1000000000}};
  const auto unit = kUnits.find(text.substr(digits));
  if (digits == 0 || unit == kUnits.end()) {
    return invalid_argument("--budget: '" + text +
                            "' is not a size (bytes, or with KiB MiB GiB, also K M G, or kB MB GB; e.g. 512KiB)");
  }
  std::optional<uint64_t> bytes = 0;
  for (std::size_t i = 0; i < digits && bytes; ++i) {
    bytes = checked_mul(*bytes, 10);
    if (bytes) bytes = checked_add(*bytes, static_cast<uint64_t>(text[i] - '0'));
  }
  if (bytes) bytes = checked_mul(*bytes, unit->second);
  if (!bytes) return invalid_argument("--budget: '" + text + "' is more than 2^64 - 1 bytes");
  if (*bytes < 96) {  // a .gcz's 64-byte header and 32-byte trailer alone (FORMAT.md §2); its index is more
    return invalid_argument("--budget: '" + text + "' is " + std::to_string(*bytes) +
                            " bytes; a .gcz takes at least 96");
  }
  return *bytes;
}

}  // namespace

Result<std::vector<uint64_t>> budgets_for(const EncodeArgs& a, std::size_t steps) {
  if (a.levels.empty()) return std::vector<uint64_t>{};
  std::vector<uint64_t> sizes;
  for (const std::string& part : comma_parts(a.budget)) {
    GCZ_ASSIGN_OR_RETURN(uint64_t bytes, parse_size(part));
    sizes.push_back(bytes);
  }
  if (sizes.size() == 1) return std::vector<uint64_t>(std::max<std::size_t>(steps, 1), sizes[0]);
  if (steps == 0) {
    return invalid_argument("--budget '" + a.budget +
                            "': one size here (a list, a size per step, is for eval --steps)");
  }
  if (sizes.size() != steps) {
    return invalid_argument("--budget '" + a.budget + "': " + std::to_string(sizes.size()) + " sizes for " +
                            std::to_string(steps) + (steps == 1 ? " step" : " steps") +
                            "; give one per step, or one for all");
  }
  return sizes;
}

Result<EncodeOptions> to_encode_options(const EncodeArgs& a) {
  EncodeOptions o;
  o.spec = a.spec;
  if (!a.levels.empty() && a.spec_given) {
    return invalid_argument("-c and --adapt are both given: with --adapt, each step's codec is one of its levels");
  }
  for (const std::string& level : a.levels) {
    if (level.rfind("-", 0) == 0) {
      return invalid_argument("--adapt '" + level + "': a level is a codec spec; did --adapt lose its value to " +
                              level + "?");
    }
  }
  if (a.levels.empty() != !a.budget_given) {
    return invalid_argument(a.levels.empty() ? "--budget is given without --adapt: the levels to choose from"
                                             : "--adapt is given without --budget: the bytes a step's .gcz may take");
  }
  o.levels = a.levels;
  for (const std::string& r : a.rules) {
    GCZ_ASSIGN_OR_RETURN(CodecRule rule, parse_codec_rule(r));
    o.rules.push_back(std::move(rule));
  }
  o.min_numel = a.min_numel;
  GCZ_ASSIGN_OR_RETURN(o.device, parse_device(a.device));
  o.seed = a.seed;
  o.threads = a.threads;
  GCZ_ASSIGN_OR_RETURN(o.read, to_read_options(a.raw_dtype, a.raw_shape));
  for (const std::string& m : a.meta) {
    const auto eq = m.find('=');
    if (eq == std::string::npos || eq == 0) return invalid_argument("--meta '" + m + "': expected KEY=VALUE");
    if (m.rfind("gcz.", 0) == 0) return invalid_argument("--meta '" + m + "': keys starting 'gcz.' are gcz's own");
    if (!detail::is_utf8(m)) {
      return invalid_argument("--meta '" + m + "': not UTF-8 text, which a .gcz's metadata is (docs/FORMAT.md, 5)");
    }
    if (!o.metadata.emplace(m.substr(0, eq), m.substr(eq + 1)).second) {
      return invalid_argument("--meta '" + m + "': the key '" + m.substr(0, eq) + "' is given twice");
    }
  }
  return o;
}

Result<ReadOptions> to_read_options(const std::string& dtype, const std::string& shape) {
  ReadOptions o;
  if (!dtype.empty()) {
    auto dt = parse_dtype(dtype);
    if (!dt) {
      return invalid_argument("--dtype '" + dtype + "': expected f16, bf16, f32 or f64" +
                              (dtype == "float" ? " ('float' is float32 in C but float64 in numpy: say which)" : ""));
    }
    o.raw_dtype = *dt;
  }
  if (!shape.empty()) {
    Shape dims;
    for (const std::string& part : comma_parts(shape)) {
      if (part.empty() || part.find_first_not_of("0123456789") != std::string::npos) {
        return invalid_argument("--shape '" + shape + "': expected comma-separated sizes, e.g. 4096,1024");
      }
      if (part.size() > 15) return invalid_argument("--shape '" + shape + "': a size of more than 15 digits");
      dims.push_back(std::stoull(part));
    }
    o.raw_shape = dims;
  }
  if (o.raw_dtype.has_value() != o.raw_shape.has_value()) {
    return invalid_argument(std::string("raw input needs both --dtype and --shape, and ") +
                            (o.raw_dtype ? "--shape" : "--dtype") + " is missing");
  }
  return o;
}

}  // namespace gcz::cli
