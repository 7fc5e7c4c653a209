// gcz — encode gradient dumps into .gcz files with the codecs of distributed training, and report what
// the compression costs and loses. This file only dispatches to the subcommands (cli/cmd_*.cpp).
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <exception>
#include <map>
#include <new>
#include <string>
#include <system_error>
#include <thread>

#include "commands.h"
#include "common.h"
#include "gcz/backend.h"
#include "gcz/pipeline.h"

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

void stop_cleanly_on_signals() {
  if (::pipe2(g_stop_pipe, O_CLOEXEC) != 0) return;
  try {
    std::thread([] {
      unsigned char b = 0;
      ssize_t n;
      while ((n = ::read(g_stop_pipe[0], &b, 1)) < 0 && errno == EINTR) {
      }
      if (n != 1) return;
      gcz::remove_unfinished_outputs(/*for_good=*/true);
      std::signal(b, SIG_DFL);
      std::raise(b);
    }).detach();
  } catch (const std::system_error&) {  // no thread to be had: the signals keep their defaults
    ::close(g_stop_pipe[0]);
    ::close(g_stop_pipe[1]);
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

// A command-line error as one line: "gcz: error: WHAT (see 'gcz [COMMAND] --help')".
int usage_error(CLI::App& app, int argc, char** argv, const CLI::ParseError& e) {
  std::string command = "gcz";
  for (const CLI::App* sub : app.get_subcommands()) command += " " + sub->get_name();
  std::string what = e.what();
  if (command == "gcz" && argc > 1 && argv[1][0] != '-') {
    std::string names;
    for (const CLI::App* sub : app.get_subcommands({})) names += (names.empty() ? "" : ", ") + sub->get_name();
    what = "unknown command '" + std::string(argv[1]) + "' (commands: " + names + ")";
  }
  std::fprintf(stderr, "gcz: error: %s%s\n", what.c_str(), gcz::cli::see_help(command).c_str());
  return gcz::cli::kExitUsage;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace gcz::cli;
  stop_cleanly_on_signals();
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
      "Run 'gcz COMMAND --help' for each command's options.\n"
      "Exit codes: 0 success (warnings may have been printed), 1 internal error (a bug in gcz), 2 usage (option,\n"
      "argument, codec spec or rule), 3 I/O, 4 bad input (a file breaks its format's rules), 5 unsupported (a\n"
      "dtype, format version, codec or extension gcz does not handle, or a tensor too large for the memory gcz\n"
      "may use), 6 checksum mismatch in a .gcz file, 7 device (--device cuda without a usable GPU or CUDA\n"
      "build, or a device failure).");
  app.set_version_flag("--version", std::string("gcz ") + GCZ_CLI_VERSION +
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
    } catch (const std::bad_alloc&) {
      std::fprintf(stderr, "gcz: error: out of memory\n");
    } catch (const std::exception& e) {
      std::fprintf(stderr, "gcz: error: internal error: %s\n", e.what());
    }
    return kExitInternal;
  }
  return kExitUsage;
}
