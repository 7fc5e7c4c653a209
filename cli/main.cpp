// gcz — encode gradient dumps into .gcz files with the codecs of distributed training, and report what
// the compression costs and loses. This file dispatches to the subcommands (cli/cmd_*.cpp), and says
// what is wrong with a command line.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>
#include <map>
#include <new>
#include <optional>
#include <regex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "commands.h"
#include "common.h"
#include "gcz/backend.h"
#include "gcz/codec.h"
#include "gcz/pipeline.h"
#include "gcz/tensor_io.h"

namespace {

// On SIGINT, SIGTERM or SIGHUP (unless ignored, as under nohup) a handler, in whichever thread the
// signal lands (BLAS starts threads of its own), writes the signal to a pipe; a thread waiting on it
// removes the temporary files of unfinished outputs, then lets the signal end the process as usual.
int g_stop_pipe[2] = {-1, -1};

extern "C" void on_stop_signal(int sig) {
  const int saved = errno;
  const unsigned char b = static_cast<unsigned char>(sig);
  const ssize_t ignored = ::write(g_stop_pipe[1], &b, 1);
  (void)ignored;
  errno = saved;
}

// A mapped input that shrinks while gcz reads it (rewritten in place: the reader's fault, not the
// file's) raises SIGBUS in the thread that touched the lost page. Its handler says so in one line,
// has the waiting thread remove the unfinished outputs and end gcz with exit 3, and never returns
// (the read would fault again).
extern "C" void on_bus_error(int, siginfo_t* info, void*) {
  auto out = [](const char* bytes, std::size_t n) {
    if (::write(STDERR_FILENO, bytes, n) < 0) return;  // nothing more to be done about it here
  };
  auto say = [&out](const char* text, bool escape = false) {
    for (const char* p = text; *p != '\0';) {  // runs of printable bytes; with `escape`, control bytes as \xNN
      const char* q = p;
      while (*q != '\0' && !(escape && (static_cast<unsigned char>(*q) < 0x20 || *q == 0x7f))) ++q;
      out(p, static_cast<std::size_t>(q - p));
      if (*q == '\0') break;
      const char* hex = "0123456789abcdef";
      const char esc[4] = {'\\', 'x', hex[static_cast<unsigned char>(*q) >> 4], hex[*q & 15]};
      out(esc, 4);
      p = q + 1;
    }
  };
  say("gcz: error: ");
  if (const char* path = gcz::mapped_input_at(info->si_addr)) {
    say(path, /*escape=*/true);
    say(": the file shrank while gcz read it (was it rewritten in place? replace a file by renaming a new "
        "one over it)\n");
  } else {
    say("a file gcz had mapped into memory shrank while it was read (SIGBUS)\n");
  }
  const unsigned char b = SIGBUS;
  if (g_stop_pipe[1] < 0 || ::write(g_stop_pipe[1], &b, 1) != 1) ::_exit(3);
  for (;;) ::pause();
}

void stop_cleanly_on_signals() {
  // A write past the file-size limit (ulimit -f) fails with EFBIG instead of ending gcz: reported,
  // and the unfinished outputs removed, as for a full disk.
  std::signal(SIGXFSZ, SIG_IGN);
  struct sigaction bus {};
  bus.sa_sigaction = on_bus_error;
  sigemptyset(&bus.sa_mask);
  bus.sa_flags = SA_SIGINFO;
  ::sigaction(SIGBUS, &bus, nullptr);
  if (::pipe2(g_stop_pipe, O_CLOEXEC) != 0) {
    g_stop_pipe[0] = g_stop_pipe[1] = -1;
    return;
  }
  try {
    std::thread([] {
      unsigned char b = 0;
      ssize_t n;
      while ((n = ::read(g_stop_pipe[0], &b, 1)) < 0 && errno == EINTR) {
      }
      if (n != 1) return;
      gcz::remove_unfinished_outputs(/*for_good=*/true);
      if (b == SIGBUS) ::_exit(3);  // said by on_bus_error, an input's fault (kIoError)
      std::signal(b, SIG_DFL);
      std::raise(b);
    }).detach();
  } catch (const std::system_error&) {  // no thread to be had: the signals keep their defaults
    ::close(g_stop_pipe[0]);
    ::close(g_stop_pipe[1]);
    g_stop_pipe[0] = g_stop_pipe[1] = -1;
    return;
  }
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) != 0 || old.sa_handler == SIG_IGN) continue;
    struct sigaction act {};
    act.sa_handler = on_stop_signal;
    sigemptyset(&act.sa_mask);
    act.sa_flags = SA_RESTART | SA_RESETHAND;  // a second signal ends gcz at once
    ::sigaction(sig, &act, nullptr);
  }
}

// The innermost command the arguments named (gcz itself when none).
CLI::App* innermost_command(CLI::App& app) {
  CLI::App* at = &app;
  for (auto subs = at->get_subcommands(); !subs.empty(); subs = at->get_subcommands()) at = subs.front();
  return at;
}

std::string joined(const std::vector<std::string>& words, const char* between) {
  std::string out;
  for (const std::string& w : words) out += (out.empty() ? "" : between) + w;
  return out;
}

std::string command_names(CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands({})) names.push_back(sub->get_name());
  return joined(names, ", ");
}

// CLI11's message for a parse error, said as gcz says its others.
std::string usage_message(CLI::App& app, int argc, char** argv, const CLI::ParseError& e) {
  const std::string what = e.what();
  CLI::App* command = innermost_command(app);
  std::smatch m;
  if (command == &app && dynamic_cast<const CLI::RequiredError*>(&e)) {  // no command, or only options
    const std::string names = command_names(app);
    if (argc > 1 && argv[1][0] != '-')
      return "unknown command '" + std::string(argv[1]) + "' (commands: " + names + ")";
    if (argc > 1)
      return "unknown option '" + std::string(argv[1]) + "' (before a command gcz takes --help and --version)";
    return "no command given (commands: " + names + ")";
  }
  // CLI11 lists unknown arguments last first.
  auto unexpected = [&](const std::vector<std::string>& extra) {
    return (extra.size() == 1 ? "unexpected argument '" + extra[0] + "'"
                              : "unexpected arguments '" + joined(extra, " ") + "'") +
           " for gcz" + (command == &app ? "" : " " + command->get_name());
  };
  if (dynamic_cast<const CLI::RequiredError*>(&e) && std::regex_match(what, m, std::regex("(.+) is required"))) {
    const CLI::Option* missing = nullptr;
    for (const CLI::Option* o : command->get_options()) {
      if (o->get_name() == m[1].str()) missing = o;
    }
    const std::vector<std::string> extra = command->remaining();
    if (missing && missing->get_positional()) {
      // A FILE named like an option, the only argument left over, was taken for an unknown option.
      if (extra.size() == 1 && extra[0].size() > 1 && extra[0][0] == '-') {
        return unexpected(extra) + " (an unknown option; a file whose name starts with '-' is given as ./" + extra[0] +
               " or after --)";
      }
      if (extra.empty()) {
        std::string about = missing->get_description();
        about = about.substr(0, about.find_first_of(":;("));
        if (!about.empty()) about[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(about[0])));
        return "missing " + missing->get_name() + " (" + about + ")";
      }
    }
    return extra.empty() ? what : unexpected(extra) + " (and " + what + ")";
  }
  if (std::regex_match(what, m, std::regex("(.+): At Most 1 required but received (\\d+)"))) {
    std::string out = m[1].str() + " takes one value and was given " + m[2].str();
    if (m[1] == "--codec")
      out += " (one spec for every tensor: --rule GLOB=SPEC chooses per tensor, gcz bench compares codecs)";
    return out;
  }
  if (std::regex_match(what, m, std::regex("(.+): \\d+ required \\S+ missing"))) return m[1].str() + " needs a value";
  if (std::regex_match(what, m, std::regex("Could not convert: (\\S+) = (.*)"))) {
    return m[1].str() + ": '" + m[2].str() + "' is not a value it takes";
  }
  if (dynamic_cast<const CLI::ExtrasError*>(&e)) {
    const std::vector<std::string> extra = command->remaining();
    const bool output = std::any_of(extra.begin(), extra.end(), [](const std::string& a) {
      return a.rfind("-o", 0) == 0 || a.rfind("--output", 0) == 0;
    });
    return unexpected(extra) +
           (output && command->get_name() == "eval" ? " (eval writes nothing: gcz encode -o FILE writes a .gcz)" : "");
  }
  return what;
}

// A command-line error as one line: "gcz: error: WHAT (see 'gcz [COMMAND] --help')".
int usage_error(CLI::App& app, int argc, char** argv, const CLI::ParseError& e) {
  CLI::App* command = innermost_command(app);
  const std::string help = command == &app ? "gcz" : "gcz " + command->get_name();
  std::fprintf(stderr, "gcz: error: %s%s\n", gcz::cli::printable(usage_message(app, argc, argv, e)).c_str(),
               gcz::cli::see_help(help).c_str());
  return gcz::cli::kExitUsage;
}

// `gcz help [COMMAND]`: the help of gcz or of COMMAND, as --help prints it.
std::optional<int> help_command(CLI::App& app, int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) != "help") return std::nullopt;
  const std::string asked = argc > 2 ? argv[2] : "";
  if (argc == 2 || (argc == 3 && (asked == "--help" || asked == "-h" || asked == "help"))) {
    std::printf("%s", app.help().c_str());
    return gcz::cli::kExitOk;
  }
  const char* problem = "'gcz help' takes one command";
  if (argc == 3) {
    for (CLI::App* sub : app.get_subcommands({})) {
      if (sub->get_name() == asked) {
        std::printf("%s", sub->help(app.get_name()).c_str());
        return gcz::cli::kExitOk;
      }
    }
    problem = "unknown command";
  }
  std::fprintf(stderr, "gcz: error: %s%s (commands: %s; see 'gcz --help')\n", problem,
               argc == 3 ? (" '" + gcz::cli::printable(asked) + "'").c_str() : "", command_names(app).c_str());
  return gcz::cli::kExitUsage;
}

// What was printed, flushed: a report that could not be written (a full disk, a closed descriptor)
// is an I/O error, unless the command had failed already.
int flush_standard_output(int rc) {
  errno = 0;
  std::cout.flush();
  const bool flushed = std::fflush(stdout) == 0;
  const int error = errno;
  if (flushed && !std::ferror(stdout) && std::cout.good()) return rc;
  // A write that failed before the flush left no errno to tell why.
  std::fprintf(stderr,
               "gcz: error: cannot write to standard output%s%s: what gcz printed there is incomplete (the "
               "command's work is done: the files it writes are in place)\n",
               error != 0 ? ": " : "", error != 0 ? std::strerror(error) : "");
  return rc == gcz::cli::kExitOk ? gcz::cli::kExitIo : rc;
}

int run(int argc, char** argv) {
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
      "Run 'gcz COMMAND --help' (or 'gcz help COMMAND') for each command's options.\n"
      "Exit codes: 0 success (warnings may have been printed), 1 internal error (a bug in gcz), 2 usage (option,\n"
      "argument, codec spec or rule), 3 I/O, 4 bad input (a file breaks its format's rules), 5 unsupported (a\n"
      "dtype, format version, codec or extension gcz does not handle, or a tensor too large for the memory gcz\n"
      "may use), 6 checksum mismatch in a .gcz file, 7 device (--device cuda without a usable GPU or CUDA\n"
      "build, or a device failure).");
  app.set_version_flag("-V,--version", std::string("gcz ") + GCZ_CLI_VERSION +
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
  if (auto help = help_command(app, argc, argv)) return *help;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() != 0) return usage_error(app, argc, argv, e);
    app.exit(e);  // --help, --version
    return kExitOk;
  }
  for (const auto& [sub, run] : runs) {
    if (!sub->parsed()) continue;
    set_command_for_usage_errors("gcz " + sub->get_name());
    // The library reports failures as Status; an exception here is a bug or the machine's limit.
    // Either way: one line, and the unfinished outputs go (their destructors ran on the way here).
    try {
      return run();
    } catch (const std::bad_alloc&) {  // the machine's limit, not a bug: as for a tensor too large for it
      std::fprintf(stderr, "gcz: error: out of memory\n");
      return kExitUnsupported;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "gcz: error: internal error: %s\n", e.what());
    }
    return kExitInternal;
  }
  return kExitUsage;
}

}  // namespace

int main(int argc, char** argv) {
  gcz::release_blas_threads();
  gcz::skip_hdf5_cleanup_at_exit();
  stop_cleanly_on_signals();
  return flush_standard_output(run(argc, argv));
}
