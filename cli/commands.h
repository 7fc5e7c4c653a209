// The gcz subcommands: each registers its options on the app and returns the function that runs it.
#pragma once

#include <functional>

#include <CLI/CLI.hpp>

namespace gcz::cli {

using RunFn = std::function<int()>;

RunFn add_encode_command(CLI::App& app);
RunFn add_eval_command(CLI::App& app);
RunFn add_decode_command(CLI::App& app);
RunFn add_info_command(CLI::App& app);
RunFn add_verify_command(CLI::App& app);
RunFn add_bench_command(CLI::App& app);

}  // namespace gcz::cli
