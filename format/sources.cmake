target_sources(gcz PRIVATE
  format/src/bench.cpp
  format/src/container_reader.cpp
  format/src/container_writer.cpp
  format/src/decode.cpp
  format/src/encode.cpp
  format/src/file_util.cpp
  format/src/index_json.cpp)
include(format/io_sources.cmake)
