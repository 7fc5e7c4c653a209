// Internal: the JSON index of a .gcz file (FORMAT.md §5) to and from FileIndex.
#pragma once

#include <string>

#include "gcz/container.h"

namespace gcz::detail {

// Formats a rule violation as "PATH: [tensor 'NAME': ]RULE: DETAIL" (FORMAT.md §6 rule names).
Status rule_error(StatusCode code, const std::string& path, const std::string& tensor, const std::string& rule,
                  const std::string& detail);

std::string serialize_index(const FileIndex& index);
// The bytes one tensor's entry adds to the index (without metrics).
uint64_t tensor_entry_bytes(const TensorRecord& record);

// Parses and checks the rules index-json, index-schema, duplicate-name, bad-dtype, bad-shape,
// bad-encoding. Codec and stream-layout rules are checked by the reader.
Result<FileIndex> parse_index(const std::string& text, uint16_t version_major, const std::string& path);

// What GczReader::open checks of an index once it has its bytes (container_reader.cpp): parse_index,
// then each tensor's codec rules (unknown-codec, bad-streams, stream-size, zstd-frame) and streams that
// tile the data section, which ends at index_offset (stream-out-of-range). `path` names the file in
// the messages.
Result<FileIndex> check_index(const std::string& text, uint64_t index_offset, const std::string& path);

}  // namespace gcz::detail
