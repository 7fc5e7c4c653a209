#include "index_json.h"

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <vector>

#include "file_util.h"
#include "gcz/detail/utf8.h"
#include "json_shape.h"

namespace gcz::detail {
namespace {

using json = nlohmann::json;

json params_to_json(const Params& params) {
  json out = json::object();
  for (const auto& [k, v] : params) {
    if (const auto* i = std::get_if<int64_t>(&v)) out[k] = *i;
    else if (const auto* d = std::get_if<double>(&v)) out[k] = *d;
    else out[k] = std::get<std::string>(v);
  }
  return out;
}

// The metrics an index stores (FORMAT.md §5.5): counts, and numbers written null where not finite.
struct MetricField {
  const char* key;
  uint64_t Metrics::*count;
  double Metrics::*number;
};
constexpr MetricField kStoredMetrics[] = {
    {"numel", &Metrics::numel, nullptr},
    {"bytes_in", &Metrics::bytes_in, nullptr},
    {"bytes_out", &Metrics::bytes_out, nullptr},
    {"ratio", nullptr, &Metrics::ratio},
    {"bits_per_element", nullptr, &Metrics::bits_per_element},
    {"rel_l2", nullptr, &Metrics::rel_l2},
    {"cosine", nullptr, &Metrics::cosine},
    {"max_abs_error", nullptr, &Metrics::max_abs_error},
    {"snr_db", nullptr, &Metrics::snr_db},
    {"norm_ratio", nullptr, &Metrics::norm_ratio},
    {"mean_error", nullptr, &Metrics::mean_error},
    {"nonfinite", &Metrics::nonfinite, nullptr},
};

json metrics_to_json(const Metrics& m) {
  json out = json::object();
  for (const MetricField& f : kStoredMetrics) {
    if (f.count)
      out[f.key] = m.*f.count;
    else
      out[f.key] = std::isfinite(m.*f.number) ? json(m.*f.number) : json(nullptr);
  }
  return out;
}

// The stored metrics, which are informative (FORMAT.md §5.5): kept for `gcz info --json` where they
// have the fields and types metrics_to_json writes (null: not finite), and dropped otherwise.
std::optional<Metrics> metrics_from_json(const json& j) {
  if (!j.is_object()) return std::nullopt;
  Metrics m;
  for (const MetricField& f : kStoredMetrics) {
    auto it = j.find(f.key);
    if (it == j.end()) return std::nullopt;
    if (f.count && it->is_number_unsigned())
      m.*f.count = it->get<uint64_t>();
    else if (f.number && (it->is_number() || it->is_null()))
      m.*f.number = it->is_null() ? std::nan("") : it->get<double>();
    else
      return std::nullopt;
  }
  return m;
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

json tensor_to_json(const TensorRecord& t, bool with_metrics) {
  json chain = json::array();
  for (const CodecStage& st : t.chain) chain.push_back({{"name", st.name}, {"params", params_to_json(st.params)}});
  json streams = json::array();
  for (const StreamRecord& s : t.streams) {
    streams.push_back({{"name", s.name},
                       {"encoding", stream_encoding_name(s.encoding)},
                       {"offset", s.offset},
                       {"length", s.length},
                       {"size", s.size},
                       {"xxh3", hex64(s.xxh3)}});
  }
  json out = {{"name", t.info.name}, {"dtype", dtype_name(t.info.dtype)}, {"shape", t.info.shape},
              {"codec", chain},      {"seed", t.seed},                     {"rng", t.rng},
              {"streams", streams}};
  if (with_metrics && t.metrics) out["metrics"] = metrics_to_json(*t.metrics);
  return out;
}

// Schema checks raise this; parse_index turns it into an index-schema error.
struct SchemaError {
  std::string tensor;
  std::string detail;
};

const json& field(const json& obj, const char* key, json::value_t type, const std::string& tensor) {
  auto it = obj.find(key);
  if (it == obj.end()) throw SchemaError{tensor, std::string("missing key '") + key + "'"};
  const bool ok = it->type() == type ||
                  (type == json::value_t::number_unsigned && it->type() == json::value_t::number_integer &&
                   it->get<int64_t>() >= 0);
  if (!ok) throw SchemaError{tensor, std::string("key '") + key + "' has the wrong type"};
  return *it;
}

uint64_t u64_field(const json& obj, const char* key, const std::string& tensor) {
  return field(obj, key, json::value_t::number_unsigned, tensor).get<uint64_t>();
}

Result<Params> params_from_json(const json& j, const std::string& tensor) {
  Params p;
  for (const auto& [k, v] : j.items()) {
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      p[k] = INT64_MAX;  // saturate: every integer parameter is bounded far below this
    } else if (v.is_number_integer()) {
      p[k] = v.get<int64_t>();
    } else if (v.is_number_float()) {
      p[k] = v.get<double>();
    } else if (v.is_string()) {
      p[k] = v.get<std::string>();
    } else {
      throw SchemaError{tensor, "codec parameter '" + k + "' has an unsupported type"};
    }
  }
  return p;
}

std::optional<uint64_t> parse_hex64(const std::string& s) {
  if (s.size() != 16) return std::nullopt;
  uint64_t v = 0;
  for (char c : s) {
    int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
    if (d < 0) return std::nullopt;
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  return v;
}

}  // namespace

Status rule_error(StatusCode code, const std::string& path, const std::string& tensor, const std::string& rule,
                  const std::string& detail) {
  std::string msg = path + ": ";
  if (!tensor.empty()) msg += "tensor '" + tensor + "': ";
  return {code, msg + rule + ": " + detail};
}

std::string serialize_index(const FileIndex& index) {
  // The text one JSON object of all would dump (its keys in order: format, metadata, producer,
  // tensors, version), written a tensor at a time so that only one tensor's tree is held at once.
  auto dump = [](const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); };
  json meta = json::object();
  for (const auto& [k, v] : index.metadata) meta[k] = v;
  std::string out = dump({{"format", "gcz"}, {"metadata", meta}, {"producer", index.producer}});
  out.pop_back();  // the closing brace
  out += ",\"tensors\":[";
  for (std::size_t i = 0; i < index.tensors.size(); ++i) {
    if (i) out += ',';
    out += dump(tensor_to_json(index.tensors[i], true));
  }
  out += "],\"version\":" + dump(json(kFormatVersionMajor)) + "}";
  return out;
}

uint64_t tensor_entry_bytes(const TensorRecord& record) {
  return tensor_to_json(record, false).dump(-1, ' ', false, json::error_handler_t::replace).size() + 1;
}

constexpr const char* kNotJson = "the index is not a valid JSON object";

Result<FileIndex> parse_index(const std::string& text, uint16_t version_major, const std::string& path) {
  // The parser stops at a NUL byte as at the end of the text; JSON text holds none.
  if (text.find('\0') != std::string::npos) {
    return rule_error(StatusCode::kFormatError, path, "", "index-json", kNotJson);
  }
  JsonShape shape("the index", kMaxIndexDepth);  // FORMAT.md §5: no key twice, at most 512 deep
  if (!json::sax_parse(text, &shape) || !shape.problem().empty()) {
    return rule_error(StatusCode::kFormatError, path, "", "index-json",
                      shape.problem().empty() || !shape.syntax_error().empty() ? kNotJson : shape.problem());
  }
  GCZ_RETURN_IF_ERROR(
      check_memory_to_read(shape.dom_bytes(), (path.empty() ? std::string("a .gcz") : path) + ": the index"));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return rule_error(StatusCode::kFormatError, path, "", "index-json", kNotJson);
  FileIndex index;
  std::string current;  // tensor being parsed, for messages
  try {
    if (field(j, "format", json::value_t::string, "").get<std::string>() != "gcz") {
      throw SchemaError{"", "'format' is not \"gcz\""};
    }
    if (u64_field(j, "version", "") != version_major) {
      throw SchemaError{"", "index 'version' differs from the header's version_major"};
    }
    index.producer = field(j, "producer", json::value_t::string, "").get<std::string>();
    if (auto it = j.find("metadata"); it != j.end()) {
      if (!it->is_object()) throw SchemaError{"", "'metadata' is not an object"};
      for (const auto& [k, v] : it->items()) {
        if (!v.is_string()) throw SchemaError{"", "metadata value '" + k + "' is not a string"};
        index.metadata[k] = v.get<std::string>();
      }
    }
    std::set<std::string> names;
    for (const json& t : field(j, "tensors", json::value_t::array, "")) {
      if (!t.is_object()) throw SchemaError{"", "a tensor entry is not an object"};
      TensorRecord rec;
      current = "";
      rec.info.name = field(t, "name", json::value_t::string, "").get<std::string>();
      if (rec.info.name.empty() || rec.info.name.size() > kMaxNameBytes) {
        return rule_error(
            StatusCode::kFormatError, path, std::string(utf8_prefix(rec.info.name, 64)), "duplicate-name",
            "a tensor name must be 1-4096 bytes, and this one has " + std::to_string(rec.info.name.size()));
      }
      current = rec.info.name;
      if (!names.insert(rec.info.name).second) {
        return rule_error(StatusCode::kFormatError, path, current, "duplicate-name", "the name occurs twice");
      }
      const std::string dtype = field(t, "dtype", json::value_t::string, current).get<std::string>();
      auto dt = dtype == "float16" || dtype == "bfloat16" || dtype == "float32" || dtype == "float64"
                    ? parse_dtype(dtype)
                    : std::nullopt;
      if (!dt) return rule_error(StatusCode::kFormatError, path, current, "bad-dtype", "unknown dtype '" + dtype + "'");
      rec.info.dtype = *dt;
      const json& shape = field(t, "shape", json::value_t::array, current);
      if (shape.size() > kMaxRank) {
        return rule_error(StatusCode::kFormatError, path, current, "bad-shape", "more than 32 dimensions");
      }
      for (const json& d : shape) {
        if (!d.is_number_unsigned() && !(d.is_number_integer() && d.get<int64_t>() >= 0)) {
          throw SchemaError{current, "a shape dimension is not a non-negative integer"};
        }
        rec.info.shape.push_back(d.get<uint64_t>());
      }
      if (auto n = checked_numel(rec.info.shape); !n) {
        return rule_error(StatusCode::kFormatError, path, current, "bad-shape", n.status().message());
      }
      const json& chain = field(t, "codec", json::value_t::array, current);
      if (chain.empty()) throw SchemaError{current, "'codec' has no stage"};
      for (const json& st : chain) {
        if (!st.is_object()) throw SchemaError{current, "a codec stage is not an object"};
        CodecStage stage;
        stage.name = field(st, "name", json::value_t::string, current).get<std::string>();
        GCZ_ASSIGN_OR_RETURN(stage.params,
                             params_from_json(field(st, "params", json::value_t::object, current), current));
        if (st.size() != 2) {  // a key beside name and params could change what the bytes mean
          return rule_error(StatusCode::kUnsupported, path, current, "unknown-codec",
                            "codec stage '" + stage.name + "' has a key other than 'name' and 'params'");
        }
        rec.chain.push_back(std::move(stage));
      }
      rec.seed = u64_field(t, "seed", current);
      rec.rng = field(t, "rng", json::value_t::string, current).get<std::string>();
      for (const json& s : field(t, "streams", json::value_t::array, current)) {
        if (!s.is_object()) throw SchemaError{current, "a stream entry is not an object"};
        StreamRecord sr;
        sr.name = field(s, "name", json::value_t::string, current).get<std::string>();
        const std::string enc = field(s, "encoding", json::value_t::string, current).get<std::string>();
        if (enc == "raw") sr.encoding = StreamEncoding::kRaw;
        else if (enc == "zstd") sr.encoding = StreamEncoding::kZstd;
        else return rule_error(StatusCode::kFormatError, path, current, "bad-encoding",
                               "stream '" + sr.name + "' has unknown encoding '" + enc + "'");
        sr.offset = u64_field(s, "offset", current);
        sr.length = u64_field(s, "length", current);
        sr.size = u64_field(s, "size", current);
        auto h = parse_hex64(field(s, "xxh3", json::value_t::string, current).get<std::string>());
        if (!h) throw SchemaError{current, "stream '" + sr.name + "' xxh3 is not 16 lowercase hex digits"};
        sr.xxh3 = *h;
        rec.streams.push_back(std::move(sr));
      }
      if (auto m = t.find("metrics"); m != t.end()) rec.metrics = metrics_from_json(*m);
      index.tensors.push_back(std::move(rec));
    }
  } catch (const SchemaError& e) {
    return rule_error(StatusCode::kFormatError, path, e.tensor, "index-schema", e.detail);
  } catch (const json::exception& e) {
    return rule_error(StatusCode::kFormatError, path, current, "index-schema", e.what());
  }
  return index;
}

}  // namespace gcz::detail
