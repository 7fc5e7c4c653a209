// Runs a probe of shared_math_probes.h on the CUDA device: records [0, n) into `out` (n *
// probe_words(p) words). Defined by shared_math_device.cu in a build with CUDA; without it, the
// parity test skips before calling it.
#pragma once

#include <cstdint>
#include <vector>

#include "gcz/status.h"
#include "shared_math_probes.h"

namespace gcz::test {

Status run_probe_on_device(Probe p, uint64_t n, std::vector<uint64_t>& out);

}  // namespace gcz::test
