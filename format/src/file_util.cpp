#include "file_util.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

namespace gcz::detail {
namespace {

std::string errno_text() { return std::strerror(errno); }

}  // namespace

Result<std::unique_ptr<MappedFile>> MappedFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return io_error(path + ": cannot open: " + errno_text());
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return io_error(path + ": cannot stat: " + errno_text());
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return io_error(path + ": not a regular file");
  }
  std::unique_ptr<MappedFile> m(new MappedFile());
  m->path_ = path;
  m->size_ = static_cast<uint64_t>(st.st_size);
  if (m->size_ > 0) {
    void* p = ::mmap(nullptr, m->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      return io_error(path + ": cannot map: " + errno_text());
    }
    m->data_ = static_cast<std::byte*>(p);
  }
  ::close(fd);
  return m;
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(data_, size_);
}

void MappedFile::release(uint64_t begin, uint64_t end) const {
  if (!data_) return;
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t b = (begin + page - 1) / page * page;
  const uint64_t e = (end < size_ ? end : size_) / page * page;
  if (e > b) ::madvise(data_ + b, e - b, MADV_DONTNEED);
}

Result<std::unique_ptr<AtomicFile>> AtomicFile::create(const std::string& path) {
  static std::atomic<unsigned> counter{0};
  std::unique_ptr<AtomicFile> f(new AtomicFile());
  f->path_ = path;
  f->tmp_path_ = path + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  f->fd_ = ::open(f->tmp_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (f->fd_ < 0) return io_error(path + ": cannot create: " + errno_text());
  return f;
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_path_.c_str());
}

Status AtomicFile::write(const void* data, std::size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return io_error(path_ + ": write failed: " + errno_text());
    }
    p += w;
    n -= static_cast<std::size_t>(w);
    pos_ += static_cast<uint64_t>(w);
  }
  return Status::ok();
}

Status AtomicFile::write_zeros(std::size_t n) {
  static const char kZeros[4096] = {};
  while (n > 0) {
    std::size_t k = n < sizeof kZeros ? n : sizeof kZeros;
    GCZ_RETURN_IF_ERROR(write(kZeros, k));
    n -= k;
  }
  return Status::ok();
}

Status AtomicFile::commit() {
  if (::close(fd_) != 0) {
    fd_ = -1;
    return io_error(path_ + ": close failed: " + errno_text());
  }
  fd_ = -1;
  if (::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    return io_error(path_ + ": cannot rename into place: " + errno_text());
  }
  committed_ = true;
  return Status::ok();
}

Result<std::string> read_small_file(const std::string& path, uint64_t max_bytes) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return io_error(path + ": cannot open: " + errno_text());
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t r = ::read(fd, buf, sizeof buf);
    if (r < 0) {
      if (errno == EINTR) continue;
      ::close(fd);
      return io_error(path + ": read failed: " + errno_text());
    }
    if (r == 0) break;
    out.append(buf, static_cast<std::size_t>(r));
    if (out.size() > max_bytes) {
      ::close(fd);
      return format_error(path + ": larger than " + std::to_string(max_bytes) + " bytes");
    }
  }
  ::close(fd);
  return out;
}

}  // namespace gcz::detail
