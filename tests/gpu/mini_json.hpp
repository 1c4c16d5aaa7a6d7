// Minimal JSON reader for the GPU suite (the GPU machine has no network and maybe no JSON library):
// objects, arrays, strings (simple escapes), numbers, true/false/null. Throws std::runtime_error.
#pragma once

#include <cctype>
#include <cstdlib>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace mini_json {

struct Value {
  enum Kind { kNull, kBool, kNumber, kString, kArray, kObject } kind = kNull;
  bool b = false;
  double num = 0;
  std::string str;
  std::vector<Value> arr;
  std::map<std::string, Value> obj;

  bool has(const std::string& k) const { return kind == kObject && obj.count(k) > 0; }
  const Value& operator[](const std::string& k) const {
    auto it = obj.find(k);
    if (it == obj.end()) throw std::runtime_error("json: missing key " + k);
    return it->second;
  }
  bool is_num() const { return kind == kNumber; }
  bool is_arr() const { return kind == kArray; }
  bool is_obj() const { return kind == kObject; }
  bool is_str() const { return kind == kString; }
};

class Parser {
 public:
  explicit Parser(const std::string& s) : s_(s) {}
  Value parse() {
    Value v = value();
    ws();
    if (i_ != s_.size()) throw std::runtime_error("json: trailing characters");
    return v;
  }

 private:
  void ws() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  char peek() {
    ws();
    if (i_ >= s_.size()) throw std::runtime_error("json: unexpected end");
    return s_[i_];
  }
  void expect(char c) {
    if (peek() != c) throw std::runtime_error(std::string("json: expected ") + c);
    ++i_;
  }
  std::string string_lit() {
    expect('"');
    std::string out;
    while (i_ < s_.size() && s_[i_] != '"') {
      char c = s_[i_++];
      if (c == '\\' && i_ < s_.size()) {
        char e = s_[i_++];
        switch (e) {
          case 'n': out += '\n'; break;
          case 't': out += '\t'; break;
          case 'u': out += '?'; i_ += 4; break;
          default: out += e;
        }
      } else {
        out += c;
      }
    }
    ++i_;
    return out;
  }
  Value value() {
    Value v;
    const char c = peek();
    if (c == '{') {
      ++i_;
      v.kind = Value::kObject;
      if (peek() == '}') { ++i_; return v; }
      for (;;) {
        std::string k = string_lit();
        expect(':');
        v.obj[k] = value();
        if (peek() == ',') { ++i_; continue; }
        expect('}');
        return v;
      }
    }
    if (c == '[') {
      ++i_;
      v.kind = Value::kArray;
      if (peek() == ']') { ++i_; return v; }
      for (;;) {
        v.arr.push_back(value());
        if (peek() == ',') { ++i_; continue; }
        expect(']');
        return v;
      }
    }
    if (c == '"') {
      v.kind = Value::kString;
      v.str = string_lit();
      return v;
    }
    if (s_.compare(i_, 4, "true") == 0) { i_ += 4; v.kind = Value::kBool; v.b = true; return v; }
    if (s_.compare(i_, 5, "false") == 0) { i_ += 5; v.kind = Value::kBool; return v; }
    if (s_.compare(i_, 4, "null") == 0) { i_ += 4; return v; }
    char* end = nullptr;
    v.num = std::strtod(s_.c_str() + i_, &end);
    if (end == s_.c_str() + i_) throw std::runtime_error("json: bad value");
    i_ = static_cast<size_t>(end - s_.c_str());
    v.kind = Value::kNumber;
    return v;
  }
  const std::string& s_;
  size_t i_ = 0;
};

inline Value parse(const std::string& s) { return Parser(s).parse(); }

}  // namespace mini_json
