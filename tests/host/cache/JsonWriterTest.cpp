// The JSON writer (compiler/cache/Json.h) against the reader: every string, control bytes included, and every kind
// of value must come back unchanged, and the text must be strict JSON.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "compiler/cache/Json.h"

namespace megamoe::json {
namespace {

// Strict: what any other JSON reader accepts (no duplicate keys, default depth).
bool parseStrict(const std::string& text, Value& out, std::string& why) {
  ParseError error;
  if (parse(text, out, error)) return true;
  why = error.reason + " at " + std::to_string(error.offset) + " in " + text;
  return false;
}

void expectNoRawControlBytes(const std::string& text) {
  for (unsigned char c : text) EXPECT_GE(c, 0x20) << "raw control byte " << int(c) << " in " << text;
}

TEST(JsonWriter, EveryControlByteQuoteAndBackslashRoundTrips) {
  std::string all;
  for (int b = 0; b < 0x20; ++b) {
    const std::string s = std::string("a") + char(b) + "\"\\/" + char(b) + "z";
    all += s;
    std::string quoted;
    appendQuoted(quoted, s);
    expectNoRawControlBytes(quoted);
    Value back;
    std::string why;
    ASSERT_TRUE(parseStrict(quoted, back, why)) << "byte " << b << ": " << why;
    EXPECT_EQ(back.kind, Value::Kind::kString);
    EXPECT_EQ(back.text, s) << "byte " << b;
  }
  // All of them at once, DEL and non-ASCII too, as a value and as a key.
  all += "\x7f\xc2\xb5\xff";
  Value object = objectValue();
  object.object.emplace_back(all, stringValue(all));
  const std::string text = render(object);
  expectNoRawControlBytes(text);
  Value back;
  std::string why;
  ASSERT_TRUE(parseStrict(text, back, why)) << why;
  ASSERT_EQ(back.object.size(), 1u);
  EXPECT_EQ(back.object[0].first, all);
  EXPECT_EQ(back.object[0].second.text, all);
}

TEST(JsonWriter, ControlBytesWithoutAShortFormAreUnicodeEscapes) {
  std::string quoted;
  appendQuoted(quoted, std::string("\x00\x01\x1f\x7f\n\t", 6));
  EXPECT_EQ(quoted, "\"\\u0000\\u0001\\u001f\\u007f\\n\\t\"");
}

TEST(JsonWriter, TreesRoundTripThroughTheReader) {
  Value inner = arrayValue();
  inner.array.push_back(integerValue(std::numeric_limits<int64_t>::min()));
  inner.array.push_back(integerValue(std::numeric_limits<int64_t>::max()));
  inner.array.push_back(numberValue(0.1));
  inner.array.push_back(numberValue(-2.5e-300));
  inner.array.push_back(boolValue(false));
  inner.array.push_back(Value());
  inner.array.push_back(objectValue());
  inner.array.push_back(arrayValue());
  Value root = objectValue();
  root.object.emplace_back("list", inner);
  root.object.emplace_back("name", stringValue("q\"b\\s\n"));
  root.object.emplace_back("yes", boolValue(true));

  const std::string text = render(root);
  Value back;
  std::string why;
  ASSERT_TRUE(parseStrict(text, back, why)) << why;
  EXPECT_EQ(render(back), text);
  const Value* list = back.find("list");
  ASSERT_TRUE(list && list->array.size() == 8);
  EXPECT_EQ(list->array[0].integer, std::numeric_limits<int64_t>::min());
  EXPECT_EQ(list->array[1].integer, std::numeric_limits<int64_t>::max());
  EXPECT_EQ(std::stod(list->array[2].text), 0.1);  // shortest text that reads back exactly
  EXPECT_EQ(list->array[2].text, "0.1");
  EXPECT_EQ(std::stod(list->array[3].text), -2.5e-300);
  EXPECT_EQ(list->array[5].kind, Value::Kind::kNull);
  EXPECT_EQ(back.find("name")->text, "q\"b\\s\n");
}

TEST(JsonWriter, NonFiniteNumbersBecomeNull) {
  EXPECT_EQ(render(numberValue(std::nan(""))), "null");
  EXPECT_EQ(render(numberValue(std::numeric_limits<double>::infinity())), "null");
  EXPECT_EQ(render(numberValue(12.0)), "12");
  EXPECT_EQ(render(numberValue(1234.5)), "1234.5");
}

}  // namespace
}  // namespace megamoe::json
