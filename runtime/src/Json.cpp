// Kernel metadata on top of the project's JSON reader (compiler/cache/Json.h); see megamoe/Json.h.
#include "megamoe/Json.h"

#include <limits>

#include "compiler/cache/Json.h"
#include "megamoe/Error.h"

namespace megamoe {
namespace {

// Metadata comes from the compiler but is read from disk: deep nesting is bounded, any JSON number is accepted and
// a repeated key is not an error (the last one wins).
constexpr json::ParseOptions kMetadataJson = {/*maxDepth=*/256, /*integersOnly=*/false, /*allowDuplicateKeys=*/true};

[[noreturn]] void invalid(const std::string& reason, size_t offset) {
  throw Error(ErrorCode::kBadMetadata,
              "kernel metadata is not valid JSON: " + reason + " at byte " + std::to_string(offset));
}

// The text as one JSON object, or Error(kBadMetadata).
json::Value parseObject(const std::string& text) {
  json::Value root;
  json::ParseError error;
  if (!json::parse(text, root, error, kMetadataJson)) invalid(error.reason, error.offset);
  if (root.kind != json::Value::Kind::kObject) {
    const size_t start = text.find_first_not_of(" \t\n\r");
    invalid("expected '{'", start == std::string::npos ? text.size() : start);
  }
  return root;
}

JsonScalar toScalar(const json::Value& v) {
  using K = json::Value::Kind;
  JsonScalar s;
  switch (v.kind) {
    case K::kNull: s.kind = JsonScalar::Kind::kNull; break;
    case K::kBool:
      s.kind = JsonScalar::Kind::kBool;
      s.boolean = v.boolean;
      break;
    case K::kInteger:
    case K::kNumber:
      s.kind = JsonScalar::Kind::kNumber;
      s.text = v.text;
      break;
    case K::kString:
      s.kind = JsonScalar::Kind::kString;
      s.text = v.text;
      break;
    case K::kArray:
    case K::kObject: s.kind = JsonScalar::Kind::kComposite; break;
  }
  return s;
}

int intField(const json::Value& members, const char* name, long long minimum) {
  const json::Value* v = members.find(name);
  if (!v) throw Error(ErrorCode::kBadMetadata, std::string("kernel metadata lacks \"") + name + "\" (an integer)");
  const bool isNumber = v->kind == json::Value::Kind::kInteger || v->kind == json::Value::Kind::kNumber;
  if (v->kind != json::Value::Kind::kInteger || v->integer < minimum || v->integer > std::numeric_limits<int>::max())
    throw Error(ErrorCode::kBadMetadata, std::string("kernel metadata field \"") + name +
                                             "\" must be an integer >= " + std::to_string(minimum) +
                                             (isNumber ? ", got " + v->text : ""));
  return static_cast<int>(v->integer);
}

}  // namespace

std::map<std::string, JsonScalar> parseFlatJsonObject(const std::string& text) {
  std::map<std::string, JsonScalar> members;
  for (const auto& [key, value] : parseObject(text).object) members[key] = toScalar(value);
  return members;
}

KernelMetadata parseKernelMetadata(const std::string& text) {
  const json::Value members = parseObject(text);
  KernelMetadata meta;
  const json::Value* symbol = members.find("symbol");
  if (!symbol || symbol->kind != json::Value::Kind::kString || symbol->text.empty())
    throw Error(ErrorCode::kBadMetadata, "kernel metadata lacks \"symbol\" (a non-empty string)");
  meta.symbol = symbol->text;
  meta.blockThreads = intField(members, "block_threads", 1);
  meta.sharedBytes = intField(members, "shared_bytes", 0);
  if (const json::Value* sig = members.find("signature")) {
    if (sig->kind != json::Value::Kind::kString)
      throw Error(ErrorCode::kBadMetadata, "kernel metadata field \"signature\" must be a string");
    meta.signature = sig->text;
  }
  if (members.find("abi_version")) meta.abiVersion = intField(members, "abi_version", 1);
  return meta;
}

}  // namespace megamoe
