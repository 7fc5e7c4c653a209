#include "npy.h"

#include <cstring>
#include <string_view>
#include <utility>
#include <vector>

namespace gcz::detail {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr std::size_t kMagicSize = 6;
constexpr int kMaxLiteralDepth = 8;

// A value of the Python literal subset found in .npy headers: strings, non-negative integers, booleans,
// tuples, lists and dicts with string keys.
struct PyValue {
  enum class Kind { kString, kInt, kBool, kTuple, kList, kDict };
  Kind kind = Kind::kInt;
  std::string text;               // kString
  uint64_t integer = 0;           // kInt
  bool boolean = false;           // kBool
  std::vector<PyValue> items;     // kTuple, kList; dict values
  std::vector<std::string> keys;  // kDict keys, parallel to items
};

// A strict recursive-descent parser for that subset: anything else (expressions, negative numbers,
// floats, None) is rejected rather than guessed at.
class PyLiteralParser {
 public:
  explicit PyLiteralParser(std::string_view text) : s_(text) {}

  Result<PyValue> parse_value(int depth) {
    if (depth > kMaxLiteralDepth) return error("nesting too deep");
    skip_space();
    if (pos_ >= s_.size()) return error("unexpected end");
    const char c = s_[pos_];
    if (c == '\'' || c == '"') return parse_string();
    if (c >= '0' && c <= '9') return parse_int();
    if (c == '(') return parse_sequence(')', PyValue::Kind::kTuple, depth);
    if (c == '[') return parse_sequence(']', PyValue::Kind::kList, depth);
    if (c == '{') return parse_dict(depth);
    if (consume_word("True")) return make_bool(true);
    if (consume_word("False")) return make_bool(false);
    return error(std::string("unexpected character '") + c + "'");
  }

  // Whitespace, then the end of the text.
  Status expect_end() {
    skip_space();
    if (pos_ != s_.size()) return error("unexpected text after the dict");
    return Status::ok();
  }

 private:
  void skip_space() {
    // numpy pads with spaces and ends with '\n'; very old writers padded with NULs.
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\t' || s_[pos_] == '\r' || s_[pos_] == '\0')) {
      ++pos_;
    }
  }

  bool consume(char c) {
    skip_space();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  bool consume_word(std::string_view w) {
    if (s_.substr(pos_, w.size()) != w) return false;
    pos_ += w.size();
    return true;
  }

  static PyValue make_bool(bool b) {
    PyValue v;
    v.kind = PyValue::Kind::kBool;
    v.boolean = b;
    return v;
  }

  Result<PyValue> parse_string() {
    const char quote = s_[pos_++];
    PyValue v;
    v.kind = PyValue::Kind::kString;
    while (pos_ < s_.size() && s_[pos_] != quote) {
      if (s_[pos_] == '\\') {  // keep the escaped character itself; enough for names in descr lists
        if (++pos_ >= s_.size()) break;
      }
      v.text += s_[pos_++];
    }
    if (pos_ >= s_.size()) return error("unterminated string");
    ++pos_;
    return v;
  }

  Result<PyValue> parse_int() {
    PyValue v;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
      const auto m = checked_mul(v.integer, 10);
      const auto a = m ? checked_add(*m, static_cast<uint64_t>(s_[pos_] - '0')) : std::nullopt;
      if (!a) return error("integer out of range");
      v.integer = *a;
      ++pos_;
    }
    if (pos_ < s_.size() && s_[pos_] == 'L') ++pos_;  // Python 2 long, written by old numpy
    return v;
  }

  // A tuple or list. "(x)" without a comma is a parenthesised value, as in Python, not a tuple.
  Result<PyValue> parse_sequence(char close, PyValue::Kind kind, int depth) {
    ++pos_;
    PyValue v;
    v.kind = kind;
    bool saw_comma = false;
    while (!consume(close)) {
      if (!v.items.empty() && !saw_comma) return error("expected ',' or closing bracket");
      GCZ_ASSIGN_OR_RETURN(PyValue item, parse_value(depth + 1));
      v.items.push_back(std::move(item));
      saw_comma = consume(',');
    }
    if (kind == PyValue::Kind::kTuple && v.items.size() == 1 && !saw_comma) return std::move(v.items[0]);
    return v;
  }

  Result<PyValue> parse_dict(int depth) {
    ++pos_;
    PyValue v;
    v.kind = PyValue::Kind::kDict;
    bool saw_comma = true;
    while (!consume('}')) {
      if (!saw_comma) return error("expected ',' or '}'");
      GCZ_ASSIGN_OR_RETURN(PyValue key, parse_value(depth + 1));
      if (key.kind != PyValue::Kind::kString) return error("dict key is not a string");
      for (const std::string& k : v.keys) {
        if (k == key.text) return error("duplicate key '" + k + "'");
      }
      if (!consume(':')) return error("expected ':'");
      GCZ_ASSIGN_OR_RETURN(PyValue value, parse_value(depth + 1));
      v.keys.push_back(std::move(key.text));
      v.items.push_back(std::move(value));
      saw_comma = consume(',');
    }
    return v;
  }

  Status error(const std::string& what) const {
    return format_error("npy header: " + what + " at offset " + std::to_string(pos_) + " of the dict");
  }

  std::string_view s_;
  std::size_t pos_ = 0;
};

uint64_t read_le(const std::byte* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

// What a descr string says: a supported float dtype, or why the array is not one.
struct DescrInfo {
  std::optional<DType> dtype;
  bool big_endian = false;
  std::string reason;
};

Result<DescrInfo> parse_descr(const std::string& descr) {
  std::string_view d = descr;
  char order = '=';
  if (!d.empty() && (d[0] == '<' || d[0] == '>' || d[0] == '|' || d[0] == '=')) {
    order = d[0];
    d.remove_prefix(1);
  }
  constexpr std::string_view kKinds = "biufcmMOSaUV?";
  if (d.empty() || kKinds.find(d[0]) == std::string_view::npos) {
    return format_error("npy header: unknown descr '" + descr + "'");
  }
  DescrInfo info;
  const char kind = d[0];
  d.remove_prefix(1);
  if (kind != 'f') {
    info.reason = "dtype " + descr + " is not floating";
    return info;
  }
  if (d == "2") info.dtype = DType::kFloat16;
  if (d == "4") info.dtype = DType::kFloat32;
  if (d == "8") info.dtype = DType::kFloat64;
  if (!info.dtype) {
    info.reason = "dtype " + descr + " is not supported (float16, float32 and float64 are)";
    return info;
  }
  info.big_endian = order == '>';
  return info;
}

Result<Shape> shape_from(const PyValue& v) {
  if (v.kind != PyValue::Kind::kTuple) return format_error("npy header: 'shape' is not a tuple");
  if (v.items.size() > kMaxRank) {
    return format_error("npy header: shape has " + std::to_string(v.items.size()) + " dimensions, more than " +
                        std::to_string(kMaxRank));
  }
  Shape shape;
  for (const PyValue& d : v.items) {
    if (d.kind != PyValue::Kind::kInt) return format_error("npy header: 'shape' holds a non-integer");
    shape.push_back(d.integer);
  }
  return shape;
}

// Fills descr, fortran_order and shape from the parsed dict, which must have exactly those keys.
Status fill_from_dict(const PyValue& dict, NpyHeader& h) {
  if (dict.kind != PyValue::Kind::kDict) return format_error("npy header: not a dict");
  const PyValue* descr = nullptr;
  const PyValue* fortran = nullptr;
  const PyValue* shape = nullptr;
  for (std::size_t i = 0; i < dict.keys.size(); ++i) {
    const std::string& k = dict.keys[i];
    if (k == "descr")
      descr = &dict.items[i];
    else if (k == "fortran_order")
      fortran = &dict.items[i];
    else if (k == "shape")
      shape = &dict.items[i];
    else
      return format_error("npy header: unexpected key '" + k + "'");
  }
  if (!descr || !fortran || !shape) return format_error("npy header: missing one of 'descr', 'fortran_order', 'shape'");
  if (fortran->kind != PyValue::Kind::kBool) return format_error("npy header: 'fortran_order' is not True or False");
  h.fortran_order = fortran->boolean;
  GCZ_ASSIGN_OR_RETURN(h.shape, shape_from(*shape));
  if (descr->kind == PyValue::Kind::kList) {
    h.descr = "structured";
    h.not_float_reason = "structured dtype is not floating";
    return Status::ok();
  }
  if (descr->kind != PyValue::Kind::kString) return format_error("npy header: 'descr' is not a string or list");
  h.descr = descr->text;
  GCZ_ASSIGN_OR_RETURN(DescrInfo info, parse_descr(h.descr));
  h.dtype = info.dtype;
  h.big_endian = info.big_endian;
  h.not_float_reason = info.reason;
  return Status::ok();
}

// Copies C-order elements starting at `first` from a column-major payload: walks the C-order index
// like an odometer while tracking the matching Fortran-order offset.
template <std::size_t kItem>
void gather_fortran(const Shape& shape, const std::byte* payload, uint64_t first, uint64_t count, void* dst) {
  const std::size_t rank = shape.size();
  std::vector<uint64_t> idx(rank), stride(rank);
  uint64_t s = 1;
  for (std::size_t k = 0; k < rank; ++k) {
    stride[k] = s;
    s *= shape[k];
  }
  uint64_t rest = first, offset = 0;
  for (std::size_t k = rank; k-- > 0;) {
    idx[k] = rest % shape[k];
    rest /= shape[k];
    offset += idx[k] * stride[k];
  }
  auto* out = static_cast<std::byte*>(dst);
  for (uint64_t n = 0; n < count; ++n) {
    std::memcpy(out + n * kItem, payload + offset * kItem, kItem);
    for (std::size_t k = rank; k-- > 0;) {
      if (++idx[k] < shape[k]) {
        offset += stride[k];
        break;
      }
      offset -= (shape[k] - 1) * stride[k];
      idx[k] = 0;
    }
  }
}

}  // namespace

Result<NpyPreamble> parse_npy_preamble(const std::byte* data, uint64_t size) {
  if (size < kMagicSize || std::memcmp(data, kMagic, kMagicSize) != 0) {
    return format_error("not a .npy file (no \\x93NUMPY magic)");
  }
  if (size < 10) return format_error("npy header: truncated in the version and header length");
  NpyPreamble p;
  p.major = static_cast<uint8_t>(data[6]);
  p.minor = static_cast<uint8_t>(data[7]);
  if (p.major < 1 || p.major > 3 || p.minor != 0) {
    return unsupported("npy format version " + std::to_string(p.major) + "." + std::to_string(p.minor) +
                       " is not supported (1.0, 2.0 and 3.0 are)");
  }
  const int len_bytes = p.major == 1 ? 2 : 4;
  if (size < static_cast<uint64_t>(8 + len_bytes)) return format_error("npy header: truncated in the header length");
  const uint64_t len = read_le(data + 8, len_bytes);
  if (len > kNpyMaxHeaderBytes) {
    return format_error("npy header: length " + std::to_string(len) + " exceeds the limit of 1 MiB");
  }
  p.header_end = 8 + len_bytes + len;
  return p;
}

Result<NpyHeader> parse_npy_header(const std::byte* data, uint64_t size) {
  GCZ_ASSIGN_OR_RETURN(NpyPreamble pre, parse_npy_preamble(data, size));
  if (size < pre.header_end) {
    return format_error("npy header: truncated: " + std::to_string(size) + " bytes, the header needs " +
                        std::to_string(pre.header_end));
  }
  const uint64_t begin = pre.major == 1 ? 10 : 12;
  PyLiteralParser parser(std::string_view(reinterpret_cast<const char*>(data) + begin, pre.header_end - begin));
  GCZ_ASSIGN_OR_RETURN(PyValue dict, parser.parse_value(0));
  GCZ_RETURN_IF_ERROR(parser.expect_end());
  NpyHeader h;
  GCZ_RETURN_IF_ERROR(fill_from_dict(dict, h));
  auto numel = checked_numel(h.shape);
  if (!numel) return format_error("npy header: " + numel.status().message());
  h.numel = *numel;
  h.data_offset = pre.header_end;
  if (h.dtype) h.payload_bytes = h.numel * dtype_size(*h.dtype);  // numel <= 2^48: no overflow
  return h;
}

ElementLayout NpyHeader::layout() const {
  ElementLayout l;
  l.item_size = dtype ? dtype_size(*dtype) : 1;
  l.byte_swapped = big_endian && l.item_size > 1;
  // With at most one dimension longer than 1, Fortran and C order put the elements in the same order.
  int long_dims = 0;
  for (uint64_t d : shape) long_dims += d > 1 ? 1 : 0;
  l.fortran_order = fortran_order && long_dims > 1;
  l.shape = shape;
  return l;
}

const char* npy_descr(DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return "<f2";
    case DType::kFloat32: return "<f4";
    case DType::kFloat64: return "<f8";
    case DType::kBFloat16: break;
  }
  return "";
}

std::string make_npy_header(DType dtype, const Shape& shape) {
  std::string dims;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) dims += ", ";
    dims += std::to_string(shape[i]);
  }
  if (shape.size() == 1) dims += ",";
  const std::string dict =
      std::string("{'descr': '") + npy_descr(dtype) + "', 'fortran_order': False, 'shape': (" + dims + "), }";
  // numpy's rule: pad with spaces so that magic + version + length + header is a multiple of 64, then '\n'.
  auto build = [&](int major, std::size_t prefix) {
    const std::size_t unpadded = prefix + dict.size() + 1;
    const std::size_t len = dict.size() + (64 - unpadded % 64) % 64 + 1;
    std::string out(kMagic, kMagicSize);
    out += static_cast<char>(major);
    out += '\0';
    for (std::size_t i = 0; i < prefix - 8; ++i) out += static_cast<char>((len >> (8 * i)) & 0xFF);
    out += dict;
    out.append(len - dict.size() - 1, ' ');
    out += '\n';
    return out;
  };
  std::string v1 = build(1, 10);
  if (v1.size() - 10 <= 65535) return v1;
  return build(2, 12);
}

void byte_swap_elements(void* data, uint64_t count, std::size_t item_size) {
  auto* p = static_cast<std::byte*>(data);
  auto swap_each = [&](auto word, auto swap) {
    for (uint64_t i = 0; i < count; ++i, p += sizeof word) {
      std::memcpy(&word, p, sizeof word);
      word = swap(word);
      std::memcpy(p, &word, sizeof word);
    }
  };
  if (item_size == 2) swap_each(uint16_t{}, [](uint16_t w) { return __builtin_bswap16(w); });
  if (item_size == 4) swap_each(uint32_t{}, [](uint32_t w) { return __builtin_bswap32(w); });
  if (item_size == 8) swap_each(uint64_t{}, [](uint64_t w) { return __builtin_bswap64(w); });
}

void copy_elements(const ElementLayout& layout, const std::byte* payload, uint64_t first, uint64_t count, void* dst) {
  if (count == 0) return;
  if (!layout.fortran_order) {
    std::memcpy(dst, payload + first * layout.item_size, count * layout.item_size);
  } else if (layout.item_size == 2) {
    gather_fortran<2>(layout.shape, payload, first, count, dst);
  } else if (layout.item_size == 4) {
    gather_fortran<4>(layout.shape, payload, first, count, dst);
  } else {
    gather_fortran<8>(layout.shape, payload, first, count, dst);
  }
  if (layout.byte_swapped) byte_swap_elements(dst, count, layout.item_size);
}

}  // namespace gcz::detail
