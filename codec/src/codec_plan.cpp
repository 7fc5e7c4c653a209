// stage_for_tensor: per-tensor choices a codec makes before encoding (its fallback).
#include "codecs/powersgd.h"
#include "gcz/codec_spec.h"

namespace gcz {

Result<StageSpec> stage_for_tensor(const TensorInfo& t, const StageSpec& stage) {
  if (stage.name != "powersgd") return stage;
  GCZ_ASSIGN_OR_RETURN(std::string text, powersgd_plan_for(t, stage.params));
  GCZ_ASSIGN_OR_RETURN(CodecSpec spec, parse_codec_spec(text));
  if (spec.stages.size() != 1) return internal_error("powersgd planned '" + text + "', not one stage");
  return spec.stages[0];
}

}  // namespace gcz
