target_sources(gcz PRIVATE
  codec/src/backend.cpp
  codec/src/blas_threads.cpp
  codec/src/cast_codec.cpp
  codec/src/codec.cpp
  codec/src/codec_plan.cpp
  codec/src/codec_spec.cpp
  codec/src/convert.cpp
  codec/src/cpu_features.cpp
  codec/src/metrics.cpp
  codec/src/status.cpp
  codec/src/tensor.cpp
  codec/src/value_codec.cpp)
# The gradient codecs: one file (or a few) per codec under codec/src/codecs/.
file(GLOB GCZ_CODEC_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/src/codecs/*.cpp)
target_sources(gcz PRIVATE ${GCZ_CODEC_SOURCES})
# Library-internal headers are included as "codecs/<family>.h", "cuda_hooks.h".
target_include_directories(gcz PRIVATE ${CMAKE_CURRENT_LIST_DIR}/src)
include(${CMAKE_CURRENT_LIST_DIR}/blas.cmake)
