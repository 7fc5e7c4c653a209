// HDF5 output: one dataset per tensor, created with its full shape when the writer is created (so name
// clashes such as "a" and "a/b" fail before any data is written), groups made for '/'-separated names,
// and elements written as hyperslabs as write() delivers them. float16 is stored as an IEEE half type.
#include "hdf5_io_util.h"
#include "tensor_io_common.h"

namespace gcz::detail {
namespace {

Result<H5Id> make_dataspace(const Shape& shape) {
  if (shape.empty()) return H5Id(H5Screate(H5S_SCALAR));
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  H5Id space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr));
  if (!space.valid()) return internal_error("cannot create an HDF5 dataspace: " + hdf5_error_text());
  return space;
}

class Hdf5Writer final : public SequentialWriter {
 public:
  Hdf5Writer(const std::string& path, const std::vector<TensorInfo>& tensors, bool widen,
             std::unique_ptr<TempPath> temp, H5Id file)
      : SequentialWriter(path, tensors, widen), temp_(std::move(temp)), file_(std::move(file)) {}

  // Creates every dataset up front, each with the dtype it will be stored in.
  Status create_datasets(bool widen) {
    H5Id lcpl(H5Pcreate(H5P_LINK_CREATE));
    H5Id dcpl(H5Pcreate(H5P_DATASET_CREATE));
    // Names are UTF-8 (gcz's rule): the links say so, for the tools that go by their character set.
    if (!lcpl.valid() || !dcpl.valid() || H5Pset_create_intermediate_group(lcpl.get(), 1) < 0 ||
        H5Pset_char_encoding(lcpl.get(), H5T_CSET_UTF8) < 0 ||
        H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER) < 0) {  // every element gets written
      return internal_error(path() + ": cannot set up HDF5 property lists: " + hdf5_error_text());
    }
    for (const TensorInfo& t : input_tensors()) {
      // The groups of its path first, with UTF-8 links too (intermediate groups HDF5 makes on its own
      // get ASCII ones); a part that is already a dataset fails below, at the dataset.
      for (std::size_t slash = t.name.find('/'); slash != std::string::npos; slash = t.name.find('/', slash + 1)) {
        const std::string group = t.name.substr(0, slash);
        if (H5Lexists(file_.get(), group.c_str(), H5P_DEFAULT) > 0) continue;
        H5Id made(H5Gcreate2(file_.get(), group.c_str(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT));
      }
      const TensorInfo stored = stored_info(t, widen);
      H5Id type = hdf5_float_type(stored.dtype);
      GCZ_ASSIGN_OR_RETURN(H5Id space, make_dataspace(stored.shape));
      H5Id dataset(
          H5Dcreate2(file_.get(), t.name.c_str(), type.get(), space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT));
      if (!dataset.valid()) {
        return invalid_argument(tensor_context(path(), t.name) + ": cannot create the HDF5 dataset (" +
                                hdf5_error_text() + "); does another tensor's name use it as a group?");
      }
      datasets_.push_back(std::move(dataset));
    }
    return Status::ok();
  }

 protected:
  Status start_tensor(std::size_t index, const TensorInfo& stored) override {
    index_ = index;
    shape_ = stored.shape;
    offset_ = 0;
    mem_type_ = hdf5_float_type(stored.dtype);
    if (!mem_type_.valid()) return internal_error(path() + ": cannot build the HDF5 memory type");
    return Status::ok();
  }

  Status write_elements(const void* src, uint64_t count) override {
    if (count == 0) return Status::ok();
    quiet_hdf5_errors();
    const hid_t dataset = datasets_[index_].get();
    if (shape_.empty()) {
      if (H5Dwrite(dataset, mem_type_.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, src) < 0) return write_failed();
    } else {
      // const_cast: a write only reads the buffer.
      GCZ_RETURN_IF_ERROR(transfer_flat_range(dataset, mem_type_.get(), shape_, offset_, count, const_cast<void*>(src),
                                              /*write=*/true, [this] { return write_failed(); }));
    }
    offset_ += count;
    return Status::ok();
  }

  Status end_tensor() override {
    datasets_[index_].reset();
    return Status::ok();
  }

  Status finish_file() override {
    quiet_hdf5_errors();
    datasets_.clear();
    const herr_t r = H5Fclose(file_.release());
    if (r < 0) return io_error(path() + ": cannot finish the HDF5 file: " + hdf5_error_text());
    return temp_->commit();
  }

 private:
  Status write_failed() const {
    return io_error(tensor_context(path(), input_tensors()[index_].name) + ": HDF5 write failed: " + hdf5_error_text());
  }

  // Declared first so it is destroyed last: the file must be closed before its temporary is removed.
  std::unique_ptr<TempPath> temp_;
  H5Id file_;
  std::vector<H5Id> datasets_;
  std::size_t index_ = 0;
  Shape shape_;
  uint64_t offset_ = 0;  // elements of the current tensor written so far
  H5Id mem_type_;
};

}  // namespace

WriterResult create_hdf5_writer(const std::string& path, const std::vector<TensorInfo>& tensors,
                                const WriteOptions& options) {
  GCZ_RETURN_IF_ERROR(check_bf16_storable(path, tensors, options, "HDF5"));
  for (const TensorInfo& t : tensors) GCZ_RETURN_IF_ERROR(check_path_like_name(path, t.name));
  quiet_hdf5_errors();
  auto temp = std::make_unique<TempPath>(path);
  H5Id file(H5Fcreate(temp->path().c_str(), H5F_ACC_EXCL, H5P_DEFAULT, H5P_DEFAULT));
  if (!file.valid()) return io_error(path + ": cannot create: " + hdf5_error_text());
  auto writer = std::make_unique<Hdf5Writer>(path, tensors, options.widen_bf16, std::move(temp), std::move(file));
  GCZ_RETURN_IF_ERROR(writer->create_datasets(options.widen_bf16));
  return std::unique_ptr<TensorFileWriter>(std::move(writer));
}

}  // namespace gcz::detail
