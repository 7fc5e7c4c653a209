// The BLAS's threads: pinned to one (pin_blas_threads), and OpenBLAS's idle workers stopped
// (release_blas_threads, gcz/codec.h).
#include "blas_threads.h"

#include <cblas.h>

#include <mutex>

#include "gcz/codec.h"

#ifdef GCZ_HAVE_OPENBLAS
// OpenBLAS's own call to stop its worker threads (what it does before a fork), exported by its
// pthreads build though not declared in cblas.h: weak, so a build without it (serial, OpenMP) links
// and skips it.
extern "C" int blas_thread_shutdown_(void) __attribute__((weak));
#endif

namespace gcz {

void detail::pin_blas_threads() {
#ifdef GCZ_HAVE_OPENBLAS
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
#endif
}

void release_blas_threads() {
  detail::pin_blas_threads();
#ifdef GCZ_HAVE_OPENBLAS
  // With one thread pinned, OpenBLAS runs every call on the caller's thread and starts no worker again.
  if (blas_thread_shutdown_ != nullptr) blas_thread_shutdown_();
#endif
}

}  // namespace gcz
