#include "fuzz_targets.h"

#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "gcz/container.h"
#include "gcz/pipeline.h"
#include "gcz/tensor_io.h"

namespace gcz::fuzz {
namespace {

// Writes the bytes to a per-process scratch file with the given extension.
std::string scratch(const uint8_t* data, std::size_t size, const char* ext) {
  const char* dir = std::getenv("TMPDIR");
  std::string path = std::string(dir ? dir : "/tmp") + "/gcz_fuzz_" + std::to_string(::getpid()) + ext;
  if (std::FILE* f = std::fopen(path.c_str(), "wb")) {
    if (size) std::fwrite(data, 1, size, f);
    std::fclose(f);
  }
  return path;
}

}  // namespace

int gcz_file(const uint8_t* data, std::size_t size) {
  const std::string path = scratch(data, size, ".gcz");
  auto r = GczReader::open(path);
  if (r && (*r)->verify(nullptr)) {
    // Every codec's decoder on every tensor: hostile stream contents must be rejected, not trusted.
    for (std::size_t t = 0; t < (*r)->index().tensors.size(); ++t) {
      auto bytes = (*r)->index().tensors[t].info.byte_size();
      if (bytes && *bytes <= (uint64_t{64} << 20)) (void)decode_tensor(**r, t);
    }
    std::vector<std::byte> buf;
    for (std::size_t t = 0; t < (*r)->index().tensors.size(); ++t) {
      const auto& rec = (*r)->index().tensors[t];
      for (std::size_t s = 0; s < rec.streams.size(); ++s) {
        auto c = (*r)->open_stream(t, s);
        if (!c) continue;
        buf.resize(std::min<uint64_t>(rec.streams[s].size, 1 << 20));
        for (uint64_t left = rec.streams[s].size; left > 0;) {
          const uint64_t n = std::min<uint64_t>(left, buf.size());
          if (!(*c)->read(buf.data(), n)) break;
          left -= n;
        }
      }
    }
  }
  std::remove(path.c_str());
  return 0;
}

int tensor_file(const uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  static const char* kExt[] = {".npy", ".npz", ".safetensors", ".h5"};
  const std::string path = scratch(data + 1, size - 1, kExt[data[0] % 4]);
  auto r = open_tensor_file(path, {});
  if (r) {
    std::vector<std::byte> buf;
    for (std::size_t i = 0; i < (*r)->tensors().size(); ++i) {
      const TensorInfo& t = (*r)->tensors()[i];
      auto bytes = t.byte_size();
      if (!bytes || *bytes > (uint64_t{64} << 20)) continue;
      buf.resize(*bytes);
      auto src = (*r)->open(i);
      if (src) (void)(*src)->read(0, *t.numel(), buf.data());
    }
  }
  std::remove(path.c_str());
  return 0;
}

}  // namespace gcz::fuzz

#ifdef GCZ_LIBFUZZER_GCZ
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) { return gcz::fuzz::gcz_file(data, size); }
#endif
#ifdef GCZ_LIBFUZZER_TENSOR
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  return gcz::fuzz::tensor_file(data, size);
}
#endif
