// The layer's SM budget (MoeLayerConfig::smBudget, MEGAMOE_SM_BUDGET) on the fake HIP backend (256 compute units):
// its validation, its default for ranks that share a device, and that every persistent kernel of a forward and a
// backward launches at most the budget's blocks. The layer's kernels are stand-ins (FakeLayerKernels.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "FakeLayerKernels.h"
#include "TestSupport.h"
#include "megamoe/Error.h"
#include "megamoe/MoeLayer.h"
#include "megamoe/Runtime.h"

namespace megamoe {
namespace {

constexpr int kFakeSms = 256;  // HipBackend's multiprocessors()

MoeLayerConfig small(int64_t budget, bool training = false) {
  MoeLayerConfig c{512, 256, 16, 4, 64, 0};
  c.training = training;
  c.smBudget = budget;
  return c;
}

std::string errorOf(const std::function<void()>& f, ErrorCode* code = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (code) *code = e.code();
    return e.what();
  }
  return "";
}

TEST(SmBudget, ValidateNamesTheConstraint) {
  EXPECT_EQ(MoeLayer::validate(small(0), 2), "");
  EXPECT_EQ(MoeLayer::validate(small(100), 2), "");
  for (int64_t bad : {-2, 99, 1, 2048}) {
    const std::string e = MoeLayer::validate(small(bad), 2);
    EXPECT_NE(e.find("sm_budget=" + std::to_string(bad)), std::string::npos) << e;
    EXPECT_NE(e.find("even"), std::string::npos) << e;
  }
}

TEST(SmBudget, EnvironmentVariableIsStrict) {
  auto parse = [](const char* value) {
    return parseEnv([value](const char* name) -> const char* {
      return std::string(name) == "MEGAMOE_SM_BUDGET" ? value : nullptr;
    });
  };
  EXPECT_EQ(parse(nullptr).smBudget, 0);
  EXPECT_EQ(parse("100").smBudget, 100);
  for (const char* bad : {"0", "3", "", " 4", "+4", "4x", "2000", "1e2"}) {
    ErrorCode code = ErrorCode::kOk;
    const std::string e = errorOf([&] { parse(bad); }, &code);
    EXPECT_EQ(code, ErrorCode::kInvalidEnv) << "'" << bad << "': " << e;
    EXPECT_NE(e.find("MEGAMOE_SM_BUDGET"), std::string::npos) << e;
  }
}

// Two ranks of one process on fake device 0, with every kernel of the layer stored as a fake one.
class SmBudgetOnFakeHip : public ::testing::Test {
 protected:
  void open(const MoeLayerConfig& config, int nranks, const char* envBudget = nullptr) {
    RuntimeEnv env = parseEnv([envBudget](const char* name) -> const char* {
      return std::string(name) == "MEGAMOE_SM_BUDGET" ? envBudget : nullptr;
    });
    env.hipLibrary = test::FakeHip::path();
    env.cacheDir = dir.path();
    test::storeFakeLayerKernels(dir.path(), config, nranks);
    layers.clear();  // before the runtimes they launch through
    runtimes.clear();
    for (int r = 0; r < nranks; ++r) runtimes.push_back(std::make_unique<Runtime>(BackendKind::kHip, 0, env));
    std::vector<Runtime*> raw;
    for (auto& rt : runtimes) raw.push_back(rt.get());
    layers = MoeLayer::createLocal(raw, config);
  }
  // The largest grid each kernel was launched with since launch index `from`.
  std::map<std::string, unsigned> gridsSince(int from) {
    std::map<std::string, unsigned> grids;
    for (int i = from; i < test::FakeHip::get().launchCount(); ++i) {
      FakeHipLaunch l{};
      test::FakeHip::get().launch(i, &l);
      grids[l.name] = std::max(grids[l.name], l.grid[0]);
    }
    return grids;
  }
  test::TempDir dir;
  std::vector<std::unique_ptr<Runtime>> runtimes;
  std::vector<std::unique_ptr<MoeLayer>> layers;
};

TEST_F(SmBudgetOnFakeHip, RanksSharingADeviceSplitItsSmsByDefault) {
  open(small(0), 2);
  ASSERT_EQ(layers.size(), 2u);
  EXPECT_EQ(layers[0]->smBudget(), kFakeSms / 2);
  EXPECT_EQ(layers[1]->smBudget(), kFakeSms / 2);
}

// Every rank of a workspace launches the same grid (the combine counts the owner's blocks against its own grid):
// ranks in one process whose shares of their devices differ all take the smallest; ranks that exchange handles
// must agree on it.
TEST_F(SmBudgetOnFakeHip, RanksOfOneWorkspaceRunOneGrid) {
  RuntimeEnv env = parseEnv([](const char*) -> const char* { return nullptr; });
  env.hipLibrary = test::FakeHip::path();
  env.cacheDir = dir.path();
  test::storeFakeLayerKernels(dir.path(), small(0), 4);
  std::vector<std::unique_ptr<Runtime>> rts;
  std::vector<Runtime*> raw;
  for (int device : {0, 0, 0, 1}) {
    rts.push_back(std::make_unique<Runtime>(BackendKind::kHip, device, env));
    raw.push_back(rts.back().get());
  }
  auto spread = MoeLayer::createLocal(raw, small(0));
  const int shareOfThree = kFakeSms / 3 / 2 * 2;
  for (auto& layer : spread) EXPECT_EQ(layer->smBudget(), shareOfThree);
  spread.clear();

  std::unique_ptr<Workspace::Pending> pending[2] = {Workspace::prepare(*raw[0], small(40), 0, 2),
                                                    Workspace::prepare(*raw[1], small(60), 1, 2)};
  std::vector<uint8_t> all = pending[0]->handle();
  all.insert(all.end(), pending[1]->handle().begin(), pending[1]->handle().end());
  const std::string e = errorOf([&] { Workspace::join(*pending[0], all.data(), all.size()); });
  EXPECT_NE(e.find("rank 1's sm_budget=60 differs from rank 0's sm_budget=40"), std::string::npos) << e;
}

TEST_F(SmBudgetOnFakeHip, EnvironmentDefaultAndConfigOverride) {
  open(small(0), 1, "40");
  EXPECT_EQ(layers[0]->smBudget(), 40);
  open(small(60), 1, "40");
  EXPECT_EQ(layers[0]->smBudget(), 60);
}

TEST_F(SmBudgetOnFakeHip, MoreThanTheDeviceIsRefused) {
  ErrorCode code = ErrorCode::kOk;
  std::string e = errorOf([&] { open(small(300), 1); }, &code);
  EXPECT_EQ(code, ErrorCode::kInvalidArgument) << e;
  EXPECT_NE(e.find("sm_budget=300 exceeds the 256 SMs of device 0"), std::string::npos) << e;
  e = errorOf([&] { open(small(200), 2); }, &code);
  EXPECT_EQ(code, ErrorCode::kInvalidArgument) << e;
  EXPECT_NE(e.find("add up to 400 SMs"), std::string::npos) << e;
  e = errorOf([&] { open(small(99), 1); }, &code);
  EXPECT_EQ(code, ErrorCode::kInvalidArgument) << e;
  EXPECT_NE(e.find("sm_budget=99"), std::string::npos) << e;
}

// At a budget above and below the prologue's 16 blocks (whose blocks meet on a grid barrier: all must be resident).
TEST_F(SmBudgetOnFakeHip, EveryPersistentKernelStaysWithinTheBudget) {
  for (int budget : {100, 8}) {
    SCOPED_TRACE("budget " + std::to_string(budget));
    open(small(budget, /*training=*/true), 2);
    auto& fake = test::FakeHip::get();
    std::vector<DevicePtr> buffers;
    Device& d = *runtimes[0]->device();
    auto buffer = [&] {
      buffers.push_back(d.allocate(1 << 20));
      return buffers.back();
    };
    const int from = fake.launchCount();
    for (auto& layer : layers) {
      ForwardArgs f{buffer(), 8, buffer(), buffer(), buffer(), buffer(), buffer()};
      layer->forward(f, nullptr);
      BackwardArgs b{buffer(), f.x, 8, f.topkIdx, f.topkWeights, f.w1, f.w2, buffer(), buffer(), buffer(), buffer()};
      layer->backward(b, nullptr);
    }
    const auto grids = gridsSince(from);
    // The persistent kernels (one block per SM of the budget); swiglu_bwd is a plain grid of 8 blocks per SM.
    for (const char* persistent : {"dispatch_grouped_gemm", "grouped_gemm_combine", "grouped_gemm_tn_tma"}) {
      ASSERT_TRUE(grids.count(persistent)) << persistent << " was not launched";
      EXPECT_EQ(grids.at(persistent), unsigned(budget)) << persistent;
    }
    EXPECT_EQ(grids.at("dispatch_prologue"), unsigned(std::min(budget, 16)));
    EXPECT_EQ(grids.at("swiglu_bwd"), unsigned(8 * budget));
    for (DevicePtr p : buffers) d.free(p);
  }
}

}  // namespace
}  // namespace megamoe
