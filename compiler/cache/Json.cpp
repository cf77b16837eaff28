// JSON reader and writer (see Json.h).
#include "compiler/cache/Json.h"

#include <charconv>
#include <cmath>
#include <cstring>

namespace megamoe::json {
namespace {

class Parser {
 public:
  Parser(const std::string& text, const ParseOptions& options) : text_(text), options_(options) {}

  bool parse(Value& out, ParseError& error) {
    skipSpace();
    bool ok = parseValue(out, 0);
    if (ok) {
      skipSpace();
      if (pos_ != text_.size()) ok = fail("trailing characters");
    }
    if (!ok) error = error_;
    return ok;
  }

 private:
  bool fail(const std::string& why) {
    error_.reason = why;
    error_.offset = pos_;
    return false;
  }
  bool atEnd() const { return pos_ >= text_.size(); }
  char peek() const { return atEnd() ? '\0' : text_[pos_]; }
  bool atDigit() const { return peek() >= '0' && peek() <= '9'; }
  void skipSpace() {
    while (!atEnd() && (peek() == ' ' || peek() == '\n' || peek() == '\r' || peek() == '\t')) ++pos_;
  }
  bool consume(char c) {
    skipSpace();
    if (atEnd() || peek() != c) return false;
    ++pos_;
    return true;
  }

  // `depth`: how many containers enclose this value (0 for the root).
  bool parseValue(Value& out, int depth) {
    skipSpace();
    if (atEnd()) return fail("unexpected end of input");
    char c = peek();
    if (c == '{' || c == '[') {
      // Bounded, so that hostile input cannot exhaust the stack.
      if (depth > options_.maxDepth) return fail("nesting too deep");
      return c == '{' ? parseObject(out, depth) : parseArray(out, depth);
    }
    if (c == '"') {
      out.kind = Value::Kind::kString;
      return parseString(out.text);
    }
    if (c == '-' || (c >= '0' && c <= '9')) return parseNumber(out);
    for (const char* literal : {"true", "false", "null"}) {
      if (text_.compare(pos_, std::strlen(literal), literal) == 0) {
        pos_ += std::strlen(literal);
        out.kind = literal[0] == 'n' ? Value::Kind::kNull : Value::Kind::kBool;
        out.boolean = literal[0] == 't';
        return true;
      }
    }
    return fail("unexpected character");
  }

  bool parseObject(Value& out, int depth) {
    out.kind = Value::Kind::kObject;
    ++pos_;  // '{'
    if (consume('}')) return true;
    do {
      skipSpace();
      std::string key;
      if (atEnd() || peek() != '"') return fail("expected a key");
      if (!parseString(key)) return false;
      if (!options_.allowDuplicateKeys && out.find(key)) return fail("duplicate key '" + key + "'");
      if (!consume(':')) return fail("expected ':'");
      Value value;
      if (!parseValue(value, depth + 1)) return false;
      out.object.emplace_back(std::move(key), std::move(value));
    } while (consume(','));
    return consume('}') || fail("expected ',' or '}'");
  }

  bool parseArray(Value& out, int depth) {
    out.kind = Value::Kind::kArray;
    ++pos_;  // '['
    if (consume(']')) return true;
    do {
      Value value;
      if (!parseValue(value, depth + 1)) return false;
      out.array.push_back(std::move(value));
    } while (consume(','));
    return consume(']') || fail("expected ',' or ']'");
  }

  bool parseHex4(uint32_t& out) {
    if (text_.size() - pos_ < 4) return fail("truncated \\u escape");
    out = 0;
    for (int i = 0; i < 4; ++i) {
      char c = text_[pos_++];
      uint32_t digit;
      if (c >= '0' && c <= '9') digit = uint32_t(c - '0');
      else if (c >= 'a' && c <= 'f') digit = uint32_t(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') digit = uint32_t(c - 'A' + 10);
      else return fail("bad hex digit in \\u escape");
      out = out * 16 + digit;
    }
    return true;
  }

  static void appendUtf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += char(cp);
    } else if (cp < 0x800) {
      out += char(0xc0 | (cp >> 6));
      out += char(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out += char(0xe0 | (cp >> 12));
      out += char(0x80 | ((cp >> 6) & 0x3f));
      out += char(0x80 | (cp & 0x3f));
    } else {
      out += char(0xf0 | (cp >> 18));
      out += char(0x80 | ((cp >> 12) & 0x3f));
      out += char(0x80 | ((cp >> 6) & 0x3f));
      out += char(0x80 | (cp & 0x3f));
    }
  }

  bool parseString(std::string& out) {
    ++pos_;  // opening quote
    while (true) {
      if (atEnd()) return fail("unterminated string");
      auto c = static_cast<unsigned char>(text_[pos_++]);
      if (c == '"') return true;
      if (c < 0x20) return fail("raw control character in string");
      if (c != '\\') {
        out += char(c);
        continue;
      }
      if (atEnd()) return fail("unterminated escape");
      char e = text_[pos_++];
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
          uint32_t unit;
          if (!parseHex4(unit)) return false;
          if (unit >= 0xdc00 && unit <= 0xdfff) return fail("lone low surrogate");
          if (unit >= 0xd800 && unit <= 0xdbff) {
            uint32_t low;
            if (text_.compare(pos_, 2, "\\u") != 0) return fail("lone high surrogate");
            pos_ += 2;
            if (!parseHex4(low)) return false;
            if (low < 0xdc00 || low > 0xdfff) return fail("bad low surrogate");
            unit = 0x10000 + ((unit - 0xd800) << 10) + (low - 0xdc00);
          }
          appendUtf8(out, unit);
          break;
        }
        default: return fail("bad escape");
      }
    }
  }

  // -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
  bool parseNumber(Value& out) {
    const size_t start = pos_;
    const bool negative = peek() == '-';
    if (negative) ++pos_;
    const size_t first = pos_;
    uint64_t magnitude = 0;
    bool fits = true;
    const uint64_t limit = negative ? uint64_t(INT64_MAX) + 1 : uint64_t(INT64_MAX);
    while (atDigit()) {
      uint64_t digit = uint64_t(peek() - '0');
      if (fits && magnitude > (limit - digit) / 10) {
        if (options_.integersOnly) return fail("integer out of range");
        fits = false;
      }
      if (fits) magnitude = magnitude * 10 + digit;
      ++pos_;
    }
    if (pos_ == first) return fail("expected digits");
    if (text_[first] == '0' && pos_ - first > 1) return fail("leading zero");
    bool integral = true;
    if (peek() == '.') {
      if (options_.integersOnly) return fail("only integers are supported");
      integral = false;
      ++pos_;
      if (!atDigit()) return fail("expected digits");
      while (atDigit()) ++pos_;
    }
    if (peek() == 'e' || peek() == 'E') {
      if (options_.integersOnly) return fail("only integers are supported");
      integral = false;
      ++pos_;
      if (peek() == '+' || peek() == '-') ++pos_;
      if (!atDigit()) return fail("expected digits");
      while (atDigit()) ++pos_;
    }
    out.text = text_.substr(start, pos_ - start);
    if (integral && fits) {
      out.kind = Value::Kind::kInteger;
      // Two's-complement negation of the magnitude handles INT64_MIN without signed overflow.
      out.integer = negative ? int64_t(~magnitude + 1) : int64_t(magnitude);
    } else {
      out.kind = Value::Kind::kNumber;
    }
    return true;
  }

  const std::string& text_;
  const ParseOptions& options_;
  size_t pos_ = 0;
  ParseError error_;
};

}  // namespace

const Value* Value::find(const std::string& name) const {
  for (auto it = object.rbegin(); it != object.rend(); ++it)
    if (it->first == name) return &it->second;
  return nullptr;
}

bool parse(const std::string& text, Value& out, ParseError& error, const ParseOptions& options) {
  out = Value();
  return Parser(text, options).parse(out, error);
}

void appendQuoted(std::string& out, const std::string& s) {
  static const char kHexDigits[] = "0123456789abcdef";
  out += '"';
  for (char ch : s) {
    auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          out += "\\u00";
          out += kHexDigits[c >> 4];
          out += kHexDigits[c & 0xf];
        } else {
          out += ch;  // other bytes verbatim, so arbitrary byte strings round-trip exactly
        }
    }
  }
  out += '"';
}

Value stringValue(std::string s) {
  Value v;
  v.kind = Value::Kind::kString;
  v.text = std::move(s);
  return v;
}

Value integerValue(int64_t i) {
  Value v;
  v.kind = Value::Kind::kInteger;
  v.integer = i;
  v.text = std::to_string(i);
  return v;
}

Value numberValue(double d) {
  Value v;
  if (!std::isfinite(d)) return v;  // kNull
  char buffer[64];
  auto result = std::to_chars(buffer, buffer + sizeof buffer, d);
  v.kind = Value::Kind::kNumber;
  v.text.assign(buffer, result.ptr);
  return v;
}

Value boolValue(bool b) {
  Value v;
  v.kind = Value::Kind::kBool;
  v.boolean = b;
  return v;
}

Value objectValue() {
  Value v;
  v.kind = Value::Kind::kObject;
  return v;
}

Value arrayValue() {
  Value v;
  v.kind = Value::Kind::kArray;
  return v;
}

void appendValue(std::string& out, const Value& value) {
  using K = Value::Kind;
  switch (value.kind) {
    case K::kNull: out += "null"; break;
    case K::kBool: out += value.boolean ? "true" : "false"; break;
    case K::kInteger: out += std::to_string(value.integer); break;
    case K::kNumber: out += value.text.empty() ? "null" : value.text; break;
    case K::kString: appendQuoted(out, value.text); break;
    case K::kArray:
      out += '[';
      for (size_t i = 0; i < value.array.size(); ++i) {
        if (i) out += ',';
        appendValue(out, value.array[i]);
      }
      out += ']';
      break;
    case K::kObject:
      out += '{';
      for (size_t i = 0; i < value.object.size(); ++i) {
        if (i) out += ',';
        appendQuoted(out, value.object[i].first);
        out += ':';
        appendValue(out, value.object[i].second);
      }
      out += '}';
      break;
  }
}

std::string render(const Value& value) {
  std::string out;
  appendValue(out, value);
  return out;
}

}  // namespace megamoe::json
