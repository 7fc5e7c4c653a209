#include "codecs/randomk.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>

#include "codecs/quant_uniforms.h"
#include "cpu_features.h"
#include "gcz/detail/philox.h"
#include "gcz/detail/select.h"
#include "parallel.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace gcz::codecs {

namespace {

constexpr uint64_t kSpan = 4096;  // keys drawn per step: a buffer that stays in L1

// Writes the keys of elements [first, first + count) to out: their 32-bit draws.
void draw_keys(const CodecContext& context, uint64_t first, uint64_t count, uint32_t* out) {
  detail::fill_draws32(context.seed, context.tensor_key, detail::kStreamRandomK, first, count, out);
}

// The keys below `bound` of elements [begin, end), in index order, with their indices.
struct Candidates {
  std::vector<uint32_t> keys;
  std::vector<uint64_t> index;
};

// Appends the keys[i] < bound of keys[from, count), with their indices first + i.
void keep_below(const uint32_t* keys, uint64_t from, uint64_t count, uint32_t bound, uint64_t first,
                Candidates& found) {
  for (uint64_t i = from; i < count; ++i) {
    if (keys[i] < bound) {
      found.keys.push_back(keys[i]);
      found.index.push_back(first + i);
    }
  }
}

#if defined(__x86_64__)
// keep_below from 0, eight keys to a compare: most eights hold no candidate and cost one branch. (The
// scalar loop ran at 1-1.5 cycles a key, depending on where the linker placed it.)
[[gnu::target("avx2")]] void keep_below_avx2(const uint32_t* keys, uint64_t count, uint32_t bound, uint64_t first,
                                             Candidates& found) {
  const __m256i flip = _mm256_set1_epi32(INT32_MIN);  // unsigned order as signed: both sides' top bit flipped
  const __m256i limit = _mm256_xor_si256(_mm256_set1_epi32(static_cast<int32_t>(bound)), flip);
  uint64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m256i k = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(keys + i)), flip);
    unsigned below = static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(limit, k))));
    while (below != 0) {
      const unsigned j = static_cast<unsigned>(__builtin_ctz(below));
      found.keys.push_back(keys[i + j]);
      found.index.push_back(first + i + j);
      below &= below - 1;
    }
  }
  keep_below(keys, i, count, bound, first, found);
}
#endif

void find_candidates(const CodecContext& context, uint64_t begin, uint64_t end, uint32_t bound, double fraction,
                     Candidates& found) {
  const std::size_t expect = static_cast<std::size_t>(fraction * static_cast<double>(end - begin) * 1.25) + 64;
  found.keys.reserve(expect);
  found.index.reserve(expect);
#if defined(__x86_64__)
  const bool avx2 = detail::cpu_has_avx2();
#else
  const bool avx2 = false;
#endif
  uint32_t keys[kSpan];
  for (uint64_t first = begin; first < end; first += kSpan) {
    const uint64_t count = std::min(kSpan, end - first);
    draw_keys(context, first, count, keys);
#if defined(__x86_64__)
    if (avx2) {
      keep_below_avx2(keys, count, bound, first, found);
      continue;
    }
#endif
    keep_below(keys, 0, count, bound, first, found);
  }
}

// The keys are uniform, so the k smallest almost surely lie below a bound some standard deviations
// above the k/n quantile. Only the keys below it are kept, with their indices, in one pass (over
// contiguous ranges on `parts` threads, joined in order); the exact selection then runs on those few.
// Returns nothing in the (about 1e-15) case that fewer than k keys fall below the bound, or when k/n
// is too large for the shortcut to pay.
std::optional<std::vector<uint64_t>> select_below_bound(const CodecContext& context, uint64_t n, uint64_t k,
                                                        unsigned parts) {
  const double kd = static_cast<double>(k);
  const double fraction = (kd + 8.0 * std::sqrt(kd) + 16.0) / static_cast<double>(n);
  if (fraction > 0.25) return std::nullopt;
  const uint32_t bound = static_cast<uint32_t>(fraction * 4294967296.0);
  std::vector<Candidates> found(parts);
  detail::run_parts(parts, n, kSpan, [&](unsigned p, uint64_t begin, uint64_t end) {
    find_candidates(context, begin, end, bound, fraction, found[p]);
  });
  // Candidate j is range p's candidate j - offset[p], for offset[p] <= j < offset[p + 1].
  std::vector<uint64_t> offset(parts + 1, 0);
  for (unsigned p = 0; p < parts; ++p) offset[p + 1] = offset[p] + found[p].keys.size();
  const uint64_t total = offset[parts];
  if (total < k) return std::nullopt;
  // The selection reads the keys as one array: the ranges' keys are copied into it on the threads,
  // each range's freed once copied. The indices stay where they are.
  std::unique_ptr<uint32_t[]> joined;
  const uint32_t* key = found[0].keys.data();
  if (parts > 1) {
    joined.reset(new uint32_t[total]);
    detail::run_each(parts, [&](unsigned p) {
      std::copy(found[p].keys.begin(), found[p].keys.end(), joined.get() + offset[p]);
      std::vector<uint32_t>().swap(found[p].keys);
    });
    key = joined.get();
  }
  // Every key <= the k-th smallest is below the bound, so it is a candidate, in index order.
  auto key_at = [key](uint64_t j) { return key[j]; };
  const auto t = detail::find_threshold<uint32_t>(total, k, key_at);
  std::vector<uint64_t> out;
  out.reserve(k);
  unsigned p = 0;
  detail::for_each_selected(total, t, key_at, [&](uint64_t j) {  // j ascending
    while (j >= offset[p + 1]) ++p;
    out.push_back(found[p].index[j - offset[p]]);
  });
  return out;
}

}  // namespace

std::vector<uint64_t> select_random_k(const CodecContext& context, uint64_t n, uint64_t k, unsigned threads) {
  k = std::min(k, n);
  if (k == n) return detail::select_smallest<uint32_t>(n, k, [](uint64_t) { return uint32_t{0}; });
  const unsigned parts = detail::parts_for(threads, n, detail::kMinPartElements);
  if (auto fast = select_below_bound(context, n, k, parts)) return std::move(*fast);
  // The general path: every key drawn once, then the shared selection.
  std::vector<uint32_t> keys(n);
  detail::run_parts(parts, n, kSpan, [&](unsigned, uint64_t begin, uint64_t end) {
    draw_keys(context, begin, end - begin, keys.data() + begin);
  });
  const uint32_t* key = keys.data();
  return detail::select_smallest<uint32_t>(
      n, k, [key](uint64_t i) { return key[i]; }, parts, detail::RunEach{});
}

float randomk_scale(uint64_t n, uint64_t k, bool unbiased) {
  if (!unbiased || k == 0) return 1.0f;
  return static_cast<float>(static_cast<double>(n) / static_cast<double>(k));
}

Params RandomKCodec::params() const {
  Params p;
  count_.add_params(p);
  p["scale"] = std::string(unbiased_ ? "unbiased" : "none");
  p["values"] = values_.spec();
  return p;
}

Result<uint64_t> RandomKCodec::stream_size(const TensorInfo& t, std::size_t stream, uint64_t, uint64_t) const {
  if (stream >= values_.stream_count()) return internal_error("randomk: no stream " + std::to_string(stream));
  GCZ_ASSIGN_OR_RETURN(uint64_t n, t.numel());
  if (n == 0) return uint64_t{0};  // an empty tensor writes no bytes at all
  return values_.stream_size({count_.k(n)}, stream);
}

Status RandomKCodec::encode(const TensorInfo& t, const void* src, uint64_t first, uint64_t count,
                            std::vector<ByteBuffer>& out) {
  GCZ_ASSIGN_OR_RETURN(uint64_t n, whole_tensor(t, first, count, name()));
  if (out.size() != values_.stream_count()) return internal_error("randomk: wrong number of output streams");
  if (n == 0) return Status::ok();
  const uint64_t k = count_.k(n);
  const std::vector<uint64_t> idx = select_random_k(context_, n, k, threads());
  const std::vector<float> values = gather_values(t.dtype, src, idx, randomk_scale(n, k, unbiased_));
  return values_.encode({k}, values.data(), out.data(), context_).with_context("randomk");
}

Status RandomKCodec::decode(const TensorInfo& t, const std::vector<ByteSpan>& in, uint64_t first, uint64_t count,
                            void* dst) {
  GCZ_ASSIGN_OR_RETURN(uint64_t n, whole_tensor(t, first, count, name()));
  if (in.size() != values_.stream_count()) return internal_error("randomk: wrong number of input streams");
  if (n == 0) {
    for (const ByteSpan& s : in) {
      if (!s.empty()) return format_error("randomk: an empty tensor must have empty streams");
    }
    return Status::ok();
  }
  const uint64_t k = count_.k(n);
  std::vector<float> values(k);
  GCZ_RETURN_IF_ERROR(values_.decode({k}, in.data(), values.data(), context_).with_context("randomk"));
  scatter_values(t.dtype, select_random_k(context_, n, k, threads()), values.data(), n, dst);
  return Status::ok();
}

Result<std::unique_ptr<Codec>> make_randomk(const Params& params, Backend) {
  GCZ_RETURN_IF_ERROR(check_param_keys(params, "randomk", {"ratio", "k", "scale", "values"}));
  GCZ_ASSIGN_OR_RETURN(SparseCount count, SparseCount::parse(params, "randomk"));
  GCZ_ASSIGN_OR_RETURN(std::string scale, get_choice_param(params, "randomk", "scale", {"none", "unbiased"}, "none"));
  GCZ_ASSIGN_OR_RETURN(detail::ValueCodec values,
                       detail::ValueCodec::make("randomk", params, "values", "fp32", Backend::kCpu));
  return std::unique_ptr<Codec>(new RandomKCodec(count, scale == "unbiased", std::move(values)));
}

}  // namespace gcz::codecs
