target_sources(gcz PRIVATE
  format/src/bench.cpp
  format/src/container_reader.cpp
  format/src/container_writer.cpp
  format/src/decode.cpp
  format/src/encode.cpp
  format/src/error_feedback.cpp
  format/src/file_util.cpp
  format/src/glob.cpp
  format/src/index_json.cpp
  format/src/mapped_file.cpp
  format/src/output_paths.cpp
  format/src/tensor_encoder.cpp)
include(format/io_sources.cmake)
