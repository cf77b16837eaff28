// The MEGAMOE_* registry and its parser: defaults, valid values, and clear errors for bad ones.
#include <gtest/gtest.h>

#include <clocale>
#include <functional>
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
                               "MEGAMOE_RENDEZVOUS_TIMEOUT_S", "MEGAMOE_RENDEZVOUS_SECRET", "MEGAMOE_WAIT_TIMEOUT_MS",
                               "MEGAMOE_PUSH_BLOCKS"})
    EXPECT_EQ(names.count(expected), 1u) << expected;
}

TEST(Env, DefaultsWhenUnset) {
  const RuntimeEnv env = parseWith({});
  EXPECT_EQ(env.cacheDir, "");
  EXPECT_EQ(env.cudaLibrary, "libcuda.so.1");
  EXPECT_EQ(env.hipLibrary, "libamdhip64.so");
  EXPECT_EQ(env.backend, "auto");
  EXPECT_DOUBLE_EQ(env.rendezvousTimeoutS, 30.0);
  EXPECT_EQ(env.rendezvousSecret, "");
  EXPECT_EQ(env.waitTimeoutMs, 10000u);
  EXPECT_EQ(env.pushBlocks, 32);
}

TEST(Env, ReadsValidValues) {
  const RuntimeEnv env = parseWith({{"MEGAMOE_CACHE_DIR", "/tmp/c"},
                                    {"MEGAMOE_HIP_LIBRARY", "/opt/rocm/lib/libamdhip64.so"},
                                    {"MEGAMOE_BACKEND", "hip"},
                                    {"MEGAMOE_RENDEZVOUS_TIMEOUT_S", "0.25"},
                                    {"MEGAMOE_RENDEZVOUS_SECRET", "launcher-made"},
                                    {"MEGAMOE_WAIT_TIMEOUT_MS", "1500"},
                                    {"MEGAMOE_PUSH_BLOCKS", "48"}});
  EXPECT_EQ(env.cacheDir, "/tmp/c");
  EXPECT_EQ(env.hipLibrary, "/opt/rocm/lib/libamdhip64.so");
  EXPECT_EQ(env.backend, "hip");
  EXPECT_DOUBLE_EQ(env.rendezvousTimeoutS, 0.25);
  EXPECT_EQ(env.rendezvousSecret, "launcher-made");
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

void expectRejected(const std::string& name, const std::string& value) {
  try {
    parseWith({{name, value}});
    ADD_FAILURE() << name << "='" << value << "' accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidEnv);
    EXPECT_NE(std::string(e.what()).find(name + "='" + value + "'"), std::string::npos) << e.what();
  }
}

// The same grammar as the other variables: digits, optionally '.' and digits; from a millisecond to a day.
TEST(Env, RendezvousTimeoutIsDigitsWithAnOptionalFraction) {
  const std::vector<std::pair<std::string, double>> good = {
      {"0.001", 0.001}, {"1", 1}, {"2.5", 2.5}, {"030", 30}, {"86400", 86400}, {"86400.000", 86400}};
  for (const auto& [text, value] : good)
    EXPECT_DOUBLE_EQ(parseWith({{"MEGAMOE_RENDEZVOUS_TIMEOUT_S", text}}).rendezvousTimeoutS, value) << text;
  for (const char* bad : {
           " 5", "5 ", "\t5", "5\n",           // blanks
           "+5", "-0", "-5",                    // signs
           "0x10", "0x1p3", "0X1P-3",           // hex, hex floats
           "1e-300", "1e3", "5E0", "1e",        // exponents (1e-300: a zero timeout)
           "1,5", ".5", "5.", "1.2.3", "1..2",  // decimal point: '.' between digits only
           "inf", "infinity", "nan", "",        // not numbers
           "0", "0.0", "0.0009",                // below a millisecond
           "86400.5", "86401", "99999999999999999999999999999999999"}) {
    expectRejected("MEGAMOE_RENDEZVOUS_TIMEOUT_S", bad);
  }
}

// The integer variables share one parser: decimal digits only (leading zeros allowed; no blanks, sign, hex,
// fraction or exponent), the same error naming the variable, the value and the accepted range.
TEST(Env, IntegerVariablesShareOneGrammarAndErrorShape) {
  struct IntegerVar {
    std::string name;
    uint64_t min, max;
    std::string range;  // as the error states it
    std::function<uint64_t(const RuntimeEnv&)> read;
  };
  const std::vector<IntegerVar> vars = {
      {"MEGAMOE_WAIT_TIMEOUT_MS", 1, 1000000000000, "an integer from 1 to 1000000000000",
       [](const RuntimeEnv& e) { return e.waitTimeoutMs; }},
      {"MEGAMOE_PUSH_BLOCKS", 1, 1024, "an integer from 1 to 1024",
       [](const RuntimeEnv& e) { return uint64_t(e.pushBlocks); }},
      {"MEGAMOE_SM_BUDGET", 2, 1024, "an even integer from 2 to 1024",
       [](const RuntimeEnv& e) { return uint64_t(e.smBudget); }},
  };
  for (const IntegerVar& var : vars) {
    SCOPED_TRACE(var.name);
    for (const std::string& good : {"8", "08", "0008", "000000008"})
      EXPECT_EQ(var.read(parseWith({{var.name, good}})), 8u) << "'" << good << "'";
    EXPECT_EQ(var.read(parseWith({{var.name, std::to_string(var.max)}})), var.max);
    EXPECT_EQ(var.read(parseWith({{var.name, std::to_string(var.min)}})), var.min);
    for (const std::string& bad : {std::string("8 "), std::string(" 8"), std::string("\t8"), std::string("+8"),
                                   std::string("-8"), std::string("0x10"), std::string("8.0"), std::string("8e0"),
                                   std::string("8,0"), std::string("8ms"), std::string(""), std::string("eight"),
                                   std::to_string(var.max + 2), std::to_string(var.min - 1),
                                   std::string("99999999999999999999999")}) {
      try {
        parseWith({{var.name, bad}});
        ADD_FAILURE() << "'" << bad << "' accepted";
      } catch (const Error& e) {
        const std::string what = e.what();
        EXPECT_EQ(e.code(), ErrorCode::kInvalidEnv) << what;
        EXPECT_NE(what.find(var.name + "='" + bad + "' is invalid: expected " + var.range), std::string::npos)
            << what;
      }
    }
  }
}

// strtod reads "2,5" as 2.5 under a decimal-comma locale (and "2.5" as 2): the parser must not consult the locale.
TEST(Env, RendezvousTimeoutIgnoresTheLocale) {
  const std::string before = std::setlocale(LC_NUMERIC, nullptr);
  const char* comma = nullptr;
  for (const char* name : {"de_DE.UTF-8", "de_DE.utf8", "fr_FR.UTF-8", "fr_FR.utf8", "nl_NL.UTF-8", "ru_RU.UTF-8"})
    if (std::setlocale(LC_NUMERIC, name)) {
      comma = name;
      break;
    }
  if (!comma) GTEST_SKIP() << "no locale with a decimal comma is installed here (tried de_DE, fr_FR, nl_NL, ru_RU)";
  double dot = 0;
  bool commaAccepted = true;
  try {
    dot = parseWith({{"MEGAMOE_RENDEZVOUS_TIMEOUT_S", "2.5"}}).rendezvousTimeoutS;
    parseWith({{"MEGAMOE_RENDEZVOUS_TIMEOUT_S", "2,5"}});
  } catch (const Error&) {
    commaAccepted = false;
  }
  std::setlocale(LC_NUMERIC, before.c_str());  // before any assertion can return
  EXPECT_DOUBLE_EQ(dot, 2.5) << comma;
  EXPECT_FALSE(commaAccepted) << comma;
}

}  // namespace
}  // namespace megamoe
