// Outputs' side of the file helpers: files written under temporary names and renamed into place (one
// or two together), and their removal when gcz is interrupted. (Output paths checked up front are
// output_paths.cpp; inputs' side, the mapping and the memory bounds, is mapped_file.cpp.)
#include "file_util.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gcz/pipeline.h"

namespace gcz::detail {
namespace {

std::string errno_text() { return std::strerror(errno); }

// The registry of temporary paths. Never destroyed: a thread that removes them on a signal may run
// while the program's statics are being torn down.
std::mutex& temp_mutex() {
  static auto* m = new std::mutex;
  return *m;
}

std::set<std::string>& temp_paths() {
  static auto* paths = new std::set<std::string>;
  return *paths;
}

bool g_outputs_stopped = false;  // remove_unfinished_outputs(for_good): the program is ending

// Called with the registry locked: once outputs are stopped for good, this thread waits for the end.
void wait_if_stopped(std::unique_lock<std::mutex>& lock) {
  if (!g_outputs_stopped) return;
  lock.unlock();
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

// Makes a rename in `path`'s directory durable.
void sync_parent_directory(const std::string& path) {
  const int fd = ::open(directory_of(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // the rename has happened; a directory that cannot be opened is not an error
  (void)::fsync(fd);
  ::close(fd);
}

}  // namespace

std::filesystem::path resolved_path(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path absolute = std::filesystem::absolute(path, ec);
  return std::filesystem::weakly_canonical(ec ? std::filesystem::path(path) : absolute, ec);
}

bool same_file(const std::string& a, const std::string& b) {
  std::error_code ec;
  if (std::filesystem::exists(a, ec) && std::filesystem::exists(b, ec)) return std::filesystem::equivalent(a, b, ec);
  return resolved_path(a) == resolved_path(b);
}

std::filesystem::path directory_of(const std::string& path) {
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  return dir.empty() ? std::filesystem::path(".") : dir;
}

std::string without_trailing_slashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

std::string make_temp_path(const std::string& target) {
  static std::atomic<unsigned> counter{0};
  const std::string base = without_trailing_slashes(target);
  // A name that exists was left by a process of the same number that was killed (SIGKILL leaves its
  // temporaries; the signals gcz handles do not): the next number is taken instead.
  std::string tmp;
  struct stat st {};
  for (int tries = 0; tries < 1000; ++tries) {  // then the last: its O_EXCL open fails and says so
    tmp = base + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
    if (::lstat(tmp.c_str(), &st) != 0) break;
  }
  std::unique_lock<std::mutex> lock(temp_mutex());
  wait_if_stopped(lock);
  temp_paths().insert(tmp);
  return tmp;
}

void forget_temp_path(const std::string& tmp) {
  std::lock_guard<std::mutex> lock(temp_mutex());
  temp_paths().erase(tmp);
}

FileVersion version_of(const struct stat& st) {
  return {true, static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino), static_cast<uint64_t>(st.st_size),
          static_cast<int64_t>(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec};
}

namespace {

// The open, locked `dest` that rename_if_unchanged compares and replaces, or an errno. An exclusive
// flock: a second writer of the same version waits for the first to finish, then finds `dest`
// replaced. Taken before the registry's lock, so that a signal's cleanup never waits for it.
struct DestLock {
  int fd = -1;
  int err = 0;
  ~DestLock() {
    if (fd >= 0) ::close(fd);  // unlocks
  }
};

void lock_dest(const std::string& dest, DestLock& lock) {
  lock.fd = ::open(dest.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (lock.fd < 0) {
    lock.err = errno == ENOENT ? EEXIST : errno;  // removed meanwhile: changed
    return;
  }
  int r;
  while ((r = ::flock(lock.fd, LOCK_EX)) != 0 && errno == EINTR) {
  }
  if (r != 0 && errno == EBADF) {  // NFS locks a file open for writing only
    ::close(lock.fd);
    lock.fd = ::open(dest.c_str(), O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (lock.fd < 0) {
      lock.err = errno;
      return;
    }
    while ((r = ::flock(lock.fd, LOCK_EX)) != 0 && errno == EINTR) {
    }
  }
  if (r != 0) lock.err = errno;
}

// Whether `dest` is still `replaces`: no file, or the same file, checked under `lock` (lock_dest). 0,
// EEXIST when `dest` changed, or the errno.
int check_unchanged(const std::string& dest, const FileVersion& replaces, const DestLock& lock) {
  struct stat named {};
  if (!replaces.exists) {
    if (::lstat(dest.c_str(), &named) == 0) return EEXIST;
    return errno == ENOENT ? 0 : errno;
  }
  if (lock.err != 0) return lock.err;
  struct stat held {};
  if (::fstat(lock.fd, &held) != 0 || ::stat(dest.c_str(), &named) != 0) return errno == ENOENT ? EEXIST : errno;
  return version_of(held) == replaces && version_of(named) == replaces ? 0 : EEXIST;
}

// Renames `tmp` over `dest` only if `dest` is still `replaces` (check_unchanged; where there was no
// file, an atomic no-replace rename). 0, EEXIST when `dest` changed, or the errno.
int rename_if_unchanged(const std::string& tmp, const std::string& dest, const FileVersion& replaces,
                        const DestLock& lock) {
  if (!replaces.exists) {
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dest.c_str(), RENAME_NOREPLACE) == 0) return 0;
    if (errno != EINVAL && errno != ENOSYS) return errno;  // EEXIST: made meanwhile
    struct stat st {};  // a file system without no-replace renames: look, then rename
    if (::lstat(dest.c_str(), &st) == 0) return EEXIST;
    return ::rename(tmp.c_str(), dest.c_str()) == 0 ? 0 : errno;
  }
  if (const int err = check_unchanged(dest, replaces, lock); err != 0) return err;
  return ::rename(tmp.c_str(), dest.c_str()) == 0 ? 0 : errno;
}

// rename_temp_path's work, with the registry locked and `lock` held on a replaced `r.dest`: 0 or the errno.
int rename_locked(const TempRename& r, const DestLock& lock) {
  // A file replaced keeps its permission bits (a state file kept private stays private); set-user-ID,
  // set-group-ID and sticky bits are not copied, as cp does not.
  struct stat st {};
  if (::lstat(r.dest.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::chmod(r.tmp.c_str(), st.st_mode & 0777) != 0) {
    return errno;
  }
  if (r.replaces) return rename_if_unchanged(r.tmp, r.dest, *r.replaces, lock);
  return ::rename(r.tmp.c_str(), r.dest.c_str()) == 0 ? 0 : errno;
}

}  // namespace

std::pair<int, int> rename_temp_pair(const TempRename& first, const TempRename& second) {
  if (first.replaces) return {1, EINVAL};  // first is put back by exchange or removal, not compared
  DestLock second_lock;
  if (second.replaces && second.replaces->exists) lock_dest(second.dest, second_lock);
  // Under the registry's lock: remove_unfinished_outputs never sees a temporary half renamed, nor
  // one of the two in place and the other not.
  std::unique_lock<std::mutex> lock(temp_mutex());
  wait_if_stopped(lock);
  if (!temp_paths().count(first.tmp) || !temp_paths().count(second.tmp)) return {1, ENOENT};  // removed already
  // What can be known before anything moves is checked first: that `second` may replace what is at
  // its destination (so it stays, under its lock, for other gcz processes), and what `first` replaces.
  if (second.replaces) {
    if (const int err = check_unchanged(second.dest, *second.replaces, second_lock); err != 0) return {2, err};
  }
  struct stat old {};
  struct stat ours {};
  const bool replacing = ::lstat(first.dest.c_str(), &old) == 0;
  if (replacing && !S_ISREG(old.st_mode)) return {1, EEXIST};  // appeared since check_output_file
  if (::lstat(first.tmp.c_str(), &ours) != 0) return {1, errno};
  if (replacing && ::chmod(first.tmp.c_str(), old.st_mode & 0777) != 0) return {1, errno};
  // `first` goes in place keeping the file it replaces at its temporary name, to be put back if
  // `second` fails. A file system that cannot exchange two names puts `second` in place first.
  bool exchanged = false;
  if (replacing && ::renameat2(AT_FDCWD, first.tmp.c_str(), AT_FDCWD, first.dest.c_str(), RENAME_EXCHANGE) == 0) {
    exchanged = true;
  } else if (replacing && errno != ENOENT) {  // ENOENT: removed meanwhile, so a plain rename
    if (errno != EINVAL && errno != ENOSYS) return {1, errno};
    if (const int err = rename_locked(second, second_lock); err != 0) return {2, err};
    temp_paths().erase(second.tmp);
    if (const int err = rename_locked(first, {}); err != 0) return {3, err};  // `second` stays in place
    temp_paths().erase(first.tmp);
    return {0, 0};
  } else if (::renameat2(AT_FDCWD, first.tmp.c_str(), AT_FDCWD, first.dest.c_str(), RENAME_NOREPLACE) != 0) {
    // Nothing was there: nothing is overwritten either (a file another process put there since
    // stays, and this run fails before anything moved), unless the file system cannot tell.
    if (errno != EINVAL && errno != ENOSYS) return {1, errno};
    if (::rename(first.tmp.c_str(), first.dest.c_str()) != 0) return {1, errno};
  }
  if (const int err = rename_locked(second, second_lock); err != 0) {
    // Only the rename itself fails here (a directory that refuses it; a state made meanwhile by a
    // process that could not lock a file not yet there). `first` is taken back only while its
    // destination still holds this run's file: another process may have put its own there since.
    struct stat now {};
    const bool ours_there =
        ::lstat(first.dest.c_str(), &now) == 0 && now.st_dev == ours.st_dev && now.st_ino == ours.st_ino;
    const bool undone = ours_there && (exchanged ? ::renameat2(AT_FDCWD, first.tmp.c_str(), AT_FDCWD,
                                                               first.dest.c_str(), RENAME_EXCHANGE) == 0
                                                 : ::unlink(first.dest.c_str()) == 0);
    if (!undone) {
      temp_paths().erase(first.tmp);  // what it holds now (the file `first` replaced) is kept
      return {(ours_there ? 4 : 6) + (exchanged ? 1 : 0), err};
    }
    sync_parent_directory(first.dest);
    return {2, err};
  }
  if (exchanged) (void)::unlink(first.tmp.c_str());  // the file `first` replaced
  temp_paths().erase(first.tmp);
  temp_paths().erase(second.tmp);
  return {0, 0};
}

int rename_temp_path(const std::string& tmp, const std::string& dest, const std::optional<FileVersion>& replaces) {
  const TempRename r{tmp, dest, replaces};
  DestLock dest_lock;
  if (replaces && replaces->exists) lock_dest(dest, dest_lock);
  // Under the registry's lock: remove_unfinished_outputs never sees a temporary half renamed.
  std::unique_lock<std::mutex> lock(temp_mutex());
  wait_if_stopped(lock);
  if (!temp_paths().count(tmp)) return ENOENT;  // removed already
  if (const int err = rename_locked(r, dest_lock); err != 0) return err;
  temp_paths().erase(tmp);
  return 0;
}

Result<std::unique_ptr<AtomicFile>> AtomicFile::create(const std::string& path, bool durable,
                                                       std::optional<FileVersion> replaces) {
  GCZ_RETURN_IF_ERROR(check_output_file(path));
  std::unique_ptr<AtomicFile> f(new AtomicFile());
  f->path_ = path;
  f->durable_ = durable;
  f->replaces_ = replaces;
  // Another process may have made the temporary name meanwhile (one of the same number in another
  // PID namespace, writing to a shared directory): then the next name.
  for (int attempt = 0;; ++attempt) {
    f->tmp_path_ = make_temp_path(path);
    f->fd_ = ::open(f->tmp_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (f->fd_ >= 0) return f;
    const int err = errno;
    forget_temp_path(f->tmp_path_);
    if (err != EEXIST || attempt == 100) {
      f->committed_ = true;  // nothing to remove
      return io_error(path + ": cannot create its temporary file " + f->tmp_path_ + ": " + std::strerror(err));
    }
  }
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (kept_ >= 0) ::close(kept_);
  if (!committed_) {
    ::unlink(tmp_path_.c_str());
    forget_temp_path(tmp_path_);
  }
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
  // A durable file goes to the disk as it is written, kWriteBehindBytes at a time: the writes are
  // started, not waited for, so the disk works while the codecs do, and the fsync before the rename
  // has little left to wait for. (The kernel would start them only past its dirty-memory threshold,
  // a tenth of the memory, and a file smaller than that would wait whole for the fsync.)
  if (durable_ && pos_ - written_behind_ >= kWriteBehindBytes) {
    (void)::sync_file_range(fd_, static_cast<off_t>(written_behind_), static_cast<off_t>(pos_ - written_behind_),
                            SYNC_FILE_RANGE_WRITE);
    written_behind_ = pos_;
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

Status AtomicFile::close() {
  if (kept_ >= 0) return Status::ok();  // closed already
  // On disk before the rename: after a crash the path holds the old file or the whole new one.
  if (durable_ && ::fsync(fd_) != 0) return io_error(path_ + ": cannot flush to disk: " + errno_text());
  // A second descriptor, to name the file as it is once in place (the rename changes its ctime).
  kept_ = ::dup(fd_);
  if (kept_ < 0) return io_error(path_ + ": cannot duplicate a descriptor: " + errno_text());
  const int closed = ::close(fd_);
  fd_ = -1;
  if (closed != 0) return io_error(path_ + ": close failed: " + errno_text());
  return Status::ok();
}

Status AtomicFile::rename_error(int err) const {
  if (replaces_ && err == EEXIST) {
    return io_error(path_ + ": " + (replaces_->exists ? "replaced or removed" : "created") +
                    " by another process since gcz read or wrote it (another run sharing this file?); not "
                    "overwritten, so that update is not lost");
  }
  return io_error(path_ + ": cannot rename into place: " + std::strerror(err));
}

Status AtomicFile::placed() {
  committed_ = true;
  struct stat st {};
  const int stat_err = ::fstat(kept_, &st) == 0 ? 0 : errno;
  ::close(kept_);
  kept_ = -1;
  if (stat_err != 0) return io_error(path_ + ": cannot stat: " + std::strerror(stat_err));
  version_ = version_of(st);
  if (durable_) sync_parent_directory(path_);
  return Status::ok();
}

Status AtomicFile::commit() {
  GCZ_RETURN_IF_ERROR(close());
  if (const int err = rename_temp_path(tmp_path_, path_, replaces_); err != 0) return rename_error(err);
  return placed();
}

Status AtomicFile::commit_together(AtomicFile& first, AtomicFile& second) {
  GCZ_RETURN_IF_ERROR(first.close());
  GCZ_RETURN_IF_ERROR(second.close());
  const auto [failed, err] = rename_temp_pair({first.tmp_path_, first.path_, first.replaces_},
                                              {second.tmp_path_, second.path_, second.replaces_});
  switch (failed) {
    case 0:
      GCZ_RETURN_IF_ERROR(first.placed());
      return second.placed();
    case 1:  // neither in place: the two go together or not at all
      return io_error(first.rename_error(err).message() + "; " + second.path_ + " was not written either");
    case 2:
      return io_error(second.rename_error(err).message() + "; " + first.path_ + " was not written either");
    case 3:
      (void)second.placed();
      return io_error(first.rename_error(err).message() + "; " + second.path_ + " was put in place before it");
    default:  // `first` in place and not taken back: 4-5, it could not be; 6-7, another file is there now
      (void)first.placed();
      return io_error(second.rename_error(err).message() + "; " + first.path_ + " was put in place before it" +
                      (failed >= 6 ? ", and another process has put a file of its own there since, which stays"
                                   : " and could not be taken back") +
                      (failed % 2 == 1 ? " (the file it replaced is " + first.tmp_path_ + ")" : std::string()));
  }
}

void sync_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  (void)::fsync(fd);
  ::close(fd);
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

namespace gcz {

Result<FileVersion> FileVersion::of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) return detail::version_of(st);
  if (errno == ENOENT) return FileVersion{};
  return io_error(path + ": cannot stat: " + std::strerror(errno));
}

void remove_unfinished_outputs(bool for_good) {
  std::lock_guard<std::mutex> lock(detail::temp_mutex());
  detail::g_outputs_stopped = detail::g_outputs_stopped || for_good;
  for (const std::string& p : detail::temp_paths()) {
    // A writer may still be adding files to a temporary directory: remove until it is gone.
    std::error_code ec;
    auto gone = [&] { return std::filesystem::symlink_status(p, ec).type() == std::filesystem::file_type::not_found; };
    for (int attempt = 0; attempt < 100 && !gone(); ++attempt) std::filesystem::remove_all(p, ec);
  }
  detail::temp_paths().clear();  // rename_temp_path now refuses them: nothing half removed is put in place
}

}  // namespace gcz
