// The codecs' thread helpers (codec/src/parallel.h): every element in exactly one range, for any
// split, and each worker's own scratch index.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <new>
#include <thread>
#include <vector>

#include "parallel.h"

namespace gcz {
namespace {

TEST(Parallel, RunPiecesCoversEveryElementOnceInWholePieces) {
  for (unsigned workers : {1u, 2u, 3u, 5u}) {
    for (uint64_t piece : {1u, 7u, 64u}) {
      for (uint64_t n : {uint64_t{0}, uint64_t{1}, piece - 1, piece, piece + 1, 10 * piece, 10 * piece + 3}) {
        std::vector<std::atomic<int>> seen(n);
        std::atomic<int> calls{0}, bad{0};
        detail::run_pieces(workers, n, piece, [&](unsigned k, uint64_t begin, uint64_t end) {
          calls.fetch_add(1);
          // Whole pieces, in order of their start; the last may be short; k names a worker.
          if (k >= workers || begin % piece != 0 || begin >= end || end - begin > piece ||
              (end - begin < piece && end != n)) {
            bad.fetch_add(1);
          }
          for (uint64_t i = begin; i < end; ++i) seen[i].fetch_add(1);
        });
        EXPECT_EQ(bad.load(), 0) << workers << " " << piece << " " << n;
        EXPECT_EQ(static_cast<uint64_t>(calls.load()), n / piece + (n % piece != 0)) << workers << " " << n;
        for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(seen[i].load(), 1) << i << " of " << n;
      }
    }
  }
}

// A slow worker takes fewer pieces instead of a fixed share: with worker 0 held up on its first
// piece until worker 1 has done all the others, it does that one piece only (a fixed split would
// give each 20). Worker 1 starts no piece before worker 0 has one, so that worker 0 gets one at all.
// Each k runs one piece at a time, so per-worker scratch is never shared.
TEST(Parallel, RunPiecesGivesASlowWorkerFewerPieces) {
  const uint64_t pieces = 40;
  std::vector<std::atomic<int>> by_worker(2);
  std::vector<std::atomic<int>> busy(2);
  std::atomic<int> done{0}, overlap{0};
  std::atomic<bool> zero_started{false};
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  auto wait_for = [&](auto ready) {
    while (!ready() && std::chrono::steady_clock::now() < give_up) std::this_thread::yield();
  };
  detail::run_pieces(2, pieces, 1, [&](unsigned k, uint64_t, uint64_t) {
    if (busy[k].fetch_add(1) != 0) overlap.fetch_add(1);
    if (k == 0 && by_worker[0].load() == 0) {
      zero_started.store(true);
      wait_for([&] { return done.load() == static_cast<int>(pieces) - 1; });
    } else if (k == 1) {
      wait_for([&] { return zero_started.load(); });
    }
    by_worker[k].fetch_add(1);
    done.fetch_add(1);
    busy[k].fetch_sub(1);
  });
  EXPECT_EQ(overlap.load(), 0);
  EXPECT_EQ(by_worker[0].load() + by_worker[1].load(), static_cast<int>(pieces));
  EXPECT_EQ(by_worker[0].load(), 1);
  EXPECT_EQ(by_worker[1].load(), static_cast<int>(pieces) - 1);
}

// An exception (out of memory) from any part comes back to the caller once every thread has ended,
// as from a call on its own thread; on a thread of its own it would have ended the process.
TEST(Parallel, AnExceptionFromAnyPartReachesTheCaller) {
  for (unsigned thrower : {0u, 1u, 2u}) {
    std::atomic<int> ran{0};
    EXPECT_THROW(detail::run_each(3,
                                  [&](unsigned k) {
                                    ran.fetch_add(1);
                                    if (k == thrower) throw std::bad_alloc();
                                  }),
                 std::bad_alloc)
        << thrower;
    EXPECT_EQ(ran.load(), 3) << thrower;  // the other parts ran to the end
    EXPECT_THROW(detail::run_pieces(3, 30, 1,
                                    [&](unsigned, uint64_t begin, uint64_t) {
                                      if (begin == 10 * thrower + 5) throw std::bad_alloc();
                                    }),
                 std::bad_alloc)
        << thrower;
  }
}

}  // namespace
}  // namespace gcz
