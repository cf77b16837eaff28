// The C ABI (libmegamoe) over layers and kernels on the fake HIP device: what needs a loadable kernel, which the C
// test (c_abi_test.c) cannot store: handle lifetimes (a layer keeps its runtime alive) and launch argument checks.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "FakeLayerKernels.h"
#include "TestSupport.h"
#include "megamoe/megamoe.h"

namespace megamoe {
namespace {

constexpr uint64_t kW1 = 0x40000, kW2 = 0x50000;  // never dereferenced by the stand-in kernels

class CApiOnFakeHip : public ::testing::Test {
 protected:
  void SetUp() override {
    MoeLayerConfig c;
    c.hidden = config.hidden;
    c.intermediate = config.intermediate;
    c.experts = config.experts;
    c.topk = config.topk;
    c.maxTokens = config.max_tokens;
    test::storeFakeLayerKernels(dir.path(), c, 1);
    ASSERT_EQ(megamoe_runtime_create("hip", 0, &runtime), MEGAMOE_OK) << megamoe_last_error();
  }
  void TearDown() override { EXPECT_EQ(megamoe_runtime_destroy(runtime), MEGAMOE_OK); }

  test::TempDir dir;
  test::ScopedEnv hip{"MEGAMOE_HIP_LIBRARY", test::FakeHip::path()};
  test::ScopedEnv cache{"MEGAMOE_CACHE_DIR", dir.path().c_str()};
  megamoe_layer_config config{sizeof(megamoe_layer_config), 512, 256, 16, 4, 64, 0, 0, MEGAMOE_DTYPE_BF16, 0, 0, 0, 0, 0};
  megamoe_runtime* runtime = nullptr;
};

// Hardening item 8: destroying the runtime drops the caller's reference only; the layer still launches on its
// device and is destroyed last (the ASan tier reports the use after free this was).
TEST_F(CApiOnFakeHip, LayerOutlivesItsRuntime) {
  megamoe_layer* layer = nullptr;
  ASSERT_EQ(megamoe_layer_create(runtime, &config, 0, 1, nullptr, &layer), MEGAMOE_OK) << megamoe_last_error();
  ASSERT_EQ(megamoe_runtime_destroy(runtime), MEGAMOE_OK);
  runtime = nullptr;
  const int launches = test::FakeHip::get().launchCount();
  EXPECT_EQ(megamoe_layer_forward(layer, 0, 0, 0, 0, kW1, kW2, 0, nullptr), MEGAMOE_OK) << megamoe_last_error();
  EXPECT_GT(test::FakeHip::get().launchCount(), launches);
  EXPECT_EQ(megamoe_layer_check_errors(layer, nullptr), MEGAMOE_OK) << megamoe_last_error();
  EXPECT_EQ(megamoe_layer_destroy(layer), MEGAMOE_OK);
}

TEST_F(CApiOnFakeHip, LocalLayerOutlivesItsRuntime) {
  megamoe_layer* layers[1] = {nullptr};
  ASSERT_EQ(megamoe_layer_create_local(&runtime, 1, &config, layers), MEGAMOE_OK) << megamoe_last_error();
  ASSERT_EQ(megamoe_runtime_destroy(runtime), MEGAMOE_OK);
  runtime = nullptr;
  EXPECT_EQ(megamoe_layer_forward(layers[0], 0, 0, 0, 0, kW1, kW2, 0, nullptr), MEGAMOE_OK) << megamoe_last_error();
  EXPECT_EQ(megamoe_layer_destroy(layers[0]), MEGAMOE_OK);
}

// The caller-exchanged rendezvous through the C ABI: sizes are checked, a workspace joined from its handles serves a
// layer, handles gathered out of order are refused naming the position, and the pending object is freed either way.
TEST_F(CApiOnFakeHip, WorkspaceFromHandlesTheCallerExchanged) {
  const size_t size = megamoe_workspace_handle_size();
  ASSERT_GT(size, 0u);
  megamoe_workspace_pending* pending = nullptr;
  ASSERT_EQ(megamoe_workspace_prepare(runtime, &config, 0, 1, &pending), MEGAMOE_OK) << megamoe_last_error();
  std::vector<uint8_t> handle(size);
  EXPECT_EQ(megamoe_workspace_export(pending, handle.data(), size - 1), MEGAMOE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(megamoe_last_error()).find("megamoe_workspace_handle_size()"), std::string::npos)
      << megamoe_last_error();
  ASSERT_EQ(megamoe_workspace_export(pending, handle.data(), size), MEGAMOE_OK) << megamoe_last_error();
  megamoe_workspace* workspace = nullptr;
  ASSERT_EQ(megamoe_workspace_join(pending, handle.data(), size, &workspace), MEGAMOE_OK) << megamoe_last_error();
  EXPECT_EQ(megamoe_workspace_export(pending, handle.data(), size), MEGAMOE_ERROR_INVALID_ARGUMENT)
      << "a joined pending workspace holds nothing";
  EXPECT_EQ(megamoe_workspace_pending_destroy(pending), MEGAMOE_OK);
  megamoe_layer* layer = nullptr;
  ASSERT_EQ(megamoe_layer_create_on(workspace, &config, &layer), MEGAMOE_OK) << megamoe_last_error();
  EXPECT_EQ(megamoe_layer_forward_saved(layer, 0, 0, 0, 0, kW1, kW2, 0, 0, nullptr), MEGAMOE_OK)
      << megamoe_last_error();
  uint64_t dropped = 1;
  EXPECT_EQ(megamoe_workspace_dropped_picks(workspace, nullptr, &dropped), MEGAMOE_OK) << megamoe_last_error();
  EXPECT_EQ(dropped, 0u);
  EXPECT_EQ(megamoe_layer_dropped_picks(layer, nullptr, nullptr), MEGAMOE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(megamoe_last_error()).find("picks"), std::string::npos) << megamoe_last_error();
  EXPECT_EQ(megamoe_workspace_destroy(workspace), MEGAMOE_OK);  // the layer keeps it alive
  EXPECT_EQ(megamoe_layer_check_errors(layer, nullptr), MEGAMOE_OK) << megamoe_last_error();
  EXPECT_EQ(megamoe_layer_destroy(layer), MEGAMOE_OK);

  // Two ranks in one process, handles swapped: refused, and both pending objects are destroyed unjoined.
  megamoe_workspace_pending* ranks[2] = {nullptr, nullptr};
  for (int r = 0; r < 2; ++r)
    ASSERT_EQ(megamoe_workspace_prepare(runtime, &config, r, 2, &ranks[r]), MEGAMOE_OK) << megamoe_last_error();
  std::vector<uint8_t> swapped(2 * size);
  ASSERT_EQ(megamoe_workspace_export(ranks[1], swapped.data(), size), MEGAMOE_OK);
  ASSERT_EQ(megamoe_workspace_export(ranks[0], swapped.data() + size, size), MEGAMOE_OK);
  workspace = nullptr;
  EXPECT_EQ(megamoe_workspace_join(ranks[0], swapped.data(), 2 * size, &workspace), MEGAMOE_ERROR_RENDEZVOUS);
  EXPECT_EQ(workspace, nullptr);
  EXPECT_NE(std::string(megamoe_last_error()).find("position 0 is not rank 0's own handle"), std::string::npos)
      << megamoe_last_error();
  for (auto* p : ranks) EXPECT_EQ(megamoe_workspace_pending_destroy(p), MEGAMOE_OK);
  EXPECT_EQ(megamoe_workspace_prepare(runtime, &config, 2, 2, &pending), MEGAMOE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(megamoe_last_error()).find("rank=2"), std::string::npos) << megamoe_last_error();
}

// Hardening round 2, item 2: handles belong to one group. Two jobs of one configuration (groups A and B, two ranks
// each, here in one process): a rank handed the other job's handle joins (the handle is well formed) but its group
// digest differs from its peer's, which is how the caller tells (the package all-gathers it); the ranks of one
// group agree. Every prepare draws its own nonce, so even equal heaps make different handles.
TEST_F(CApiOnFakeHip, GroupDigestTellsRanksHandedAnotherGroupsHandle) {
  const size_t size = megamoe_workspace_handle_size();
  megamoe_workspace_pending* a[2] = {nullptr, nullptr};
  megamoe_workspace_pending* b[2] = {nullptr, nullptr};
  std::vector<uint8_t> ha(2 * size), hb(2 * size);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(megamoe_workspace_prepare(runtime, &config, r, 2, &a[r]), MEGAMOE_OK) << megamoe_last_error();
    ASSERT_EQ(megamoe_workspace_prepare(runtime, &config, r, 2, &b[r]), MEGAMOE_OK) << megamoe_last_error();
    ASSERT_EQ(megamoe_workspace_export(a[r], ha.data() + r * size, size), MEGAMOE_OK);
    ASSERT_EQ(megamoe_workspace_export(b[r], hb.data() + r * size, size), MEGAMOE_OK);
  }
  EXPECT_NE(std::vector<uint8_t>(ha.begin(), ha.begin() + size), std::vector<uint8_t>(hb.begin(), hb.begin() + size))
      << "two prepares of rank 0 with one configuration made the same handle";
  std::vector<uint8_t> mixed(ha.begin(), ha.begin() + size);  // rank 0 of A, rank 1 of B
  mixed.insert(mixed.end(), hb.begin() + size, hb.end());
  megamoe_workspace* joined[4] = {nullptr, nullptr, nullptr, nullptr};
  ASSERT_EQ(megamoe_workspace_join(a[0], mixed.data(), mixed.size(), &joined[0]), MEGAMOE_OK) << megamoe_last_error();
  ASSERT_EQ(megamoe_workspace_join(a[1], ha.data(), ha.size(), &joined[1]), MEGAMOE_OK) << megamoe_last_error();
  ASSERT_EQ(megamoe_workspace_join(b[0], hb.data(), hb.size(), &joined[2]), MEGAMOE_OK) << megamoe_last_error();
  ASSERT_EQ(megamoe_workspace_join(b[1], hb.data(), hb.size(), &joined[3]), MEGAMOE_OK) << megamoe_last_error();
  uint64_t digest[4] = {0, 0, 0, 0};
  for (int i = 0; i < 4; ++i)
    ASSERT_EQ(megamoe_workspace_group_digest(joined[i], &digest[i]), MEGAMOE_OK) << megamoe_last_error();
  EXPECT_NE(digest[0], digest[1]) << "rank 0 joined with B's rank 1: its digest must differ from A's rank 1";
  EXPECT_EQ(digest[2], digest[3]) << "the ranks of one group agree";
  EXPECT_NE(digest[1], digest[2]);
  EXPECT_NE(digest[2], 0u);
  EXPECT_EQ(megamoe_workspace_group_digest(joined[0], nullptr), MEGAMOE_ERROR_INVALID_ARGUMENT);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(megamoe_workspace_destroy(joined[i]), MEGAMOE_OK);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(megamoe_workspace_pending_destroy(a[r]), MEGAMOE_OK);
    EXPECT_EQ(megamoe_workspace_pending_destroy(b[r]), MEGAMOE_OK);
  }
}

// Hardening item 16: a launch without its parameter array is an invalid argument, not a read through NULL.
TEST_F(CApiOnFakeHip, LaunchRefusesNullParams) {
  megamoe_kernel_key key{};
  key.kernel = "epoch_advance";
  megamoe_kernel* kernel = nullptr;
  // options NULL: the target's defaults, those megamoe-cache stores the entry with (no copy in the caller).
  ASSERT_EQ(megamoe_kernel_load(runtime, &key, nullptr, &kernel), MEGAMOE_OK) << megamoe_last_error();
  const std::string wrong = "target=gfx950;O=2";
  key.options = wrong.c_str();
  megamoe_kernel* other = nullptr;
  EXPECT_EQ(megamoe_kernel_load(runtime, &key, nullptr, &other), MEGAMOE_ERROR_KERNEL_NOT_FOUND);
  megamoe_launch_dims dims{};
  dims.grid[0] = dims.grid[1] = dims.grid[2] = 1;
  dims.block[0] = 256;
  dims.block[1] = dims.block[2] = 1;
  const int launches = test::FakeHip::get().launchCount();
  EXPECT_EQ(megamoe_launch(runtime, kernel, &dims, nullptr, nullptr, nullptr), MEGAMOE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(megamoe_last_error()).find("params must not be NULL"), std::string::npos)
      << megamoe_last_error();
  EXPECT_EQ(test::FakeHip::get().launchCount(), launches);
  // Hardening round 2, item 4: a NULL slot of a declared argument is refused by the argument's name.
  void* nullSlot[] = {nullptr};
  EXPECT_EQ(megamoe_launch(runtime, kernel, &dims, nullptr, nullSlot, nullptr), MEGAMOE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(megamoe_last_error()).find("params[0] (argument ctx) is NULL"), std::string::npos)
      << megamoe_last_error();
  EXPECT_EQ(test::FakeHip::get().launchCount(), launches);
  uint64_t context = 0;
  void* params[] = {&context};
  EXPECT_EQ(megamoe_launch(runtime, kernel, &dims, nullptr, params, nullptr), MEGAMOE_OK) << megamoe_last_error();
}

}  // namespace
}  // namespace megamoe
