// The PowerSGD low-rank codec (Vogels, Karimireddy, Jaggi 2019), docs/codecs/powersgd.md.
//
// A tensor viewed as an n × m matrix M is stored as two factors, P (n × r) and Q (m × r), found by
// power iteration from a seeded Gaussian start (or from the previous step's Q); x̂ = P·Qᵀ. Tensors the
// factors would not shrink (1-D biases, small matrices) go to a fallback codec, chosen at planning
// time so that the index names the codec that really encoded them:
//
//   auto spec = gcz::powersgd_plan_for(info, stage.params);   // "powersgd:..." or e.g. "fp16"
//   auto codec = gcz::make_powersgd_codec(params, gcz::Backend::kCpu);
//   (*codec)->set_state(info, saved_q);                        // optional warm start
#pragma once

#include <memory>
#include <string>

#include "gcz/codec.h"

namespace gcz {

// The codec `powersgd` with `params` (rank, iters, view, factors, min_rate, fallback). Every backend
// gets the host implementation: the GEMMs run through the CPU BLAS.
Result<std::unique_ptr<Codec>> make_powersgd_codec(const Params& params, Backend backend);

// The one-stage spec to encode tensor `t` with when the spec names `powersgd` with `params`: the
// canonical powersgd spec when the tensor is a matrix its factors shrink by `min_rate`, otherwise the
// canonical `fallback` spec. Fails on bad parameters.
Result<std::string> powersgd_plan_for(const TensorInfo& t, const Params& params);

}  // namespace gcz
