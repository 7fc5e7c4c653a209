// Internal: ScratchBuffer, the encoder's and decoder's memory for chunks and whole tensors.
#pragma once

#include <cstddef>
#include <memory>

namespace gcz::detail {

// Scratch memory for chunks and whole tensors, left uninitialised: every byte is written before it
// is read. (Zeroing a whole tensor's worth first, as a vector's resize does, took a third of a
// whole-tensor `gcz eval`.) A resize keeps nothing; the memory is kept for a later, smaller one.
class ScratchBuffer {
 public:
  void resize(std::size_t n) {
    if (n > capacity_) {
      data_.reset();
      data_ = std::make_unique_for_overwrite<std::byte[]>(n);
      capacity_ = n;
    }
    size_ = n;
  }
  std::byte* data() const { return data_.get(); }
  std::size_t size() const { return size_; }

 private:
  std::unique_ptr<std::byte[]> data_;
  std::size_t size_ = 0, capacity_ = 0;
};

}  // namespace gcz::detail
