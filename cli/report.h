// Printing an EncodeReport: a human table (default), JSON or CSV, plus warnings on stderr.
#pragma once

#include <cstdio>
#include <string>

#include "gcz/pipeline.h"

namespace gcz::cli {

// format: "table", "json" or "csv".
void print_report(std::FILE* out, const EncodeReport& report, const std::string& format);
// Norm-ratio, non-finite and skipped-tensor notes, on stderr.
void print_warnings(const EncodeReport& report);
// "1.5 MiB"
std::string human_bytes(uint64_t bytes);

}  // namespace gcz::cli
