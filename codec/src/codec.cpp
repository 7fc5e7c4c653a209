#include "gcz/codec.h"

#include <xxhash.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "codecs/powersgd.h"
#include "codecs/qsgd.h"
#include "codecs/randomk.h"
#include "codecs/terngrad.h"
#include "codecs/topk.h"
#include "cuda_hooks.h"
#include "gcz/detail/cast_codec.h"
#include "gcz/detail/value_codec.h"

namespace gcz {

std::string param_to_string(const ParamValue& v) {
  if (const auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (const auto* d = std::get_if<double>(&v)) {
    // Shortest form that reads back exactly; no '+' in exponents, since '+' separates stages.
    char buf[40];
    for (int precision = 1; precision <= 17; ++precision) {
      std::snprintf(buf, sizeof buf, "%.*g", precision, *d);
      if (std::strtod(buf, nullptr) == *d) break;
    }
    std::string out = buf;
    if (auto e = out.find("e+"); e != std::string::npos) out.erase(e + 1, 1);
    return out;
  }
  return std::get<std::string>(v);
}

namespace {

// What a word parameter's text reads as: no number, a number, or a number beyond float64.
enum class WordNumber { kNone, kNumber, kOutOfRange };

WordNumber word_number(const std::string& text) {
  if (text.empty() || text.find_first_not_of("0123456789+-.eE") != std::string::npos) return WordNumber::kNone;
  errno = 0;
  char* end = nullptr;
  std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size()) return WordNumber::kNone;
  return errno == ERANGE ? WordNumber::kOutOfRange : WordNumber::kNumber;
}

// A parameter's value in a message: a word that reads as a number was one in parentheses, "(4)", or
// a JSON string in a file's index.
std::string shown_param(const ParamValue& v) {
  std::string text = param_to_string(v);
  text.insert(0, 1, '\'');  // not "'" + ...: GCC 12 warns of a false overlap there (-Wrestrict)
  text.push_back('\'');
  const auto* word = std::get_if<std::string>(&v);
  if (word && word_number(*word) == WordNumber::kNumber) {
    text.append(", a word (a number in parentheses or quotes is one)");
  }
  return text;
}

}  // namespace

Result<int64_t> get_int_param(const Params& p, std::string_view codec, std::string_view key, int64_t def) {
  auto it = p.find(key);
  if (it == p.end()) return def;
  if (const auto* i = std::get_if<int64_t>(&it->second)) return *i;
  const std::string what = "codec '" + std::string(codec) + "': parameter '" + std::string(key) + "'";
  if (const auto* d = std::get_if<double>(&it->second); d && *d == std::floor(*d)) {
    if (std::fabs(*d) < 0x1p63) {  // "3.0", "1e6": whole, but written as a decimal number
      char whole[32];
      std::snprintf(whole, sizeof whole, "%.0f", *d);  // 10, not the canonical 1e01
      return invalid_argument(what + " must be an integer, got the decimal number " + whole +
                              " (write it without a point or exponent)");
    }
    return invalid_argument(what + " must be an integer of at most " +
                            std::to_string(std::numeric_limits<int64_t>::max()) + " in magnitude, got " +
                            param_to_string(it->second));
  }
  return invalid_argument(what + " must be an integer, got " + shown_param(it->second));
}

Result<double> get_number_param(const Params& p, std::string_view codec, std::string_view key, double def) {
  auto it = p.find(key);
  if (it == p.end()) return def;
  if (const auto* i = std::get_if<int64_t>(&it->second)) return static_cast<double>(*i);
  if (const auto* d = std::get_if<double>(&it->second)) return *d;
  const bool out_of_range = word_number(param_to_string(it->second)) == WordNumber::kOutOfRange;
  const char* what = out_of_range ? "a number float64 can hold (magnitudes from about 2.2e-308 to 1.8e308)" : "a number";
  return invalid_argument("codec '" + std::string(codec) + "': parameter '" + std::string(key) + "' must be " + what +
                          ", got " + shown_param(it->second));
}

Result<std::string> get_choice_param(const Params& p, std::string_view codec, std::string_view key,
                                     const std::vector<std::string>& allowed, std::string_view def) {
  auto it = p.find(key);
  std::string value = it == p.end() ? std::string(def) : param_to_string(it->second);
  for (const std::string& a : allowed) {
    if (a == value) return value;
  }
  std::string list;
  for (const std::string& a : allowed) list += (list.empty() ? "" : ", ") + a;
  return invalid_argument("codec '" + std::string(codec) + "': parameter '" + std::string(key) + "' must be one of " +
                          list + ", got '" + value + "'");
}

Status check_param_keys(const Params& p, std::string_view codec, const std::vector<std::string>& known) {
  for (const auto& [k, v] : p) {
    bool ok = false;
    for (const std::string& name : known) ok = ok || name == k;
    if (!ok) {
      std::string list;
      for (const std::string& name : known) list += (list.empty() ? "" : ", ") + name;
      return invalid_argument("codec '" + std::string(codec) + "' has no parameter '" + k + "'" +
                              (list.empty() ? std::string(" (it takes none)") : " (it takes " + list + ")"));
    }
  }
  return Status::ok();
}

uint64_t tensor_key(std::string_view name) { return XXH3_64bits(name.data(), name.size()); }

namespace {

using Factory = Result<std::unique_ptr<Codec>> (*)(const Params&, Backend);

Result<std::unique_ptr<Codec>> make_cast(std::string_view name, const Params& params, Backend backend) {
  GCZ_RETURN_IF_ERROR(check_param_keys(params, name, {}));
  if (backend == Backend::kCuda) return cuda::make_codec(name, params);
  return std::unique_ptr<Codec>(new detail::CastCodec(std::string(name), *detail::cast_codec_target(name)));
}

// The element codecs. Each codec family declares its factory in codec/src/codecs/<family>.h.
struct Entry {
  const char* name;
  Factory factory;
};
const Entry kCodecs[] = {
    {"none", [](const Params& p, Backend b) { return make_cast("none", p, b); }},
    {"fp32", [](const Params& p, Backend b) { return make_cast("fp32", p, b); }},
    {"fp16", [](const Params& p, Backend b) { return make_cast("fp16", p, b); }},
    {"bf16", [](const Params& p, Backend b) { return make_cast("bf16", p, b); }},
    {"qsgd", make_qsgd_codec},
    {"terngrad", make_terngrad_codec},
    {"topk", codecs::make_topk},
    {"randomk", codecs::make_randomk},
    {"powersgd", make_powersgd_codec},
    // gcz-codec-registry: one line per codec family above this comment.
};

}  // namespace

std::vector<std::string> codec_names() {
  std::vector<std::string> out;
  for (const Entry& e : kCodecs) out.push_back(e.name);
  return out;
}

Result<std::unique_ptr<Codec>> make_codec(std::string_view name, const Params& params, Backend backend) {
  for (const Entry& e : kCodecs) {
    if (name != e.name) continue;
    GCZ_ASSIGN_OR_RETURN(std::unique_ptr<Codec> codec, e.factory(params, backend));
    if (const std::size_t n = codec->stream_names({}).size(); n > detail::kMaxCodecStreams) {
      return invalid_argument("codec '" + std::string(name) + "' with its value codecs writes " + std::to_string(n) +
                              " streams, more than " + std::to_string(detail::kMaxCodecStreams));
    }
    return codec;
  }
  std::string known;
  for (const auto& n : codec_names()) known += (known.empty() ? "" : ", ") + n;
  return unsupported("unknown codec '" + std::string(name) + "' (known: " + known + ")");
}

}  // namespace gcz
