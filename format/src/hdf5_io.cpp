// HDF5 input: every floating dataset in the file, in nested groups too, named by its path without the
// leading '/'. Element ranges are read with hyperslab selections, so only the requested part of a
// dataset is ever in memory; HDF5 converts big-endian or differently ordered storage on the way.
#include <algorithm>

#include "hdf5_io_util.h"
#include "tensor_io_common.h"

namespace gcz::detail {
namespace {

#if H5_VERSION_GE(1, 12, 0)
using ObjectInfo = H5O_info2_t;
using LinkInfo = H5L_info2_t;
#else
using ObjectInfo = H5O_info_t;
using LinkInfo = H5L_info_t;
#endif

herr_t collect_dataset(hid_t, const char* name, const ObjectInfo* info, void* data) {
  if (info->type == H5O_TYPE_DATASET) static_cast<std::vector<std::string>*>(data)->push_back(name);
  return 0;
}

Status list_datasets(hid_t file, const std::string& path, std::vector<std::string>& names) {
#if H5_VERSION_GE(1, 12, 0)
  const herr_t r = H5Ovisit3(file, H5_INDEX_NAME, H5_ITER_INC, collect_dataset, &names, H5O_INFO_BASIC);
#else
  const herr_t r = H5Ovisit2(file, H5_INDEX_NAME, H5_ITER_INC, collect_dataset, &names, H5O_INFO_BASIC);
#endif
  if (r < 0) return hdf5_read_error(path + ": cannot list the HDF5 objects");
  std::sort(names.begin(), names.end());
  return Status::ok();
}

herr_t collect_link(hid_t, const char* name, const LinkInfo* info, void* data) {
  auto* skipped = static_cast<std::vector<SkippedTensor>*>(data);
  if (info->type == H5L_TYPE_SOFT) {
    skipped->push_back({name, "a soft link: gcz reads each dataset once, under its own path, not through links"});
  } else if (info->type == H5L_TYPE_EXTERNAL) {
    skipped->push_back({name, "an external link to another file, which gcz does not follow"});
  } else if (info->type != H5L_TYPE_HARD) {
    skipped->push_back({name, "a user-defined link, which gcz does not follow"});
  }
  return 0;
}

// The links that are not hard links (H5Ovisit goes through hard links only), noted as skipped. Only
// notes: a file whose links cannot all be listed is still read.
void list_other_links(hid_t file, std::vector<SkippedTensor>& skipped) {
#if H5_VERSION_GE(1, 12, 0)
  (void)H5Lvisit2(file, H5_INDEX_NAME, H5_ITER_INC, collect_link, &skipped);
#else
  (void)H5Lvisit(file, H5_INDEX_NAME, H5_ITER_INC, collect_link, &skipped);
#endif
}

const char* class_name(H5T_class_t c) {
  switch (c) {
    case H5T_INTEGER: return "integer";
    case H5T_TIME: return "time";
    case H5T_STRING: return "string";
    case H5T_BITFIELD: return "bitfield";
    case H5T_OPAQUE: return "opaque";
    case H5T_COMPOUND: return "compound";
    case H5T_REFERENCE: return "reference";
    case H5T_ENUM: return "enum";
    case H5T_VLEN: return "variable-length";
    case H5T_ARRAY: return "array";
    default: return "unknown";
  }
}

// The tensor a dataset holds, or (with `reason` set) why it is skipped.
struct DatasetInfo {
  TensorInfo info;
  uint64_t numel = 0;
  std::string reason;
};

Result<Shape> dataset_shape(hid_t dataset, const std::string& ctx, std::string& reason) {
  H5Id space(H5Dget_space(dataset));
  if (!space.valid()) return hdf5_read_error(ctx + ": cannot read the dataspace");
  const H5S_class_t kind = H5Sget_simple_extent_type(space.get());
  if (kind == H5S_SCALAR) return Shape{};
  if (kind != H5S_SIMPLE) {
    reason = "the dataset has a null dataspace (no elements, no shape)";
    return Shape{};
  }
  const int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank < 0 || static_cast<std::size_t>(rank) > kMaxRank) {
    return format_error(ctx + ": the dataspace has " + std::to_string(rank) + " dimensions (at most " +
                        std::to_string(kMaxRank) + ")");
  }
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank)), most(dims.size());
  if (H5Sget_simple_extent_dims(space.get(), dims.data(), most.data()) < 0) {
    return hdf5_read_error(ctx + ": cannot read the dataspace");
  }
  // A damaged dataspace can claim dimensions past its own maxima, which HDF5 1.10 reads regardless.
  for (std::size_t k = 0; k < dims.size(); ++k) {
    if (most[k] != H5S_UNLIMITED && dims[k] > most[k]) {
      return format_error(ctx + ": dimension " + std::to_string(k) + " of the dataspace is " + std::to_string(dims[k]) +
                          ", past its maximum " + std::to_string(most[k]));
    }
  }
  return Shape(dims.begin(), dims.end());
}

Result<DatasetInfo> describe_dataset(hid_t file, const std::string& path, const std::string& name) {
  const std::string ctx = tensor_context(path, name);
  H5Id dataset(H5Dopen2(file, name.c_str(), H5P_DEFAULT));
  if (!dataset.valid()) return hdf5_read_error(ctx + ": cannot open the dataset");
  H5Id type(H5Dget_type(dataset.get()));
  if (!type.valid()) return hdf5_read_error(ctx + ": cannot read the datatype");
  DatasetInfo d;
  d.info.name = name;
  // Data kept outside this file would have gcz read whatever files a hostile .h5 names.
  H5Id create(H5Dget_create_plist(dataset.get()));
  if (!create.valid()) return hdf5_read_error(ctx + ": cannot read the dataset's properties");
  if (H5Pget_external_count(create.get()) > 0) {
    d.reason = "its data is in files outside this one (HDF5 external storage), which gcz does not read";
    return d;
  }
  if (H5Pget_layout(create.get()) == H5D_VIRTUAL) {
    d.reason = "a virtual dataset (its data is mapped from other datasets or files), which gcz does not read";
    return d;
  }
  const H5T_class_t cls = H5Tget_class(type.get());
  if (cls != H5T_FLOAT) {
    d.reason = std::string("HDF5 ") + class_name(cls) + " dataset is not floating";
    return d;
  }
  const auto dtype = dtype_of_hdf5_float(type.get());
  if (!dtype) {
    d.reason = "HDF5 float of " + std::to_string(H5Tget_size(type.get())) +
               " bytes has a layout other than IEEE float16/32/64 or bfloat16";
    return d;
  }
  d.info.dtype = *dtype;
  GCZ_ASSIGN_OR_RETURN(d.info.shape, dataset_shape(dataset.get(), ctx, d.reason));
  auto numel = checked_numel(d.info.shape);
  if (!numel) return format_error(ctx + ": " + numel.status().message());
  d.numel = *numel;
  // Chunks never written read as the fill value: a few hundred bytes can claim terabytes. Like a
  // deflated .npz member (at most about 1032 to 1), a dataset may hold at most 1024 times what it
  // stores, past 1 GiB.
  const double claimed = static_cast<double>(d.numel) * static_cast<double>(H5Tget_size(type.get()));
  const double stored = static_cast<double>(H5Dget_storage_size(dataset.get()));
  if (claimed > std::max(0x1p30, 1024.0 * stored)) {
    return unsupported(ctx + ": the dataset claims " + std::to_string(static_cast<uint64_t>(claimed)) +
                       " bytes but stores " + std::to_string(static_cast<uint64_t>(stored)) +
                       " (chunks never written read as its fill value); gcz reads at most 1024 times what a "
                       "dataset stores, past 1 GiB");
  }
  return d;
}

class Hdf5Source final : public TensorSource {
 public:
  Hdf5Source(std::string path, TensorInfo info, uint64_t numel, H5Id dataset, H5Id mem_type, FileVersion opened)
      : path_(std::move(path)),
        info_(std::move(info)),
        numel_(numel),
        dataset_(std::move(dataset)),
        mem_type_(std::move(mem_type)),
        opened_(opened) {}
  const TensorInfo& info() const override { return info_; }
  // HDF5 reads through the file it opened, so a file renamed over the path leaves it whole.
  Status check_unchanged() const override { return check_input_unchanged(path_, opened_); }

  Status read(uint64_t first, uint64_t count, void* dst) override {
    GCZ_RETURN_IF_ERROR(check_read_range(path_, info_, numel_, first, count));
    if (count == 0) return Status::ok();
    quiet_hdf5_errors();
    if (info_.shape.empty()) {
      if (H5Dread(dataset_.get(), mem_type_.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, dst) < 0) return read_failed();
      return Status::ok();
    }
    return transfer_flat_range(dataset_.get(), mem_type_.get(), info_.shape, first, count, dst, /*write=*/false,
                               [this] { return read_failed(); });
  }

 private:
  Status read_failed() const { return hdf5_read_error(tensor_context(path_, info_.name) + ": HDF5 read failed"); }

  std::string path_;
  TensorInfo info_;
  uint64_t numel_;
  H5Id dataset_;  // keeps the file open while the source lives
  H5Id mem_type_;
  FileVersion opened_;
};

class Hdf5Reader final : public ReaderBase {
 public:
  Hdf5Reader(const std::string& path, H5Id file, FileVersion opened)
      : ReaderBase(path, TensorFileFormat::kHdf5), file_(std::move(file)), opened_(opened) {}

  Status list() {
    std::vector<std::string> names;
    GCZ_RETURN_IF_ERROR(list_datasets(file_.get(), path_, names));
    list_other_links(file_.get(), skipped_);
    for (const std::string& name : names) {
      GCZ_ASSIGN_OR_RETURN(DatasetInfo d, describe_dataset(file_.get(), path_, name));
      if (!d.reason.empty()) {
        skipped_.push_back({name, d.reason});
        continue;
      }
      tensors_.push_back(d.info);
      numels_.push_back(d.numel);
    }
    return Status::ok();
  }

  Result<std::unique_ptr<TensorSource>> open(std::size_t i) override {
    GCZ_RETURN_IF_ERROR(check_index(i));
    quiet_hdf5_errors();
    const TensorInfo& t = tensors_[i];
    H5Id dataset(H5Dopen2(file_.get(), t.name.c_str(), H5P_DEFAULT));
    if (!dataset.valid()) {
      return hdf5_read_error(tensor_context(path_, t.name) + ": cannot open the dataset");
    }
    H5Id mem_type = hdf5_float_type(t.dtype);
    if (!mem_type.valid()) return internal_error(path_ + ": cannot build the HDF5 memory type: " + hdf5_error_text());
    return std::unique_ptr<TensorSource>(
        new Hdf5Source(path_, t, numels_[i], std::move(dataset), std::move(mem_type), opened_));
  }

 private:
  H5Id file_;
  FileVersion opened_;  // the file as it was before H5Fopen read any of it
  std::vector<uint64_t> numels_;
};

}  // namespace

Result<std::unique_ptr<TensorFileReader>> open_hdf5_reader(const std::string& path) {
  GCZ_RETURN_IF_ERROR(check_readable(path));
  // Before HDF5 reads a byte: a change in place from here on shows in the check after the reads.
  GCZ_ASSIGN_OR_RETURN(const FileVersion opened, FileVersion::of(path));
  quiet_hdf5_errors();
  if (H5Fis_hdf5(path.c_str()) <= 0) return format_error(path + ": not an HDF5 file (no HDF5 signature)");
  H5Id file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  if (!file.valid()) return hdf5_read_error(path + ": cannot open as HDF5");
  auto reader = std::make_unique<Hdf5Reader>(path, std::move(file), opened);
  GCZ_RETURN_IF_ERROR(reader->list());
  return std::unique_ptr<TensorFileReader>(std::move(reader));
}

}  // namespace gcz::detail
