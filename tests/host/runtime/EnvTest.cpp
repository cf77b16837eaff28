// The MEGAMOE_* registry and its parser: defaults, valid values, and clear errors for bad ones.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "megamoe/Error.h"
#include "megamoe/env.h"

namespace megamoe {
namespace {

RuntimeEnv parseWith(const std::map<std::string, std::string>& vars) {
  return parseEnv([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

TEST(Env, RegistryIsCompleteAndDocumented) {
  std::set<std::string> names;
  for (const EnvVar& v : envRegistry()) {
    EXPECT_EQ(std::string(v.name).rfind("MEGAMOE_", 0), 0u) << v.name;
    EXPECT_GT(std::string(v.doc).size(), 10u) << v.name;
    EXPECT_TRUE(names.insert(v.name).second) << "duplicate " << v.name;
  }
  for (const char* expected : {"MEGAMOE_CACHE_DIR", "MEGAMOE_CUDA_LIBRARY", "MEGAMOE_HIP_LIBRARY", "MEGAMOE_BACKEND",
                               "MEGAMOE_RENDEZVOUS_TIMEOUT_S", "MEGAMOE_WAIT_TIMEOUT_MS", "MEGAMOE_PUSH_BLOCKS"})
    EXPECT_EQ(names.count(expected), 1u) << expected;
}

TEST(Env, DefaultsWhenUnset) {
  const RuntimeEnv env = parseWith({});
  EXPECT_EQ(env.cacheDir, "");
  EXPECT_EQ(env.cudaLibrary, "libcuda.so.1");
  EXPECT_EQ(env.hipLibrary, "libamdhip64.so");
  EXPECT_EQ(env.backend, "auto");
  EXPECT_DOUBLE_EQ(env.rendezvousTimeoutS, 30.0);
  EXPECT_EQ(env.waitTimeoutMs, 10000u);
  EXPECT_EQ(env.pushBlocks, 32);
}

TEST(Env, ReadsValidValues) {
  const RuntimeEnv env = parseWith({{"MEGAMOE_CACHE_DIR", "/tmp/c"},
                                    {"MEGAMOE_HIP_LIBRARY", "/opt/rocm/lib/libamdhip64.so"},
                                    {"MEGAMOE_BACKEND", "hip"},
                                    {"MEGAMOE_RENDEZVOUS_TIMEOUT_S", "0.25"},
                                    {"MEGAMOE_WAIT_TIMEOUT_MS", "1500"},
                                    {"MEGAMOE_PUSH_BLOCKS", "48"}});
  EXPECT_EQ(env.cacheDir, "/tmp/c");
  EXPECT_EQ(env.hipLibrary, "/opt/rocm/lib/libamdhip64.so");
  EXPECT_EQ(env.backend, "hip");
  EXPECT_DOUBLE_EQ(env.rendezvousTimeoutS, 0.25);
  EXPECT_EQ(env.waitTimeoutMs, 1500u);
  EXPECT_EQ(env.pushBlocks, 48);
}

TEST(Env, BadValuesNameTheVariableTheValueAndTheDefault) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"MEGAMOE_WAIT_TIMEOUT_MS", "abc"},       {"MEGAMOE_WAIT_TIMEOUT_MS", "0"},
      {"MEGAMOE_WAIT_TIMEOUT_MS", "-5"},        {"MEGAMOE_WAIT_TIMEOUT_MS", "10ms"},
      {"MEGAMOE_WAIT_TIMEOUT_MS", ""},          {"MEGAMOE_WAIT_TIMEOUT_MS", "99999999999999999999999"},
      {"MEGAMOE_RENDEZVOUS_TIMEOUT_S", "soon"}, {"MEGAMOE_RENDEZVOUS_TIMEOUT_S", "0"},
      {"MEGAMOE_RENDEZVOUS_TIMEOUT_S", "-1"},   {"MEGAMOE_RENDEZVOUS_TIMEOUT_S", "nan"},
      {"MEGAMOE_RENDEZVOUS_TIMEOUT_S", "1e9"},  {"MEGAMOE_BACKEND", "opencl"},
      {"MEGAMOE_HIP_LIBRARY", ""},              {"MEGAMOE_CUDA_LIBRARY", ""},
      {"MEGAMOE_PUSH_BLOCKS", "0"},             {"MEGAMOE_PUSH_BLOCKS", "1025"},
      {"MEGAMOE_PUSH_BLOCKS", "-3"},            {"MEGAMOE_PUSH_BLOCKS", "many"},
  };
  for (const auto& [name, value] : bad) {
    try {
      parseWith({{name, value}});
      ADD_FAILURE() << name << "=" << value << " accepted";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_EQ(e.code(), ErrorCode::kInvalidEnv);
      EXPECT_NE(what.find(name + "='" + value + "'"), std::string::npos) << what;
      EXPECT_NE(what.find("default"), std::string::npos) << what;
    }
  }
}

}  // namespace
}  // namespace megamoe
