#include "gcz/codec.h"

#include <cstdio>

#include <xxhash.h>

#include "cuda_hooks.h"
#include "gcz/detail/cast_codec.h"

namespace gcz {

std::string param_to_string(const ParamValue& v) {
  if (const auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (const auto* d = std::get_if<double>(&v)) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.17g", *d);
    return buf;
  }
  return std::get<std::string>(v);
}

Result<int64_t> get_int_param(const Params& p, std::string_view codec, std::string_view key, int64_t def) {
  auto it = p.find(key);
  if (it == p.end()) return def;
  if (const auto* i = std::get_if<int64_t>(&it->second)) return *i;
  return invalid_argument("codec '" + std::string(codec) + "': parameter '" + std::string(key) +
                          "' must be an integer, got '" + param_to_string(it->second) + "'");
}

Result<double> get_number_param(const Params& p, std::string_view codec, std::string_view key, double def) {
  auto it = p.find(key);
  if (it == p.end()) return def;
  if (const auto* i = std::get_if<int64_t>(&it->second)) return static_cast<double>(*i);
  if (const auto* d = std::get_if<double>(&it->second)) return *d;
  return invalid_argument("codec '" + std::string(codec) + "': parameter '" + std::string(key) +
                          "' must be a number, got '" + param_to_string(it->second) + "'");
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

std::vector<std::string> codec_names() { return {"none", "fp32", "fp16", "bf16"}; }

Result<std::unique_ptr<Codec>> make_codec(std::string_view name, const Params& params, Backend backend) {
  auto target = detail::cast_codec_target(name);
  if (!target) {
    std::string known;
    for (const auto& n : codec_names()) known += (known.empty() ? "" : ", ") + n;
    return unsupported("unknown codec '" + std::string(name) + "' (known: " + known + ")");
  }
  if (!params.empty()) {
    return invalid_argument("codec '" + std::string(name) + "' takes no parameters, got '" +
                            params.begin()->first + "'");
  }
  if (backend == Backend::kCuda) return cuda::make_codec(name, params);
  return std::unique_ptr<Codec>(new detail::CastCodec(std::string(name), *target));
}

}  // namespace gcz
