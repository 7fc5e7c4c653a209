// gcz decode: a .gcz in, a tensor file out.
#include <memory>

#include "commands.h"
#include "common.h"

namespace gcz::cli {

RunFn add_decode_command(CLI::App& app) {
  struct Args {
    std::string input, output, device = "auto";
    std::vector<std::string> tensors;
    bool widen = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("decode", "Decode a .gcz file back into tensors");
  cmd->add_option("FILE", a->input, "The .gcz file")->required();
  cmd->add_option("-o,--output", a->output,
                  "Output; the format follows the extension: .safetensors, .npz, .npy (one tensor), .h5/.hdf5, "
                  ".bin/.raw (one tensor), or a directory (ending in '/', or an existing empty one: one .npy per "
                  "tensor). Replaced atomically; nothing is left on failure")
      ->required();
  cmd->add_option("-t,--tensor", a->tensors,
                  "Decode only tensors matching GLOB (a GLOB that matches none is an error); repeatable. "
                  "Example: -t 'blocks.0.*'")
      ->allow_extra_args(false);  // one GLOB each time: the input after it stays the input
  cmd->add_flag("--widen", a->widen,
                "Write bfloat16 tensors as float32 (exactly) to formats that cannot hold bfloat16 (.npy, .npz, HDF5)");
  cmd->add_option("--device", a->device, "Where codecs run: cpu, cuda (or gpu) or auto")->capture_default_str();
  cmd->footer(
      "Examples:\n"
      "  gcz decode grads.gcz -o restored.safetensors\n"
      "  gcz decode grads.gcz -o head.npy -t head.weight\n"
      "  gcz decode grads.gcz -o restored/ --widen");
  return [a]() {
    if (Status s = check_output_option(a->output); !s) return report_error(s);
    DecodeOptions o;
    o.names = a->tensors;
    o.write.widen_bf16 = a->widen;
    auto device = parse_device(a->device);
    if (!device) return report_error(device.status());
    o.device = *device;
    ProgressLine progress("decoding");
    o.progress = progress.callback();
    Status s = decode_file(a->input, a->output, o);
    progress.clear();
    if (!s) return report_error(s);
    return static_cast<int>(kExitOk);
  };
}

}  // namespace gcz::cli
