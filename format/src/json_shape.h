// json_shape.h — what gcz asks of JSON beyond RFC 8259, checked in one SAX pass that builds nothing:
// no object has a key twice (RFC 8259 leaves that to each parser, and most keep the last: gcz refuses
// it, so that every reader sees the same thing), and arrays and objects nest at most a given depth.
// Used for the .gcz index (FORMAT.md §5) and the safetensors header.
//
//   JsonShape shape("the index", kMaxIndexDepth);
//   if (!json::sax_parse(text, &shape) || !shape.problem().empty()) ... shape.problem() ...
//
// (nlohmann's parser callback could see the keys, but erases from the enclosing object at every
// object's end, a scan that made an object of many object members take quadratic time.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gcz/status.h"

namespace gcz::detail {

class JsonShape {
 public:
  using json = nlohmann::json;

  // `what` names the text in messages ("the index"); `max_depth` counts the outermost value as 1.
  // Inside the outermost object's member named `lenient`, if any, a key may come twice.
  JsonShape(std::string what, std::size_t max_depth, std::string lenient = {})
      : what_(std::move(what)), max_depth_(max_depth), lenient_(std::move(lenient)) {}

  bool null() { return value(); }
  bool boolean(bool) { return value(); }
  bool number_integer(json::number_integer_t) { return value(); }
  bool number_unsigned(json::number_unsigned_t) { return value(); }
  bool number_float(json::number_float_t, const json::string_t&) { return value(); }
  bool string(json::string_t& s) { return value(kStringBytes + text_bytes(s)); }
  bool binary(json::binary_t&) { return value(); }
  bool start_object(std::size_t) {
    objects_.emplace_back();
    value(kObjectBytes);
    return enter();
  }
  bool key(json::string_t& k) {
    dom_bytes_ += kMemberBytes + text_bytes(k);
    if (depth_ == 1) outer_key_ = k;
    if (depth_ > 1 && !lenient_.empty() && outer_key_ == lenient_) return true;
    if (objects_.back().insert(k).second) return true;
    duplicate_ = k;
    duplicate_depth_ = depth_;
    problem_ = "an object of " + what_ + " has the key '" + k + "' twice";
    return false;
  }
  bool end_object() {
    objects_.pop_back();
    --depth_;
    return true;
  }
  bool start_array(std::size_t) {
    value(kArrayBytes);
    return enter();
  }
  bool end_array() {
    --depth_;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    syntax_ = e.what();
    // "[json.exception.parse_error.101] parse error at ...": the parser's own tag says nothing to a user.
    if (syntax_.rfind("[json.exception.", 0) == 0 && syntax_.find("] ") != std::string::npos) {
      syntax_.erase(0, syntax_.find("] ") + 2);
    }
    problem_ = what_ + " is not valid JSON";
    return false;
  }

  // Why the text breaks the rules, or "" where it keeps them.
  const std::string& problem() const { return problem_; }
  // The key an object has twice, and how deep that object is (1: the outermost), if that is the problem.
  const std::string& duplicate() const { return duplicate_; }
  std::size_t duplicate_depth() const { return duplicate_depth_; }
  // The last key of the outermost object met before the problem (which tensor, in a safetensors header).
  const std::string& outer_key() const { return outer_key_; }
  // The parser's own words for a syntax error, if that is the problem.
  const std::string& syntax_error() const { return syntax_; }
  // About the most memory nlohmann::json's tree of the text takes, in bytes (allocator overhead in):
  // what a caller checks before building it. A text of many small values takes many times its size
  // (a 64 MiB array of {} about 2 GiB), and a tree that runs out of memory while it is being built
  // cannot be given back: nlohmann's clean-up allocates, in a destructor that may not throw.
  uint64_t dom_bytes() const { return dom_bytes_; }

 private:
  // A value's own 16 bytes, twice for the spare room of the array it may sit in, and what it allocates.
  static constexpr uint64_t kValueBytes = 32, kStringBytes = 48, kObjectBytes = 64, kArrayBytes = 48;
  static constexpr uint64_t kMemberBytes = 96;  // a map node: its links, its key's string
  static uint64_t text_bytes(const std::string& s) { return s.size() > 15 ? s.size() + 17 : 0; }  // past SSO
  bool value(uint64_t allocates = 0) {
    dom_bytes_ += kValueBytes + allocates;
    return true;
  }

  bool enter() {
    if (++depth_ <= max_depth_) return true;
    problem_ = "arrays and objects in " + what_ + " nest more than " + std::to_string(max_depth_) + " deep";
    return false;
  }

  std::string what_;
  std::size_t max_depth_;
  std::string lenient_;
  std::vector<std::set<std::string>> objects_;  // the keys of each object open, innermost last
  std::size_t depth_ = 0;
  std::string problem_, duplicate_, syntax_, outer_key_;
  std::size_t duplicate_depth_ = 0;
  uint64_t dom_bytes_ = 0;
};

}  // namespace gcz::detail
