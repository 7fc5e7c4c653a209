target_sources(gcz PRIVATE
  codec/src/backend.cpp
  codec/src/cast_codec.cpp
  codec/src/codec.cpp
  codec/src/codec_spec.cpp
  codec/src/convert.cpp
  codec/src/metrics.cpp
  codec/src/status.cpp
  codec/src/tensor.cpp)
