// Raw binary files: one tensor's elements, little-endian, C order, no header. The dtype and shape come
// from the caller, so the file size is the only thing that can be checked, and it must match exactly.
#include <filesystem>

#include "file_kind.h"
#include "tensor_io_common.h"

namespace gcz::detail {
namespace {

class RawReader final : public ReaderBase {
 public:
  RawReader(const std::string& path, std::shared_ptr<const MappedFile> file, TensorInfo info, uint64_t numel)
      : ReaderBase(path, TensorFileFormat::kRaw), file_(std::move(file)), numel_(numel) {
    tensors_.push_back(std::move(info));
  }

  Result<std::unique_ptr<TensorSource>> open(std::size_t i) override {
    GCZ_RETURN_IF_ERROR(check_index(i));
    ElementLayout layout;
    layout.item_size = dtype_size(tensors_[i].dtype);
    return std::unique_ptr<TensorSource>(new MappedTensorSource(file_, tensors_[i], numel_, 0, layout));
  }

 private:
  std::shared_ptr<const MappedFile> file_;
  uint64_t numel_;
};


}  // namespace

Result<std::unique_ptr<TensorFileReader>> open_raw_reader(const std::string& path, const ReadOptions& options) {
  if (!options.raw_dtype || !options.raw_shape) {
    return invalid_argument(path + ": raw binary input needs both an element dtype and a shape" +
                            tensor_input_note(sniff_file_kind(path), FileKind::kUnknown));
  }
  TensorInfo info{std::filesystem::path(path).stem().string(), *options.raw_dtype, *options.raw_shape};
  auto numel = info.numel();
  if (!numel) return invalid_argument(path + ": raw shape: " + numel.status().message());
  GCZ_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> mapped, MappedFile::open(path));
  const uint64_t needed = *numel * dtype_size(info.dtype);  // numel <= 2^48: no overflow
  if (mapped->size() != needed) {
    return format_error(path + ": raw file is " + std::to_string(mapped->size()) + " bytes, but shape " +
                        shape_to_string(info.shape) + " of " + std::string(dtype_name(info.dtype)) + " needs exactly " +
                        std::to_string(needed));
  }
  return std::unique_ptr<TensorFileReader>(new RawReader(path, std::move(mapped), std::move(info), *numel));
}

WriterResult create_raw_writer(const std::string& path, const std::vector<TensorInfo>& tensors, const WriteOptions&) {
  GCZ_RETURN_IF_ERROR(check_single_tensor(path, tensors, "raw binary"));
  GCZ_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFile> file, AtomicFile::create(path));
  return std::unique_ptr<TensorFileWriter>(new ContiguousWriter(path, tensors, /*widen_bf16=*/false, std::move(file)));
}

}  // namespace gcz::detail
