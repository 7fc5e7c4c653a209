# Tensor file I/O: .npy .npz .safetensors HDF5 raw binary and directories (see gcz/tensor_io.h).
target_sources(gcz PRIVATE
  format/src/directory_io.cpp
  format/src/file_kind.cpp
  format/src/hdf5_io.cpp
  format/src/hdf5_io_util.cpp
  format/src/hdf5_write_io.cpp
  format/src/npy.cpp
  format/src/npy_io.cpp
  format/src/npz.cpp
  format/src/raw_io.cpp
  format/src/safetensors_io.cpp
  format/src/tensor_io.cpp
  format/src/tensor_io_common.cpp)
