// megamoe-cache's metadata reader and report writer (compiler/cache/CacheReport.h): the facts of real metadata,
// bad fields reported instead of thrown, and reports that are strict JSON whatever their strings hold.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "compiler/cache/CacheReport.h"

namespace megamoe::cache {
namespace {

// The shape CompiledKernel::metadataJson() writes; note the two shared_bytes (dynamic on top, static inside).
const char* kMetadata =
    R"({"symbol":"gemm_nt","block_threads":384,"shared_bytes":1024,"compile_ms":{"lower":1.5,"optimize":2,)"
    R"("codegen":3,"link":4},"static":{"target":"sm_90a","registers":168,"agprs":0,"sgprs":0,"scratch_bytes":0,)"
    R"("spill_bytes":0,"shared_bytes":200704,"mma_instructions":96,"mma_mnemonic":"wgmma.mma_async",)"
    R"("expects_mma":true,"violations":[]}})";

TEST(KernelFacts, ReadsTheCompilersMetadata) {
  KernelFacts facts;
  std::string problem;
  ASSERT_TRUE(readKernelFacts(kMetadata, facts, problem)) << problem;
  EXPECT_EQ(facts.dynamicSharedBytes, 1024);
  EXPECT_EQ(facts.column("registers"), "168");
  EXPECT_EQ(facts.column("mma_instructions"), "96");
  EXPECT_EQ(facts.column("no_such_fact"), "?");
  EXPECT_EQ(facts.column("mma_mnemonic"), "?");  // not an integer column
  EXPECT_EQ(facts.sharedColumn(), "201728");
  EXPECT_TRUE(facts.staticChecksPassed());
}

TEST(KernelFacts, ViolationsOrNoStaticFactsFailTheChecks) {
  KernelFacts facts;
  std::string problem;
  ASSERT_TRUE(readKernelFacts(R"({"static":{"shared_bytes":0,"violations":["spills 8 bytes"]}})", facts, problem));
  EXPECT_FALSE(facts.staticChecksPassed());
  EXPECT_EQ(facts.sharedColumn(), "0");
  ASSERT_TRUE(readKernelFacts(R"({"symbol":"k"})", facts, problem));
  EXPECT_FALSE(facts.staticChecksPassed());
  EXPECT_EQ(facts.sharedColumn(), "?");
  EXPECT_EQ(facts.dynamicSharedBytes, 0);
}

// The old reader ran std::stoll on whatever followed "shared_bytes": and aborted the whole run.
TEST(KernelFacts, BadFieldsAreReportedNotThrown) {
  struct Case {
    const char* metadata;
    const char* named;  // what the problem must mention
  };
  const Case cases[] = {
      {R"({"shared_bytes":"12a"})", "'shared_bytes' is not an integer"},
      {R"({"shared_bytes":1.5})", "'shared_bytes' is not an integer (1.5)"},
      {R"({"shared_bytes":1e3})", "'shared_bytes' is not an integer"},
      {R"({"shared_bytes":99999999999999999999})", "'shared_bytes' is not an integer"},
      {R"({"shared_bytes":null})", "'shared_bytes' is not an integer"},
      {R"({"static":{"registers":"many"}})", "'static.registers' is not an integer"},
      {R"({"static":{"shared_bytes":[1]}})", "'static.shared_bytes' is not an integer"},
      {R"({"static":[]})", "'static' is not an object"},
      {R"({"static":{"violations":"none"}})", "'static.violations' is not a list of strings"},
      {R"({"static":{"violations":[1]}})", "'static.violations' is not a list of strings"},
      {R"([1,2])", "not a JSON object"},
      {"", "not valid JSON"},
      {R"({"shared_bytes":12)", "not valid JSON"},
  };
  for (const Case& c : cases) {
    KernelFacts facts;
    facts.dynamicSharedBytes = 7;
    std::string problem;
    bool ok = true;
    EXPECT_NO_THROW(ok = readKernelFacts(c.metadata, facts, problem)) << c.metadata;
    EXPECT_FALSE(ok) << c.metadata;
    EXPECT_NE(problem.find(c.named), std::string::npos) << c.metadata << ": " << problem;
    EXPECT_EQ(facts.dynamicSharedBytes, 7) << "facts must be untouched on failure: " << c.metadata;
  }
}

// Every byte below 0x20, quotes and backslashes in every string field.
std::string hostile(const std::string& base) {
  std::string s = base;
  for (int b = 0; b < 0x20; ++b) s += char(b);
  return s + "\"\\\x7f";
}

TEST(CacheReport, GenerateJsonIsStrictJsonWhateverTheStrings) {
  GenerateRow row;
  row.kernel = hostile("gemm_nt[N=4096]");
  row.target = hostile("sm_90a");
  row.ranks = hostile("2,8");
  row.status = "FAIL";
  row.error = hostile("ptxas said:\n\t\"no\"");
  row.hit = true;
  row.ms = 12.25;
  row.loadMs = 0.5;
  std::string problem;
  ASSERT_TRUE(readKernelFacts(kMetadata, row.facts, problem)) << problem;
  GenerateRow failed;  // a row whose getKernel threw: no facts
  failed.kernel = "x";
  failed.status = "FAIL";

  GenerateSummary summary{hostile("deepseek-v3"), hostile("/tmp/cache"), hostile("megamoe 0.1"), 1500.5, 2};
  const std::string text = generateJson(summary, {row, failed});
  json::Value report;
  json::ParseError error;
  ASSERT_TRUE(json::parse(text, report, error)) << error.reason << " at " << error.offset << ": " << text;
  EXPECT_EQ(report.find("shape")->text, summary.shape);
  EXPECT_EQ(report.find("cache")->text, summary.cacheRoot);
  EXPECT_EQ(report.find("fingerprint")->text, summary.fingerprint);
  EXPECT_EQ(report.find("total_ms")->text, "1500.5");
  EXPECT_EQ(report.find("failures")->integer, 2);
  const json::Value* kernels = report.find("kernels");
  ASSERT_TRUE(kernels && kernels->array.size() == 2);
  const json::Value& first = kernels->array[0];
  EXPECT_EQ(first.find("kernel")->text, row.kernel);
  EXPECT_EQ(first.find("target")->text, row.target);
  EXPECT_EQ(first.find("ep")->text, row.ranks);
  EXPECT_EQ(first.find("error")->text, row.error);
  EXPECT_TRUE(first.find("hit")->boolean);
  EXPECT_EQ(first.find("ms")->text, "12.25");
  EXPECT_EQ(first.find("load_ms")->text, "0.5");
  EXPECT_EQ(first.find("dynamic_shared_bytes")->integer, 1024);
  EXPECT_EQ(first.find("static")->find("registers")->integer, 168);
  EXPECT_EQ(json::render(*first.find("static")), json::render(row.facts.staticFacts));
  EXPECT_EQ(kernels->array[1].find("static")->kind, json::Value::Kind::kObject);
  EXPECT_TRUE(kernels->array[1].find("static")->object.empty());
}

TEST(CacheReport, RepeatedStaticKeysAreWrittenOnce) {
  KernelFacts facts;
  std::string problem;
  ASSERT_TRUE(readKernelFacts(R"({"static":{"registers":1,"registers":2}})", facts, problem)) << problem;
  EXPECT_EQ(facts.column("registers"), "2");
  GenerateRow row;
  row.facts = facts;
  json::Value report;
  json::ParseError error;
  EXPECT_TRUE(json::parse(generateJson({}, {row}), report, error)) << error.reason;  // strict: no duplicate keys
}

TEST(CacheReport, EntriesJsonIsStrictJson) {
  EntryInfo valid;
  valid.digest = std::string(64, 'a');
  valid.description = hostile("swiglu_fwd[I=2048]@gfx950");
  valid.bytes = 123456;
  valid.valid = true;
  valid.indexProblem = hostile("index/b is missing");
  EntryInfo invalid;
  invalid.digest = "not-a-digest";
  invalid.problem = hostile("code.bin is not a regular file (a FIFO)");
  const std::string text = entriesJson({valid, invalid});
  json::Value list;
  json::ParseError error;
  ASSERT_TRUE(json::parse(text, list, error)) << error.reason << " at " << error.offset << ": " << text;
  ASSERT_EQ(list.array.size(), 2u);
  EXPECT_EQ(list.array[0].find("digest")->text, valid.digest);
  EXPECT_EQ(list.array[0].find("kernel")->text, valid.description);
  EXPECT_EQ(list.array[0].find("bytes")->integer, 123456);
  EXPECT_TRUE(list.array[0].find("valid")->boolean);
  EXPECT_EQ(list.array[0].find("index_problem")->text, valid.indexProblem);
  EXPECT_FALSE(list.array[1].find("valid")->boolean);
  EXPECT_EQ(list.array[1].find("problem")->text, invalid.problem);
  EXPECT_EQ(entriesJson({}), "[]\n");
}

}  // namespace
}  // namespace megamoe::cache
