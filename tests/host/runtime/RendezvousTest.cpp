// The heap rendezvous, run with fork()ed ranks: the happy path, and every way setup can go wrong must end in an
// error naming the rank at fault, within the timeout plus a little, never in a hang.
#include <gtest/gtest.h>

#include <memory>
#include <thread>

#include "TestSupport.h"
#include "megamoe/Error.h"
#include "megamoe/Rendezvous.h"

namespace megamoe {
namespace {

using test::Child;
using test::ChildOutcome;

// Generous slack for a loaded CI machine; the point is "bounded", not "fast".
constexpr double kSlackS = 3.0;

std::vector<uint8_t> payloadFor(int rank) {
  std::vector<uint8_t> p(static_cast<size_t>(rank) * 100);  // rank 0 sends an empty payload
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<uint8_t>(rank * 31 + i);
  return p;
}

std::unique_ptr<Child> startRank(const std::string& path, int rank, int nranks, uint64_t hash, double timeoutS,
                                 std::function<void(Rendezvous&)> after = nullptr) {
  return std::make_unique<Child>([=] {
    RendezvousOptions o;
    o.path = path;
    o.rank = rank;
    o.nranks = nranks;
    o.layoutHash = hash;
    o.timeoutS = timeoutS;
    Rendezvous rv(o, payloadFor(rank));
    for (int r = 0; r < nranks; ++r)
      if (rv.payloads()[r] != payloadFor(r)) throw std::runtime_error("payload of rank " + std::to_string(r) + " differs");
    if (after) after(rv);
    return std::string("ok");
  });
}

void expectError(const ChildOutcome& o, const std::string& needle, const std::string& who) {
  ASSERT_TRUE(o.finished) << who << " did not report (hung?)";
  EXPECT_FALSE(o.ok) << who << " succeeded unexpectedly";
  EXPECT_NE(o.text.find(needle), std::string::npos) << who << ": " << o.text;
}

TEST(Rendezvous, FourRanksExchangePayloadsAndPassBarriers) {
  test::TempDir dir;
  const std::string path = dir.file("rv.sock");
  std::vector<std::unique_ptr<Child>> ranks;
  // Followers first: they must retry until rank 0 listens.
  for (int r = 3; r >= 0; --r) {
    ranks.push_back(startRank(path, r, 4, 0xabcdef, 10.0, [](Rendezvous& rv) {
      rv.barrier("step one");
      rv.barrier("step two");
    }));
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  for (auto& c : ranks) {
    const ChildOutcome o = c->wait(20);
    ASSERT_TRUE(o.finished);
    EXPECT_TRUE(o.ok) << o.text;
  }
  EXPECT_FALSE(std::filesystem::exists(path)) << "rank 0 must remove its socket file";
}

TEST(Rendezvous, SingleRankNeedsNoSocket) {
  RendezvousOptions o;
  o.path = "/nonexistent/dir/rv.sock";
  Rendezvous rv(o, {1, 2, 3});
  ASSERT_EQ(rv.payloads().size(), 1u);
  EXPECT_EQ(rv.payloads()[0], (std::vector<uint8_t>{1, 2, 3}));
  rv.barrier("alone");
}

TEST(Rendezvous, RankThatNeverJoinsIsNamedWithinTheTimeout) {
  test::TempDir dir;
  const std::string path = dir.file("rv.sock");
  const double timeoutS = 1.0;
  std::vector<std::unique_ptr<Child>> ranks;
  for (int r : {0, 1, 3}) ranks.push_back(startRank(path, r, 4, 1, timeoutS));
  const std::string expected = "rank 2 did not join the rendezvous at " + path + " within 1 s";
  for (auto& c : ranks) {
    const ChildOutcome o = c->wait(timeoutS + 10);
    expectError(o, expected, "a surviving rank");
    EXPECT_EQ(o.code, static_cast<int>(ErrorCode::kTimeout));
    EXPECT_LT(o.seconds, timeoutS + kSlackS) << "timeout bound not respected";
    EXPECT_GE(o.seconds, timeoutS * 0.9);
  }
}

TEST(Rendezvous, MissingRankZeroIsNamed) {
  test::TempDir dir;
  const std::string path = dir.file("rv.sock");
  std::vector<std::unique_ptr<Child>> ranks;
  for (int r : {1, 2}) ranks.push_back(startRank(path, r, 3, 1, 0.5));
  for (auto& c : ranks) {
    const ChildOutcome o = c->wait(10);
    expectError(o, "rank 0 did not open the rendezvous at " + path + " within 0.5 s", "follower");
    EXPECT_LT(o.seconds, 0.5 + kSlackS);
  }
}

TEST(Rendezvous, RankDyingMidSetupIsNamedAtOnce) {
  test::TempDir dir;
  const std::string path = dir.file("rv.sock");
  const double timeoutS = 20.0;  // long: the failure must come from the hang-up, not from the timeout
  auto rank0 = startRank(path, 0, 4, 1, timeoutS);
  auto rank1 = startRank(path, 1, 4, 1, timeoutS);
  auto rank2 = startRank(path, 2, 4, 1, timeoutS);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // all three joined; rank 3 never comes
  rank1->kill();
  for (Child* c : {rank0.get(), rank2.get()}) {
    const ChildOutcome o = c->wait(timeoutS);
    expectError(o, "rank 1 closed the connection during setup", "survivor");
    EXPECT_EQ(o.code, static_cast<int>(ErrorCode::kRendezvous));
    EXPECT_LT(o.seconds, 0.5 + kSlackS);
  }
}

TEST(Rendezvous, RankDyingBeforeABarrierIsNamed) {
  test::TempDir dir;
  const std::string path = dir.file("rv.sock");
  std::vector<std::unique_ptr<Child>> ranks;
  for (int r = 0; r < 3; ++r)
    ranks.push_back(startRank(path, r, 3, 1, 20.0, [r](Rendezvous& rv) {
      if (r == 2) ::_exit(3);  // dies between setup and the barrier
      rv.barrier("heap teardown");
    }));
  for (int r : {0, 1}) {
    const ChildOutcome o = ranks[r]->wait(20);
    expectError(o, "rank 2 closed the connection during heap teardown", "rank " + std::to_string(r));
    EXPECT_LT(o.seconds, kSlackS);
  }
}

TEST(Rendezvous, LateRankAtABarrierIsNamedWithinTheTimeout) {
  test::TempDir dir;
  const std::string path = dir.file("rv.sock");
  std::vector<std::unique_ptr<Child>> ranks;
  for (int r = 0; r < 3; ++r)
    ranks.push_back(startRank(path, r, 3, 1, 1.0, [r](Rendezvous& rv) {
      if (r == 1) std::this_thread::sleep_for(std::chrono::seconds(30));  // alive but stuck
      rv.barrier("heap setup");
    }));
  for (int r : {0, 2}) {
    const ChildOutcome o = ranks[r]->wait(15);
    expectError(o, "rank 1 did not reach heap setup within 1 s", "rank " + std::to_string(r));
    EXPECT_LT(o.seconds, 1.0 + kSlackS);
  }
}

// A rank that shows up after rank 0 already failed sees either rank 0's reason or that rank 0 is gone.
void expectCauseOrRankZeroGone(const ChildOutcome& o, const std::string& cause, double timeoutS) {
  ASSERT_TRUE(o.finished);
  EXPECT_FALSE(o.ok);
  const bool named = o.text.find(cause) != std::string::npos || o.text.find("rank 0") != std::string::npos;
  EXPECT_TRUE(named) << o.text;
  EXPECT_LT(o.seconds, 2 * timeoutS + kSlackS);
}

TEST(Rendezvous, MismatchedLayoutHashIsRejected) {
  test::TempDir dir;
  const std::string path = dir.file("rv.sock");
  const double timeoutS = 2.0;
  std::vector<std::unique_ptr<Child>> ranks;
  for (int r = 1; r < 4; ++r) ranks.push_back(startRank(path, r, 4, r == 3 ? 0xbad : 0x600d, timeoutS));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  auto rank0 = startRank(path, 0, 4, 0x600d, timeoutS);
  const std::string cause = "rank 3's heap layout (hash 0xbad) differs from rank 0's (0x600d)";
  const ChildOutcome o0 = rank0->wait(timeoutS + 10);
  expectError(o0, cause, "rank 0");
  EXPECT_EQ(o0.code, static_cast<int>(ErrorCode::kRendezvous));
  EXPECT_LT(o0.seconds, timeoutS) << "a mismatch must fail at once, not at the timeout";
  expectError(ranks[2]->wait(timeoutS + 10), cause, "rank 3");
  for (int i : {0, 1}) expectCauseOrRankZeroGone(ranks[i]->wait(3 * timeoutS + 10), cause, timeoutS);
}

TEST(Rendezvous, DuplicateRankIsRejected) {
  test::TempDir dir;
  const std::string path = dir.file("rv.sock");
  const double timeoutS = 2.0;
  auto rank0 = startRank(path, 0, 4, 1, timeoutS);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  auto first = startRank(path, 1, 4, 1, timeoutS);
  auto second = startRank(path, 1, 4, 1, timeoutS);
  const std::string cause = "rank 1 joined the rendezvous at " + path + " twice";
  const ChildOutcome o0 = rank0->wait(timeoutS + 10);
  expectError(o0, cause, "rank 0");
  EXPECT_LT(o0.seconds, timeoutS);
  for (Child* c : {first.get(), second.get()}) expectError(c->wait(timeoutS + 10), cause, "a rank 1");
}

TEST(Rendezvous, WrongRankCountIsRejected) {
  test::TempDir dir;
  const std::string path = dir.file("rv.sock");
  auto rank0 = startRank(path, 0, 2, 1, 5.0);
  auto rank1 = startRank(path, 1, 3, 1, 5.0);
  expectError(rank0->wait(15), "rank 1 expects 3 ranks but rank 0 expects 2", "rank 0");
  expectError(rank1->wait(15), "rank 1 expects 3 ranks but rank 0 expects 2", "rank 1");
}

TEST(Rendezvous, AbandonTellsTheOthersWhy) {
  test::TempDir dir;
  const std::string path = dir.file("rv.sock");
  std::vector<std::unique_ptr<Child>> ranks;
  for (int r = 0; r < 3; ++r)
    ranks.push_back(startRank(path, r, 3, 1, 10.0, [r](Rendezvous& rv) {
      if (r == 2) {
        rv.abandon("rank 2 could not map rank 0's heap: out of memory");
        throw Error(ErrorCode::kDriverError, "local failure");
      }
      rv.barrier("heap setup");
    }));
  for (int r : {0, 1}) {
    const ChildOutcome o = ranks[r]->wait(15);
    expectError(o, "rank 2 could not map rank 0's heap: out of memory", "rank " + std::to_string(r));
    EXPECT_LT(o.seconds, kSlackS);
  }
}

TEST(Rendezvous, BadOptionsAreRejectedUpFront) {
  RendezvousOptions o;
  o.nranks = 2;
  o.rank = 2;
  o.path = "/tmp/x";
  EXPECT_THROW(Rendezvous(o, {}), Error);
  o.rank = 1;
  o.path = std::string(200, 'x');
  try {
    Rendezvous rv(o, {});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("socket path"), std::string::npos);
  }
}

}  // namespace
}  // namespace megamoe
