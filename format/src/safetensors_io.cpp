// .safetensors files: an 8-byte little-endian header length, a JSON header mapping each tensor name to
// {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the data section after the
// header), then the data. Read through a memory map; written with every offset computed up front.
#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "file_kind.h"
#include "file_util.h"
#include "json_shape.h"
#include "tensor_io_common.h"

namespace gcz::detail {
namespace {

using nlohmann::json;

// Largest JSON header accepted (the reference implementation's limit).
constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;
constexpr const char* kMetadataKey = "__metadata__";

std::optional<DType> float_dtype(const std::string& s) {
  if (s == "F16") return DType::kFloat16;
  if (s == "BF16") return DType::kBFloat16;
  if (s == "F32") return DType::kFloat32;
  if (s == "F64") return DType::kFloat64;
  return std::nullopt;
}

const char* dtype_code(DType d) {
  switch (d) {
    case DType::kFloat16: return "F16";
    case DType::kBFloat16: return "BF16";
    case DType::kFloat32: return "F32";
    case DType::kFloat64: return "F64";
  }
  return "";
}

// Bytes per element of the whole-byte dtypes, so their byte ranges can be checked too; 0 when unknown
// (sub-byte or future dtypes), whose ranges are then only checked for bounds and overlap.
uint64_t known_item_size(const std::string& s) {
  for (const char* one : {"BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0"}) {
    if (s == one) return 1;
  }
  for (const char* two : {"I16", "U16", "F16", "BF16"}) {
    if (s == two) return 2;
  }
  for (const char* four : {"I32", "U32", "F32"}) {
    if (s == four) return 4;
  }
  for (const char* eight : {"I64", "U64", "F64", "C64"}) {
    if (s == eight) return 8;
  }
  return 0;
}

// One header entry, validated against the data section.
struct Entry {
  std::string name;
  std::string dtype;
  Shape shape;
  uint64_t numel = 0;
  uint64_t begin = 0;
  uint64_t end = 0;
};

Result<uint64_t> unsigned_field(const json& v, const std::string& context, const char* what) {
  if (!v.is_number_unsigned()) return format_error(context + ": " + what + " is not a non-negative integer");
  return v.get<uint64_t>();
}

Result<Entry> parse_entry(const std::string& path, const std::string& name, const json& v, uint64_t data_size) {
  const std::string ctx = tensor_context(path, name);
  if (!v.is_object()) return format_error(ctx + ": header entry is not an object");
  const auto dtype = v.find("dtype");
  const auto shape = v.find("shape");
  const auto offsets = v.find("data_offsets");
  if (dtype == v.end() || !dtype->is_string()) return format_error(ctx + ": 'dtype' is missing or not a string");
  if (shape == v.end() || !shape->is_array()) return format_error(ctx + ": 'shape' is missing or not an array");
  if (offsets == v.end() || !offsets->is_array() || offsets->size() != 2) {
    return format_error(ctx + ": 'data_offsets' is missing or not a [begin, end] pair");
  }
  Entry e;
  e.name = name;
  e.dtype = dtype->get<std::string>();
  if (shape->size() > kMaxRank)
    return format_error(ctx + ": shape has more than " + std::to_string(kMaxRank) + " dimensions");
  for (const json& d : *shape) {
    GCZ_ASSIGN_OR_RETURN(uint64_t dim, unsigned_field(d, ctx, "a shape dimension"));
    e.shape.push_back(dim);
  }
  auto numel = checked_numel(e.shape);
  if (!numel) return format_error(ctx + ": " + numel.status().message());
  e.numel = *numel;
  GCZ_ASSIGN_OR_RETURN(e.begin, unsigned_field((*offsets)[0], ctx, "data_offsets[0]"));
  GCZ_ASSIGN_OR_RETURN(e.end, unsigned_field((*offsets)[1], ctx, "data_offsets[1]"));
  const std::string range = "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "]";
  if (e.begin > e.end) return format_error(ctx + ": " + range + " begin after end");
  if (e.end > data_size) {
    return format_error(ctx + ": " + range + " run past the data section (" + std::to_string(data_size) + " bytes)");
  }
  if (const uint64_t item = known_item_size(e.dtype); item != 0 && e.end - e.begin != e.numel * item) {
    return format_error(ctx + ": " + range + " hold " + std::to_string(e.end - e.begin) + " bytes, but shape " +
                        shape_to_string(e.shape) + " of " + e.dtype + " needs " + std::to_string(e.numel * item));
  }
  return e;
}

// Parses the header, rejecting duplicate tensor names (which a JSON object would silently merge).
Result<json> parse_header_json(const std::string& path, const char* text, std::size_t size) {
  // A header nests 3 deep ({name: {"shape": [...]}}). A tensor named twice is refused (which one to
  // read would be up to the parser; the reference keeps the last), as is an entry with a field twice
  // (which the reference refuses too); the free-form __metadata__ may repeat a key (the last counts).
  JsonShape shape("the safetensors header", 64, kMetadataKey);
  if (!json::sax_parse(text, text + size, &shape) || !shape.problem().empty()) {
    if (!shape.syntax_error().empty()) {
      return format_error(path + ": safetensors header is not valid JSON: " + shape.syntax_error());
    }
    if (shape.duplicate_depth() == 1) {
      return format_error(tensor_context(path, shape.duplicate()) + ": duplicate name in the header");
    }
    if (shape.outer_key().empty()) return format_error(path + ": " + shape.problem());
    return format_error(tensor_context(path, shape.outer_key()) + ": " + shape.problem());
  }
  GCZ_RETURN_IF_ERROR(check_memory_to_read(shape.dom_bytes(), path + ": the safetensors header"));
  json header = json::parse(text, text + size, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded()) return format_error(path + ": safetensors header is not valid JSON");
  if (!header.is_object()) return format_error(path + ": safetensors header is not a JSON object");
  return header;
}

// __metadata__: an object of strings, or null for none, as the reference implementation requires (it
// refuses others).
Result<std::map<std::string, std::string>> parse_metadata(const std::string& path, const json& value) {
  if (value.is_null()) return std::map<std::string, std::string>();
  if (!value.is_object()) return format_error(path + ": __metadata__ is not a JSON object of strings");
  std::map<std::string, std::string> out;
  for (auto it = value.begin(); it != value.end(); ++it) {
    if (!it.value().is_string()) {
      return format_error(path + ": __metadata__ '" + it.key() +
                          "' is not a string (safetensors metadata are strings)");
    }
    out[it.key()] = it.value().get<std::string>();
  }
  return out;
}

// The byte ranges tile the data section, as the reference implementation requires: no two share a
// byte, and every byte belongs to one (no gap between them, none after the last), so a file holds
// nothing its header does not account for. An empty range may point anywhere in the section.
Status check_tiling(const std::string& path, std::vector<Entry>& entries, uint64_t data_size) {
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  const Entry* widest = nullptr;  // the entry reaching furthest so far
  for (const Entry& e : entries) {
    const uint64_t covered = widest ? widest->end : 0;
    if (widest && e.begin < covered && e.end > e.begin) {
      return format_error(tensor_context(path, e.name) + ": data_offsets overlap those of tensor '" + widest->name +
                          "'");
    }
    if (e.begin > covered) {
      return format_error(tensor_context(path, e.name) + ": data_offsets begin at " + std::to_string(e.begin) +
                          ", leaving bytes " + std::to_string(covered) + ".." + std::to_string(e.begin - 1) +
                          " of the data section to no tensor");
    }
    if (!widest || e.end > widest->end) widest = &e;
  }
  if (const uint64_t covered = widest ? widest->end : 0; covered != data_size) {
    return format_error(path + ": the data section's last " + std::to_string(data_size - covered) +
                        " bytes (from offset " + std::to_string(covered) + ") belong to no tensor");
  }
  return Status::ok();
}

class SafetensorsReader final : public ReaderBase {
 public:
  SafetensorsReader(const std::string& path, std::shared_ptr<const MappedFile> file, uint64_t data_begin)
      : ReaderBase(path, TensorFileFormat::kSafetensors), file_(std::move(file)), data_begin_(data_begin) {}

  void set_metadata(std::map<std::string, std::string> m) { metadata_ = std::move(m); }

  void add(const Entry& e) {
    if (auto d = float_dtype(e.dtype)) {
      tensors_.push_back(TensorInfo{e.name, *d, e.shape});
      offsets_.push_back(e.begin);
      numels_.push_back(e.numel);
    } else {
      const char* why = e.dtype.rfind("F", 0) == 0 ? " is not supported (F16, BF16, F32 and F64 are)"
                        : known_item_size(e.dtype) != 0
                            ? " is not floating"
                            : " is not a safetensors dtype gcz knows (F16, BF16, F32 and F64 "
                              "are the floating ones it reads)";
      skipped_.push_back({e.name, "dtype " + e.dtype + why});
    }
  }

  Result<std::unique_ptr<TensorSource>> open(std::size_t i) override {
    GCZ_RETURN_IF_ERROR(check_index(i));
    ElementLayout layout;
    layout.item_size = dtype_size(tensors_[i].dtype);
    return std::unique_ptr<TensorSource>(
        new MappedTensorSource(file_, tensors_[i], numels_[i], data_begin_ + offsets_[i], layout));
  }

 private:
  std::shared_ptr<const MappedFile> file_;
  uint64_t data_begin_;
  std::vector<uint64_t> offsets_;  // per tensor, relative to data_begin_
  std::vector<uint64_t> numels_;
};

// The header for `tensors` laid out back to back in order, after `metadata` as __metadata__ (where there
// is any), padded with spaces to a multiple of 8 bytes so the data section starts aligned.
Result<std::string> make_header(const std::string& path, const std::vector<TensorInfo>& tensors,
                                const std::map<std::string, std::string>& metadata) {
  // Written member by member: an ordered_json object finds a key by a linear search, so building one
  // of n tensors took time n^2 (a minute for 250 000). The names are distinct (checked).
  std::string text = "{";
  auto member = [&text](const std::string& key, const nlohmann::ordered_json& value) {
    text += (text.size() > 1 ? "," : "") + nlohmann::ordered_json(key).dump() + ":" + value.dump();
  };
  uint64_t offset = 0;
  try {
    if (!metadata.empty()) member(kMetadataKey, metadata);
    for (const TensorInfo& t : tensors) {
      if (t.name == kMetadataKey) return invalid_argument(tensor_context(path, t.name) + ": the name is reserved");
      const auto end = checked_add(offset, t.byte_size().value());
      if (!end) return invalid_argument(path + ": tensors total more than 2^64 bytes");
      member(t.name, {{"dtype", dtype_code(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, *end}}});
      offset = *end;
    }
  } catch (const nlohmann::ordered_json::exception&) {
    return invalid_argument(path + ": a tensor name or metadata string is not valid UTF-8, which safetensors requires");
  }
  text += "}";
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

}  // namespace

Result<std::unique_ptr<TensorFileReader>> open_safetensors_reader(const std::string& path) {
  GCZ_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> mapped, MappedFile::open(path));
  std::shared_ptr<const MappedFile> file = std::move(mapped);
  if (file->size() < 8) {
    return format_error(path + ": safetensors file is " + std::to_string(file->size()) +
                        " bytes, too short for the 8-byte header length");
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(file->data()[i]);
  const std::string other = tensor_input_note(sniff_file_kind(file->data(), file->size()), FileKind::kSafetensors);
  if (n > kMaxHeaderBytes) {
    return format_error(path + ": safetensors header length " + std::to_string(n) + " exceeds the 100 MiB limit" +
                        other);
  }
  if (n > file->size() - 8) {
    return format_error(path + ": safetensors header length " + std::to_string(n) + " runs past the end of the file (" +
                        std::to_string(file->size()) + " bytes)" + other);
  }
  GCZ_ASSIGN_OR_RETURN(json header, parse_header_json(path, reinterpret_cast<const char*>(file->data()) + 8, n));
  const uint64_t data_begin = 8 + n;
  std::vector<Entry> entries;
  std::map<std::string, std::string> metadata;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == kMetadataKey) {
      GCZ_ASSIGN_OR_RETURN(metadata, parse_metadata(path, it.value()));
      continue;
    }
    GCZ_ASSIGN_OR_RETURN(Entry e, parse_entry(path, it.key(), it.value(), file->size() - data_begin));
    entries.push_back(std::move(e));
  }
  // Also sorts the entries by offset: the order to read them in.
  GCZ_RETURN_IF_ERROR(check_tiling(path, entries, file->size() - data_begin));
  auto reader = std::make_unique<SafetensorsReader>(path, file, data_begin);
  reader->set_metadata(std::move(metadata));
  for (const Entry& e : entries) reader->add(e);
  return std::unique_ptr<TensorFileReader>(std::move(reader));
}

WriterResult create_safetensors_writer(const std::string& path, const std::vector<TensorInfo>& tensors,
                                       const WriteOptions& options) {
  GCZ_ASSIGN_OR_RETURN(std::string header, make_header(path, tensors, options.safetensors_metadata));
  GCZ_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFile> file, AtomicFile::create(path));
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>((uint64_t{header.size()} >> (8 * i)) & 0xFF);
  GCZ_RETURN_IF_ERROR(file->write(len, sizeof len));
  GCZ_RETURN_IF_ERROR(file->write(header.data(), header.size()));
  return std::unique_ptr<TensorFileWriter>(new ContiguousWriter(path, tensors, /*widen_bf16=*/false, std::move(file)));
}

}  // namespace gcz::detail
