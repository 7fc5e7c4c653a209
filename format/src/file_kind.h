// What a file's first bytes say it is, for the message about a file read as something else: a .gcz
// given to encode, a .npy given to decode, a PyTorch checkpoint named .bin or .safetensors.
//
//   FileKind k = sniff_file_kind(path);
//   return format_error(path + ": not a zip archive" + tensor_input_note(k, FileKind::kNpz));
#pragma once

#include <cstddef>
#include <string>

namespace gcz::detail {

enum class FileKind { kUnknown, kGcz, kNpy, kNpz, kZip, kTorch, kPickle, kSafetensors, kHdf5 };

// From the first bytes: the magic numbers, and a zip's first member name.
FileKind sniff_file_kind(const std::byte* data, std::size_t size);
// From the file's first 4 KiB; kUnknown where it cannot be read.
FileKind sniff_file_kind(const std::string& path);

// "; it is a .gcz file: gcz decode, info and verify read it", for a message about a file read as a
// tensor input; empty for kUnknown and for `expected`, the kind the reader took it for.
std::string tensor_input_note(FileKind kind, FileKind expected);
// The same for a file read as a .gcz ("; it is a .npy file: gcz encode and eval read it").
std::string gcz_input_note(FileKind kind);

}  // namespace gcz::detail
