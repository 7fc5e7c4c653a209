// PowerSGD's reconstruction on the host, x̂ = P·Qᵀ, exactly as docs/codecs/powersgd.md specifies it.
#include <algorithm>
#include <cstring>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "cpu_features.h"
#include "gcz/convert.h"
#include "gcz/detail/powersgd_math.h"
#include "parallel.h"
#include "powersgd_host.h"

namespace gcz::detail {
namespace {

constexpr uint64_t kTileRows = 4, kTileCols = 8;
constexpr uint64_t kMostRowsPerPiece = 16 * kTileRows;
constexpr uint64_t kBlockPanelDoubles = uint64_t{1} << 16;  // a column block's panels: 512 KiB at most

// The sums of one tile: out[row][column] = Σ_c pp[c][row]·qp[c][column].
void tile_sums(const double* pp, const double* qp, uint64_t r, double* out) {
  double acc[kTileRows][kTileCols] = {};
  for (uint64_t c = 0; c < r; ++c) {
    for (uint64_t i = 0; i < kTileRows; ++i) {
      for (uint64_t j = 0; j < kTileCols; ++j) acc[i][j] = acc[i][j] + pp[c * kTileRows + i] * qp[c * kTileCols + j];
    }
  }
  std::memcpy(out, acc, sizeof acc);
}

#if defined(__x86_64__)
[[gnu::target("avx2,fma")]] void tile_sums_avx2(const double* pp, const double* qp, uint64_t r, double* out) {
  static_assert(kTileRows == 4 && kTileCols == 8);
  __m256d a0 = _mm256_setzero_pd(), b0 = a0, a1 = a0, b1 = a0, a2 = a0, b2 = a0, a3 = a0, b3 = a0;
  for (uint64_t c = 0; c < r; ++c, pp += kTileRows, qp += kTileCols) {
    const __m256d q0 = _mm256_loadu_pd(qp), q1 = _mm256_loadu_pd(qp + 4);
    __m256d v = _mm256_broadcast_sd(pp);
    a0 = _mm256_fmadd_pd(v, q0, a0);
    b0 = _mm256_fmadd_pd(v, q1, b0);
    v = _mm256_broadcast_sd(pp + 1);
    a1 = _mm256_fmadd_pd(v, q0, a1);
    b1 = _mm256_fmadd_pd(v, q1, b1);
    v = _mm256_broadcast_sd(pp + 2);
    a2 = _mm256_fmadd_pd(v, q0, a2);
    b2 = _mm256_fmadd_pd(v, q1, b2);
    v = _mm256_broadcast_sd(pp + 3);
    a3 = _mm256_fmadd_pd(v, q0, a3);
    b3 = _mm256_fmadd_pd(v, q1, b3);
  }
  _mm256_storeu_pd(out, a0);
  _mm256_storeu_pd(out + 4, b0);
  _mm256_storeu_pd(out + 8, a1);
  _mm256_storeu_pd(out + 12, b1);
  _mm256_storeu_pd(out + 16, a2);
  _mm256_storeu_pd(out + 20, b2);
  _mm256_storeu_pd(out + 24, a3);
  _mm256_storeu_pd(out + 28, b3);
}
#endif

}  // namespace

// x̂ = P·Qᵀ, each element as powersgd_element (float64 sums over c ascending from +0), then rounded once
// to `dtype`. Each product of two float32 values is exact in float64, so a fused multiply-add rounds
// each step as the written sum does. The work goes in tiles of kTileRows × kTileCols elements whose sums
// stay in registers over all of c: Q widened once into panels of kTileCols columns ([c][column]), P four
// rows at a time ([c][row]), zeros past the matrix's edges. Column blocks keep a block's panels in L2;
// pieces of rows go to the codec's threads, as many as the work is worth. A NaN sum (from NaN or Inf
// factors, which only a made-up file holds) is settled by powersgd_settle_nan: the vector and portable
// paths would otherwise choose its sign and payload differently. Blocking and threads change how fast,
// never a bit.
void powersgd_reconstruct(const std::vector<float>& p, const std::vector<float>& q, PowerSgdDims d, uint64_t r,
                          DType dtype, void* dst, unsigned threads) {
  if (d.n == 0 || d.m == 0) return;
  const uint64_t panels = (d.m + kTileCols - 1) / kTileCols;
  std::vector<double> qp(panels * r * kTileCols, 0.0);  // qp[(b·r + c)·8 + k] = Q[8b + k][c]
  for (uint64_t j = 0; j < d.m; ++j) {
    double* panel = qp.data() + j / kTileCols * r * kTileCols + j % kTileCols;
    for (uint64_t c = 0; c < r; ++c) panel[c * kTileCols] = q[j * r + c];
  }
  const uint64_t block_cols = std::min(panels, std::max<uint64_t>(1, kBlockPanelDoubles / (r * kTileCols))) * kTileCols;
#if defined(__x86_64__)
  const auto sums = cpu_has_avx2() ? tile_sums_avx2 : tile_sums;
#else
  const auto sums = tile_sums;
#endif
  // Pieces of whole tiles, at most kMostRowsPerPiece rows, enough of them for the threads; threads as
  // many as the work (n·m·r multiply-adds) is worth.
  const uint64_t per_thread = (d.n + threads - 1) / threads;
  const uint64_t piece_rows = std::min(kMostRowsPerPiece, (per_thread + kTileRows - 1) / kTileRows * kTileRows);
  const uint64_t pieces = (d.n + piece_rows - 1) / piece_rows;
  const unsigned workers = powersgd_workers(threads, pieces, d, r);
  struct Scratch {
    std::vector<double> pp;    // pp[(t·r + c)·4 + k] = P[first_row + 4t + k][c]
    std::vector<double> rows;  // a tile row's sums across the column block
  };
  std::vector<Scratch> scratch(workers);
  const std::size_t esize = dtype_size(dtype);
  run_pieces(workers, d.n, piece_rows, [&](unsigned worker, uint64_t first_row, uint64_t end_row) {
    Scratch& w = scratch[worker];
    const uint64_t tiles = (end_row - first_row + kTileRows - 1) / kTileRows;
    w.pp.assign(tiles * r * kTileRows, 0.0);
    w.rows.resize(kTileRows * block_cols);
    for (uint64_t i = first_row; i < end_row; ++i) {
      double* tile = w.pp.data() + (i - first_row) / kTileRows * r * kTileRows + (i - first_row) % kTileRows;
      for (uint64_t c = 0; c < r; ++c) tile[c * kTileRows] = p[i * r + c];
    }
    double out[kTileRows * kTileCols];
    for (uint64_t j0 = 0; j0 < d.m; j0 += block_cols) {
      const uint64_t cols = std::min(block_cols, d.m - j0);
      for (uint64_t t = 0; t < tiles; ++t) {
        for (uint64_t j = 0; j < cols; j += kTileCols) {
          sums(w.pp.data() + t * r * kTileRows, qp.data() + (j0 + j) / kTileCols * r * kTileCols, r, out);
          for (uint64_t k = 0; k < kTileRows; ++k) {
            double* row = w.rows.data() + k * block_cols + j;
            for (uint64_t c = 0; c < kTileCols; ++c) row[c] = powersgd_settle_nan(out[k * kTileCols + c]);
          }
        }
        // convert_elements rounds to nearest even whatever the FPU's modes (a bare cast follows them),
        // on the hardware where they are the defaults.
        for (uint64_t k = 0; k < kTileRows && first_row + t * kTileRows + k < end_row; ++k) {
          const uint64_t i = first_row + t * kTileRows + k;
          convert_elements(DType::kFloat64, w.rows.data() + k * block_cols, dtype,
                           static_cast<std::byte*>(dst) + (i * d.m + j0) * esize, cols);
        }
      }
    }
  });
}

}  // namespace gcz::detail
