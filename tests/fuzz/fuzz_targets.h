// Fuzz entry points, one per parser. Each takes arbitrary bytes, writes them to a scratch file, and
// runs the parser and everything after it (open, verify, decode / read every tensor); it must never
// crash, hang or allocate beyond what the bytes justify. Built as libFuzzer targets with
// -DGCZ_BUILD_FUZZERS=ON (clang), and replayed over the corrupt corpus by tests/unit/test_fuzz_replay.cpp.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gcz::fuzz {

int gcz_file(const uint8_t* data, std::size_t size);
// The first byte picks the format: 0 .npy, 1 .npz, 2 .safetensors, 3 .h5; the rest is the file.
int tensor_file(const uint8_t* data, std::size_t size);

}  // namespace gcz::fuzz
