// Inputs' side of the file helpers: the read-only mapping of a whole file, and the memory this process
// may use, which what is decoded at once is checked against. (Outputs' side is file_util.cpp.)
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "file_util.h"
#include "gcz/tensor_io.h"

namespace gcz::detail {

uint64_t physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

namespace {

// The lowest memory limit of this process's cgroup and those above it (0: none), read once: a decode
// asks for every tensor, and reading /proc and the cgroup files each time cost a tensor of a file of
// many small ones most of its time.
uint64_t cgroup_memory_limit() {
  static const uint64_t limit = [] {
    uint64_t most = 0;
    // /proc/self/cgroup: "ID:CONTROLLERS:/PATH" lines; v2's has no controllers.
    std::ifstream groups("/proc/self/cgroup");
    for (std::string line; std::getline(groups, line);) {
      const std::size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
      if (b == std::string::npos) continue;
      const std::string controllers = line.substr(a + 1, b - a - 1);
      std::filesystem::path dir;
      std::string name;
      if (controllers.empty()) {
        dir = "/sys/fs/cgroup", name = "memory.max";
      } else if (("," + controllers + ",").find(",memory,") != std::string::npos) {
        dir = "/sys/fs/cgroup/memory", name = "memory.limit_in_bytes";
      } else {
        continue;
      }
      // The cgroup and every one above it ("max" is no limit).
      std::vector<std::filesystem::path> places{dir};
      for (const auto& part : std::filesystem::path(line.substr(b + 1)).relative_path()) {
        places.push_back(places.back() / part);
      }
      for (const auto& place : places) {
        std::ifstream f(place / name);
        std::string text;
        if (f >> text && !text.empty() && text.find_first_not_of("0123456789") == std::string::npos &&
            text.size() < 20) {
          const uint64_t v = std::stoull(text);
          most = most == 0 ? v : std::min(most, v);
        }
      }
    }
    return most;
  }();
  return limit;
}

// The live mappings, for mapped_input_at: a fixed table a signal handler can read without a lock. A
// slot is claimed by its path; `begin` is set last and cleared first, so a reader that finds an
// address in [begin, end) reads a path that lives as long as the mapping the address is in.
struct MappingSlot {
  std::atomic<const char*> path{nullptr};
  std::atomic<uintptr_t> begin{0}, end{0};
};
constexpr std::size_t kMappingSlots = 256;  // more mappings at once go unnamed
MappingSlot g_mappings[kMappingSlots];

MappingSlot* register_mapping(const std::string& path, const std::byte* data, uint64_t size) {
  for (MappingSlot& slot : g_mappings) {
    const char* none = nullptr;
    if (!slot.path.compare_exchange_strong(none, path.c_str())) continue;
    slot.end.store(reinterpret_cast<uintptr_t>(data) + size, std::memory_order_relaxed);
    slot.begin.store(reinterpret_cast<uintptr_t>(data), std::memory_order_release);
    return &slot;
  }
  return nullptr;
}

}  // namespace

uint64_t memory_limit_bytes() {
  uint64_t most = physical_memory_bytes();
  auto bound = [&](uint64_t limit) { most = most == 0 ? limit : std::min(most, limit); };
  for (const int resource : {RLIMIT_AS, RLIMIT_DATA}) {
    struct rlimit r {};
    if (::getrlimit(resource, &r) == 0 && r.rlim_cur != RLIM_INFINITY) bound(static_cast<uint64_t>(r.rlim_cur));
  }
  if (const uint64_t cgroup = cgroup_memory_limit(); cgroup != 0) bound(cgroup);
  return most;
}

Status check_memory_to_read(uint64_t bytes, const std::string& where) {
  const uint64_t memory = memory_limit_bytes();
  if (memory == 0 || bytes <= memory / 2) return Status::ok();
  return unsupported(where + " would take about " + std::to_string(bytes >> 20) +
                     " MiB of memory to read, more than half of what this process may use (" +
                     std::to_string(memory >> 20) + " MiB)");
}

Status not_a_regular_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return io_error(path + ": a directory, not a file");
  return io_error(path + ": not a regular file (gcz maps its inputs into memory: no pipes or devices)");
}

Result<std::unique_ptr<MappedFile>> MappedFile::open(const std::string& path) {
  // Checked before the open, which for a device may do something, and for a pipe with no writer would
  // wait for one (O_NONBLOCK: the type may change between the two).
  struct stat before {};
  if (::stat(path.c_str(), &before) == 0 && !S_ISREG(before.st_mode)) return not_a_regular_file(path);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return io_error(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return io_error(path + ": cannot stat: " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return not_a_regular_file(path);
  }
  std::unique_ptr<MappedFile> m(new MappedFile());
  m->path_ = path;
  m->size_ = static_cast<uint64_t>(st.st_size);
  m->version_ = version_of(st);
  if (m->size_ > 0) {
    void* p = ::mmap(nullptr, m->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      return io_error(path + ": cannot map: " + std::strerror(errno));
    }
    m->data_ = static_cast<std::byte*>(p);
    m->slot_ = register_mapping(m->path_, m->data_, m->size_);
  }
  ::close(fd);
  return m;
}

MappedFile::~MappedFile() {
  if (auto* slot = static_cast<MappingSlot*>(slot_)) {
    slot->begin.store(0, std::memory_order_release);
    slot->end.store(0, std::memory_order_relaxed);
    slot->path.store(nullptr, std::memory_order_release);
  }
  if (data_) ::munmap(data_, size_);
}

Status check_input_unchanged(const std::string& path, const FileVersion& opened) {
  struct stat st {};
  if (!opened.exists || ::stat(path.c_str(), &st) != 0) return Status::ok();  // removed: read whole
  const FileVersion now = version_of(st);
  if (now.device != opened.device || now.inode != opened.inode) return Status::ok();  // another file now
  if (now == opened) return Status::ok();
  return io_error(path +
                  ": the file changed while gcz read it (was it rewritten in place? replace a file by renaming a "
                  "new one over it)");
}

void MappedFile::release(uint64_t begin, uint64_t end) const {
  if (!data_) return;
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t b = (begin + page - 1) / page * page;
  const uint64_t e = (end < size_ ? end : size_) / page * page;
  if (e > b) ::madvise(data_ + b, e - b, MADV_DONTNEED);
}

}  // namespace gcz::detail

namespace gcz {

const char* mapped_input_at(const void* address) {
  const auto a = reinterpret_cast<uintptr_t>(address);
  for (const detail::MappingSlot& slot : detail::g_mappings) {
    const uintptr_t begin = slot.begin.load(std::memory_order_acquire);
    if (begin != 0 && a >= begin && a < slot.end.load(std::memory_order_relaxed)) {
      return slot.path.load(std::memory_order_relaxed);
    }
  }
  return nullptr;
}

}  // namespace gcz
