// Output paths checked before any work: the output is not a directory, link, pipe or device, its
// directory exists and can be written, and an encode's -o and --ef-state are .gcz names of files of
// their own. (Writing them is file_util.cpp's.)
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "file_util.h"
#include "gcz/codec_spec.h"
#include "gcz/pipeline.h"
#include "gcz/tensor_io.h"

namespace gcz {
namespace detail {

Status check_output_spelling(const std::string& path) {
  if (path == "-") {
    return invalid_argument(
        "-: gcz writes its outputs to named files (a temporary one renamed into place), not to standard output; "
        "give a file name");
  }
  return Status::ok();
}

Status check_output_file(const std::string& path) {
  if (path.empty()) return invalid_argument("no output path given");
  GCZ_RETURN_IF_ERROR(check_output_spelling(path));
  if (path.find('\0') != std::string::npos) {  // the system would end it there, at another file's name
    return invalid_argument(path.substr(0, path.find('\0')) + "...: a path cannot hold a NUL character");
  }
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode)) return Status::ok();
  const char* what = S_ISDIR(st.st_mode)    ? "a directory"
                     : S_ISLNK(st.st_mode)  ? "a symbolic link"
                     : S_ISFIFO(st.st_mode) ? "a pipe"
                     : S_ISSOCK(st.st_mode) ? "a socket"
                                            : "a device";
  return invalid_argument(path + ": the output exists and is " + what +
                          "; gcz writes its outputs to a temporary file and renames it over a regular file only");
}

Status check_output_parent(const std::string& path) {
  const std::string trimmed = without_trailing_slashes(path);  // a directory output's own name
  const std::size_t name = std::filesystem::path(trimmed).filename().string().size();
  if (name + kTempSuffixBytes > kMostNameBytes || trimmed.size() + kTempSuffixBytes > kMostPathBytes) {
    const bool whole = name + kTempSuffixBytes <= kMostNameBytes;
    return invalid_argument(path + ": a " + (whole ? "path" : "name") + " of " +
                            std::to_string(whole ? trimmed.size() : name) +
                            " bytes; the output is written under "
                            "its name and a temporary suffix of up to " +
                            std::to_string(kTempSuffixBytes) + " bytes, so at most " +
                            std::to_string((whole ? kMostPathBytes : kMostNameBytes) - kTempSuffixBytes) + " fit");
  }
  const std::filesystem::path dir = directory_of(trimmed);
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    const bool exists = std::filesystem::exists(dir, ec);
    return io_error(path + ": " + dir.string() + (exists ? " is not a directory" : ": no such directory"));
  }
  // The output is created there under a temporary name, then renamed: both need the directory
  // writable (for this process's effective user), which the writer would otherwise find out at its end.
  if (::faccessat(AT_FDCWD, dir.c_str(), W_OK | X_OK, AT_EACCESS) != 0) {
    return io_error(path + ": cannot write in the directory " + dir.string() + ": " + std::strerror(errno));
  }
  return Status::ok();
}

}  // namespace detail

Status check_output_path(const std::string& path) {
  GCZ_RETURN_IF_ERROR(detail::check_output_file(path));
  return detail::check_output_parent(path);
}

namespace {

// A .gcz file under a tensor format's extension would be read as that format, and fail.
Status check_gcz_output_name(const std::string& path) {
  if (!path.empty() && path.back() == '/') {
    return invalid_argument(path + ": a name ending in '/' is a directory's, and a .gcz is a file: name it NAME.gcz");
  }
  const auto format = tensor_format_from_path(path);
  if (!format || *format == TensorFileFormat::kDirectory) return Status::ok();
  const std::string ext = std::filesystem::path(path).extension().string();
  return invalid_argument(path + ": '" + ext +
                          "' is the extension of a tensor file format, but gcz encode writes a "
                          ".gcz file: name it NAME.gcz (gcz decode writes " +
                          ext + " files)");
}

}  // namespace

Status check_encode_outputs(const std::vector<std::string>& inputs, const std::string& output,
                            const std::string& ef_state, const std::string& ef_codec) {
  GCZ_RETURN_IF_ERROR(check_output_path(output).with_context("-o"));
  GCZ_RETURN_IF_ERROR(check_gcz_output_name(output).with_context("-o"));
  if (ef_state.empty()) return Status::ok();
  GCZ_RETURN_IF_ERROR(check_output_path(ef_state).with_context("--ef-state"));
  GCZ_RETURN_IF_ERROR(check_gcz_output_name(ef_state).with_context("--ef-state"));
  if (detail::same_file(output, ef_state)) {
    return invalid_argument("-o and --ef-state name the same file, " + output + "; the state needs a file of its own");
  }
  for (const std::string& input : inputs) {
    if (detail::same_file(input, ef_state)) {
      return invalid_argument("--ef-state names an input, " + input +
                              "; the state is a file of its own, not a gradient");
    }
  }
  return check_encoding_plan(ef_codec).status().with_context("--ef-codec");
}

}  // namespace gcz
