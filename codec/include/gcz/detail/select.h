// gcz/detail/select.h — exact selection of the k elements with the smallest keys, ties broken by the
// lower index, in O(n) time: the one selection routine Top-K and Random-K share (docs/codecs/topk.md,
// docs/codecs/randomk.md).
//
// A key is an unsigned integer computed per element; Top-K uses magnitude keys (small for large |x|),
// Random-K uses Philox draws. The selection is a radix select: a histogram of the top 11 key bits over
// all elements finds the bucket that holds the k-th smallest key; the keys of that bucket are set
// aside and narrowed digit by digit to the exact threshold key T and the number of ties at T to take.
// Selected are every element with key < T and the first `ties` (in index order) with key == T. No
// sort: two passes over the input (three when one bucket holds more than an eighth of it) plus work
// on the bucket.
//
//   auto key_at = [&](uint64_t i) { return gcz::detail::magnitude_key_f32(bits[i]); };
//   std::vector<uint64_t> idx = gcz::detail::select_smallest<uint32_t>(n, k, key_at);  // ascending
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "gcz/detail/hd.h"

namespace gcz::detail {

// Magnitude keys: larger |x| gives a smaller key, equal |x| equal keys (so +0 and -0 tie), and every
// non-finite value (NaN, ±Inf) gets the largest key, ranking it after every finite element. The bits
// of |x| order like |x| for finite values, so a key is (bits of Inf) - (bits of |x|), moved to the top
// of the key word so the first radix digit sees the exponent.
GCZ_HD uint32_t magnitude_key_f32(uint32_t bits) {
  const uint32_t m = bits & 0x7FFFFFFFu;
  return m < 0x7F800000u ? (0x7F800000u - m) << 1 : 0xFFFFFFFFu;
}
GCZ_HD uint32_t magnitude_key_f16(uint16_t bits) {
  const uint32_t m = bits & 0x7FFFu;
  return m < 0x7C00u ? (0x7C00u - m) << 17 : 0xFFFFFFFFu;
}
GCZ_HD uint32_t magnitude_key_bf16(uint16_t bits) {
  const uint32_t m = bits & 0x7FFFu;
  return m < 0x7F80u ? (0x7F80u - m) << 17 : 0xFFFFFFFFu;
}
GCZ_HD uint64_t magnitude_key_f64(uint64_t bits) {
  const uint64_t m = bits & 0x7FFFFFFFFFFFFFFFull;
  return m < 0x7FF0000000000000ull ? (0x7FF0000000000000ull - m) << 1 : ~uint64_t{0};
}

// The k-th smallest key and how many elements equal to it are taken: all elements with key < key,
// and the first `ties` (in index order) with key == key.
template <class Key>
struct Threshold {
  Key key;
  uint64_t ties;
};

namespace select_internal {

inline constexpr int kDigitBits = 11;
inline constexpr std::size_t kBuckets = std::size_t{1} << kDigitBits;

// The bucket holding the need-th smallest element (need >= 1, counted from the first bucket); on
// return `need` counts from that bucket's first element. The last bucket where there are fewer (keys
// that changed since they were counted: a wrong selection, not a read out of bounds).
inline uint64_t pick_bucket(const std::vector<uint64_t>& hist, uint64_t& need) {
  uint64_t b = 0;
  while (b + 1 < hist.size() && hist[b] < need) need -= hist[b++];
  return b;
}

// Histogram of the top digit of the keys of [begin, end). Two interleaved tables: runs of equal keys
// (common in gradients) would otherwise make every increment wait for the previous one to the same
// counter.
template <class Key, class KeyAt>
std::vector<uint64_t> top_histogram(uint64_t begin, uint64_t end, int shift, const KeyAt& key_at) {
  std::vector<uint64_t> hist(kBuckets, 0), hist2(kBuckets, 0);
  uint64_t i = begin;
  for (; i + 1 < end; i += 2) {
    ++hist[key_at(i) >> shift];
    ++hist2[key_at(i + 1) >> shift];
  }
  if (i < end) ++hist[key_at(i) >> shift];
  for (std::size_t b = 0; b < kBuckets; ++b) hist[b] += hist2[b];
  return hist;
}

// The threshold among `cand`, keys that all equal `prefix` above bit `shift`, of which the need-th
// smallest is wanted: narrowed one digit per pass, dropping the candidates of other digits.
template <class Key>
Threshold<Key> narrow(std::vector<Key> cand, int shift, Key prefix, uint64_t need) {
  std::vector<uint64_t> hist(kBuckets);
  while (shift > 0) {
    const int width = std::min(kDigitBits, shift);
    shift -= width;
    const Key mask = static_cast<Key>((Key{1} << width) - 1);
    std::fill(hist.begin(), hist.end(), 0);
    for (Key c : cand) ++hist[(c >> shift) & mask];
    const Key digit = static_cast<Key>(pick_bucket(hist, need));
    prefix = static_cast<Key>(prefix | (digit << shift));
    std::size_t kept = 0;
    for (Key c : cand) {
      cand[kept] = c;
      kept += ((c >> shift) & mask) == digit;
    }
    cand.resize(kept);
  }
  return {prefix, need};
}

// The branch-free passes check their counts against the first pass's after every kSlack elements,
// and so write at most kSlack entries past them.
inline constexpr uint64_t kSlack = 4096;

template <class Key>
constexpr int top_shift() {
  return 8 * static_cast<int>(sizeof(Key)) - kDigitBits;
}

// The keys of [begin, end) in top-digit bucket `digit`, of which the histogram counted `most`.
// Branch-free: every key is written, and the next one goes over it unless it is in the bucket (a
// bucket of many scattered members mispredicts a branch about as often as not). The count is capped
// after every kSlack keys all the same, so that keys that change between passes (an input file
// rewritten under its memory map) give a wrong selection, never a write out of bounds.
template <class Key, class KeyAt>
std::vector<Key> bucket_keys(uint64_t begin, uint64_t end, const KeyAt& key_at, Key digit, uint64_t most) {
  constexpr int kShift = top_shift<Key>();
  std::vector<Key> cand(most + kSlack + 1);
  uint64_t m = 0;
  for (uint64_t b = begin; b < end; b += kSlack) {
    for (uint64_t i = b, e = std::min(end, b + kSlack); i < e; ++i) {
      const Key key = key_at(i);
      cand[m] = key;
      m += (key >> kShift) == digit;
    }
    m = std::min(m, most);
  }
  cand.resize(m);
  return cand;
}

// The threshold, once the top-digit histogram `hist` has named the bucket `digit` of the k-th smallest
// key, `need` of whose keys are still to take: one pass sets the bucket's keys aside.
template <class Key, class KeyAt>
Threshold<Key> threshold_in_bucket(uint64_t n, const KeyAt& key_at, const std::vector<uint64_t>& hist, Key digit,
                                   uint64_t need) {
  return narrow<Key>(bucket_keys<Key>(0, n, key_at, digit, hist[digit]), top_shift<Key>(),
                     static_cast<Key>(digit << top_shift<Key>()), need);
}

// The indices in [begin, end), ascending, of the keys below t.key and the first `ties` equal to it, of
// which there are `most` (more are not kept: keys changed between passes). Branch-free, capped as
// bucket_keys.
// (Not inlined: inside select_smallest, GCC 12 kept `ties != 0` on the stack, a store and a load in
// the loop's chain: 0.9 -> 0.66 GB/s on a tie-heavy tensor.)
template <class Key, class KeyAt>
[[gnu::noinline]] std::vector<uint64_t> select_range(uint64_t begin, uint64_t end, const KeyAt& key_at, Key key_t,
                                                     uint64_t ties, uint64_t most) {
  std::vector<uint64_t> out(most + kSlack + 1);
  uint64_t m = 0;
  for (uint64_t b = begin; b < end; b += kSlack) {
    for (uint64_t i = b, e = std::min(end, b + kSlack); i < e; ++i) {
      const Key key = key_at(i);
      const bool tie = (key == key_t) & (ties != 0);
      out[m] = i;
      m += (key < key_t) | tie;
      ties -= tie;
    }
    m = std::min(m, most);
  }
  out.resize(m);
  return out;
}

// The elements of [begin, end) in buckets below `digit` (indices, ascending; `most_sure` of them, with
// room for `room` more) and in bucket `digit` (keys and indices; `most_cand`), branch-free and capped
// as bucket_keys.
template <class Key>
struct RangeSplit {
  std::vector<uint64_t> sure;
  std::vector<Key> cand_key;
  std::vector<uint64_t> cand_index;
};
template <class Key, class KeyAt>
RangeSplit<Key> split_range(uint64_t begin, uint64_t end, const KeyAt& key_at, Key digit, uint64_t most_sure,
                            uint64_t most_cand, uint64_t room) {
  constexpr int kShift = top_shift<Key>();
  RangeSplit<Key> r;
  r.sure.resize(most_sure + std::max(kSlack + 1, room));
  r.cand_key.resize(most_cand + kSlack + 1);
  r.cand_index.resize(most_cand + kSlack + 1);
  uint64_t sure = 0, c = 0;
  for (uint64_t b = begin; b < end; b += kSlack) {
    for (uint64_t i = b, e = std::min(end, b + kSlack); i < e; ++i) {
      const Key key = key_at(i);
      const Key d = static_cast<Key>(key >> kShift);
      r.sure[sure] = i;
      sure += d < digit;
      r.cand_key[c] = key;
      r.cand_index[c] = i;
      c += d == digit;
    }
    sure = std::min(sure, most_sure);
    c = std::min(c, most_cand);
  }
  r.sure.resize(sure);
  r.cand_key.resize(c);
  r.cand_index.resize(c);
  return r;
}

// The vectors of `parts` joined in order, with room for `capacity` elements (the one moved, not copied,
// when there is one), each freed once copied.
template <class T>
std::vector<T> joined(std::vector<std::vector<T>>&& parts, std::size_t capacity = 0) {
  if (parts.size() == 1) return std::move(parts[0]);
  std::vector<T> out;
  std::size_t size = 0;
  for (const std::vector<T>& p : parts) size += p.size();
  out.reserve(std::max(size, capacity));
  for (std::vector<T>& p : parts) {
    out.insert(out.end(), p.begin(), p.end());
    std::vector<T>().swap(p);
  }
  return out;
}

}  // namespace select_internal

// Runs f(p) for p = 0 .. parts - 1 one after another: select_smallest's default. A caller with threads
// passes one that runs them side by side.
struct RunInOrder {
  template <class F>
  void operator()(unsigned parts, const F& f) const {
    for (unsigned p = 0; p < parts; ++p) f(p);
  }
};

// The threshold of the k smallest keys among key_at(0 .. n-1); requires 1 <= k <= n. Two passes over
// the keys, then work on the keys of one top-digit bucket.
template <class Key, class KeyAt>
Threshold<Key> find_threshold(uint64_t n, uint64_t k, const KeyAt& key_at) {
  using namespace select_internal;
  const std::vector<uint64_t> hist = top_histogram<Key>(0, n, top_shift<Key>(), key_at);
  uint64_t need = k;
  const Key digit = static_cast<Key>(pick_bucket(hist, need));
  return threshold_in_bucket<Key>(n, key_at, hist, digit, need);
}

// Calls emit(i) for each selected element in ascending order of i: every key < t.key and the first
// t.ties keys == t.key.
template <class Key, class KeyAt, class Emit>
void for_each_selected(uint64_t n, Threshold<Key> t, const KeyAt& key_at, Emit&& emit) {
  uint64_t ties = t.ties;
  for (uint64_t i = 0; i < n; ++i) {
    const Key key = key_at(i);
    if (key < t.key) {
      emit(i);
    } else if (key == t.key && ties != 0) {
      --ties;
      emit(i);
    }
  }
}

// The indices, ascending, of the k smallest keys, ties broken by the lower index; k is clamped to n.
//
// Two passes over the keys: a top-digit histogram finds the bucket of the k-th smallest key; the
// second pass takes every element of a smaller bucket and sets aside (key, index) of the elements in
// that bucket. The threshold is found among those candidates, the ones it selects (in index order)
// are merged with the rest. When the bucket is a large part of the tensor (few distinct keys), the
// candidates' indices are not kept: a pass for the bucket's keys alone, then a third pass that
// selects, bound the memory instead.
//
// The passes go over `parts` (at most 1024) contiguous ranges of [0, n), run by `run(parts, f)` (f(p)
// for each p, in any order or side by side; key_at must then be safe to call from several threads).
// Each range's histogram says how many indices and candidates it keeps, so the result is the same
// for any number of parts. Only the histogram goes in ranges where the ranges would cost memory: more
// than an eighth of the keys to keep (each range's list is copied into the result), or the
// few-distinct path (its candidates and selection would be copied from the ranges).
template <class Key, class KeyAt, class Run = RunInOrder>
std::vector<uint64_t> select_smallest(uint64_t n, uint64_t k, const KeyAt& key_at, unsigned parts = 1,
                                      const Run& run = {}) {
  using namespace select_internal;
  constexpr int kShift = top_shift<Key>();
  k = std::min(k, n);
  std::vector<uint64_t> out;
  if (k == 0) return out;
  if (k == n) {  // everything: no passes
    out.resize(n);
    for (uint64_t i = 0; i < n; ++i) out[i] = i;
    return out;
  }
  parts = static_cast<unsigned>(std::max<uint64_t>(1, std::min<uint64_t>({parts, n, 1024})));
  std::vector<uint64_t> bound(parts + 1);
  for (unsigned p = 0; p <= parts; ++p) bound[p] = p == parts ? n : n / parts * p;
  std::vector<std::vector<uint64_t>> hists(parts);
  run(parts, [&](unsigned p) { hists[p] = top_histogram<Key>(bound[p], bound[p + 1], kShift, key_at); });
  std::vector<uint64_t> hist(kBuckets, 0);
  for (const auto& h : hists) {
    for (std::size_t b = 0; b < kBuckets; ++b) hist[b] += h[b];
  }
  uint64_t need = k;
  const Key digit = static_cast<Key>(pick_bucket(hist, need));
  if (hist[digit] > n / 8 + 1024) {  // few distinct keys: the other passes over the whole
    const Threshold<Key> t = threshold_in_bucket<Key>(n, key_at, hist, digit, need);
    return select_range<Key>(0, n, key_at, t.key, t.ties, k);
  }
  if (parts > 1 && k > n / 8) {  // the other passes in one range
    parts = 1;
    bound = {0, n};
    hists = {hist};
  }
  auto below = [&](unsigned p) {  // the elements of range p in buckets below `digit`
    uint64_t s = 0;
    for (Key b = 0; b < digit; ++b) s += hists[p][b];
    return s;
  };
  // One range's vectors are used as they are, its list of the sure ones with room for the candidates.
  std::vector<std::vector<uint64_t>> sure_parts(parts), index_parts(parts);
  std::vector<std::vector<Key>> key_parts(parts);
  run(parts, [&](unsigned p) {
    RangeSplit<Key> r =
        split_range<Key>(bound[p], bound[p + 1], key_at, digit, below(p), hists[p][digit], parts == 1 ? need : 0);
    sure_parts[p] = std::move(r.sure);
    key_parts[p] = std::move(r.cand_key);
    index_parts[p] = std::move(r.cand_index);
  });
  out = joined(std::move(sure_parts), k);
  const std::vector<Key> cand_key = joined(std::move(key_parts));
  const std::vector<uint64_t> cand_index = joined(std::move(index_parts));
  const uint64_t sure = out.size();
  const Threshold<Key> t = narrow<Key>(cand_key, kShift, static_cast<Key>(digit << kShift), need);
  const Key* ck = cand_key.data();
  for_each_selected(cand_key.size(), t, [ck](uint64_t j) { return ck[j]; },
                    [&](uint64_t j) { out.push_back(cand_index[j]); });
  std::inplace_merge(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(sure), out.end());
  return out;
}

}  // namespace gcz::detail
