#include "gcz/codec_spec.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>

#include "gcz/detail/value_codec.h"

namespace gcz {
namespace {

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
         c == '.';
}

ParamValue typed_value(const std::string& s) {
  if (s.empty()) return s;
  errno = 0;
  char* end = nullptr;
  long long i = std::strtoll(s.c_str(), &end, 10);
  if (errno == 0 && end == s.c_str() + s.size()) return static_cast<int64_t>(i);
  // Decimal numbers only: strtod would also read hex floats, "inf" and "nan", which stay words.
  if (s.find_first_not_of("0123456789+-.eE") != std::string::npos) return s;
  errno = 0;
  double d = std::strtod(s.c_str(), &end);
  if (errno == 0 && end == s.c_str() + s.size()) return d;
  return s;
}

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  Result<CodecSpec> spec() {
    CodecSpec out;
    for (;;) {
      GCZ_ASSIGN_OR_RETURN(StageSpec stage, this->stage());
      out.stages.push_back(std::move(stage));
      if (pos_ < text_.size() && text_[pos_] == '+') {
        ++pos_;
        continue;
      }
      return out;
    }
  }

  bool at_end() const { return pos_ == text_.size(); }
  std::size_t pos() const { return pos_; }

  Status error(const std::string& what) const {
    return invalid_argument("codec spec '" + std::string(text_) + "': " + what + " at position " +
                            std::to_string(pos_ + 1));
  }

 private:
  std::string word() {
    std::size_t start = pos_;
    while (pos_ < text_.size() && is_name_char(text_[pos_])) ++pos_;
    return std::string(text_.substr(start, pos_ - start));
  }

  Result<StageSpec> stage() {
    StageSpec s;
    s.name = word();
    if (s.name.empty()) return error("expected a codec name");
    if (pos_ < text_.size() && text_[pos_] == ':') {
      ++pos_;
      for (;;) {
        std::string key = word();
        if (key.empty()) return error("expected a parameter name");
        if (pos_ >= text_.size() || text_[pos_] != '=') return error("expected '=' after '" + key + "'");
        ++pos_;
        GCZ_ASSIGN_OR_RETURN(ParamValue value, this->value());
        if (!s.params.emplace(key, std::move(value)).second) return error("parameter '" + key + "' given twice");
        if (pos_ < text_.size() && text_[pos_] == ',') {
          ++pos_;
          continue;
        }
        break;
      }
    }
    return s;
  }

  Result<ParamValue> value() {
    if (pos_ < text_.size() && text_[pos_] == '(') {
      int depth = 0;
      std::size_t start = pos_ + 1;
      for (; pos_ < text_.size(); ++pos_) {
        if (text_[pos_] == '(') ++depth;
        if (text_[pos_] == ')' && --depth == 0) break;
      }
      if (depth != 0) return error("unbalanced '('");
      std::string inner(text_.substr(start, pos_ - start));
      ++pos_;
      return ParamValue(inner);
    }
    std::string v = word();
    if (v.empty()) return error("expected a value");
    return typed_value(v);
  }

  std::string_view text_;
  std::size_t pos_ = 0;
};

}  // namespace

std::string CodecSpec::to_string() const {
  std::string out;
  for (std::size_t i = 0; i < stages.size(); ++i) {
    if (i) out += '+';
    out += stages[i].name;
    char sep = ':';
    for (const auto& [k, v] : stages[i].params) {
      out += sep;
      sep = ',';
      std::string text = param_to_string(v);
      bool nested = text.find_first_of(":+,=()") != std::string::npos;
      out += k + "=" + (nested ? "(" + text + ")" : text);
    }
  }
  return out;
}

Result<CodecSpec> parse_codec_spec(std::string_view text) {
  Parser p(text);
  GCZ_ASSIGN_OR_RETURN(CodecSpec spec, p.spec());
  if (!p.at_end()) return p.error("unexpected character '" + std::string(1, text[p.pos()]) + "'");
  return spec;
}

Result<EncodingPlan> plan_from_spec(const CodecSpec& spec) {
  EncodingPlan plan;
  if (spec.stages.empty()) return invalid_argument("codec spec is empty");
  plan.codec = spec.stages[0];
  if (plan.codec.name == "zstd") {
    return invalid_argument("zstd is a stream stage and must follow a codec, e.g. 'none+zstd'");
  }
  for (std::size_t i = 1; i < spec.stages.size(); ++i) {
    const StageSpec& st = spec.stages[i];
    if (st.name != "zstd") {
      return invalid_argument("stage '" + st.name + "' cannot follow a codec; only 'zstd' acts on streams" +
                              detail::exponent_plus_hint(spec));
    }
    if (plan.zstd_level) return invalid_argument("zstd given twice");
    for (const auto& [k, v] : st.params) {
      if (k != "level") return invalid_argument("codec 'zstd' has no parameter '" + k + "' (it takes level)");
    }
    GCZ_ASSIGN_OR_RETURN(int64_t level, get_int_param(st.params, "zstd", "level", kDefaultZstdLevel));
    if (level < 1 || level > kMaxZstdLevel) {
      return invalid_argument("codec 'zstd': level must be 1.." + std::to_string(kMaxZstdLevel) + ", got " +
                              std::to_string(level));
    }
    plan.zstd_level = static_cast<int>(level);
  }
  CodecSpec canonical = spec;
  if (plan.zstd_level) canonical.stages.back().params["level"] = int64_t{*plan.zstd_level};
  plan.text = canonical.to_string();
  return plan;
}

Result<EncodingPlan> parse_encoding_plan(std::string_view text) {
  GCZ_ASSIGN_OR_RETURN(CodecSpec spec, parse_codec_spec(text));  // its errors name the text already
  auto plan = plan_from_spec(spec);
  if (!plan) return plan.status().with_context("codec spec '" + std::string(text) + "'");
  return plan;
}

int nested_codec_depth(std::string_view text) {
  // Whether text[i] begins the value of "values=", "factors=" or "fallback=": a nested codec, in
  // parentheses or (one without parameters) bare, "values=fp16" as "values=(fp16)".
  auto begins_a_codec = [&](std::size_t i) {
    for (std::string_view key : {"values=", "factors=", "fallback="}) {
      if (i >= key.size() && text.substr(i - key.size(), key.size()) == key &&
          (i == key.size() || text[i - key.size() - 1] == ',' || text[i - key.size() - 1] == ':')) {
        return true;
      }
    }
    return false;
  };
  std::vector<bool> open;  // per '(' still open: whether it holds a codec
  int depth = 0, deepest = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const bool codec = begins_a_codec(i);
    if (codec) deepest = std::max(deepest, depth + 1);
    if (text[i] == '(') {
      open.push_back(codec);
      depth += codec ? 1 : 0;
    } else if (text[i] == ')' && !open.empty()) {
      depth -= open.back() ? 1 : 0;
      open.pop_back();
    }
  }
  return deepest;
}

std::string brief_spec(std::string_view text) {
  auto spec = parse_codec_spec(text);
  if (!spec) return std::string(text);
  auto nested = [](const std::string& key) { return key == "values" || key == "factors" || key == "fallback"; };
  for (StageSpec& stage : spec->stages) {
    Params defaults;
    if (stage.name == "zstd") {
      defaults["level"] = int64_t{kDefaultZstdLevel};
    } else if (auto made = make_codec(stage.name, {}, Backend::kCpu)) {
      defaults = (*made)->params();
    }
    for (auto it = stage.params.begin(); it != stage.params.end();) {
      auto def = defaults.find(it->first);
      if (nested(it->first) && std::holds_alternative<std::string>(it->second)) {
        it->second = brief_spec(std::get<std::string>(it->second));
        if (def != defaults.end()) def->second = brief_spec(param_to_string(def->second));
      }
      const bool is_default = def != defaults.end() && param_to_string(it->second) == param_to_string(def->second);
      it = is_default ? stage.params.erase(it) : std::next(it);  // by text: min_rate=2 is the default 2.0
    }
  }
  return spec->to_string();
}

Result<EncodingPlan> check_encoding_plan(std::string_view text) {
  GCZ_ASSIGN_OR_RETURN(EncodingPlan plan, parse_encoding_plan(text));
  const std::string where = "codec spec '" + detail::spec_excerpt(text) + "': ";
  auto codec = make_codec(plan.codec.name, plan.codec.params, Backend::kCpu);
  if (!codec) return invalid_argument(where + codec.status().message());
  // A codec can take its parameters and still refuse every tensor it would meet: Top-K hands its
  // kept values, a vector, to its value codec, and `topk:values=(powersgd)` fails on every tensor.
  // A tensor encoded now says so before any work: a 256 x 256 matrix, large enough that PowerSGD up
  // to rank 32 factors it (and so tries its factors' codec) rather than taking its fallback. Some
  // refusals depend on the size (a PowerSGD of the factors, whose min_rate only tall factors meet):
  // a spec the small matrix fails is refused only if a 2048 x 2048 one fails too. A spec accepted once
  // is not probed again (eval --steps checks its specs at every step).
  static std::mutex mutex;
  static std::set<std::string> accepted;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (accepted.count(plan.text) != 0) return plan;
  }
  Status refused;
  for (const uint64_t side : {uint64_t{256}, uint64_t{2048}}) {
    const TensorInfo probe{"probe", DType::kFloat32, {side, side}};
    std::vector<float> values(side * side);
    for (std::size_t i = 0; i < values.size(); ++i) values[i] = std::sin(0.37f * static_cast<float>(i) + 0.5f);
    GCZ_ASSIGN_OR_RETURN(StageSpec stage, stage_for_tensor(probe, plan.codec));
    auto made = make_codec(stage.name, stage.params, Backend::kCpu);
    if (!made) return invalid_argument(where + made.status().message());
    (*made)->set_context({0, tensor_key(probe.name)});
    std::vector<ByteBuffer> out((*made)->stream_names(probe).size());
    Status s = (*made)->encode(probe, values.data(), 0, values.size(), out);
    if (s) {
      std::lock_guard<std::mutex> lock(mutex);
      accepted.insert(plan.text);
      return plan;
    }
    if (refused) refused = s;  // the small matrix's reason
  }
  return invalid_argument(
      where + "it fails on every tensor (a 256x256 and a 2048x2048 float32 matrix both fail): " + refused.message());
}

}  // namespace gcz
