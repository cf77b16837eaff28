// Profiler ranges (megamoe/Profile.h): no-ops when off or when the NVTX library is missing (said once, at debug),
// and push/pop pairs with the names through a fake NVTX library (FakeNvtx.cpp) when MEGAMOE_NVTX=1.
#include <gtest/gtest.h>

#include <dlfcn.h>

#include <string>
#include <vector>

#include "TestSupport.h"
#include "megamoe/Profile.h"

namespace megamoe {
namespace {

using test::LogCapture;

// The fake's record of calls (same dlopen handle as the runtime's, by path).
std::vector<std::string> fakeEvents() {
  static void* lib = ::dlopen(MEGAMOE_FAKE_NVTX_PATH, RTLD_NOW | RTLD_LOCAL);
  if (!lib) throw std::runtime_error(std::string("cannot load the fake NVTX library: ") + ::dlerror());
  static auto count = reinterpret_cast<int (*)()>(::dlsym(lib, "fakenvtx_event_count"));
  static auto event = reinterpret_cast<int (*)(int, char*, int)>(::dlsym(lib, "fakenvtx_event"));
  std::vector<std::string> out;
  for (int i = 0; i < count(); ++i) {
    char text[128];
    if (event(i, text, sizeof text) == 0) out.emplace_back(text);
  }
  return out;
}
void clearFakeEvents() {
  static void* lib = ::dlopen(MEGAMOE_FAKE_NVTX_PATH, RTLD_NOW | RTLD_LOCAL);
  reinterpret_cast<void (*)()>(::dlsym(lib, "fakenvtx_clear"))();
}

// Each test starts as a process does: nothing decided, MEGAMOE_NVTX read at the first range.
class ProfileRanges : public ::testing::Test {
 protected:
  void SetUp() override {
    resetProfileRanges();
    clearFakeEvents();
  }
  void TearDown() override { resetProfileRanges(); }
  test::ScopedEnv nvtxOff{"MEGAMOE_NVTX", nullptr};
  test::ScopedEnv libraryDefault{"MEGAMOE_NVTX_LIBRARY", nullptr};
};

int countLines(const LogCapture& capture, const std::string& fragment) {
  int n = 0;
  for (const auto& l : capture.lines()) n += l.text.find(fragment) != std::string::npos;
  return n;
}

TEST_F(ProfileRanges, OffByDefaultEvenWithTheLibraryAtHand) {
  test::ScopedEnv library("MEGAMOE_NVTX_LIBRARY", MEGAMOE_FAKE_NVTX_PATH);
  LogCapture capture(LogLevel::kDebug);
  { ProfileRange range("dispatch"); }
  EXPECT_FALSE(profileRangesActive());
  EXPECT_TRUE(fakeEvents().empty());
  EXPECT_TRUE(capture.lines().empty()) << capture.dump();
}

TEST_F(ProfileRanges, MissingLibraryIsANoOpSaidOnceAtDebug) {
  test::ScopedEnv on("MEGAMOE_NVTX", "1");
  test::ScopedEnv library("MEGAMOE_NVTX_LIBRARY", "/nonexistent/libnvToolsExt.so.1");
  LogCapture capture(LogLevel::kDebug);
  for (int i = 0; i < 3; ++i) {
    ProfileRange outer("dispatch");
    ProfileRange inner("gemm");
  }
  EXPECT_FALSE(profileRangesActive());
  EXPECT_EQ(
      countLines(capture, "profile ranges off: the NVTX library /nonexistent/libnvToolsExt.so.1 cannot be loaded"), 1)
      << capture.dump();
  EXPECT_EQ(capture.lines().size(), 1u) << capture.dump();
  EXPECT_EQ(capture.lines()[0].level, LogLevel::kDebug);
}

TEST_F(ProfileRanges, LibraryWithoutTheFunctionsIsANoOp) {
  LogCapture capture(LogLevel::kDebug);
  EXPECT_FALSE(setProfileRanges(true, test::FakeHip::path()));
  { ProfileRange range("dispatch"); }
  EXPECT_EQ(countLines(capture, "does not export nvtxRangePushA and nvtxRangePop"), 1) << capture.dump();
}

TEST_F(ProfileRanges, FakeLibraryRecordsPushPopPairsWithTheNames) {
  test::ScopedEnv on("MEGAMOE_NVTX", "1");
  test::ScopedEnv library("MEGAMOE_NVTX_LIBRARY", MEGAMOE_FAKE_NVTX_PATH);
  LogCapture capture(LogLevel::kInfo);
  {
    ProfileRange forward("forward");
    { ProfileRange dispatch("dispatch"); }
    { ProfileRange combine("combine"); }
  }
  EXPECT_TRUE(profileRangesActive());
  EXPECT_EQ(fakeEvents(), (std::vector<std::string>{"push forward", "push dispatch", "pop", "push combine", "pop",
                                                    "pop"}));
  EXPECT_EQ(countLines(capture, std::string("profile ranges on: NVTX through ") + MEGAMOE_FAKE_NVTX_PATH), 1)
      << capture.dump();
}

TEST_F(ProfileRanges, ARangeOpenAcrossAReconfigurationStillPops) {
  ASSERT_TRUE(setProfileRanges(true, MEGAMOE_FAKE_NVTX_PATH));
  {
    ProfileRange range("dispatch");
    setProfileRanges(false);
    ProfileRange unrecorded("gemm");
  }
  EXPECT_EQ(fakeEvents(), (std::vector<std::string>{"push dispatch", "pop"}));
}

TEST_F(ProfileRanges, BadVariableLeavesRangesOffWithAWarning) {
  test::ScopedEnv bad("MEGAMOE_NVTX", "yes");
  LogCapture capture(LogLevel::kWarn);
  { ProfileRange range("dispatch"); }
  EXPECT_FALSE(profileRangesActive());
  EXPECT_EQ(countLines(capture, "MEGAMOE_NVTX='yes' is invalid"), 1) << capture.dump();
}

}  // namespace
}  // namespace megamoe
