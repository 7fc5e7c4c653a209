// Internal: running the parts of one codec call on threads of their own.
//
//   detail::run_each(parts, [&](unsigned k) { ... });
//   detail::run_parts(parts, n, 40, [&](unsigned k, uint64_t begin, uint64_t end) { ... });
//   detail::run_pieces(workers, n, 65280, [&](unsigned k, uint64_t begin, uint64_t end) { ... });
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <system_error>
#include <thread>
#include <vector>

namespace gcz::detail {

// Elements a thread should have at least, against the cost of starting it (a pass over 2^18 float32
// takes tens of microseconds).
inline constexpr uint64_t kMinPartElements = uint64_t{1} << 18;

// How many parts to split n elements into for `threads` threads: at most one per `min_part` elements.
inline unsigned parts_for(unsigned threads, uint64_t n, uint64_t min_part) {
  const uint64_t most = n / min_part;
  return most < 1 ? 1u : most < threads ? static_cast<unsigned>(most) : threads;
}

// Where part k of [0, n) split into `parts` begins (n for k == parts): a multiple of `align`.
inline uint64_t part_begin(unsigned parts, uint64_t n, uint64_t align, unsigned k) {
  return k == parts ? n : n / parts * k / align * align;
}

// Starts f() on a thread of its own, kept in `pool` to be joined; where the process can make no more
// threads (std::thread throws), runs f() here instead: a thread changes how fast, never what.
template <class F>
void start_or_run(std::vector<std::thread>& pool, const F& f) {
  try {
    pool.emplace_back(f);
  } catch (const std::system_error&) {
    f();
  }
}

// Runs f(k) for k = 0 .. parts - 1: 0 on the calling thread, the others on threads of their own
// (start_or_run); returns when all are done. An exception from any f (std::bad_alloc) is rethrown
// here once every thread has ended, as if f had run on the calling thread: on a thread of its own it
// would end the process.
template <class F>
void run_each(unsigned parts, const F& f) {
  std::vector<std::exception_ptr> failed(parts);
  auto guarded = [&](unsigned k) {
    try {
      f(k);
    } catch (...) {
      failed[k] = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  for (unsigned k = 1; k < parts; ++k) start_or_run(pool, [&guarded, k] { guarded(k); });
  if (parts > 0) guarded(0u);
  for (std::thread& th : pool) th.join();
  for (const std::exception_ptr& e : failed) {
    if (e) std::rethrow_exception(e);
  }
}

// run_each as a callable object, for code that takes how to run its parts (select_smallest's `run`).
struct RunEach {
  template <class F>
  void operator()(unsigned parts, const F& f) const {
    run_each(parts, f);
  }
};

// Splits [0, n) into `parts` ranges at part_begin and runs f(k, begin, end) for each, as run_each.
template <class F>
void run_parts(unsigned parts, uint64_t n, uint64_t align, const F& f) {
  auto bound = [&](unsigned k) { return part_begin(parts, n, align, k); };
  run_each(parts, [&](unsigned k) { f(k, bound(k), bound(k + 1)); });
}

// Cuts [0, n) into pieces of `piece` (>= 1) elements, the last maybe shorter, and runs f(k, begin,
// end) for each, the pieces handed out in order to whichever of the `workers` asks next: worker 0 is
// the calling thread, the others threads of their own; returns when all are done. A worker that runs
// slower (its core shared with other work) takes fewer pieces instead of holding up the others, as a
// fixed split would (a worker with no thread to be had runs first, here). k names the worker, for its
// scratch: which pieces it gets depends on timing, so f's results must go where the piece, not the
// worker, says. Exceptions as run_each's.
template <class F>
void run_pieces(unsigned workers, uint64_t n, uint64_t piece, const F& f) {
  const uint64_t pieces = n / piece + (n % piece != 0);
  std::atomic<uint64_t> next{0};
  run_each(std::max(workers, 1u), [&](unsigned k) {
    for (uint64_t p; (p = next.fetch_add(1, std::memory_order_relaxed)) < pieces;) {
      f(k, p * piece, std::min(n, (p + 1) * piece));
    }
  });
}

}  // namespace gcz::detail
