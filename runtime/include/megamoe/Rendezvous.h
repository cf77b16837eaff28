// Setup-time exchange between the R processes of one node (one per GPU) over a Unix domain socket: rank 0
// listens, the others connect, each sends {rank, nranks, layout hash, opaque payload}; rank 0 checks that they
// agree and hands every payload to everyone. Independent of any GPU API (the heap's payload is an IPC handle), so
// host tests drive it with fork(). Every wait is bounded: a rank that never joins or dies mid-setup becomes an
// Error naming that rank on every surviving rank, never a hang.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace megamoe {

struct RendezvousOptions {
  std::string path;         // socket path, identical on every rank (at most 107 bytes)
  int rank = 0;
  int nranks = 1;
  uint64_t layoutHash = 0;  // must be equal on every rank
  double timeoutS = 30.0;   // MEGAMOE_RENDEZVOUS_TIMEOUT_S
};

class Rendezvous {
 public:
  static constexpr size_t kMaxPayloadBytes = 1u << 20;

  // Blocks until every rank has joined and the payloads are exchanged, keeping the connections for barrier().
  // Rank 0 waits at most timeoutS for the others; rank r > 0 waits at most timeoutS to reach rank 0 and then at
  // most timeoutS (plus a second) for rank 0's answer, so that rank 0's report of the real cause arrives first.
  // Throws Error(kTimeout) for a rank that did not come, Error(kRendezvous) for disagreement or a dead rank.
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
  void closeAll() noexcept;

  RendezvousOptions options_;
  std::vector<std::vector<uint8_t>> payloads_;
  int listenFd_ = -1;
  std::vector<int> peerFds_;  // rank 0: fd per rank (index 0 unused); others: [0] is the link to rank 0
  bool failed_ = false;       // after an error, barrier() refuses (the group is broken)
};

}  // namespace megamoe
