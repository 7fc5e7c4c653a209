// QSGD (Alistarh et al. 2017) on the CPU: per group of `group` elements a scale (max|x| or ||x||_2)
// and a `bits`-bit sign-magnitude code per element, rounded stochastically (unbiased) or to nearest.
// The math and the bit layout are in gcz/detail/qsgd_math.h and docs/codecs/qsgd.md.
//
//   auto c = gcz::make_qsgd_codec({{"bits", int64_t{4}}}, gcz::Backend::kCpu);
//   (*c)->stream_names(t);   // {"codes", "scales"}
#pragma once

#include <memory>

#include "gcz/codec.h"

namespace gcz {

// Makes the `qsgd` codec from its spec parameters (bits, group, scale, rounding, scale_dtype).
Result<std::unique_ptr<Codec>> make_qsgd_codec(const Params& params, Backend backend);

namespace detail {

struct QsgdOptions {
  int bits = 8;                          // 2..8
  uint64_t group = 128;                  // elements per scale, 1..kQsgdMaxGroup
  bool l2_scale = false;                 // scale = ||x_G||_2 (paper) instead of max|x_G|
  bool stochastic = true;                // unbiased stochastic rounding, else nearest
  DType scale_dtype = DType::kFloat32;   // float32, float16 or bfloat16
};

inline constexpr uint64_t kQsgdMaxGroup = uint64_t{1} << 24;

// Parses and range-checks the spec parameters.
Result<QsgdOptions> parse_qsgd_options(const Params& params);

class QsgdCodec : public Codec {
 public:
  explicit QsgdCodec(const QsgdOptions& o);

  std::string_view name() const override { return "qsgd"; }
  Params params() const override;
  std::vector<std::string> stream_names(const TensorInfo&) const override { return {"codes", "scales"}; }
  uint64_t chunk_unit() const override { return unit_; }
  Result<uint64_t> stream_size(const TensorInfo& t, std::size_t stream, uint64_t first,
                               uint64_t count) const override;
  Status encode(const TensorInfo& t, const void* src, uint64_t first, uint64_t count,
                std::vector<ByteBuffer>& out) override;
  Status decode(const TensorInfo& t, const std::vector<ByteSpan>& in, uint64_t first, uint64_t count,
                void* dst) override;

 private:
  QsgdOptions o_;
  uint64_t unit_;  // lcm(group, 8)
  uint64_t span_;  // elements per span: a multiple of unit_ near 1536
  std::vector<float> x_, y_, step_, scale_;
  std::vector<uint8_t> u_, codes_, finite_;
  std::vector<uint32_t> ties_;
};

}  // namespace detail
}  // namespace gcz
