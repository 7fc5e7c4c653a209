#include "gcz/status.h"

namespace gcz {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid argument";
    case StatusCode::kIoError: return "I/O error";
    case StatusCode::kFormatError: return "format error";
    case StatusCode::kUnsupported: return "unsupported";
    case StatusCode::kChecksumMismatch: return "checksum mismatch";
    case StatusCode::kDeviceError: return "device error";
    case StatusCode::kInternal: return "internal error";
  }
  return "unknown";
}

}  // namespace gcz
