// gcz/status.h — errors as values.
//
// Every fallible function in libgcz returns a Status or a Result<T>; nothing in the library throws past
// its boundary or aborts, but std::bad_alloc where memory runs out on the calling thread (the standard
// containers' way; the gcz command turns it into "out of memory"; on a worker thread it ends the
// process). Threads it cannot make only make it slower. A Status carries one StatusCode (fixed values,
// never reused) and a one-line message naming the file, tensor and rule involved.
//
//   gcz::Result<gcz::GczReader> r = gcz::GczReader::open("grads.gcz");
//   if (!r) { std::fprintf(stderr, "error: %s\n", r.status().message().c_str()); return 1; }
//   gcz::GczReader& reader = *r;
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

namespace gcz {

// Fixed values: never renumber or reuse a retired one. docs/CLI.md maps them to exit codes.
enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,  // bad option, bad codec spec, inconsistent request
  kIoError = 2,          // a file could not be opened, read, written or renamed
  kFormatError = 3,      // an input file breaks a rule of its format (truncated, malformed, hostile)
  kUnsupported = 4,      // well-formed but not supported (dtype, format version, codec)
  kChecksumMismatch = 5, // stored XXH3-64 does not match the bytes
  kDeviceError = 6,      // the requested backend is unavailable or a device call failed
  kInternal = 7,         // a bug in gcz
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return {}; }
  bool is_ok() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // Returns this status with `prefix: ` put in front of its message (for adding file/tensor context),
  // unless the message begins with it already (a file named by the error and by its caller).
  Status with_context(const std::string& prefix) const {
    if (is_ok() || message_.rfind(prefix + ": ", 0) == 0) return *this;
    return {code_, prefix + ": " + message_};
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status invalid_argument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status io_error(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
inline Status format_error(std::string m) { return {StatusCode::kFormatError, std::move(m)}; }
inline Status unsupported(std::string m) { return {StatusCode::kUnsupported, std::move(m)}; }
inline Status checksum_mismatch(std::string m) { return {StatusCode::kChecksumMismatch, std::move(m)}; }
inline Status device_error(std::string m) { return {StatusCode::kDeviceError, std::move(m)}; }
inline Status internal_error(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

// A value or the Status that explains why there is none.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status)                          // NOLINT: implicit by design
      : status_(status.is_ok() ? Status(StatusCode::kInternal, "Result made from an ok Status") : std::move(status)) {}

  bool has_value() const { return value_.has_value(); }
  explicit operator bool() const { return has_value(); }
  // Ok when there is a value, else why there is none.
  const Status& status() const { return status_; }

  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }
  T&& operator*() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace gcz

#define GCZ_CONCAT_INNER(a, b) a##b
#define GCZ_CONCAT(a, b) GCZ_CONCAT_INNER(a, b)

// Returns from the enclosing function when `expr` (a Status) is not ok.
#define GCZ_RETURN_IF_ERROR(expr)                   \
  do {                                              \
    ::gcz::Status gcz_status_ = (expr);             \
    if (!gcz_status_.is_ok()) return gcz_status_;  \
  } while (0)

// `GCZ_ASSIGN_OR_RETURN(auto x, make_x());` declares x from a Result or returns its Status.
#define GCZ_ASSIGN_OR_RETURN(decl, expr) GCZ_ASSIGN_OR_RETURN_IMPL(GCZ_CONCAT(gcz_result_, __LINE__), decl, expr)
#define GCZ_ASSIGN_OR_RETURN_IMPL(tmp, decl, expr) \
  auto tmp = (expr);                               \
  if (!tmp.has_value()) return tmp.status();       \
  decl = std::move(tmp).value()
