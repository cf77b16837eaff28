// The metadata JSON reader: the three fields the runtime needs, everything else skipped correctly.
#include <gtest/gtest.h>

#include "megamoe/Error.h"
#include "megamoe/Json.h"

namespace megamoe {
namespace {

TEST(KernelMetadata, ReadsTheThreeFields) {
  const KernelMetadata m = parseKernelMetadata(R"({"symbol":"swiglu_fwd_kernel","block_threads":256,"shared_bytes":0})");
  EXPECT_EQ(m.symbol, "swiglu_fwd_kernel");
  EXPECT_EQ(m.blockThreads, 256);
  EXPECT_EQ(m.sharedBytes, 0);
}

TEST(KernelMetadata, SkipsNestedValuesEvenWhenTheyLookLikeFields) {
  const std::string json = R"( {
    "compile_ms": 812.5,
    "static": {"symbol": "wrong", "block_threads": 1, "list": [1, 2, {"shared_bytes": 3}], "s": "}]{["},
    "registers": [[], {}, [[["\"", "\\"]]]],
    "symbol" : "k\u00e9rnel\n\"q\"",
    "ok": true, "none": null, "neg": -1e-3,
    "block_threads": 384,
    "shared_bytes": 232448,
    "trailing": {"shared_bytes": 1}
  } )";
  const KernelMetadata m = parseKernelMetadata(json);
  EXPECT_EQ(m.symbol, "k\xc3\xa9rnel\n\"q\"");
  EXPECT_EQ(m.blockThreads, 384);
  EXPECT_EQ(m.sharedBytes, 232448);
}

TEST(FlatJson, KeepsScalarKindsAndMarksComposites) {
  const auto members = parseFlatJsonObject(R"({"a":"x","b":12,"c":false,"d":null,"e":[1],"f":{},"g":"\ud83d\ude00"})");
  EXPECT_EQ(members.at("a").kind, JsonScalar::Kind::kString);
  EXPECT_EQ(members.at("b").text, "12");
  EXPECT_EQ(members.at("c").kind, JsonScalar::Kind::kBool);
  EXPECT_FALSE(members.at("c").boolean);
  EXPECT_EQ(members.at("d").kind, JsonScalar::Kind::kNull);
  EXPECT_EQ(members.at("e").kind, JsonScalar::Kind::kComposite);
  EXPECT_EQ(members.at("f").kind, JsonScalar::Kind::kComposite);
  EXPECT_EQ(members.at("g").text, "\xf0\x9f\x98\x80");
  EXPECT_TRUE(parseFlatJsonObject("{}").empty());
}

TEST(FlatJson, RejectsMalformedText) {
  for (const char* bad : {"", "[]", "{", "{\"a\"}", "{\"a\":}", "{\"a\":1,}", "{\"a\":1} x", "{\"a\":tru}",
                          "{\"a\":\"unterminated}", "{\"a\":[1,2}", "{\"a\":01}", "{\"a\":1.}", "{\"a\":\"\\q\"}",
                          "{\"a\":\"\\ud800\"}", "{a:1}", "{\"a\":\"tab\there\"}"}) {
    try {
      parseFlatJsonObject(bad);
      ADD_FAILURE() << "accepted: " << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kBadMetadata);
      EXPECT_NE(std::string(e.what()).find("at byte"), std::string::npos) << e.what();
    }
  }
}

TEST(FlatJson, DeepNestingIsAnErrorNotACrash) {
  const std::string deep = "{\"a\":" + std::string(100000, '[') + std::string(100000, ']') + "}";
  EXPECT_THROW(parseFlatJsonObject(deep), Error);
}

TEST(KernelMetadata, MissingOrWrongFieldsAreNamed) {
  auto expectError = [](const std::string& json, const std::string& needle) {
    try {
      parseKernelMetadata(json);
      ADD_FAILURE() << "accepted: " << json;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kBadMetadata);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expectError(R"({"block_threads":128,"shared_bytes":0})", "\"symbol\"");
  expectError(R"({"symbol":"","block_threads":128,"shared_bytes":0})", "\"symbol\"");
  expectError(R"({"symbol":5,"block_threads":128,"shared_bytes":0})", "\"symbol\"");
  expectError(R"({"symbol":"k","shared_bytes":0})", "\"block_threads\"");
  expectError(R"({"symbol":"k","block_threads":0,"shared_bytes":0})", "\"block_threads\" must be an integer >= 1");
  expectError(R"({"symbol":"k","block_threads":128.5,"shared_bytes":0})", "\"block_threads\"");
  expectError(R"({"symbol":"k","block_threads":"128","shared_bytes":0})", "\"block_threads\"");
  expectError(R"({"symbol":"k","block_threads":128,"shared_bytes":-1})", "\"shared_bytes\"");
  expectError(R"({"symbol":"k","block_threads":128,"shared_bytes":99999999999})", "\"shared_bytes\"");
  expectError(R"({"symbol":"k","block_threads":128})", "\"shared_bytes\"");
}

}  // namespace
}  // namespace megamoe
