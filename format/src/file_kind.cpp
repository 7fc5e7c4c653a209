#include "file_kind.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>

namespace gcz::detail {
namespace {

bool starts_with(const std::byte* data, std::size_t size, const char* magic, std::size_t n) {
  return size >= n && std::memcmp(data, magic, n) == 0;
}

bool ends_with(const std::string& s, const std::string& end) {
  return s.size() >= end.size() && s.compare(s.size() - end.size(), end.size(), end) == 0;
}

uint64_t le(const std::byte* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

std::string kind_name(FileKind kind) {
  switch (kind) {
    case FileKind::kGcz:
      return "a .gcz file";
    case FileKind::kNpy:
      return "a .npy file";
    case FileKind::kNpz:
      return "an .npz archive";
    case FileKind::kZip:
      return "a zip archive";
    case FileKind::kTorch:
      return "a PyTorch checkpoint (torch.save)";
    case FileKind::kPickle:
      return "a Python pickle (an older torch.save checkpoint?)";
    case FileKind::kSafetensors:
      return "a safetensors file";
    case FileKind::kHdf5:
      return "an HDF5 file";
    case FileKind::kUnknown:
      break;
  }
  return "";
}

const char* kTorchHint =
    ", which gcz does not read: write the gradients with safetensors.torch.save_file (README, 'What it reads and "
    "writes')";

}  // namespace

FileKind sniff_file_kind(const std::byte* data, std::size_t size) {
  if (starts_with(data, size, "\x89GCZ\r\n\x1a\n", 8)) return FileKind::kGcz;
  if (starts_with(data, size, "\x93NUMPY", 6)) return FileKind::kNpy;
  if (starts_with(data, size, "\x89HDF\r\n\x1a\n", 8)) return FileKind::kHdf5;
  if (starts_with(data, size, "PK\x03\x04", 4)) {
    // The first member's name: torch.save's archive starts with NAME/data.pkl, numpy's with NAME.npy.
    if (size < 30) return FileKind::kZip;
    const std::size_t n = le(data + 26, 2);
    const std::string name(reinterpret_cast<const char*>(data) + 30, std::min(n, size - 30));
    if (name.size() == n && (name == "data.pkl" || ends_with(name, "/data.pkl"))) return FileKind::kTorch;
    if (name.size() == n && ends_with(name, ".npy")) return FileKind::kNpz;
    return FileKind::kZip;
  }
  if (size >= 2 && static_cast<uint8_t>(data[0]) == 0x80 && static_cast<uint8_t>(data[1]) >= 2 &&
      static_cast<uint8_t>(data[1]) <= 5) {
    return FileKind::kPickle;
  }
  if (size >= 10 && le(data, 8) >= 2 && static_cast<char>(data[8]) == '{') return FileKind::kSafetensors;
  return FileKind::kUnknown;
}

FileKind sniff_file_kind(const std::string& path) {
  char head[4096];
  std::ifstream f(path, std::ios::binary);
  if (!f) return FileKind::kUnknown;
  f.read(head, sizeof head);
  return sniff_file_kind(reinterpret_cast<const std::byte*>(head), static_cast<std::size_t>(f.gcount()));
}

std::string tensor_input_note(FileKind kind, FileKind expected) {
  if (kind == FileKind::kUnknown || kind == expected) return "";
  const std::string it = "; it is " + kind_name(kind);
  switch (kind) {
    case FileKind::kGcz:
      return it + ": gcz decode, info and verify read it";
    case FileKind::kTorch:
    case FileKind::kPickle:
      return it + kTorchHint;
    case FileKind::kZip:
      return it + " (gcz reads .npz archives of .npy members)";
    case FileKind::kNpy:
      return it + ": name it NAME.npy";
    case FileKind::kNpz:
      return it + ": name it NAME.npz";
    case FileKind::kSafetensors:
      return it + ": name it NAME.safetensors";
    case FileKind::kHdf5:
      return it + ": name it NAME.h5";
    case FileKind::kUnknown:
      break;
  }
  return "";
}

std::string gcz_input_note(FileKind kind) {
  if (kind == FileKind::kUnknown || kind == FileKind::kGcz) return "";
  const std::string it = "; it is " + kind_name(kind);
  if (kind == FileKind::kTorch || kind == FileKind::kPickle) return it + kTorchHint;
  if (kind == FileKind::kZip) return it;
  return it + ": gcz encode and gcz eval read it";
}

}  // namespace gcz::detail
