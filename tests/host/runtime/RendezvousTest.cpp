// The heap rendezvous, run with fork()ed ranks: the happy path, and every way setup can go wrong must end in an
// error naming the rank at fault, within the timeout plus a little, never in a hang. Then who may join: only
// processes of this user, through an owner-only socket; strangers (another uid, garbage, malformed hellos) are
// dropped unanswered without failing the group; nothing rank 0 did not create is ever removed from the path.
#include <gtest/gtest.h>
#include <grp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <thread>

#include "RendezvousWire.h"
#include "TestSupport.h"
#include "megamoe/Error.h"
#include "megamoe/Rendezvous.h"

namespace megamoe {
namespace {

using test::Child;
using test::ChildOutcome;
using test::expectOk;

// Generous slack for a loaded CI machine; the point is "bounded", not "fast".
constexpr double kSlackS = 3.0;

std::vector<uint8_t> payloadFor(int rank) {
  std::vector<uint8_t> p(static_cast<size_t>(rank) * 100);  // rank 0 sends an empty payload
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<uint8_t>(rank * 31 + i);
  return p;
}

RendezvousOptions optionsFor(const std::string& path, int rank, int nranks, uint64_t hash, double timeoutS) {
  RendezvousOptions o;
  o.path = path;
  o.rank = rank;
  o.nranks = nranks;
  o.layoutHash = hash;
  o.timeoutS = timeoutS;
  return o;
}

// A rank in a child process; `before` runs in the child first (e.g. a umask), `after` once the group has met.
std::unique_ptr<Child> startWith(const RendezvousOptions& o, std::function<void()> before = nullptr,
                                 std::function<void(Rendezvous&)> after = nullptr) {
  return std::make_unique<Child>([=] {
    if (before) before();
    Rendezvous rv(o, payloadFor(o.rank));
    for (int r = 0; r < o.nranks; ++r)
      if (rv.payloads()[r] != payloadFor(r))
        throw std::runtime_error("payload of rank " + std::to_string(r) + " differs");
    if (after) after(rv);
    return std::string("ok");
  });
}

std::unique_ptr<Child> startRank(const std::string& path, int rank, int nranks, uint64_t hash, double timeoutS,
                                 std::function<void(Rendezvous&)> after = nullptr) {
  return startWith(optionsFor(path, rank, nranks, hash, timeoutS), nullptr, std::move(after));
}

// Bounded: true once something is at `path`.
bool waitForPath(const std::string& path, double boundS) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(int(boundS * 1000));
  struct stat st {};
  while (::lstat(path.c_str(), &st) != 0) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

sockaddr_un addressOf(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  return addr;
}

// A connected socket, or -errno.
int connectTo(const std::string& path) {
  const sockaddr_un addr = addressOf(path);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    const int err = errno;
    ::close(fd);
    return -err;
  }
  return fd;
}

// Bounded: true once rank 0 accepts connections at `path` (past its checks of the file it bound). The probe is
// itself a stranger, closed at once, which rank 0 must shrug off.
bool waitForListener(const std::string& path, double boundS) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(int(boundS * 1000));
  for (;;) {
    const int fd = connectTo(path);
    if (fd >= 0) {
      ::close(fd);
      return true;
    }
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// A listening socket bound at `path` (the fake rank 0s and squatters of these tests).
int listenAt(const std::string& path) {
  const sockaddr_un addr = addressOf(path);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || ::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, 16) != 0)
    throw std::runtime_error("cannot listen at " + path + ": " + std::strerror(errno));
  return fd;
}

// Best effort: the other side may hang up at once, which is what some tests expect.
void sendAll(int fd, const std::vector<uint8_t>& bytes) {
  size_t at = 0;
  while (at < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + at, bytes.size() - at, MSG_NOSIGNAL);
    if (n <= 0) return;
    at += static_cast<size_t>(n);
  }
}

// What came from the other side until it closed or `boundS` passed.
struct Received {
  size_t bytes = 0;
  bool closed = false;
};
Received drain(int fd, double boundS) {
  Received r;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(int(boundS * 1000));
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    if (left.count() <= 0 || ::poll(&p, 1, int(left.count())) <= 0) return r;
    char buffer[4096];
    const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
    if (n <= 0) {
      r.closed = true;
      return r;
    }
    r.bytes += static_cast<size_t>(n);
  }
}

// Reads exactly `n` bytes within `boundS`, or throws.
std::vector<uint8_t> readExactly(int fd, size_t n, double boundS) {
  std::vector<uint8_t> out(n);
  size_t at = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(int(boundS * 1000));
  while (at < n) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    if (left.count() <= 0 || ::poll(&p, 1, int(left.count())) <= 0) throw std::runtime_error("read timed out");
    const ssize_t got = ::recv(fd, out.data() + at, n - at, 0);
    if (got <= 0) throw std::runtime_error("peer closed");
    at += static_cast<size_t>(got);
  }
  return out;
}

std::vector<uint8_t> bytesOf(const wire::Header& h, const std::vector<uint8_t>& body = {}) {
  wire::Header copy = h;
  copy.bytes = body.size();
  std::vector<uint8_t> out(sizeof copy + body.size());
  std::memcpy(out.data(), &copy, sizeof copy);
  if (!body.empty()) std::memcpy(out.data() + sizeof copy, body.data(), body.size());
  return out;
}

// The hello a rank of these tests sends (no secret, no agreement).
wire::Header helloHeader(int rank, int nranks, uint64_t hash) {
  wire::Header h;
  h.type = wire::kHello;
  h.rank = rank;
  h.nranks = nranks;
  h.layoutHash = hash;
  h.secretDigest = wire::secretDigest("");
  return h;
}
std::vector<uint8_t> helloBytes(int rank, int nranks, uint64_t hash) {
  return bytesOf(helloHeader(rank, nranks, hash), wire::encodeHello({}, payloadFor(rank)));
}

constexpr uid_t kNobody = 65534;

// In a forked child: become user nobody for good (groups first, then gid, then uid).
void becomeNobody() {
  if (::setgroups(0, nullptr) != 0 || ::setgid(kNobody) != 0 || ::setuid(kNobody) != 0)
    throw std::runtime_error(std::string("cannot switch to uid 65534: ") + std::strerror(errno));
}

#define SKIP_UNLESS_ROOT()                                                                                   \
  if (::geteuid() != 0) GTEST_SKIP() << "needs root: a child process switches to uid 65534 (nobody) to play " \
                                        "another user"

std::string modeText(mode_t mode) {
  std::ostringstream out;
  out << "0" << std::oct << (mode & 07777);
  return out.str();
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
  for (size_t i = 0; i < ranks.size(); ++i) expectOk(*ranks[i], "rank " + std::to_string(3 - i));  // started 3 .. 0
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
    // Nothing at the path cannot tell "never started" from "failed and removed its socket": both are said.
    expectError(o, "rank 0 has not started, or it already failed and removed its socket", "follower");
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

// A hello for another group size is not a member of this group: refused unanswered, named when rank 0 gives up.
TEST(Rendezvous, WrongRankCountIsRefusedAndNamed) {
  test::TempDir dir;
  const std::string path = dir.file("rv.sock");
  auto rank0 = startRank(path, 0, 2, 1, 1.0);
  auto rank1 = startRank(path, 1, 3, 1, 1.0);
  const ChildOutcome o0 = rank0->wait(15);
  expectError(o0, "rank 1 did not join the rendezvous at " + path + " within 1 s", "rank 0");
  expectError(o0, "rank 1 expects 3 ranks but rank 0 expects 2", "rank 0");
  EXPECT_EQ(o0.code, static_cast<int>(ErrorCode::kTimeout));
  expectError(rank1->wait(15), "closed the connection without answering rank 1", "rank 1");
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

// ---------------------------------------------------------------- agreed values

// Every rank declares named values (the layer's configuration); rank 0 compares each rank's with its own and a
// difference fails the group, on every rank, naming the field. Order does not matter.
TEST(Rendezvous, RanksMustAgreeOnEveryNamedValue) {
  const RendezvousAgreement mine = {{"hidden", "7168"}, {"intermediate", "2048"}};
  const std::string longA(300, 'a'), longB = std::string(200, 'a') + "b" + std::string(99, 'a');
  struct Case {
    RendezvousAgreement rank0, rank1;
    std::string named;  // "" when they agree
  };
  const Case cases[] = {
      {mine, {{"intermediate", "2048"}, {"hidden", "7168"}}, ""},
      {mine, {{"hidden", "7168"}, {"intermediate", "1024"}},
       "rank 1's intermediate=1024 differs from rank 0's intermediate=2048"},
      {mine, {{"intermediate", "2048"}}, "rank 1 does not declare hidden (rank 0's hidden=7168)"},
      {mine, {{"hidden", "7168"}, {"intermediate", "2048"}, {"training", "true"}},
       "rank 1 declares training=true, which rank 0 does not declare"},
      // A long value is shown where it departs, not whole.
      {{{"kernels", longA}}, {{"kernels", longB}}, "rank 1's kernels=..." + std::string(40, 'a') + "b"},
  };
  for (const Case& c : cases) {
    test::TempDir dir;
    const std::string path = dir.file("rv.sock");
    RendezvousOptions o0 = optionsFor(path, 0, 2, 1, 10.0), o1 = optionsFor(path, 1, 2, 1, 10.0);
    o0.agreement = c.rank0;
    o1.agreement = c.rank1;
    auto rank0 = startWith(o0);
    auto rank1 = startWith(o1);
    for (Child* child : {rank0.get(), rank1.get()}) {
      const ChildOutcome o = child->wait(20);
      ASSERT_TRUE(o.finished);
      if (c.named.empty()) {
        EXPECT_TRUE(o.ok) << o.text;
        continue;
      }
      expectError(o, c.named, "a rank");
      EXPECT_EQ(o.code, static_cast<int>(ErrorCode::kRendezvous));
      EXPECT_LT(o.text.size(), 400u) << "a long value must be shown in part";
    }
  }
}

// ---------------------------------------------------------------- who may join (docs/decisions/rendezvous-security.md)

// The socket is owner-only from the moment it exists, whatever the umask; another user cannot even connect.
TEST(Rendezvous, SocketIsOwnerOnlyUnderAPermissiveUmask) {
  test::TempDir dir;
  ASSERT_EQ(::chmod(dir.path().c_str(), 0711), 0);  // others may reach the socket: only its own mode stops them
  const std::string path = dir.file("rv.sock");
  auto rank0 = startWith(optionsFor(path, 0, 2, 1, 10.0), [] { ::umask(0); });
  ASSERT_TRUE(waitForPath(path, 5));
  struct stat st {};
  ASSERT_EQ(::lstat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 077, 0u) << "socket mode " << modeText(st.st_mode) << " under umask 0";
  EXPECT_EQ(st.st_uid, ::geteuid());
  if (::geteuid() == 0) {
    Child stranger([=] {
      becomeNobody();
      const int fd = connectTo(path);
      if (fd >= 0) return std::string("connected");
      return std::string("refused: ") + std::strerror(-fd);
    });
    const ChildOutcome o = stranger.wait(10);
    ASSERT_TRUE(o.finished);
    EXPECT_EQ(o.text, "refused: " + std::string(std::strerror(EACCES)));
  } else {
    std::printf("[  NOTE    ] not root: skipped the connect attempt by another uid\n");
  }
  auto rank1 = startRank(path, 1, 2, 1, 10.0);
  expectOk(*rank0, "rank 0");
  expectOk(*rank1, "rank 1");
}

// Another user's process running a real rank 1 cannot join, even when rank 0 runs under umask 0; the real rank 1
// still does.
TEST(Rendezvous, AnotherUserCannotJoinAsARank) {
  SKIP_UNLESS_ROOT();
  test::TempDir dir;
  ASSERT_EQ(::chmod(dir.path().c_str(), 0711), 0);
  const std::string path = dir.file("rv.sock");
  auto rank0 = startWith(optionsFor(path, 0, 2, 3, 10.0), [] { ::umask(0); });
  ASSERT_TRUE(waitForPath(path, 5));
  auto stranger = startWith(optionsFor(path, 1, 2, 3, 0.5), becomeNobody);
  const ChildOutcome s = stranger->wait(10);
  expectError(s, "refuses this user (permission denied)", "uid 65534's rank 1");
  EXPECT_EQ(s.code, static_cast<int>(ErrorCode::kTimeout));
  auto rank1 = startRank(path, 1, 2, 3, 10.0);
  expectOk(*rank0, "rank 0");
  expectOk(*rank1, "rank 1");
}

// Past the socket's mode (opened here on purpose), the uid check: another user's well-formed hello for rank 1 is
// dropped before a byte is read or sent, and the real rank 1 still joins.
TEST(Rendezvous, AnotherUsersHelloIsDroppedUnanswered) {
  SKIP_UNLESS_ROOT();
  test::TempDir dir;
  ASSERT_EQ(::chmod(dir.path().c_str(), 0711), 0);
  const std::string path = dir.file("rv.sock");
  auto rank0 = startRank(path, 0, 2, 0x77, 10.0);
  ASSERT_TRUE(waitForListener(path, 5));
  ASSERT_EQ(::chmod(path.c_str(), 0666), 0);
  Child stranger([=] {
    becomeNobody();
    const int fd = connectTo(path);
    if (fd < 0) throw std::runtime_error(std::string("connect failed: ") + std::strerror(-fd));
    sendAll(fd, helloBytes(1, 2, 0x77));
    const Received r = drain(fd, 5.0);
    return std::to_string(r.bytes) + " bytes, " + (r.closed ? "closed" : "still open");
  });
  const ChildOutcome s = stranger.wait(10);
  ASSERT_TRUE(s.finished);
  EXPECT_TRUE(s.ok) << s.text;
  EXPECT_EQ(s.text, "0 bytes, closed") << "rank 0 must drop another user's connection without answering";
  auto rank1 = startRank(path, 1, 2, 0x77, 10.0);
  expectOk(*rank0, "rank 0");
  expectOk(*rank1, "rank 1");
}

// In a shared sticky directory another user binds the path first: rank 1 sends it nothing and says whose it is;
// rank 0 names the foreign socket and leaves it where it is.
TEST(Rendezvous, ListenerOfAnotherUserIsRefused) {
  SKIP_UNLESS_ROOT();
  test::TempDir dir;
  ASSERT_EQ(::chmod(dir.path().c_str(), 01777), 0);  // like /tmp
  const std::string path = dir.file("rv.sock");
  int stop[2];
  ASSERT_EQ(::pipe(stop), 0);
  // Counts every byte anyone sends it, until the test closes `stop` (bounded: 20 s).
  Child squatter([=] {
    ::close(stop[1]);
    becomeNobody();
    const int listener = listenAt(path);
    std::vector<int> fds;
    size_t total = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      std::vector<pollfd> p = {{stop[0], POLLIN, 0}, {listener, POLLIN, 0}};
      for (int fd : fds) p.push_back({fd, POLLIN, 0});
      if (::poll(p.data(), p.size(), 100) <= 0) continue;
      if (p[0].revents) break;
      if (p[1].revents) fds.push_back(::accept(listener, nullptr, nullptr));
      for (size_t i = 2; i < p.size(); ++i) {
        if (!p[i].revents) continue;
        char buffer[4096];
        const ssize_t n = ::recv(p[i].fd, buffer, sizeof buffer, MSG_DONTWAIT);
        if (n > 0) total += static_cast<size_t>(n);
      }
    }
    return std::to_string(total);
  });
  ::close(stop[0]);
  ASSERT_TRUE(waitForPath(path, 5));
  auto rank1 = startRank(path, 1, 2, 1, 1.0);
  const ChildOutcome o1 = rank1->wait(15);
  expectError(o1, "a listener of uid 65534", "rank 1");
  EXPECT_EQ(o1.code, static_cast<int>(ErrorCode::kTimeout));
  auto rank0 = startRank(path, 0, 2, 1, 1.0);
  const ChildOutcome o0 = rank0->wait(15);
  expectError(o0, "a socket owned by uid 65534 is already at that path", "rank 0");
  EXPECT_LT(o0.seconds, 1.0) << "rank 0 must fail at once, not wait out its timeout";
  ::close(stop[1]);
  const ChildOutcome s = squatter.wait(25);
  ASSERT_TRUE(s.finished);
  EXPECT_EQ(s.text, "0") << "bytes the other user's listener received";
  struct stat st {};
  ASSERT_EQ(::lstat(path.c_str(), &st), 0) << "rank 0 removed another user's socket";
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_uid, kNobody);
}

// A port probe, garbage and a silent connection: none fails the group, none hears a byte, the ranks still meet.
TEST(Rendezvous, StrangersDoNotBreakTheGroup) {
  test::TempDir dir;
  const std::string path = dir.file("rv.sock");
  auto rank0 = startRank(path, 0, 3, 5, 10.0);
  ASSERT_TRUE(waitForListener(path, 5));  // a port probe: connect and close
  std::mt19937 random(7);
  std::vector<int> strangers;
  for (size_t bytes : {40, 100}) {
    std::vector<uint8_t> noise(bytes);
    for (uint8_t& b : noise) b = static_cast<uint8_t>(random());
    strangers.push_back(connectTo(path));
    sendAll(strangers.back(), noise);
  }
  strangers.push_back(connectTo(path));  // says nothing
  for (int fd : strangers) ASSERT_GE(fd, 0);
  auto rank1 = startRank(path, 1, 3, 5, 10.0);
  auto rank2 = startRank(path, 2, 3, 5, 10.0);
  expectOk(*rank0, "rank 0");
  expectOk(*rank1, "rank 1");
  expectOk(*rank2, "rank 2");
  for (int fd : strangers) {
    EXPECT_EQ(drain(fd, 2.0).bytes, 0u) << "a stranger heard from rank 0";
    ::close(fd);
  }
}

// What each kind of malformed or foreign hello looks like (forged with the wire format), and how rank 0 names it.
struct Forgery {
  std::vector<uint8_t> bytes;
  bool closeAfter;
  std::string named;
};
std::vector<Forgery> forgeries() {
  std::vector<Forgery> out;
  const std::vector<uint8_t> good = helloBytes(1, 2, 5);
  out.push_back({std::vector<uint8_t>(good.begin(), good.begin() + 20), true,
                 "closed after 20 bytes, before a whole hello"});
  out.push_back({std::vector<uint8_t>(good.begin(), good.end() - 10), true, "before a whole hello"});
  std::vector<uint8_t> noise(100, 0x5a);
  out.push_back({noise, false, "48 bytes that are not a megamoe hello"});
  wire::Header h = helloHeader(1, 2, 5);
  h.bytes = uint64_t(1) << 40;
  std::vector<uint8_t> oversized(sizeof h);
  std::memcpy(oversized.data(), &h, sizeof h);
  out.push_back({oversized, false, "a hello announcing 1099511627776 bytes"});
  h = helloHeader(1, 2, 5);
  h.version = 1;
  out.push_back({bytesOf(h, wire::encodeHello({}, {})), false, "protocol version 1"});
  h = helloHeader(1, 2, 5);
  h.type = wire::kBarrier;
  out.push_back({bytesOf(h), false, "a megamoe message of type 4, not a hello"});
  std::vector<uint8_t> body = {0xe8, 0x03, 0, 0, 1, 2, 3};  // 1000 entries in 3 bytes
  out.push_back({bytesOf(helloHeader(1, 2, 5), body), false, "a malformed hello"});
  out.push_back({helloBytes(1, 3, 5), false, "rank 1 expects 3 ranks but rank 0 expects 2"});
  out.push_back({helloBytes(0, 2, 5), false, "a hello claiming rank 0, outside 1..1"});
  out.push_back({helloBytes(5, 2, 5), false, "a hello claiming rank 5, outside 1..1"});
  h = helloHeader(1, 2, 5);
  h.secretDigest = wire::secretDigest("another job");
  out.push_back({bytesOf(h, wire::encodeHello({}, payloadFor(1))), false, "without this group's rendezvous secret"});
  return out;
}

std::vector<int> sendForgeries(const std::string& path) {
  std::vector<int> open;
  for (const Forgery& f : forgeries()) {
    const int fd = connectTo(path);
    if (fd < 0) throw std::runtime_error("cannot connect to rank 0");
    sendAll(fd, f.bytes);
    if (f.closeAfter) ::close(fd);
    else open.push_back(fd);
  }
  return open;
}

TEST(Rendezvous, MalformedHellosDoNotBreakTheGroup) {
  test::TempDir dir;
  const std::string path = dir.file("rv.sock");
  auto rank0 = startRank(path, 0, 2, 5, 10.0);
  ASSERT_TRUE(waitForListener(path, 5));
  const std::vector<int> strangers = sendForgeries(path);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // let rank 0 see them before the real rank 1
  auto rank1 = startRank(path, 1, 2, 5, 10.0);
  expectOk(*rank0, "rank 0");
  expectOk(*rank1, "rank 1");
  for (int fd : strangers) {
    EXPECT_EQ(drain(fd, 2.0).bytes, 0u) << "a stranger heard from rank 0";
    ::close(fd);
  }
}

TEST(Rendezvous, RefusedConnectionsAreNamedWhenTheGroupFails) {
  test::TempDir dir;
  const std::string path = dir.file("rv.sock");
  auto rank0 = startRank(path, 0, 2, 5, 1.0);
  ASSERT_TRUE(waitForListener(path, 5));
  const std::vector<int> strangers = sendForgeries(path);
  const ChildOutcome o = rank0->wait(15);
  expectError(o, "rank 1 did not join the rendezvous at " + path + " within 1 s", "rank 0");
  EXPECT_EQ(o.code, static_cast<int>(ErrorCode::kTimeout));
  const std::string refused = std::to_string(forgeries().size() + 1) + " connections";  // + waitForListener's probe
  EXPECT_NE(o.text.find("rank 0 refused " + refused), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("a connection closed without a word"), std::string::npos) << o.text;
  for (const Forgery& f : forgeries())
    EXPECT_NE(o.text.find(f.named), std::string::npos) << f.named << " in " << o.text;
  for (int fd : strangers) {
    EXPECT_EQ(drain(fd, 2.0).bytes, 0u) << "a stranger heard rank 0's failure";
    ::close(fd);
  }
}

// A rank 0 of this user that hands out a payload made for another layout (or other agreed values) is refused by
// the follower, which checks every entry, not only its own.
TEST(Rendezvous, FollowerChecksEveryPayloadItReceives) {
  for (const bool badLayout : {true, false}) {
    test::TempDir dir;
    const std::string path = dir.file("rv.sock");
    const int listener = listenAt(path);
    auto rank1 = startRank(path, 1, 3, 0x600d, 5.0);
    pollfd p{listener, POLLIN, 0};
    ASSERT_EQ(::poll(&p, 1, 5000), 1);
    const int fd = ::accept(listener, nullptr, nullptr);
    ASSERT_GE(fd, 0);
    wire::Header hello;
    const std::vector<uint8_t> head = readExactly(fd, sizeof hello, 5);
    std::memcpy(&hello, head.data(), sizeof hello);
    ASSERT_EQ(hello.rank, 1);
    readExactly(fd, hello.bytes, 5);
    const uint64_t agreed = wire::agreementDigest({});
    std::vector<wire::RankEntry> entries = {
        {0x600d, agreed, payloadFor(0)}, {0x600d, agreed, payloadFor(1)}, {0x600d, agreed, payloadFor(2)}};
    if (badLayout) entries[2].layoutHash = 0xbad;
    else entries[2].agreementDigest = agreed + 1;
    wire::Header answer;
    answer.type = wire::kPayloads;
    answer.nranks = 3;
    answer.layoutHash = 0x600d;
    answer.secretDigest = wire::secretDigest("");
    sendAll(fd, bytesOf(answer, wire::encodePayloads(entries)));
    expectError(rank1->wait(15),
                badLayout ? "rank 2's heap layout (hash 0xbad, as handed out by rank 0) differs from rank 1's (0x600d)"
                          : "rank 2's agreed values (as handed out by rank 0) differ from rank 1's",
                "rank 1");
    ::close(fd);
    ::close(listener);
  }
}

// MEGAMOE_RENDEZVOUS_SECRET: two jobs of one user at one path never join each other, and the secret is never shown.
TEST(Rendezvous, RanksWithoutTheSecretAreRefused) {
  test::TempDir dir;
  const std::string path = dir.file("rv.sock");
  RendezvousOptions o0 = optionsFor(path, 0, 2, 1, 1.0), o1 = optionsFor(path, 1, 2, 1, 1.0);
  o0.secret = "job-a-secret";
  o1.secret = "job-b-secret";
  auto rank0 = startWith(o0);
  auto rank1 = startWith(o1);
  const ChildOutcome r0 = rank0->wait(15), r1 = rank1->wait(15);
  expectError(r0, "without this group's rendezvous secret", "rank 0");
  expectError(r1, "closed the connection without answering rank 1", "rank 1");
  for (const ChildOutcome* o : {&r0, &r1}) EXPECT_EQ(o->text.find("-secret"), std::string::npos) << o->text;
  o1.secret = o0.secret;
  o0.timeoutS = o1.timeoutS = 10;
  rank0 = startWith(o0);
  rank1 = startWith(o1);
  expectOk(*rank0, "rank 0");
  expectOk(*rank1, "rank 1");
}

TEST(Rendezvous, AbstractAndEmptyPathsAreRefused) {
  for (const std::string& path : {std::string("\0megamoe-rv", 11), std::string(), std::string("/tmp/megamoe\0rv", 15)})
    for (int rank : {0, 1}) {
      try {
        Rendezvous rv(optionsFor(path, rank, 2, 1, 0.3), {});
        ADD_FAILURE() << "rank " << rank << " accepted a path of " << path.size() << " bytes";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
      }
    }
}

// ---------------------------------------------------------------- what is at the path

std::string readText(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

Error errorOf(const RendezvousOptions& o) {
  try {
    Rendezvous rv(o, {});
  } catch (const Error& e) {
    return e;
  }
  return Error(ErrorCode::kOk, "no error");
}

TEST(Rendezvous, RegularFileAtThePathIsLeftAlone) {
  test::TempDir dir;
  const std::string path = dir.file("notes.txt");
  std::ofstream(path) << "precious\n";
  const Error e0 = errorOf(optionsFor(path, 0, 2, 1, 0.3));
  EXPECT_EQ(e0.code(), ErrorCode::kRendezvous) << e0.what();
  EXPECT_NE(std::string(e0.what()).find("rank 0 cannot open the rendezvous at " + path +
                                        ": a regular file is already at that path (left untouched"),
            std::string::npos)
      << e0.what();
  EXPECT_EQ(readText(path), "precious\n");
  const Error e1 = errorOf(optionsFor(path, 1, 2, 1, 0.3));
  EXPECT_EQ(e1.code(), ErrorCode::kTimeout) << e1.what();
  EXPECT_NE(std::string(e1.what()).find("a regular file is there, not a rendezvous socket"), std::string::npos)
      << e1.what();
  EXPECT_EQ(readText(path), "precious\n");
}

TEST(Rendezvous, DirectoryAtThePathIsNamed) {
  test::TempDir dir;
  const std::string path = dir.file("rv.sock");
  ASSERT_EQ(::mkdir(path.c_str(), 0700), 0);
  const Error e = errorOf(optionsFor(path, 0, 2, 1, 0.3));
  EXPECT_EQ(e.code(), ErrorCode::kRendezvous);
  EXPECT_NE(std::string(e.what()).find("a directory is already at that path"), std::string::npos) << e.what();
  EXPECT_EQ(std::string(e.what()).find(std::strerror(EADDRINUSE)), std::string::npos) << e.what();
  struct stat st {};
  EXPECT_TRUE(::lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode));
}

// A socket nobody listens on (an earlier run died): not created by this group, so not removed, but named.
TEST(Rendezvous, StaleSocketIsNamedAndLeftAlone) {
  test::TempDir dir;
  const std::string path = dir.file("rv.sock");
  ::close(listenAt(path));
  struct stat before {};
  ASSERT_EQ(::lstat(path.c_str(), &before), 0);
  const Error e = errorOf(optionsFor(path, 0, 2, 1, 0.3));
  EXPECT_EQ(e.code(), ErrorCode::kRendezvous);
  EXPECT_NE(std::string(e.what()).find("a socket is already at that path (another rendezvous may be using it, or "
                                       "an earlier run died and left it"),
            std::string::npos)
      << e.what();
  struct stat after {};
  ASSERT_EQ(::lstat(path.c_str(), &after), 0) << "the stale socket was removed";
  EXPECT_EQ(after.st_ino, before.st_ino);
}

// Someone replaces rank 0's socket during setup: rank 0 removes only the file it bound, so the replacement stays.
TEST(Rendezvous, ReplacedSocketIsNotRemoved) {
  test::TempDir dir;
  const std::string path = dir.file("rv.sock");
  auto rank0 = startRank(path, 0, 2, 1, 1.0);
  ASSERT_TRUE(waitForListener(path, 5));
  const std::string other = dir.file("other.sock");
  ::close(listenAt(other));
  ASSERT_EQ(::rename(other.c_str(), path.c_str()), 0);
  struct stat replacement {};
  ASSERT_EQ(::lstat(path.c_str(), &replacement), 0);
  expectError(rank0->wait(15), "rank 1 did not join", "rank 0");
  struct stat after {};
  ASSERT_EQ(::lstat(path.c_str(), &after), 0) << "rank 0 removed a socket it did not create";
  EXPECT_EQ(after.st_ino, replacement.st_ino);
}

// Rank 0 died and left its socket: a follower that comes later says so instead of "rank 0 did not open".
TEST(Rendezvous, FollowerAfterRankZeroDiedSaysSo) {
  test::TempDir dir;
  const std::string path = dir.file("rv.sock");
  auto rank0 = startRank(path, 0, 2, 1, 20.0);
  ASSERT_TRUE(waitForPath(path, 5));
  rank0->kill();
  const Error e = errorOf(optionsFor(path, 1, 2, 1, 0.5));
  EXPECT_EQ(e.code(), ErrorCode::kTimeout);
  EXPECT_NE(std::string(e.what()).find("no rank 0 accepted rank 1 at " + path + " within 0.5 s: a socket is there "
                                       "but nobody accepts connections on it (rank 0 closed it or failed"),
            std::string::npos)
      << e.what();
}

}  // namespace
}  // namespace megamoe
