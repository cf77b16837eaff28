// Flat JSON object reader for cache-entry metadata (see Json.h).
#include "megamoe/Json.h"

#include <cerrno>
#include <cstdlib>
#include <limits>

#include "megamoe/Error.h"

namespace megamoe {
namespace {

class Reader {
 public:
  explicit Reader(const std::string& text) : s_(text) {}

  std::map<std::string, JsonScalar> object() {
    std::map<std::string, JsonScalar> members;
    skipSpace();
    expect('{');
    skipSpace();
    if (peek() == '}') {
      ++pos_;
    } else {
      for (;;) {
        skipSpace();
        if (peek() != '"') fail("expected a member name");
        std::string key = string();
        skipSpace();
        expect(':');
        skipSpace();
        members[key] = value();
        skipSpace();
        if (peek() == ',') {
          ++pos_;
          continue;
        }
        expect('}');
        break;
      }
    }
    skipSpace();
    if (pos_ != s_.size()) fail("unexpected text after the object");
    return members;
  }

 private:
  static constexpr int kMaxDepth = 256;

  [[noreturn]] void fail(const std::string& what) const {
    throw Error(ErrorCode::kBadMetadata, "kernel metadata is not valid JSON: " + what + " at byte " +
                                             std::to_string(pos_));
  }
  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  bool atEnd() const { return pos_ >= s_.size(); }
  void expect(char c) {
    if (atEnd() || s_[pos_] != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  void skipSpace() {
    while (!atEnd() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  void literal(const char* word) {
    for (const char* p = word; *p; ++p) {
      if (atEnd() || s_[pos_] != *p) fail(std::string("expected '") + word + "'");
      ++pos_;
    }
  }

  static void appendUtf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  uint32_t hex4() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = peek();
      uint32_t d;
      if (c >= '0' && c <= '9') d = c - '0';
      else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
      else fail("bad \\u escape");
      v = v * 16 + d;
      ++pos_;
    }
    return v;
  }

  std::string string() {
    expect('"');
    std::string out;
    for (;;) {
      if (atEnd()) fail("unterminated string");
      const char c = s_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (atEnd()) fail("unterminated escape");
      const char e = s_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00) {  // high surrogate: a low one must follow
            if (peek() != '\\') fail("lone surrogate in \\u escape");
            ++pos_;
            expect('u');
            const uint32_t low = hex4();
            if (low < 0xDC00 || low >= 0xE000) fail("bad low surrogate in \\u escape");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          } else if (cp >= 0xDC00 && cp < 0xE000) {
            fail("lone surrogate in \\u escape");
          }
          appendUtf8(out, cp);
          break;
        }
        default: --pos_; fail("bad escape");
      }
    }
  }

  std::string number() {
    const size_t start = pos_;
    if (peek() == '-') ++pos_;
    if (peek() == '0') {
      ++pos_;
    } else if (peek() >= '1' && peek() <= '9') {
      while (peek() >= '0' && peek() <= '9') ++pos_;
    } else {
      fail("bad number");
    }
    if (peek() == '.') {
      ++pos_;
      if (!(peek() >= '0' && peek() <= '9')) fail("bad number");
      while (peek() >= '0' && peek() <= '9') ++pos_;
    }
    if (peek() == 'e' || peek() == 'E') {
      ++pos_;
      if (peek() == '+' || peek() == '-') ++pos_;
      if (!(peek() >= '0' && peek() <= '9')) fail("bad number");
      while (peek() >= '0' && peek() <= '9') ++pos_;
    }
    return s_.substr(start, pos_ - start);
  }

  // Skips a nested object or array; depth-bounded so hostile input cannot exhaust the stack.
  void skipComposite(int depth) {
    if (depth > kMaxDepth) fail("nesting too deep");
    const char open = peek();
    const char close = open == '{' ? '}' : ']';
    ++pos_;
    skipSpace();
    if (peek() == close) {
      ++pos_;
      return;
    }
    for (;;) {
      skipSpace();
      if (open == '{') {
        if (peek() != '"') fail("expected a member name");
        string();
        skipSpace();
        expect(':');
        skipSpace();
      }
      skipValue(depth + 1);
      skipSpace();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect(close);
      return;
    }
  }

  void skipValue(int depth) {
    const char c = peek();
    if (c == '{' || c == '[') skipComposite(depth);
    else value();
  }

  JsonScalar value() {
    JsonScalar v;
    const char c = peek();
    if (c == '"') {
      v.kind = JsonScalar::Kind::kString;
      v.text = string();
    } else if (c == '{' || c == '[') {
      v.kind = JsonScalar::Kind::kComposite;
      skipComposite(1);
    } else if (c == 't') {
      literal("true");
      v.kind = JsonScalar::Kind::kBool;
      v.boolean = true;
    } else if (c == 'f') {
      literal("false");
      v.kind = JsonScalar::Kind::kBool;
    } else if (c == 'n') {
      literal("null");
      v.kind = JsonScalar::Kind::kNull;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      v.kind = JsonScalar::Kind::kNumber;
      v.text = number();
    } else {
      fail(atEnd() ? "unexpected end of input" : "unexpected character");
    }
    return v;
  }

  const std::string& s_;
  size_t pos_ = 0;
};

int intField(const std::map<std::string, JsonScalar>& members, const char* name, long long minimum) {
  const auto it = members.find(name);
  if (it == members.end())
    throw Error(ErrorCode::kBadMetadata, std::string("kernel metadata lacks \"") + name + "\" (an integer)");
  const JsonScalar& v = it->second;
  const bool integral = v.kind == JsonScalar::Kind::kNumber &&
                        v.text.find_first_of(".eE") == std::string::npos;
  errno = 0;
  const long long value = integral ? std::strtoll(v.text.c_str(), nullptr, 10) : 0;
  if (!integral || errno != 0 || value < minimum || value > std::numeric_limits<int>::max())
    throw Error(ErrorCode::kBadMetadata, std::string("kernel metadata field \"") + name +
                                             "\" must be an integer >= " + std::to_string(minimum) +
                                             (v.kind == JsonScalar::Kind::kNumber ? ", got " + v.text : ""));
  return static_cast<int>(value);
}

}  // namespace

std::map<std::string, JsonScalar> parseFlatJsonObject(const std::string& json) { return Reader(json).object(); }

KernelMetadata parseKernelMetadata(const std::string& json) {
  const auto members = parseFlatJsonObject(json);
  KernelMetadata meta;
  const auto symbol = members.find("symbol");
  if (symbol == members.end() || symbol->second.kind != JsonScalar::Kind::kString || symbol->second.text.empty())
    throw Error(ErrorCode::kBadMetadata, "kernel metadata lacks \"symbol\" (a non-empty string)");
  meta.symbol = symbol->second.text;
  meta.blockThreads = intField(members, "block_threads", 1);
  meta.sharedBytes = intField(members, "shared_bytes", 0);
  return meta;
}

}  // namespace megamoe
