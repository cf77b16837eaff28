// megamoe-cache's metadata reader and report writer (see CacheReport.h).
#include "compiler/cache/CacheReport.h"

#include <utility>

namespace megamoe::cache {
namespace {

// As the runtime reads metadata (runtime/src/Json.cpp): nesting bounded, any number, the last repeated key wins.
constexpr json::ParseOptions kMetadataJson = {/*maxDepth=*/256, /*integersOnly=*/false, /*allowDuplicateKeys=*/true};

// The static facts shown as integers (StaticFacts in compiler/include/megamoe/Target/Codegen.h).
constexpr const char* kIntegerFacts[] = {"registers",    "agprs",       "sgprs",           "scratch_bytes",
                                         "spill_bytes", "shared_bytes", "mma_instructions"};

// A present member must be an integer; `where` names it in the problem ("static.registers").
bool integerOrAbsent(const json::Value& object, const char* name, const std::string& where, std::string& problem) {
  const json::Value* v = object.find(name);
  if (!v || v->kind == json::Value::Kind::kInteger) return true;
  problem = "metadata field '" + where + "' is not an integer" +
            (v->kind == json::Value::Kind::kNumber ? " (" + v->text + ")" : std::string());
  return false;
}

void add(json::Value& object, const char* name, json::Value value) {
  object.object.emplace_back(name, std::move(value));
}

}  // namespace

std::string KernelFacts::column(const std::string& name) const {
  const json::Value* v = staticFacts.find(name);
  return v && v->kind == json::Value::Kind::kInteger ? std::to_string(v->integer) : "?";
}

std::string KernelFacts::sharedColumn() const {
  const json::Value* v = staticFacts.find("shared_bytes");
  if (!v || v->kind != json::Value::Kind::kInteger) return "?";
  // Both come from the compiler as int64; the sum of two shared-memory sizes cannot approach the limit.
  return std::to_string(v->integer + dynamicSharedBytes);
}

bool KernelFacts::staticChecksPassed() const {
  const json::Value* v = staticFacts.find("violations");
  return v && v->kind == json::Value::Kind::kArray && v->array.empty();
}

bool readKernelFacts(const std::string& metadata, KernelFacts& facts, std::string& problem) {
  json::Value root;
  json::ParseError error;
  if (!json::parse(metadata, root, error, kMetadataJson)) {
    problem = "metadata is not valid JSON: " + error.reason + " at byte " + std::to_string(error.offset);
    return false;
  }
  if (root.kind != json::Value::Kind::kObject) {
    problem = "metadata is not a JSON object";
    return false;
  }
  KernelFacts read;
  if (!integerOrAbsent(root, "shared_bytes", "shared_bytes", problem)) return false;
  if (const json::Value* shared = root.find("shared_bytes")) read.dynamicSharedBytes = shared->integer;
  if (const json::Value* statics = root.find("static")) {
    if (statics->kind != json::Value::Kind::kObject) {
      problem = "metadata field 'static' is not an object";
      return false;
    }
    for (const char* name : kIntegerFacts)
      if (!integerOrAbsent(*statics, name, std::string("static.") + name, problem)) return false;
    if (const json::Value* violations = statics->find("violations")) {
      bool strings = violations->kind == json::Value::Kind::kArray;
      for (const json::Value& v : violations->array) strings = strings && v.kind == json::Value::Kind::kString;
      if (!strings) {
        problem = "metadata field 'static.violations' is not a list of strings";
        return false;
      }
    }
    // Written back out by generateJson: one member per name (the last, as find() reads it), so strict readers
    // accept the report.
    for (size_t i = 0; i < statics->object.size(); ++i) {
      const auto& member = statics->object[i];
      bool repeated = false;
      for (size_t j = i + 1; j < statics->object.size() && !repeated; ++j)
        repeated = statics->object[j].first == member.first;
      if (!repeated) read.staticFacts.object.push_back(member);
    }
  }
  facts = std::move(read);
  return true;
}

std::string generateJson(const GenerateSummary& summary, const std::vector<GenerateRow>& rows) {
  json::Value kernels = json::arrayValue();
  for (const GenerateRow& r : rows) {
    json::Value row = json::objectValue();
    add(row, "kernel", json::stringValue(r.kernel));
    add(row, "target", json::stringValue(r.target));
    add(row, "ep", json::stringValue(r.ranks));
    add(row, "hit", json::boolValue(r.hit));
    add(row, "ms", json::numberValue(r.ms));
    add(row, "load_ms", json::numberValue(r.loadMs));
    add(row, "dynamic_shared_bytes", json::integerValue(r.facts.dynamicSharedBytes));
    add(row, "status", json::stringValue(r.status));
    add(row, "error", json::stringValue(r.error));
    add(row, "static", r.facts.staticFacts);
    kernels.array.push_back(std::move(row));
  }
  json::Value report = json::objectValue();
  add(report, "shape", json::stringValue(summary.shape));
  add(report, "cache", json::stringValue(summary.cacheRoot));
  add(report, "fingerprint", json::stringValue(summary.fingerprint));
  add(report, "total_ms", json::numberValue(summary.totalMs));
  add(report, "failures", json::integerValue(summary.failures));
  add(report, "kernels", std::move(kernels));
  return json::render(report) + "\n";
}

std::string entriesJson(const std::vector<EntryInfo>& entries) {
  json::Value list = json::arrayValue();
  for (const EntryInfo& e : entries) {
    json::Value entry = json::objectValue();
    add(entry, "digest", json::stringValue(e.digest));
    add(entry, "kernel", json::stringValue(e.description));
    add(entry, "bytes", json::integerValue(int64_t(e.bytes)));
    add(entry, "valid", json::boolValue(e.valid));
    add(entry, "problem", json::stringValue(e.problem));
    add(entry, "index_problem", json::stringValue(e.indexProblem));
    list.array.push_back(std::move(entry));
  }
  return json::render(list) + "\n";
}

}  // namespace megamoe::cache
