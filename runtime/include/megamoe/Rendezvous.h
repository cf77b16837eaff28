// Setup-time exchange between the R processes of one node (one per GPU) over a Unix domain socket: rank 0
// listens, the others connect, each sends {rank, nranks, layout hash, agreed values, opaque payload}; rank 0 checks
// that they agree and hands every payload to everyone. Independent of any GPU API (the heap's payload is an IPC
// handle), so host tests drive it with fork(). Every wait is bounded: a rank that never joins or dies mid-setup
// becomes an Error naming that rank on every surviving rank, never a hang.
// Only processes of this user meet (docs/decisions/rendezvous-security.md): the socket is owner-only, both sides
// check the peer's uid, and a connection that is not a rank of this group is dropped, unanswered, and named in the
// error text should the group fail later; it never fails the group itself.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace megamoe {

// Named values every rank must declare alike, e.g. {"intermediate", "2048"}; order does not matter.
using RendezvousAgreement = std::vector<std::pair<std::string, std::string>>;

struct RendezvousOptions {
  std::string path;         // socket path, identical on every rank (1 to 107 bytes, no NUL: no abstract names)
  int rank = 0;
  int nranks = 1;
  uint64_t layoutHash = 0;  // must be equal on every rank
  double timeoutS = 30.0;   // MEGAMOE_RENDEZVOUS_TIMEOUT_S
  // MEGAMOE_RENDEZVOUS_SECRET: ranks meet only a rank with the same secret (empty on all ranks: no secret). It
  // tells apart jobs of one user; it is no defence against a hostile process of that user.
  std::string secret;
  // A difference fails the group naming it: "rank 1's intermediate=1024 differs from rank 0's intermediate=2048".
  RendezvousAgreement agreement;
};

class Rendezvous {
 public:
  static constexpr size_t kMaxPayloadBytes = 1u << 20;
  static constexpr size_t kMaxAgreementBytes = 64u << 10;  // the agreement list as sent

  // Blocks until every rank has joined and the payloads are exchanged, keeping the connections for barrier().
  // Rank 0 waits at most timeoutS for the others; rank r > 0 waits at most timeoutS to reach rank 0 and then at
  // most timeoutS (plus a second) for rank 0's answer, so that rank 0's report of the real cause arrives first.
  // Throws Error(kTimeout) for a rank that did not come, Error(kRendezvous) for disagreement or a dead rank, or when
  // rank 0 finds something other than nothing at the path (it never removes what it did not create), and
  // Error(kInvalidArgument) for bad options.
  Rendezvous(const RendezvousOptions& options, const std::vector<uint8_t>& payload);
  ~Rendezvous();
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  int rank() const { return options_.rank; }
  int nranks() const { return options_.nranks; }
  // Indexed by rank; payloads()[rank()] is this rank's own.
  const std::vector<std::vector<uint8_t>>& payloads() const { return payloads_; }

  // Returns once every rank has called barrier() with the same `stage` text (used in messages, e.g. "heap
  // teardown"). Bounded by timeoutS; a dead or late rank becomes an Error naming it on every rank.
  void barrier(const std::string& stage);

  // This rank failed locally (e.g. could not map a peer's memory): tells the group why, so that the others fail
  // with this reason instead of a bare "closed the connection". Never throws; later barriers refuse.
  void abandon(const std::string& why) noexcept;

 private:
  void lead(const std::vector<uint8_t>& payload);
  void follow(const std::vector<uint8_t>& payload);
  void openSocket();
  void removeOwnSocket() noexcept;
  void closeAll() noexcept;

  RendezvousOptions options_;
  std::vector<std::vector<uint8_t>> payloads_;
  int listenFd_ = -1;
  // Rank 0: the socket file it created (device, inode), the only thing at the path it may remove.
  bool ownsSocket_ = false;
  uint64_t socketDevice_ = 0, socketInode_ = 0;
  std::vector<int> peerFds_;  // rank 0: fd per rank (index 0 unused); others: [0] is the link to rank 0
  bool failed_ = false;       // after an error, barrier() refuses (the group is broken)
};

}  // namespace megamoe
