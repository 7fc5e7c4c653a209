// Entry points of tensor file I/O: picks the format from the path and hands over to its module.
#include "gcz/tensor_io.h"

#include <sys/stat.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "file_kind.h"
#include "tensor_io_common.h"

namespace gcz {
namespace {

constexpr const char* kKnownExtensions = ".npy .npz .safetensors .h5 .hdf5 .bin .raw, or a directory";

std::string lower_extension(const std::string& path) {
  std::string ext = std::filesystem::path(path).extension().string();
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ext;
}

// What a path of no known extension may be instead: raw bytes when read, a directory when written.
Status unknown_extension(const std::string& path, bool writing) {
  const std::string ext = lower_extension(path);
  const std::string unknown = path + ": unknown tensor file extension " + (ext.empty() ? "(none)" : "'" + ext + "'");
  // A file of a kind gcz knows (a .gcz, a PyTorch checkpoint) is named as such, not as raw bytes.
  const std::string note =
      writing ? std::string() : detail::tensor_input_note(detail::sniff_file_kind(path), detail::FileKind::kUnknown);
  if (!note.empty()) return unsupported(unknown + note);
  return unsupported(unknown + "; known: " + kKnownExtensions +
                     (writing ? " (a path ending in '/')" : ", and any file as raw bytes given --dtype and --shape"));
}

}  // namespace

const char* tensor_file_format_name(TensorFileFormat f) {
  switch (f) {
    case TensorFileFormat::kNpy: return "npy";
    case TensorFileFormat::kNpz: return "npz";
    case TensorFileFormat::kSafetensors: return "safetensors";
    case TensorFileFormat::kHdf5: return "hdf5";
    case TensorFileFormat::kRaw: return "raw";
    case TensorFileFormat::kDirectory: return "directory";
  }
  return "unknown";
}

std::optional<TensorFileFormat> tensor_format_from_path(const std::string& path) {
  if (!path.empty() && path.back() == '/') return TensorFileFormat::kDirectory;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return TensorFileFormat::kDirectory;
  const std::string ext = lower_extension(path);
  if (ext == ".npy") return TensorFileFormat::kNpy;
  if (ext == ".npz") return TensorFileFormat::kNpz;
  if (ext == ".safetensors") return TensorFileFormat::kSafetensors;
  if (ext == ".h5" || ext == ".hdf5") return TensorFileFormat::kHdf5;
  if (ext == ".bin" || ext == ".raw") return TensorFileFormat::kRaw;
  return std::nullopt;
}

Result<std::unique_ptr<TensorFileReader>> open_tensor_file(const std::string& path, const ReadOptions& options) {
  if (path.empty()) return invalid_argument("no input path given");
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return io_error(path + ": cannot open: " + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) return detail::open_directory_reader(path, options);
  if (!S_ISREG(st.st_mode)) {  // checked before anything opens it: opening a pipe waits for a writer
    return detail::not_a_regular_file(path);
  }
  if (detail::is_shard_index_path(path)) return detail::open_shard_index_reader(path, options);
  // A dtype and shape given by the caller mean "these are raw bytes" for a file that is not of a known
  // tensor format (.bin, .raw, or any other extension); .npy .npz .safetensors .h5 are read as such.
  const auto format = tensor_format_from_path(path);
  if ((options.raw_dtype || options.raw_shape) && (!format || *format == TensorFileFormat::kRaw)) {
    return detail::open_raw_reader(path, options);
  }
  if (!format) return unknown_extension(path, false);
  switch (*format) {
    case TensorFileFormat::kNpy:
      return detail::open_npy_reader(path);
    case TensorFileFormat::kNpz: return detail::open_npz_reader(path);
    case TensorFileFormat::kSafetensors: return detail::open_safetensors_reader(path);
    case TensorFileFormat::kHdf5: return detail::open_hdf5_reader(path);
    case TensorFileFormat::kRaw: return detail::open_raw_reader(path, options);
    case TensorFileFormat::kDirectory: return detail::open_directory_reader(path, options);
  }
  return internal_error(path + ": unhandled tensor file format");
}

Result<std::unique_ptr<TensorFileWriter>> create_tensor_file(const std::string& path,
                                                             const std::vector<TensorInfo>& tensors,
                                                             const WriteOptions& options) {
  if (path.empty()) return invalid_argument("no output path given");
  GCZ_RETURN_IF_ERROR(detail::check_output_spelling(path));
  GCZ_RETURN_IF_ERROR(detail::check_tensor_list(path, tensors));
  const auto format = tensor_format_from_path(path);
  if (!format) return unknown_extension(path, true);
  if (*format != TensorFileFormat::kDirectory) GCZ_RETURN_IF_ERROR(detail::check_output_file(path));
  GCZ_RETURN_IF_ERROR(detail::check_output_parent(path));
  switch (*format) {
    case TensorFileFormat::kNpy: return detail::create_npy_writer(path, tensors, options);
    case TensorFileFormat::kNpz: return detail::create_npz_writer(path, tensors, options);
    case TensorFileFormat::kSafetensors: return detail::create_safetensors_writer(path, tensors, options);
    case TensorFileFormat::kHdf5: return detail::create_hdf5_writer(path, tensors, options);
    case TensorFileFormat::kRaw: return detail::create_raw_writer(path, tensors, options);
    case TensorFileFormat::kDirectory: return detail::create_directory_writer(path, tensors, options);
  }
  return internal_error(path + ": unhandled tensor file format");
}

}  // namespace gcz
