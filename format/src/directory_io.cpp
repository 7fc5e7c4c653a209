// Directories of tensor files. Reading lists every file with a known extension, recursively, sorted by
// path; a tensor is named by the file's relative path without extension, joined with '/' to the name
// inside a container. Writing puts one .npy per tensor into a temporary sibling directory that is
// renamed into place by finish().
#include <algorithm>
#include <filesystem>
#include <set>

#include "gcz/detail/utf8.h"
#include "tensor_io_common.h"

namespace gcz::detail {
namespace {

namespace fs = std::filesystem;

constexpr const char* kKnownFileTypes = ".npy .npz .safetensors .h5 .hdf5 (.bin .raw with a dtype and shape)";

struct DirEntryFile {
  std::string path;      // as opened
  std::string relative;  // '/'-separated, relative to the directory
  std::string stem;      // relative path without extension
  TensorFileFormat format = TensorFileFormat::kNpy;
  std::string skip_reason;  // set for files that are not read
};

// Where a directory tensor comes from: file `file`, tensor `index` of that file's reader.
struct DirTensor {
  std::size_t file;
  std::size_t index;
  std::string inner_name;  // the name inside that file
};

Result<std::unique_ptr<TensorFileReader>> open_member_file(const DirEntryFile& f, const ReadOptions& options) {
  switch (f.format) {
    case TensorFileFormat::kNpy: return open_npy_reader(f.path, /*in_container=*/true);
    case TensorFileFormat::kNpz: return open_npz_reader(f.path);
    case TensorFileFormat::kSafetensors: return open_safetensors_reader(f.path);
    case TensorFileFormat::kHdf5: return open_hdf5_reader(f.path);
    case TensorFileFormat::kRaw: return open_raw_reader(f.path, options);
    case TensorFileFormat::kDirectory: break;
  }
  return internal_error(f.path + ": a directory inside a directory listing");
}

bool holds_one_tensor(TensorFileFormat f) { return f == TensorFileFormat::kNpy || f == TensorFileFormat::kRaw; }

// A member file's source under the directory-level name.
class RenamedSource final : public TensorSource {
 public:
  RenamedSource(std::unique_ptr<TensorSource> inner, TensorInfo info)
      : inner_(std::move(inner)), info_(std::move(info)) {}
  const TensorInfo& info() const override { return info_; }
  Status read(uint64_t first, uint64_t count, void* dst) override { return inner_->read(first, count, dst); }
  void release(uint64_t end) override { inner_->release(end); }

 private:
  std::unique_ptr<TensorSource> inner_;
  TensorInfo info_;
};

class DirectoryReader final : public ReaderBase {
 public:
  DirectoryReader(const std::string& path, const ReadOptions& options)
      : ReaderBase(path, TensorFileFormat::kDirectory), options_(options) {}

  Status list();

  Result<std::unique_ptr<TensorSource>> open(std::size_t i) override {
    GCZ_RETURN_IF_ERROR(check_index(i));
    const DirTensor& where = origins_[i];
    // Consecutive tensors usually come from the same file: keep its reader open between calls.
    if (!current_ || current_file_ != where.file) {
      current_.reset();
      GCZ_ASSIGN_OR_RETURN(current_, open_member_file(files_[where.file], options_));
      current_file_ = where.file;
    }
    const auto& inner = current_->tensors();
    if (where.index >= inner.size() || inner[where.index].name != where.inner_name ||
        inner[where.index].dtype != tensors_[i].dtype || inner[where.index].shape != tensors_[i].shape) {
      return format_error(files_[where.file].path + ": the file changed while the directory was being read");
    }
    GCZ_ASSIGN_OR_RETURN(std::unique_ptr<TensorSource> source, current_->open(where.index));
    return std::unique_ptr<TensorSource>(new RenamedSource(std::move(source), tensors_[i]));
  }

 private:
  Status collect_files();
  Status add_file(std::size_t file_index);

  ReadOptions options_;
  std::vector<DirEntryFile> files_;  // every regular file, sorted by path
  std::vector<DirTensor> origins_;   // parallel to tensors_
  std::unique_ptr<TensorFileReader> current_;
  std::size_t current_file_ = 0;
};

Status DirectoryReader::collect_files() {
  std::error_code ec;
  const fs::path root(path_);
  std::vector<fs::path> found;
  for (fs::recursive_directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_regular_file(ec)) found.push_back(it->path());
  }
  if (ec) return io_error(path_ + ": cannot list the directory: " + ec.message());
  std::sort(found.begin(), found.end());
  const bool have_raw_layout = options_.raw_dtype && options_.raw_shape;
  for (const fs::path& p : found) {
    const fs::path rel = p.lexically_relative(root);
    DirEntryFile f;
    f.path = p.string();
    f.relative = rel.generic_string();
    f.stem = fs::path(rel).replace_extension().generic_string();
    const auto format = tensor_format_from_path(p.string());
    if (!format || *format == TensorFileFormat::kDirectory) {
      f.skip_reason = std::string("not a tensor file; known: ") + kKnownFileTypes;
    } else if (*format == TensorFileFormat::kRaw && !have_raw_layout) {
      f.skip_reason = "raw binary needs an element dtype and a shape";
    } else {
      f.format = *format;
    }
    files_.push_back(std::move(f));
  }
  return Status::ok();
}

Status DirectoryReader::add_file(std::size_t file_index) {
  const DirEntryFile& f = files_[file_index];
  GCZ_ASSIGN_OR_RETURN(std::unique_ptr<TensorFileReader> reader, open_member_file(f, options_));
  auto full_name = [&](const std::string& inner) { return holds_one_tensor(f.format) ? f.stem : f.stem + "/" + inner; };
  for (std::size_t j = 0; j < reader->tensors().size(); ++j) {
    TensorInfo t = reader->tensors()[j];
    origins_.push_back({file_index, j, t.name});
    t.name = full_name(t.name);
    tensors_.push_back(std::move(t));
  }
  for (const SkippedTensor& s : reader->skipped()) skipped_.push_back({full_name(s.name), s.reason});
  return Status::ok();
}

Status DirectoryReader::list() {
  GCZ_RETURN_IF_ERROR(collect_files());
  for (std::size_t i = 0; i < files_.size(); ++i) {
    if (files_[i].skip_reason.empty()) {
      GCZ_RETURN_IF_ERROR(add_file(i));
    } else {
      skipped_.push_back({files_[i].relative, files_[i].skip_reason});
    }
  }
  std::set<std::string> names;
  for (const TensorInfo& t : tensors_) {
    if (!names.insert(t.name).second) {
      return format_error(tensor_context(path_, t.name) + ": two files in the directory give this name");
    }
  }
  return Status::ok();
}

class DirectoryWriter final : public SequentialWriter {
 public:
  DirectoryWriter(const std::string& path, const std::vector<TensorInfo>& tensors, const WriteOptions& options,
                  std::unique_ptr<TempPath> temp)
      // bfloat16 passes through unchanged: the per-tensor .npy writer widens it.
      : SequentialWriter(path, tensors, /*widen_bf16=*/false), options_(options), temp_(std::move(temp)) {}

 protected:
  Status start_tensor(std::size_t index, const TensorInfo& stored) override {
    const fs::path file = fs::path(temp_->path()) / (stored.name + ".npy");
    std::error_code ec;
    fs::create_directories(file.parent_path(), ec);
    if (ec) return io_error(tensor_context(path(), stored.name) + ": cannot create its directory: " + ec.message());
    GCZ_ASSIGN_OR_RETURN(inner_, create_npy_writer(file.string(), {input_tensors()[index]}, options_,
                                                   /*durable=*/false));
    return inner_->begin(0);
  }
  Status write_elements(const void* src, uint64_t count) override { return inner_->write(src, count); }
  Status end_tensor() override {
    GCZ_RETURN_IF_ERROR(inner_->end());
    GCZ_RETURN_IF_ERROR(inner_->finish());
    inner_.reset();
    return Status::ok();
  }
  Status finish_file() override { return temp_->commit(); }

 private:
  WriteOptions options_;
  std::unique_ptr<TempPath> temp_;
  std::unique_ptr<TensorFileWriter> inner_;  // declared last: closed before temp_ removes the directory
};

// The output directory may not exist yet, or may exist empty; anything else would be merged into.
Status check_output_directory(const std::string& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) return Status::ok();
  if (!fs::is_directory(st)) return invalid_argument(path + ": exists and is not a directory");
  if (!fs::is_empty(path, ec) || ec) {
    return invalid_argument(path + ": the output directory exists and is not empty; remove it or choose another");
  }
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<TensorFileReader>> open_directory_reader(const std::string& path, const ReadOptions& options) {
  auto reader = std::make_unique<DirectoryReader>(path, options);
  GCZ_RETURN_IF_ERROR(reader->list());
  return std::unique_ptr<TensorFileReader>(std::move(reader));
}

WriterResult create_directory_writer(const std::string& path, const std::vector<TensorInfo>& tensors,
                                     const WriteOptions& options) {
  GCZ_RETURN_IF_ERROR(check_bf16_storable(path, tensors, options, "a directory of .npy files"));
  for (const TensorInfo& t : tensors) {
    GCZ_RETURN_IF_ERROR(check_path_like_name(path, t.name));
    // Each part of a name becomes a directory's name, or the last a file's, with ".npy" and a
    // temporary suffix (".tmp-PID-N", up to 23 bytes): 255 bytes at most on common file systems.
    constexpr std::size_t kMostName = 255, kMostFile = kMostName - 4 - 23;
    for (std::size_t begin = 0, end; begin < t.name.size(); begin = end + 1) {
      end = std::min(t.name.find('/', begin), t.name.size());
      const bool file = end == t.name.size();
      if (end - begin > (file ? kMostFile : kMostName)) {
        return invalid_argument(
            path + ": tensor '" + std::string(utf8_prefix(t.name, 64)) + "...': a part of its name has " +
            std::to_string(end - begin) + " bytes, more than the " + std::to_string(file ? kMostFile : kMostName) +
            " a " + (file ? "file" : "directory") + " name can take here (.safetensors, .npz and .h5 keep long names)");
      }
    }
  }
  GCZ_RETURN_IF_ERROR(check_output_directory(path));
  auto temp = std::make_unique<TempPath>(path);
  std::error_code ec;
  if (!fs::create_directory(temp->path(), ec) || ec) {
    return io_error(path + ": cannot create the temporary directory " + temp->path() + ": " +
                    (ec ? ec.message() : "it already exists"));
  }
  return std::unique_ptr<TensorFileWriter>(new DirectoryWriter(path, tensors, options, std::move(temp)));
}

}  // namespace gcz::detail
