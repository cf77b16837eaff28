// The project's one JSON reader and writer (RFC 8259 values to and from a small tree), LLVM-free: the cache reads
// and writes its manifests with it, the runtime reads the kernel metadata the compiler attaches to each entry
// (runtime/include/megamoe/Json.h), and megamoe-cache writes its reports with it (compiler/cache/CacheReport.h).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace megamoe::json {

struct Value {
  // kInteger: a number without fraction or exponent that fits in int64_t; kNumber: any other number.
  enum class Kind { kNull, kBool, kInteger, kNumber, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  int64_t integer = 0;  // kInteger
  std::string text;     // kString: the unescaped value (UTF-8); kInteger, kNumber: the literal as written
  std::vector<Value> array;
  std::vector<std::pair<std::string, Value>> object;  // in document order

  // The member called `name` (the last one, if duplicates were allowed), or nullptr; objects only.
  const Value* find(const std::string& name) const;
};

struct ParseOptions {
  int maxDepth = 32;                // values nested deeper than this below the root fail ("nesting too deep")
  bool integersOnly = false;        // fail on numbers that are not kInteger (fraction, exponent, beyond int64)
  bool allowDuplicateKeys = false;  // keep every member; otherwise a repeated key fails
};

struct ParseError {
  std::string reason;  // e.g. "unterminated string"
  size_t offset = 0;   // byte offset in the text where the problem was found
};

// Parses the whole text as one value (surrounding whitespace allowed). Returns false and fills `error` on malformed
// input; never throws for bad input.
bool parse(const std::string& text, Value& out, ParseError& error, const ParseOptions& options = {});

// Appends `s` as a JSON string literal: quote, backslash and every control character escaped (\u00XX where there
// is no short form). Bytes >= 0x80 are copied verbatim, so any byte string round-trips through parse() exactly.
void appendQuoted(std::string& out, const std::string& s);

// Values to write. numberValue keeps the shortest text that reads back as the same double; a NaN or infinity,
// which JSON cannot hold, becomes null.
Value stringValue(std::string s);
Value integerValue(int64_t i);
Value numberValue(double d);
Value boolValue(bool b);
Value objectValue();  // empty; add members to .object in the order they are to be written
Value arrayValue();   // empty; add elements to .array

// Compact JSON text (no whitespace) for `value`, which parse() reads back as the same tree. kInteger is written
// from `integer`, kNumber from `text` (the literal parse() kept, or numberValue's); strings via appendQuoted.
std::string render(const Value& value);
void appendValue(std::string& out, const Value& value);

}  // namespace megamoe::json
