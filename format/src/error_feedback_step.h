// Internal: one tensor's encode with error feedback.
#pragma once

#include "gcz/error_feedback.h"
#include "tensor_encoder.h"

namespace gcz::detail {

// The dtype a tensor of dtype d is encoded, and recorded, as with error feedback: float64 stays
// float64, the other float dtypes become float32 (the residual is added in it).
DType working_dtype(DType d);
// The dtype encode_with_feedback encodes such a tensor in: working_dtype(d) with feedback on, d itself
// with it off (the sums alone are tracked, and each step is encoded as gcz encode would).
DType encoded_dtype(DType d, const ErrorFeedback& ef);

// Takes the whole tensor (in place where the source holds it so), adds its residual, encodes
// x' = x + e as float32 (float64 stays float64), and stores e = x' − x̂ (and the codec's state) back
// in `ef`. The report's metrics compare x̂ with the true gradient x; with tracked sums it also
// carries the cumulative error.
Result<TensorReport> encode_with_feedback(TensorEncoder& encoder, TensorSource& src, const EncodingPlan& plan,
                                          ErrorFeedback& ef, const std::function<void(uint64_t)>& progress);

}  // namespace gcz::detail
