target_sources(gcz PRIVATE
  format/src/file_util.cpp)
include(format/io_sources.cmake)
