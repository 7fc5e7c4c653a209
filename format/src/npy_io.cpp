// .npy files: one array per file, read through a memory map, written through an AtomicFile.
#include <filesystem>

#include "file_kind.h"
#include "tensor_io_common.h"

namespace gcz::detail {
namespace {

class NpyReader final : public ReaderBase {
 public:
  NpyReader(const std::string& path, std::shared_ptr<const MappedFile> file, NpyHeader header)
      : ReaderBase(path, TensorFileFormat::kNpy), file_(std::move(file)), header_(std::move(header)) {}

  void add(TensorInfo info) { tensors_.push_back(std::move(info)); }
  void skip(SkippedTensor s) { skipped_.push_back(std::move(s)); }

  Result<std::unique_ptr<TensorSource>> open(std::size_t i) override {
    GCZ_RETURN_IF_ERROR(check_index(i));
    return std::unique_ptr<TensorSource>(
        new MappedTensorSource(file_, tensors_[i], header_.numel, header_.data_offset, header_.layout()));
  }

 private:
  std::shared_ptr<const MappedFile> file_;
  NpyHeader header_;
};


}  // namespace

Result<std::unique_ptr<TensorFileReader>> open_npy_reader(const std::string& path) {
  GCZ_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> mapped, MappedFile::open(path));
  std::shared_ptr<const MappedFile> file = std::move(mapped);
  auto parsed = parse_npy_header(file->data(), file->size());
  if (!parsed) {
    const std::string other = tensor_input_note(sniff_file_kind(file->data(), file->size()), FileKind::kNpy);
    return Status(parsed.status().code(), path + ": " + parsed.status().message() + other);
  }
  NpyHeader header = std::move(parsed).value();
  const std::string name = std::filesystem::path(path).stem().string();

  auto reader = std::make_unique<NpyReader>(path, file, header);
  if (!header.dtype) {
    // Reported as skipped, as a member of an .npz is: `gcz encode dump/*.npy` goes on past a step
    // counter, and an input of nothing else is refused for holding no floating-point tensor.
    reader->skip({name, header.not_float_reason});
    return std::unique_ptr<TensorFileReader>(std::move(reader));
  }
  const uint64_t available = file->size() - header.data_offset;
  if (available < header.payload_bytes) {
    return format_error(path + ": npy payload truncated: " + std::to_string(available) +
                        " bytes after the header, "
                        "but shape " +
                        shape_to_string(header.shape) + " of " + header.descr + " needs " +
                        std::to_string(header.payload_bytes));
  }
  reader->add(TensorInfo{name, *header.dtype, header.shape});
  return std::unique_ptr<TensorFileReader>(std::move(reader));
}

WriterResult create_npy_writer(const std::string& path, const std::vector<TensorInfo>& tensors,
                               const WriteOptions& options, bool durable) {
  GCZ_RETURN_IF_ERROR(check_single_tensor(path, tensors, ".npy"));
  GCZ_RETURN_IF_ERROR(check_bf16_storable(path, tensors, options, ".npy"));
  GCZ_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFile> file, AtomicFile::create(path, durable));
  return std::unique_ptr<TensorFileWriter>(new ContiguousWriter(path, tensors, options.widen_bf16, std::move(file),
                           [](const TensorInfo& t) { return make_npy_header(t.dtype, t.shape); }));
}

}  // namespace gcz::detail
