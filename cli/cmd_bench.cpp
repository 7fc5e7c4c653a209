// gcz bench: codec throughput in GB/s beside memcpy measured in the same run.

#include <climits>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "commands.h"
#include "common.h"
#include "gcz/bench.h"
#include "report.h"

namespace gcz::cli {
namespace {

constexpr const char* kDefaultThreads = "1,2";  // the thread counts measured when --threads is not given

using json = nlohmann::json;

// Which of the CPU code's paths ran (the same bits from each): the JSON's name and the table's line.
struct CpuCodeNames {
  const char* json;
  const char* line;
};
CpuCodeNames cpu_code_names(CpuCode code) {
  switch (code) {
    case CpuCode::kAvx512:
      return {"avx512", "AVX2 paths, Philox draws in AVX-512 (AVX2, FMA, F16C and AVX-512F found)"};
    case CpuCode::kAvx2:
      return {"avx2", "AVX2 paths (AVX2, FMA and F16C found)"};
    case CpuCode::kPortable:
      break;
  }
  return {"portable", "portable paths (no AVX2, FMA or F16C: slower, the same bits)"};
}

// The whole run as one JSON document: what --json prints instead of the tables.
json bench_json(const BenchResult& r, int repeats, bool synthetic) {
  json yardsticks = json::array();
  for (const BenchYardstick& y : r.yardsticks) {
    yardsticks.push_back({{"threads", y.threads}, {"memcpy_gbps", y.memcpy_gbps}, {"read_gbps", y.read_gbps}});
  }
  json rows = json::array();
  for (const BenchRow& row : r.rows) {
    rows.push_back({{"codec", row.spec},
                    {"threads", row.threads},
                    {"ratio", row.ratio},
                    {"encode_gbps", row.encode_gbps},
                    {"decode_gbps", row.decode_gbps}});
  }
  json device_kernels = json::array();
  for (const DeviceKernelRate& k : r.device_kernels) {
    device_kernels.push_back({{"name", k.name}, {"elements", k.elements}, {"gbps", k.gbps}});
  }
  return {{"input_bytes", r.input_bytes},
          {"tensors", r.tensors},
          {"synthetic", synthetic},
          {"backend", std::string(backend_name(r.backend))},
          {"cpu_code", cpu_code_names(r.cpu_code).json},
          {"repeats", repeats},
          {"memcpy_gbps", r.memcpy_gbps},
          {"yardsticks", std::move(yardsticks)},
          {"device_kernels", std::move(device_kernels)},
          {"rows", std::move(rows)}};
}

// The GPU's rates on its own memory: the device copy first, which 'x copy' divides by.
void print_device_kernels(const std::vector<DeviceKernelRate>& kernels) {
  std::printf(
      "\nGPU, data already on the device (%s of float32; GB/s counts bytes read + written; median of the "
      "runs)\n",
      human_bytes(kernels.front().elements * 4).c_str());
  std::printf("%-34s %12s %8s\n", "kernel", "GB/s", "x copy");
  for (const DeviceKernelRate& k : kernels) {
    std::printf("%-34s %12.1f %8.2f\n", k.name.c_str(), k.gbps, k.gbps / kernels.front().gbps);
  }
  std::printf("The rows below count host-resident input bytes (each chunk crosses the bus and back).\n");
}

// Prints the tables as run_bench reports progress: the data and yardsticks first, then each new row.
// Both tables' scaling divides by the first thread count of the rows.
struct TablePrinter {
  int repeats;
  bool synthetic;
  std::size_t printed = 0;

  void operator()(const BenchResult& r) {
    if (printed == 0 && r.rows.empty()) {
      std::printf("data: %s in %llu tensor(s)%s, backend %s, best of %d timed runs after a warm-up\n",
                  human_bytes(r.input_bytes).c_str(), static_cast<unsigned long long>(r.tensors),
                  synthetic ? " (synthetic float32)" : "", std::string(backend_name(r.backend)).c_str(), repeats);
      std::printf("CPU code: %s\n", cpu_code_names(r.cpu_code).line);
      std::printf("memcpy (1 thread): %.2f GB/s\n\n", r.memcpy_gbps);
      std::printf("%-34s %7s %12s %8s %12s %8s\n", "yardstick", "threads", "memcpy GB/s", "scaling", "read GB/s",
                  "scaling");
      const BenchYardstick* base = &r.yardsticks.front();
      for (const BenchYardstick& y : r.yardsticks) {
        if (y.threads == r.row_threads.front()) base = &y;
      }
      for (const BenchYardstick& y : r.yardsticks) {
        std::printf("%-34s %7u %12.2f %8.2f %12.2f %8.2f\n", "machine (the same bytes)", y.threads, y.memcpy_gbps,
                    y.memcpy_gbps / base->memcpy_gbps, y.read_gbps, y.read_gbps / base->read_gbps);
      }
      if (!r.device_kernels.empty()) print_device_kernels(r.device_kernels);
      std::printf("\n%-34s %7s %7s %12s %9s %8s %12s %9s %8s\n", "codec", "threads", "ratio", "encode GB/s",
                  "x memcpy", "scaling", "decode GB/s", "x memcpy", "scaling");
    }
    const std::size_t per_spec = r.row_threads.size();
    for (; printed < r.rows.size(); ++printed) {
      const BenchRow& row = r.rows[printed];
      const BenchRow& base = r.rows[printed / per_spec * per_spec];  // the same spec's first thread count
      std::printf("%-34s %7u %7.2f %12.2f %9.2f %8.2f %12.2f %9.2f %8.2f\n", row.spec.c_str(), row.threads, row.ratio,
                  row.encode_gbps, row.encode_gbps / r.memcpy_gbps, row.encode_gbps / base.encode_gbps,
                  row.decode_gbps, row.decode_gbps / r.memcpy_gbps, row.decode_gbps / base.decode_gbps);
    }
    std::fflush(stdout);
  }
};

}  // namespace

RunFn add_bench_command(CLI::App& app) {
  struct Args {
    std::vector<std::string> inputs;
    // Every codec at its defaults, and one zstd stage.
    std::vector<std::string> specs = {"fp16", "bf16", "qsgd", "terngrad", "topk", "randomk", "powersgd", "fp16+zstd"};
    int64_t size_mib = 256;
    int repeats = 5;
    std::vector<std::string> threads;  // lists, as given (none: kDefaultThreads)
    std::string device = "cpu";
    std::string raw_dtype, raw_shape;
    bool json = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "bench", "Measure codec encode/decode throughput (GB/s of input) against memcpy in the same run");
  cmd->add_option("INPUT", a->inputs, "Tensor files to measure on (default: synthetic gradient-like float32 data)");
  // One value per -c and per --threads, so that an input file after them stays an input.
  cmd->add_option("-c,--codec", a->specs, "Codec spec to measure; repeatable, e.g. -c qsgd -c 'topk:ratio=0.01'")
      ->allow_extra_args(false)
      ->capture_default_str();
  CLI::Option* size_mib = cmd->add_option("--size-mib", a->size_mib,
                                          "Size of the synthetic data in MiB (the run holds about five copies of it); "
                                          "not used with input files")
                              ->check(whole_number(INT64_MAX, 1))
                              ->capture_default_str();
  cmd->add_option("--repeat", a->repeats, "Timed runs per measurement; the best is reported")
      ->check(whole_number(INT_MAX, 1))
      ->capture_default_str();
  cmd->add_option("--threads", a->threads,
                  "Thread counts to measure, 1.." + std::to_string(kBenchMaxThreads) +
                      " (element-wise codecs split each tensor; whole-tensor codecs take one each)")
      ->check(whole_number_list(kBenchMaxThreads, 1))
      ->allow_extra_args(false)
      ->default_str(kDefaultThreads);
  cmd->add_option("--device", a->device, "cpu, cuda (or gpu) or auto")->capture_default_str();
  add_raw_input_options(*cmd, a->raw_dtype, a->raw_shape);
  cmd->add_flag("--json", a->json,
                "Print one JSON document when done (yardsticks, and per codec and thread count ratio, "
                "encode_gbps, decode_gbps) instead of the tables");
  cmd->footer(
      "Timings are in-memory (no file I/O); GB/s counts input bytes (1 GB = 1e9 bytes). 'x memcpy' divides by\n"
      "single-threaded memcpy of the same bytes in the same run; 'scaling' by the first thread count's figure.\n"
      "The yardsticks copy and read the same bytes on each thread count: they show how far the memory's\n"
      "bandwidth scaled during the run, and so how far a codec limited by it could. On small inputs\n"
      "(a few MiB) starting the threads dominates the multi-thread figures.\n"
      "The machine may be shared and noisy: compare ratios, not absolute numbers.\n"
      "Examples:\n  gcz bench\n  gcz bench samples/grads/step_0000.safetensors -c fp16 -c bf16+zstd\n"
      "  gcz bench -c qsgd -c terngrad --threads 1,2 --json > bench.json\n"
      "  gcz bench dump.bin --dtype f32 --shape 4096,4096 -c topk");
  return [a, size_mib]() {
    // --repeat, --threads and --size-mib's least are their options' checks; the most MiB is this machine's.
    if (a->inputs.empty()) {
      const int64_t most = static_cast<int64_t>(bench_max_synthetic_bytes() >> 20);
      if (a->size_mib > most) {
        return report_error(
            invalid_argument("--size-mib must be 1.." + std::to_string(most) +
                             " here (a fifth of the memory this process may use: the run holds about five "
                             "copies of the data), got " +
                             std::to_string(a->size_mib)));
      }
    }
    BenchOptions o;
    auto read = to_read_options(a->raw_dtype, a->raw_shape);
    if (!read) return report_error(read.status());
    o.read = *read;
    note_unused_raw_options(a->raw_dtype, a->raw_shape, a->inputs);
    if (!a->inputs.empty() && size_mib->count() > 0) {
      std::fprintf(stderr,
                   "gcz: note: --size-mib sizes the synthetic data, and the input files are measured instead\n");
    }
    o.inputs = a->inputs;
    if (a->inputs.empty()) o.synthetic_bytes = static_cast<uint64_t>(a->size_mib) << 20;
    o.repeats = a->repeats;
    o.threads.clear();
    for (const std::string& list : a->threads.empty() ? std::vector<std::string>{kDefaultThreads} : a->threads) {
      for (unsigned n : whole_numbers(list)) o.threads.push_back(n);
    }
    auto device = parse_device(a->device);
    if (!device) return report_error(device.status());
    o.device = *device;
    // The tables are printed as the measurements come: a long run shows its progress row by row.
    // With --json, which prints only at the end, a terminal's stderr counts the rows meanwhile.
    TablePrinter tables{a->repeats, a->inputs.empty()};
    ProgressLine line("gcz bench:");
    if (a->json) {
      o.progress = [&](const BenchResult& r) {
        line.show(std::to_string(r.rows.size()) + " of " + std::to_string(a->specs.size() * r.row_threads.size()) +
                  " rows measured");
      };
    } else {
      o.progress = std::ref(tables);
    }
    auto r = run_bench(a->specs, o);
    line.clear();
    if (!r) return report_error(r.status());
    if (a->json) print_json(stdout, bench_json(*r, a->repeats, a->inputs.empty()));
    return static_cast<int>(kExitOk);
  };
}

}  // namespace gcz::cli
