#include "tensor_io_common.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>

#include "gcz/convert.h"

namespace gcz::detail {

// --- messages and argument checks ---------------------------------------------------------------------

std::string tensor_context(const std::string& path, const std::string& name) {
  return path + ": tensor '" + name + "'";
}

Status check_readable(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return io_error(path + ": cannot open: " + std::strerror(errno));
  ::close(fd);
  return Status::ok();
}

Status check_read_range(const std::string& path, const TensorInfo& info, uint64_t numel, uint64_t first,
                        uint64_t count) {
  const auto end = checked_add(first, count);
  if (!end || *end > numel) {
    return invalid_argument(tensor_context(path, info.name) + ": read of " + std::to_string(count) + " elements from " +
                            std::to_string(first) + " runs past its " + std::to_string(numel) + " elements");
  }
  return Status::ok();
}

Status check_tensor_list(const std::string& path, const std::vector<TensorInfo>& tensors) {
  std::set<std::string> names;
  for (const TensorInfo& t : tensors) {
    if (t.name.empty()) return invalid_argument(path + ": a tensor has an empty name");
    if (!names.insert(t.name).second) return invalid_argument(tensor_context(path, t.name) + ": duplicate name");
    auto n = t.numel();
    if (!n) return invalid_argument(tensor_context(path, t.name) + ": " + n.status().message());
  }
  return Status::ok();
}

Status check_single_tensor(const std::string& path, const std::vector<TensorInfo>& tensors, const char* format_name) {
  if (tensors.size() != 1) {
    return invalid_argument(path + ": " + format_name + " holds exactly one tensor, but " +
                            std::to_string(tensors.size()) +
                            " were given; write .npz, .safetensors, HDF5 or "
                            "a directory instead, or decode one (gcz decode -t NAME)");
  }
  return Status::ok();
}

Status check_bf16_storable(const std::string& path, const std::vector<TensorInfo>& tensors, const WriteOptions& options,
                           const char* holder) {
  if (options.widen_bf16) return Status::ok();
  for (const TensorInfo& t : tensors) {
    if (t.dtype == DType::kBFloat16) {
      return unsupported(tensor_context(path, t.name) + " is bfloat16, which " + holder +
                         " cannot hold; pass --widen to write float32, or write .safetensors");
    }
  }
  return Status::ok();
}

TensorInfo stored_info(const TensorInfo& info, bool widen_bf16) {
  TensorInfo s = info;
  if (widen_bf16 && s.dtype == DType::kBFloat16) s.dtype = DType::kFloat32;
  return s;
}

Status check_path_like_name(const std::string& path, const std::string& name) {
  if (name.find('\0') != std::string::npos) {  // the system, zip and HDF5 would all end the name there
    return invalid_argument(tensor_context(path, name) +
                            ": a name with a NUL character cannot become a path in the output (.safetensors keeps it)");
  }
  if (!name.empty() && name.front() == '/') {
    return invalid_argument(tensor_context(path, name) + ": an absolute name cannot become a path in the output");
  }
  std::size_t begin = 0;
  while (begin <= name.size()) {
    std::size_t end = name.find('/', begin);
    if (end == std::string::npos) end = name.size();
    const std::string_view part(name.data() + begin, end - begin);
    if (part.empty() || part == "." || part == "..") {
      return invalid_argument(tensor_context(path, name) +
                              ": a name with an empty, '.' or '..' component cannot become a path in the output");
    }
    begin = end + 1;
  }
  return Status::ok();
}

// --- readers --------------------------------------------------------------------------------------------

Status ReaderBase::check_index(std::size_t i) const {
  if (i >= tensors_.size()) {
    return invalid_argument(path_ + ": tensor index " + std::to_string(i) + " out of range (" +
                            std::to_string(tensors_.size()) + " tensors)");
  }
  return Status::ok();
}

MappedTensorSource::MappedTensorSource(std::shared_ptr<const MappedFile> file, TensorInfo info, uint64_t numel,
                                       uint64_t payload_offset, ElementLayout layout)
    : file_(std::move(file)),
      info_(std::move(info)),
      numel_(numel),
      payload_offset_(payload_offset),
      layout_(std::move(layout)) {}

MappedTensorSource::~MappedTensorSource() { release(numel_); }

Status MappedTensorSource::read(uint64_t first, uint64_t count, void* dst) {
  GCZ_RETURN_IF_ERROR(check_read_range(file_->path(), info_, numel_, first, count));
  copy_elements(layout_, file_->data() + payload_offset_, first, count, dst);
  return Status::ok();
}

const std::byte* MappedTensorSource::view(uint64_t first, uint64_t count) {
  const std::size_t esize = dtype_size(info_.dtype);
  if (count == 0 || layout_.byte_swapped || layout_.fortran_order || layout_.item_size != esize) return nullptr;
  if (!check_read_range(file_->path(), info_, numel_, first, count).is_ok()) return nullptr;
  const std::byte* p = file_->data() + payload_offset_ + first * esize;
  return reinterpret_cast<uintptr_t>(p) % esize == 0 ? p : nullptr;
}

void MappedTensorSource::release(uint64_t end) {
  // A Fortran-order payload is read out of order, so no prefix of it is done with.
  if (layout_.fortran_order && end < numel_) return;
  end = std::min(end, numel_);
  file_->release(payload_offset_, payload_offset_ + end * layout_.item_size);
}

// --- writers --------------------------------------------------------------------------------------------

namespace {
constexpr uint64_t kWidenChunk = uint64_t{1} << 16;  // elements converted per step when widening
}  // namespace

SequentialWriter::SequentialWriter(std::string path, std::vector<TensorInfo> tensors, bool widen_bf16)
    : path_(std::move(path)), tensors_(std::move(tensors)), widen_bf16_(widen_bf16) {}

Status SequentialWriter::fail(Status s) {
  if (!s.is_ok() && failure_.is_ok()) failure_ = s;
  return s;
}

Status SequentialWriter::check_usable() const {
  if (!failure_.is_ok()) return failure_;
  if (finished_) return invalid_argument(path_ + ": the writer has already finished");
  return Status::ok();
}

Status SequentialWriter::begin(std::size_t index) {
  GCZ_RETURN_IF_ERROR(check_usable());
  if (in_tensor_) {
    return invalid_argument(tensor_context(path_, tensors_[next_ - 1].name) + ": begin() before end()");
  }
  if (index != next_ || index >= tensors_.size()) {
    return invalid_argument(path_ + ": tensors must be written in order: expected tensor " + std::to_string(next_) +
                            ", got " + std::to_string(index));
  }
  const TensorInfo& t = tensors_[index];
  numel_ = t.numel().value();  // checked by check_tensor_list at creation
  written_ = 0;
  in_tensor_ = true;
  ++next_;
  return fail(start_tensor(index, stored_info(t, widen_bf16_)));
}

Status SequentialWriter::write(const void* src, uint64_t count) {
  GCZ_RETURN_IF_ERROR(check_usable());
  if (!in_tensor_) return invalid_argument(path_ + ": write() outside begin()/end()");
  const TensorInfo& t = tensors_[next_ - 1];
  if (count > numel_ - written_) {
    return invalid_argument(tensor_context(path_, t.name) + ": " + std::to_string(written_ + count) +
                            " elements written, but the shape holds " + std::to_string(numel_));
  }
  written_ += count;
  if (!(widen_bf16_ && t.dtype == DType::kBFloat16)) return fail(write_elements(src, count));
  widen_buf_.resize(std::min(count, kWidenChunk));
  const auto* in = static_cast<const uint16_t*>(src);
  for (uint64_t done = 0; done < count;) {
    const uint64_t n = std::min(count - done, kWidenChunk);
    convert_elements(DType::kBFloat16, in + done, DType::kFloat32, widen_buf_.data(), n);
    GCZ_RETURN_IF_ERROR(fail(write_elements(widen_buf_.data(), n)));
    done += n;
  }
  return Status::ok();
}

Status SequentialWriter::end() {
  GCZ_RETURN_IF_ERROR(check_usable());
  if (!in_tensor_) return invalid_argument(path_ + ": end() without begin()");
  const TensorInfo& t = tensors_[next_ - 1];
  if (written_ != numel_) {
    return fail(invalid_argument(tensor_context(path_, t.name) + ": only " + std::to_string(written_) + " of " +
                                 std::to_string(numel_) + " elements were written"));
  }
  in_tensor_ = false;
  return fail(end_tensor());
}

Status SequentialWriter::finish() {
  GCZ_RETURN_IF_ERROR(check_usable());
  if (in_tensor_ || next_ != tensors_.size()) {
    return fail(invalid_argument(path_ + ": finish() after " + std::to_string(next_ - (in_tensor_ ? 1 : 0)) + " of " +
                                 std::to_string(tensors_.size()) + " tensors"));
  }
  GCZ_RETURN_IF_ERROR(fail(finish_file()));
  finished_ = true;
  return Status::ok();
}

// --- temporary paths ------------------------------------------------------------------------------------

TempPath::TempPath(std::string target) : target_(std::move(target)), tmp_(make_temp_path(target_)) {}

TempPath::~TempPath() {
  if (committed_) return;
  std::error_code ec;
  std::filesystem::remove_all(tmp_, ec);  // nothing to report from a destructor; best effort
  forget_temp_path(tmp_);
}

Status TempPath::commit() {
  const std::string dest = without_trailing_slashes(target_);
  // A single file (.npz, .h5) is flushed before it replaces anything; a directory's files are not.
  std::error_code ec;
  if (std::filesystem::is_regular_file(tmp_, ec)) sync_file(tmp_);
  if (const int err = rename_temp_path(tmp_, dest); err != 0) {
    if (err == ENOTEMPTY || err == EEXIST) {
      return io_error(dest + ": cannot rename into place: the directory exists and is not empty");
    }
    return io_error(dest + ": cannot rename into place: " + std::strerror(err));
  }
  committed_ = true;
  return Status::ok();
}

}  // namespace gcz::detail
