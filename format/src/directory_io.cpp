// Directories of tensor files. Reading lists every file with a known extension, recursively, sorted by
// path; a tensor is named by the file's relative path without extension, joined with '/' to the name
// inside a container. The shards of a sharded safetensors checkpoint, which a NAME.safetensors.index.json
// lists in its "weight_map" (tensor name -> shard file), are one model: their tensors are named by the
// index's directory and their own names. An index given as the input reads its shards alone, the same
// way. Writing puts one .npy per tensor into a temporary sibling directory that is renamed into place by
// finish().
#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "file_util.h"
#include "gcz/detail/utf8.h"
#include "json_shape.h"
#include "tensor_io_common.h"

namespace gcz::detail {
namespace {

namespace fs = std::filesystem;

constexpr const char* kKnownFileTypes = ".npy .npz .safetensors .h5 .hdf5 (.bin .raw with a dtype and shape)";
constexpr std::string_view kShardIndexSuffix = ".safetensors.index.json";
constexpr uint64_t kMaxShardIndexBytes = uint64_t{100} << 20;

struct DirEntryFile {
  std::string path;      // as opened
  std::string relative;  // '/'-separated, relative to the directory
  std::string stem;      // relative path without extension
  TensorFileFormat format = TensorFileFormat::kNpy;
  std::string skip_reason;           // set for files that are not read
  bool shard_index = false;          // a NAME.safetensors.index.json, read for its weight_map
  std::optional<std::size_t> shard;  // the index (in indexes_) that lists this file as a shard
};

}  // namespace

bool is_shard_index_path(const std::string& path) {
  const std::string name = fs::path(path).filename().string();
  return name.size() > kShardIndexSuffix.size() && name.ends_with(kShardIndexSuffix);
}

namespace {

// A shard index's "weight_map": (tensor name, shard file name relative to the index), by tensor name.
using WeightMap = std::vector<std::pair<std::string, std::string>>;

Result<WeightMap> read_weight_map(const std::string& path) {
  using json = nlohmann::json;
  GCZ_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> file, MappedFile::open(path));
  if (file->size() > kMaxShardIndexBytes) {
    return format_error(path + ": a shard index of " + std::to_string(file->size()) +
                        " bytes exceeds the 100 MiB limit");
  }
  const char* text = reinterpret_cast<const char*>(file->data());
  JsonShape shape("the shard index", 64);
  if (!json::sax_parse(text, text + file->size(), &shape) || !shape.problem().empty()) {
    return format_error(path + ": " +
                        (shape.syntax_error().empty() ? shape.problem() : "not valid JSON: " + shape.syntax_error()));
  }
  const json doc = json::parse(text, text + file->size(), nullptr, /*allow_exceptions=*/false);
  const auto map = doc.is_object() ? doc.find("weight_map") : doc.end();
  if (map == doc.end() || !map->is_object()) {
    return format_error(path + ": a shard index needs a \"weight_map\" object (tensor name: shard file name)");
  }
  WeightMap out;
  for (auto it = map->begin(); it != map->end(); ++it) {
    if (!it->is_string()) {
      return format_error(tensor_context(path, it.key()) + ": the weight_map value is not a file name (a string)");
    }
    out.emplace_back(it.key(), it->get<std::string>());
  }
  return out;
}

// A shard's path relative to the directory read, from its name in the index at `index_relative`;
// empty for a name that is not a relative path within the index's directory (or holds a NUL, which
// would end the path at the file system).
std::string shard_relative(const std::string& index_relative, const std::string& shard) {
  if (shard.empty() || shard.find('\0') != std::string::npos || fs::path(shard).has_root_path()) return {};
  const fs::path within = fs::path(shard).lexically_normal();
  if (within == ".." || within.begin()->string() == ".." || within.filename().empty()) return {};
  return (fs::path(index_relative).parent_path() / within).lexically_normal().generic_string();
}

// Whether `relative` (a file's path under `root`) goes through a symbolic link to a directory, which a
// directory's listing does not follow.
bool through_linked_directory(const fs::path& root, const std::string& relative) {
  fs::path at = root;
  const fs::path rel(relative);
  for (auto part = rel.begin(); part != rel.end() && std::next(part) != rel.end(); ++part) {
    at /= *part;
    std::error_code ec;
    if (fs::is_symlink(at, ec)) return true;
  }
  return false;
}

// A NAME.safetensors.index.json: which shard file holds each tensor of the model.
struct ShardIndex {
  std::string path;    // as opened
  std::string prefix;  // its directory relative to the directory read, '/'-terminated, or empty
  std::map<std::string, std::string> weight_map;  // tensor name -> shard, relative to the directory read
  std::set<std::string> found;                    // the names its shards hold
};

// Where a directory tensor comes from: file `file`, tensor `index` of that file's reader.
struct DirTensor {
  std::size_t file;
  std::size_t index;
  std::string inner_name;  // the name inside that file
};

Result<std::unique_ptr<TensorFileReader>> open_member_file(const DirEntryFile& f, const ReadOptions& options) {
  switch (f.format) {
    case TensorFileFormat::kNpy:
      return open_npy_reader(f.path);
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
  const std::byte* view(uint64_t first, uint64_t count) override { return inner_->view(first, count); }
  void release(uint64_t end) override { inner_->release(end); }
  Status check_unchanged() const override { return inner_->check_unchanged(); }

 private:
  std::unique_ptr<TensorSource> inner_;
  TensorInfo info_;
};

class DirectoryReader final : public ReaderBase {
 public:
  DirectoryReader(const std::string& path, const ReadOptions& options)
      : ReaderBase(path, TensorFileFormat::kDirectory), options_(options) {}

  // Lists the directory `path_`, or with `index_only`, the shards of the shard index `path_`.
  Status list(bool index_only);

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
  Status collect_index_files();
  DirEntryFile entry(const fs::path& root, const fs::path& file) const;
  Status add_shard_indexes(const std::map<std::size_t, WeightMap>& weight_maps);
  Status check_shard_name(const DirEntryFile& f, const std::string& inner);
  Status check_shards_complete() const;
  Status add_file(std::size_t file_index);

  ReadOptions options_;
  std::vector<DirEntryFile> files_;  // every regular file, sorted by path
  std::vector<ShardIndex> indexes_;
  std::vector<DirTensor> origins_;   // parallel to tensors_
  std::unique_ptr<TensorFileReader> current_;
  std::size_t current_file_ = 0;
};

Status DirectoryReader::collect_files() {
  std::error_code ec;
  const fs::path root(path_);
  std::vector<fs::path> found;
  std::vector<std::pair<fs::path, std::string>> unreadable;  // noted as skipped, not passed over in silence
  for (fs::recursive_directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code kind;
    const fs::file_status status = it->status(kind);
    if (fs::is_regular_file(status)) {
      found.push_back(it->path());
    } else if (fs::is_directory(status)) {
      // Listed in turn; a link to one is not followed (it could loop, or reach outside the input).
      if (it->is_symlink(kind)) unreadable.emplace_back(it->path(), "a symbolic link to a directory (not followed)");
    } else if (it->is_symlink(kind) && !fs::exists(status)) {
      unreadable.emplace_back(it->path(), "a symbolic link to nothing");
    } else {
      unreadable.emplace_back(it->path(), "not a regular file (a pipe, device or socket)");
    }
  }
  if (ec) return io_error(path_ + ": cannot list the directory: " + ec.message());
  std::sort(found.begin(), found.end());
  std::sort(unreadable.begin(), unreadable.end());
  for (const fs::path& p : found) files_.push_back(entry(root, p));
  for (const auto& [p, why] : unreadable) skipped_.push_back({p.lexically_relative(root).generic_string(), why});
  std::map<std::size_t, WeightMap> weight_maps;  // read before any is applied: an index may mark a later file
  for (std::size_t i = 0; i < files_.size(); ++i) {
    if (files_[i].shard_index) {
      GCZ_ASSIGN_OR_RETURN(weight_maps[i], read_weight_map(files_[i].path));
    }
  }
  return add_shard_indexes(weight_maps);
}

// The index `path_` and the files its weight_map names that exist, as a directory's listing rooted at
// the index's directory.
Status DirectoryReader::collect_index_files() {
  const fs::path root = directory_of(path_);
  GCZ_ASSIGN_OR_RETURN(WeightMap weight_map, read_weight_map(path_));
  std::set<std::string> shards;  // what the directory's listing would hold of them
  for (const auto& [name, shard] : weight_map) {
    const std::string relative = shard_relative(fs::path(path_).filename().string(), shard);
    std::error_code ec;
    if (!relative.empty() && fs::is_regular_file(root / relative, ec) && !through_linked_directory(root, relative)) {
      shards.insert(relative);
    }
  }
  for (const std::string& relative : shards) files_.push_back(entry(root, root / relative));
  files_.push_back(entry(root, path_));
  std::sort(files_.begin(), files_.end(),
            [](const DirEntryFile& a, const DirEntryFile& b) { return fs::path(a.path) < fs::path(b.path); });
  const auto index = std::find_if(files_.begin(), files_.end(), [&](const DirEntryFile& f) { return f.path == path_; });
  return add_shard_indexes({{static_cast<std::size_t>(index - files_.begin()), std::move(weight_map)}});
}

DirEntryFile DirectoryReader::entry(const fs::path& root, const fs::path& file) const {
  const fs::path rel = file.lexically_relative(root);
  DirEntryFile f;
  f.path = file.string();
  f.relative = rel.generic_string();
  f.stem = fs::path(rel).replace_extension().generic_string();
  const auto format = tensor_format_from_path(f.path);
  if (is_shard_index_path(f.path)) {
    f.shard_index = true;
  } else if (!format || *format == TensorFileFormat::kDirectory) {
    f.skip_reason = std::string("not a tensor file; known: ") + kKnownFileTypes;
  } else if (*format == TensorFileFormat::kRaw && !(options_.raw_dtype && options_.raw_shape)) {
    f.skip_reason = "raw binary needs an element dtype and a shape";
  } else {
    f.format = *format;
  }
  return f;
}

// Marks the shards each shard index (the listing's file at the key) names; each must be a .safetensors
// file of the listing, named by at most one index.
Status DirectoryReader::add_shard_indexes(const std::map<std::size_t, WeightMap>& weight_maps) {
  std::map<std::string, std::size_t> by_relative;
  for (std::size_t i = 0; i < files_.size(); ++i) by_relative.emplace(files_[i].relative, i);
  for (const auto& [file_index, weight_map] : weight_maps) {
    const DirEntryFile& f = files_[file_index];
    ShardIndex index;
    index.path = f.path;
    const fs::path dir = fs::path(f.relative).parent_path();
    index.prefix = dir.empty() ? std::string() : dir.generic_string() + "/";
    for (const auto& [name, shard] : weight_map) {
      const std::string ctx = tensor_context(f.path, name) + ": the weight_map names shard '" + shard + "'";
      const std::string relative = shard_relative(f.relative, shard);
      if (relative.empty()) return format_error(ctx + ", which is not a relative path within the index's directory");
      const auto found = by_relative.find(relative);
      if (found == by_relative.end()) {
        return format_error(ctx + ", which is not a file there (symbolic links to directories are not followed)");
      }
      DirEntryFile& target = files_[found->second];
      if (target.format != TensorFileFormat::kSafetensors || !target.skip_reason.empty() || target.shard_index) {
        return format_error(ctx + ", which is not a .safetensors file");
      }
      if (target.shard && *target.shard != indexes_.size()) {
        return format_error(target.path + ": two shard indexes name this shard: " + indexes_[*target.shard].path +
                            " and " + f.path);
      }
      target.shard = indexes_.size();
      index.weight_map.emplace(name, target.relative);
    }
    indexes_.push_back(std::move(index));
  }
  return Status::ok();
}

// A tensor (or skipped tensor) of a shard must be one its index maps to that shard.
Status DirectoryReader::check_shard_name(const DirEntryFile& f, const std::string& inner) {
  ShardIndex& index = indexes_[*f.shard];
  const auto it = index.weight_map.find(inner);
  if (it == index.weight_map.end()) {
    return format_error(tensor_context(f.path, inner) + ": not in the weight_map of " + index.path);
  }
  if (it->second != f.relative) {
    return format_error(tensor_context(f.path, inner) + ": the weight_map of " + index.path + " puts it in '" +
                        it->second + "'");
  }
  index.found.insert(inner);
  return Status::ok();
}

// Every tensor an index maps must be in its shard.
Status DirectoryReader::check_shards_complete() const {
  for (const ShardIndex& index : indexes_) {
    if (index.found.size() == index.weight_map.size()) continue;
    for (const auto& [name, shard] : index.weight_map) {
      if (index.found.count(name) == 0) {
        return format_error(tensor_context(index.path, name) + ": its shard '" + shard + "' does not hold it");
      }
    }
  }
  return Status::ok();
}

Status DirectoryReader::add_file(std::size_t file_index) {
  const DirEntryFile& f = files_[file_index];
  GCZ_ASSIGN_OR_RETURN(std::unique_ptr<TensorFileReader> reader, open_member_file(f, options_));
  auto full_name = [&](const std::string& inner) {
    return f.shard ? indexes_[*f.shard].prefix + inner : holds_one_tensor(f.format) ? f.stem : f.stem + "/" + inner;
  };
  for (std::size_t j = 0; j < reader->tensors().size(); ++j) {
    TensorInfo t = reader->tensors()[j];
    if (f.shard) GCZ_RETURN_IF_ERROR(check_shard_name(f, t.name));
    origins_.push_back({file_index, j, t.name});
    t.name = full_name(t.name);
    tensors_.push_back(std::move(t));
  }
  for (const SkippedTensor& s : reader->skipped()) {
    if (f.shard) GCZ_RETURN_IF_ERROR(check_shard_name(f, s.name));
    skipped_.push_back({full_name(s.name), s.reason});
  }
  for (const auto& [key, value] : reader->metadata()) metadata_.emplace(key, value);  // the first file's wins
  return Status::ok();
}

Status DirectoryReader::list(bool index_only) {
  GCZ_RETURN_IF_ERROR(index_only ? collect_index_files() : collect_files());
  for (std::size_t i = 0; i < files_.size(); ++i) {
    if (files_[i].shard_index) continue;
    if (files_[i].skip_reason.empty()) {
      GCZ_RETURN_IF_ERROR(add_file(i));
    } else {
      skipped_.push_back({files_[i].relative, files_[i].skip_reason});
    }
  }
  GCZ_RETURN_IF_ERROR(check_shards_complete());
  std::map<std::string, std::size_t> names;  // name -> its file
  for (std::size_t i = 0; i < tensors_.size(); ++i) {
    const auto [it, added] = names.emplace(tensors_[i].name, origins_[i].file);
    if (!added) {
      return format_error(tensor_context(path_, tensors_[i].name) + ": two files in the directory give this name: " +
                          files_[it->second].relative + " and " + files_[origins_[i].file].relative);
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
  // "out/" is "out", whose status a file named so would hide behind ENOTDIR
  const std::string trimmed = without_trailing_slashes(path);
  const std::string last = fs::path(trimmed).filename().string();
  if (last.empty() || last == "." || last == "..") {
    // A temporary directory is renamed into place: not over one named by '.' or '..', nor over '/'.
    return invalid_argument(path + ": the output directory needs a name of its own (e.g. restored/), not '" +
                            (last.empty() ? trimmed : last) + "'");
  }
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(trimmed, ec);
  if (!fs::exists(st)) return Status::ok();
  if (fs::is_symlink(st)) {
    return invalid_argument(path + ": exists and is a symbolic link; the output directory is made anew and " +
                            "renamed into place, not through a link");
  }
  if (!fs::is_directory(st)) return invalid_argument(path + ": exists and is not a directory");
  if (!fs::is_empty(path, ec) || ec) {
    return invalid_argument(path + ": the output directory exists and is not empty; remove it or choose another");
  }
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<TensorFileReader>> open_directory_reader(const std::string& path, const ReadOptions& options) {
  auto reader = std::make_unique<DirectoryReader>(path, options);
  GCZ_RETURN_IF_ERROR(reader->list(/*index_only=*/false));
  return std::unique_ptr<TensorFileReader>(std::move(reader));
}

Result<std::unique_ptr<TensorFileReader>> open_shard_index_reader(const std::string& path, const ReadOptions& options) {
  auto reader = std::make_unique<DirectoryReader>(path, options);
  GCZ_RETURN_IF_ERROR(reader->list(/*index_only=*/true));
  return std::unique_ptr<TensorFileReader>(std::move(reader));
}

WriterResult create_directory_writer(const std::string& path, const std::vector<TensorInfo>& tensors,
                                     const WriteOptions& options) {
  GCZ_RETURN_IF_ERROR(check_bf16_storable(path, tensors, options, "a directory of .npy files"));
  // Each part of a name becomes a directory's name, or the last a file's, with ".npy" and a temporary
  // suffix (".tmp-PID-N", up to kTempSuffixBytes): kMostNameBytes at most. The whole path, the
  // temporary directory's (PATH and its suffix), a slash, the name and ".npy", must fit kMostPathBytes.
  constexpr std::size_t kMostFile = kMostNameBytes - 4 - kTempSuffixBytes;
  std::set<std::string> directories;  // every directory the names make, "a" and "a/b" for "a/b/c"
  for (const TensorInfo& t : tensors) {
    GCZ_RETURN_IF_ERROR(check_path_like_name(path, t.name));
    const std::string shown = path + ": tensor '" + std::string(utf8_prefix(t.name, 64)) + "...': ";
    for (std::size_t begin = 0, end; begin < t.name.size(); begin = end + 1) {
      end = std::min(t.name.find('/', begin), t.name.size());
      const bool file = end == t.name.size();
      if (end - begin > (file ? kMostFile : kMostNameBytes)) {
        return invalid_argument(shown + "a part of its name has " + std::to_string(end - begin) +
                                " bytes, more than the " + std::to_string(file ? kMostFile : kMostNameBytes) + " a " +
                                (file ? "file" : "directory") +
                                " name can take here (.safetensors, .npz and .h5 keep long names)");
      }
      if (!file) directories.insert(t.name.substr(0, end));
    }
    const std::size_t length = path.size() + kTempSuffixBytes + 1 + t.name.size() + 4;
    if (length > kMostPathBytes) {
      return invalid_argument(shown + "its file's path would be up to " + std::to_string(length) +
                              " bytes, more than the " + std::to_string(kMostPathBytes) +
                              " a path can take here; choose a shorter output path, or .safetensors, .npz or .h5");
    }
  }
  // A name's file, NAME.npy, may not be another name's directory ("x" and "x.npy/y").
  for (const TensorInfo& t : tensors) {
    if (directories.count(t.name + ".npy") != 0) {
      return invalid_argument(path + ": tensor '" + t.name + "': its file " + t.name +
                              ".npy would be a directory that another tensor's name makes; a directory output "
                              "cannot hold both (.safetensors, .npz and .h5 can)");
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
