// Shared pieces of the gcz subcommands: exit codes, error printing, progress, option helpers.
#pragma once

#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "gcz/pipeline.h"
#include "gcz/status.h"

namespace gcz::cli {

// Exit codes (docs/CLI.md). Fixed: never renumber.
enum ExitCode : int {
  kExitOk = 0,
  kExitInternal = 1,
  kExitUsage = 2,
  kExitIo = 3,
  kExitBadInput = 4,
  kExitUnsupported = 5,
  kExitChecksum = 6,
  kExitDevice = 7,
};

int exit_code_for(StatusCode code);
// `text` with each byte of what would not print as itself written as \xNN: control characters
// (C0, DEL, C1), format characters (zero-width ones, bidirectional controls), bytes that are not
// UTF-8, and characters the C library does not call printable. Names from a file cannot break a
// line of output, drive the terminal or reorder what it shows.
std::string printable(const std::string& text);
// printable() text for a table cell: whole up to `most` terminal columns (a wide character takes
// two), else its first and last parts (whole UTF-8 characters and escapes) around "...", the end kept
// longer (a name's end says most); `most` is taken as 6 at least.
std::string table_cell(const std::string& text, std::size_t most = 72);
// Prints "gcz: error: MESSAGE" on stderr and returns the exit code for the status. A usage error
// (kInvalidArgument, exit 2) ends with the --help to read: "(see 'gcz encode --help')", naming the
// command set by set_command_for_usage_errors.
int report_error(const Status& status);
void set_command_for_usage_errors(const std::string& command);
// " (see 'COMMAND --help')", which ends every usage error.
std::string see_help(const std::string& command);

// Prints `rows` (the first a header) as columns two spaces apart, each as wide as its widest cell in
// terminal columns (UTF-8: a name such as 'ünï' takes 3, not 5, and '层' 2); the first `left`
// columns are aligned left, the others right. With `rule_before_last`, dashes under every column come
// before the last row (a TOTAL), when there are rows besides it.
void print_columns(std::FILE* out, const std::vector<std::vector<std::string>>& rows, std::size_t left,
                   bool rule_before_last = false);

// A progress line on stderr, redrawn at most ~10 times a second, only when stderr is a terminal.
class ProgressLine {
 public:
  explicit ProgressLine(std::string verb);
  ~ProgressLine();
  ProgressFn callback();
  // Draws "VERB TEXT" now (when stderr is a terminal), for progress that is not a Progress.
  void show(const std::string& text);
  void clear();
  // What the line says it is doing, from the next time it is drawn ("evaluating step 2/4").
  void set_verb(std::string verb) { verb_ = std::move(verb); }

 private:
  std::string verb_;
  bool enabled_;
  bool drawn_ = false;
  double last_ = 0;
};

// Options shared by encode and eval.
struct EncodeArgs {
  std::vector<std::string> inputs;
  std::string spec = "fp16";
  std::vector<std::string> rules;
  uint64_t min_numel = 0;
  std::string device = "auto";
  uint64_t seed = 0;
  unsigned threads = 0;
  std::string raw_dtype;
  std::string raw_shape;
  std::vector<std::string> meta;
  std::string report_format = "table";
  std::string sort;  // --sort KEY[:asc|:desc]
  uint64_t top = 0;  // --top N (0: every tensor)
  bool quiet = false;
  bool spec_given = false;          // -c was on the command line
  std::vector<std::string> levels;  // --adapt, lightest first
  std::string budget;               // --budget SIZE[,SIZE...]
  bool budget_given = false;        // --budget was on the command line (perhaps empty)
};

void add_encode_options(CLI::App& app, EncodeArgs& args);
// An option's check (each value of a list): a whole number in least..most, as typed (CLI11's own
// conversion would wrap "-1" and saturate "1e23").
CLI::Validator whole_number(uint64_t most = UINT64_MAX, uint64_t least = 0);
// The same for each item of a comma-separated list (empty items included: "1,,2" is refused), and
// the numbers of a list it passed.
CLI::Validator whole_number_list(uint64_t most, uint64_t least);
std::vector<unsigned> whole_numbers(const std::string& list);
// An output named on the command line (-o, --ef-state) that starts with '=', as `-o=NAME` gives a
// short option (CLI11 keeps the '='), is refused as the slip it almost surely is.
Status check_output_option(const std::string& path);
// Each codec's parameters with their defaults, for the help of the commands that take -c.
extern const char* const kCodecParametersHelp;
// Turns parsed arguments into library options (checking dtype/shape/rules/device/meta, and that -c,
// --adapt and --budget go together as they must). The budget is budgets_for()'s.
Result<EncodeOptions> to_encode_options(const EncodeArgs& args);
// With --adapt, the budget of each of `steps` steps (eval --steps; 0 elsewhere, for one budget), in
// bytes: --budget's sizes (2MiB, 500kB, 1048576), one per step or one for all; empty without --adapt.
Result<std::vector<uint64_t>> budgets_for(const EncodeArgs& args, std::size_t steps);
// --dtype and --shape, for raw binary input.
void add_raw_input_options(CLI::App& app, std::string& dtype, std::string& shape);
// Their values as ReadOptions; both or neither.
Result<ReadOptions> to_read_options(const std::string& dtype, const std::string& shape);
// A note on stderr where --dtype or --shape is given but no input would be read as raw bytes.
void note_unused_raw_options(const std::string& dtype, const std::string& shape,
                             const std::vector<std::string>& inputs);
Result<DeviceRequest> parse_device(const std::string& text);

}  // namespace gcz::cli
