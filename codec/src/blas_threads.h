// Internal: the BLAS's threads, which the codecs' bytes must not depend on (PowerSGD's GEMMs).
#pragma once

namespace gcz::detail {

// Pins OpenBLAS to one thread for the whole process, once: the bytes must not depend on the core
// count (docs/CODECS.md, determinism). Does nothing with another BLAS.
void pin_blas_threads();

}  // namespace gcz::detail
