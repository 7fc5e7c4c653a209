// gcz bench: codec throughput in GB/s beside memcpy measured in the same run.
#include <memory>

#include "commands.h"
#include "common.h"
#include "gcz/bench.h"
#include "report.h"

namespace gcz::cli {

RunFn add_bench_command(CLI::App& app) {
  struct Args {
    std::vector<std::string> inputs;
    std::vector<std::string> specs = {"fp16", "bf16", "fp16+zstd:level=1"};
    uint64_t size_mib = 256;
    int repeats = 5;
    std::vector<unsigned> threads = {1, 2};
    std::string device = "cpu";
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "bench", "Measure codec encode/decode throughput (GB/s of input) against memcpy in the same run");
  cmd->add_option("inputs", a->inputs, "Tensor files to measure on (default: synthetic gradient-like float32 data)");
  cmd->add_option("-c,--codec", a->specs, "Codec specs to measure; repeatable")->capture_default_str();
  cmd->add_option("--size-mib", a->size_mib, "Size of the synthetic data in MiB")->capture_default_str();
  cmd->add_option("--repeat", a->repeats, "Timed runs per measurement; the best is reported")->capture_default_str();
  cmd->add_option("--threads", a->threads,
                  "Thread counts to measure (element-wise codecs split each tensor; whole-tensor codecs take one each)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--device", a->device, "cpu, cuda or auto")->capture_default_str();
  cmd->footer(
      "Timings are in-memory (no file I/O); GB/s counts input bytes (1 GB = 1e9 bytes). 'x memcpy' divides by\n"
      "single-threaded memcpy of the same bytes in the same run; 'scaling' by the codec's first thread count.\n"
      "The machine may be shared and noisy: compare ratios, not absolute numbers.\n"
      "Examples:\n  gcz bench\n  gcz bench samples/grads/step_0000.safetensors -c fp16 -c bf16+zstd");
  return [a]() {
    BenchOptions o;
    o.inputs = a->inputs;
    o.synthetic_bytes = a->size_mib << 20;
    o.repeats = a->repeats;
    o.threads = a->threads;
    auto device = parse_device(a->device);
    if (!device) return report_error(device.status());
    o.device = *device;
    auto r = run_bench(a->specs, o);
    if (!r) return report_error(r.status());
    std::printf("data: %s in %llu tensor(s)%s, backend %s, best of %d timed runs after a warm-up\n", human_bytes(r->input_bytes).c_str(),
                static_cast<unsigned long long>(r->tensors), a->inputs.empty() ? " (synthetic float32)" : "",
                std::string(backend_name(r->backend)).c_str(), a->repeats);
    std::printf("memcpy (1 thread): %.2f GB/s\n\n", r->memcpy_gbps);
    std::printf("%-34s %7s %7s %12s %9s %8s %12s %9s %8s\n", "codec", "threads", "ratio", "encode GB/s", "x memcpy",
                "scaling", "decode GB/s", "x memcpy", "scaling");
    const BenchRow* base = nullptr;
    for (const BenchRow& row : r->rows) {
      if (!base || base->spec != row.spec) base = &row;  // the first thread count of each spec
      std::printf("%-34s %7u %7.2f %12.2f %9.2f %8.2f %12.2f %9.2f %8.2f\n", row.spec.c_str(), row.threads, row.ratio,
                  row.encode_gbps, row.encode_gbps / r->memcpy_gbps, row.encode_gbps / base->encode_gbps,
                  row.decode_gbps, row.decode_gbps / r->memcpy_gbps, row.decode_gbps / base->decode_gbps);
    }
    return static_cast<int>(kExitOk);
  };
}

}  // namespace gcz::cli
