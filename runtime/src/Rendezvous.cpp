// Unix-domain-socket rendezvous for the one-process-per-GPU heap (see Rendezvous.h). Wire format: a fixed header,
// then `bytes` of body; all integers little-endian host order (the peers share a machine).
#include "megamoe/Rendezvous.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstring>
#include <sstream>
#include <thread>

#include "megamoe/Error.h"

namespace megamoe {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kMagic = 0x454f4d4du;  // "MMOE"
constexpr uint32_t kProtocolVersion = 1;
// A follower waits this much past timeoutS for rank 0's answer, so that rank 0's report of the cause wins.
constexpr std::chrono::milliseconds kFollowerGrace{1000};

enum MessageType : uint32_t { kHello = 1, kPayloads = 2, kFailure = 3, kBarrier = 4, kBarrierDone = 5 };

struct Header {
  uint32_t magic = kMagic;
  uint32_t version = kProtocolVersion;
  uint32_t type = 0;
  int32_t rank = 0;
  int32_t nranks = 0;
  uint32_t code = 0;  // ErrorCode of a kFailure
  uint64_t layoutHash = 0;
  uint64_t bytes = 0;
};
static_assert(sizeof(Header) == 40, "wire header must not change silently");

enum class Io { kOk, kClosed, kTimeout };

int remainingMs(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) return 0;
  return static_cast<int>(std::min<long long>(left, INT_MAX));
}

Clock::time_point after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

std::string secondsText(double s) {
  std::ostringstream out;
  if (s == std::floor(s)) out << static_cast<long long>(s);
  else out << s;
  return out.str() + " s";
}

std::string hex(uint64_t v) {
  std::ostringstream out;
  out << "0x" << std::hex << v;
  return out.str();
}

Io readFull(int fd, void* buffer, size_t n, Clock::time_point deadline) {
  auto* p = static_cast<uint8_t*>(buffer);
  while (n > 0) {
    pollfd pfd{fd, POLLIN, 0};
    const int ready = ::poll(&pfd, 1, remainingMs(deadline));
    if (ready < 0) {
      if (errno == EINTR) continue;
      return Io::kClosed;
    }
    if (ready == 0) return Io::kTimeout;
    const ssize_t got = ::recv(fd, p, n, MSG_DONTWAIT);
    if (got == 0) return Io::kClosed;
    if (got < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
      return Io::kClosed;
    }
    p += got;
    n -= static_cast<size_t>(got);
  }
  return Io::kOk;
}

Io writeFull(int fd, const void* buffer, size_t n, Clock::time_point deadline) {
  const auto* p = static_cast<const uint8_t*>(buffer);
  while (n > 0) {
    pollfd pfd{fd, POLLOUT, 0};
    const int ready = ::poll(&pfd, 1, remainingMs(deadline));
    if (ready < 0) {
      if (errno == EINTR) continue;
      return Io::kClosed;
    }
    if (ready == 0) return Io::kTimeout;
    const ssize_t sent = ::send(fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
      return Io::kClosed;
    }
    p += sent;
    n -= static_cast<size_t>(sent);
  }
  return Io::kOk;
}

Io sendMessage(int fd, Header header, const void* body, size_t bytes, Clock::time_point deadline) {
  header.bytes = bytes;
  const Io io = writeFull(fd, &header, sizeof header, deadline);
  if (io != Io::kOk || bytes == 0) return io;
  return writeFull(fd, body, bytes, deadline);
}

// Reads one message. `bodyLimit` guards against garbage sizes; a bad magic or version reads as kOk with
// header->magic left for the caller to reject.
Io readMessage(int fd, Header* header, std::vector<uint8_t>* body, size_t bodyLimit, Clock::time_point deadline) {
  const Io io = readFull(fd, header, sizeof *header, deadline);
  if (io != Io::kOk) return io;
  body->clear();
  if (header->magic != kMagic || header->version != kProtocolVersion || header->bytes > bodyLimit) {
    header->magic = 0;
    return Io::kOk;
  }
  body->resize(header->bytes);
  return header->bytes ? readFull(fd, body->data(), body->size(), deadline) : Io::kOk;
}

void closeFd(int& fd) noexcept {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

sockaddr_un socketAddress(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path))
    throw Error(ErrorCode::kInvalidArgument, "rendezvous socket path '" + path + "' must be 1 to " +
                                                 std::to_string(sizeof(addr.sun_path) - 1) + " bytes long");
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  return addr;
}

}  // namespace

Rendezvous::Rendezvous(const RendezvousOptions& options, const std::vector<uint8_t>& payload) : options_(options) {
  if (options.nranks < 1)
    throw Error(ErrorCode::kInvalidArgument, "rendezvous needs at least one rank, got " +
                                                 std::to_string(options.nranks));
  if (options.rank < 0 || options.rank >= options.nranks)
    throw Error(ErrorCode::kInvalidArgument, "rank " + std::to_string(options.rank) + " is outside 0.." +
                                                 std::to_string(options.nranks - 1));
  if (!(options.timeoutS > 0))
    throw Error(ErrorCode::kInvalidArgument, "rendezvous timeout must be positive");
  if (payload.size() > kMaxPayloadBytes)
    throw Error(ErrorCode::kInvalidArgument, "rendezvous payload of " + std::to_string(payload.size()) +
                                                 " bytes exceeds " + std::to_string(kMaxPayloadBytes));
  if (options.nranks == 1) {
    payloads_.push_back(payload);
    return;
  }
  try {
    if (options.rank == 0) lead(payload);
    else follow(payload);
  } catch (...) {
    closeAll();
    throw;
  }
}

Rendezvous::~Rendezvous() { closeAll(); }

void Rendezvous::closeAll() noexcept {
  if (listenFd_ >= 0) {
    closeFd(listenFd_);
    ::unlink(options_.path.c_str());
  }
  for (int& fd : peerFds_) closeFd(fd);
}

void Rendezvous::lead(const std::vector<uint8_t>& payload) {
  const std::string& path = options_.path;
  const int nranks = options_.nranks;
  const std::string within = " within " + secondsText(options_.timeoutS);
  const auto deadline = after(options_.timeoutS);
  payloads_.assign(nranks, {});
  payloads_[0] = payload;
  peerFds_.assign(nranks, -1);
  std::vector<int> pending;  // accepted, not yet identified

  // Every connected process hears why setup failed before rank 0 throws.
  auto fail = [&](ErrorCode code, const std::string& message) {
    Header h;
    h.type = kFailure;
    h.code = static_cast<uint32_t>(code);
    const auto sendBy = after(1.0);
    for (int fd : peerFds_)
      if (fd >= 0) sendMessage(fd, h, message.data(), message.size(), sendBy);
    for (int& fd : pending) {
      sendMessage(fd, h, message.data(), message.size(), sendBy);
      closeFd(fd);
    }
    failed_ = true;
    throw Error(code, message);
  };

  const sockaddr_un addr = socketAddress(path);
  ::unlink(path.c_str());  // a stale socket file from an earlier run would make bind fail
  listenFd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listenFd_ < 0)
    throw Error(ErrorCode::kRendezvous, std::string("cannot create the rendezvous socket: ") + std::strerror(errno));
  if (::bind(listenFd_, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(listenFd_, nranks + 8) != 0) {
    const int err = errno;
    closeFd(listenFd_);  // not bound (or bound but unusable): unlink only what we may have created
    ::unlink(path.c_str());
    throw Error(ErrorCode::kRendezvous, "rank 0 cannot listen on the rendezvous socket " + path + ": " +
                                            std::strerror(err));
  }

  int joined = 0;
  while (joined < nranks - 1) {
    std::vector<pollfd> fds;
    fds.push_back({listenFd_, POLLIN, 0});
    for (int fd : pending) fds.push_back({fd, POLLIN, 0});
    for (int r = 1; r < nranks; ++r)
      if (peerFds_[r] >= 0) fds.push_back({peerFds_[r], POLLIN, 0});
    const int ready = ::poll(fds.data(), fds.size(), remainingMs(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) fail(ErrorCode::kRendezvous, std::string("rendezvous poll failed: ") + std::strerror(errno));
    if (ready == 0) {
      std::vector<int> missing;
      for (int r = 1; r < nranks; ++r)
        if (peerFds_[r] < 0) missing.push_back(r);
      std::string who;
      for (size_t i = 0; i < missing.size(); ++i) who += (i ? ", " : "") + std::to_string(missing[i]);
      fail(ErrorCode::kTimeout, (missing.size() == 1 ? "rank " : "ranks ") + who +
                                    " did not join the rendezvous at " + path + within);
    }
    if (fds[0].revents & POLLIN) {
      const int fd = ::accept4(listenFd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) pending.push_back(fd);
      else if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED)
        fail(ErrorCode::kRendezvous, std::string("rendezvous accept failed: ") + std::strerror(errno));
    }
    // Ranks already joined must stay quiet until the payloads go out: anything readable is a hang-up.
    for (const pollfd& p : fds) {
      if (!p.revents) continue;
      for (int r = 1; r < nranks; ++r)
        if (peerFds_[r] == p.fd) {
          Header h;
          std::vector<uint8_t> body;
          if (readMessage(p.fd, &h, &body, 64 * 1024, after(0.5)) == Io::kOk && h.magic && h.type == kFailure)
            fail(ErrorCode::kRendezvous,
                 "rank " + std::to_string(r) + " failed during setup: " + std::string(body.begin(), body.end()));
          fail(ErrorCode::kRendezvous, "rank " + std::to_string(r) + " closed the connection during setup");
        }
    }
    std::vector<int> readyPending;
    for (const pollfd& p : fds)
      if (p.revents && std::find(pending.begin(), pending.end(), p.fd) != pending.end()) readyPending.push_back(p.fd);
    for (int fd : readyPending) {
      pending.erase(std::find(pending.begin(), pending.end(), fd));
      Header h;
      std::vector<uint8_t> body;
      const Io io = readMessage(fd, &h, &body, kMaxPayloadBytes, deadline);
      if (io != Io::kOk) {
        ::close(fd);
        if (io == Io::kTimeout)
          fail(ErrorCode::kTimeout, "a process connected to the rendezvous at " + path +
                                        " but did not say which rank it is" + within);
        fail(ErrorCode::kRendezvous, "a process connected to the rendezvous at " + path +
                                         " and closed the connection before saying which rank it is");
      }
      pending.push_back(fd);  // so that fail() tells it too
      if (!h.magic || h.type != kHello)
        fail(ErrorCode::kRendezvous, "a process that is not a megamoe rank of this version connected to the "
                                     "rendezvous at " + path);
      const std::string who = "rank " + std::to_string(h.rank);
      if (h.nranks != nranks)
        fail(ErrorCode::kRendezvous, who + " expects " + std::to_string(h.nranks) + " ranks but rank 0 expects " +
                                         std::to_string(nranks));
      if (h.rank == 0 || (h.rank > 0 && h.rank < nranks && peerFds_[h.rank] >= 0))
        fail(ErrorCode::kRendezvous, who + " joined the rendezvous at " + path + " twice (two processes claim " +
                                         who + ")");
      if (h.rank < 0 || h.rank >= nranks)
        fail(ErrorCode::kRendezvous, "a process claims rank " + std::to_string(h.rank) + ", outside 0.." +
                                         std::to_string(nranks - 1));
      if (h.layoutHash != options_.layoutHash)
        fail(ErrorCode::kRendezvous, who + "'s heap layout (hash " + hex(h.layoutHash) + ") differs from rank 0's (" +
                                         hex(options_.layoutHash) +
                                         "): every rank must declare the same heap regions with the same sizes");
      pending.pop_back();
      peerFds_[h.rank] = fd;
      payloads_[h.rank] = std::move(body);
      ++joined;
    }
  }
  closeFd(listenFd_);
  ::unlink(path.c_str());

  std::vector<uint8_t> all;
  for (const auto& p : payloads_) {
    const uint64_t n = p.size();
    all.insert(all.end(), reinterpret_cast<const uint8_t*>(&n), reinterpret_cast<const uint8_t*>(&n) + sizeof n);
    all.insert(all.end(), p.begin(), p.end());
  }
  Header h;
  h.type = kPayloads;
  h.nranks = nranks;
  h.layoutHash = options_.layoutHash;
  const auto sendBy = after(options_.timeoutS);
  for (int r = 1; r < nranks; ++r)
    if (sendMessage(peerFds_[r], h, all.data(), all.size(), sendBy) != Io::kOk)
      fail(ErrorCode::kRendezvous, "rank " + std::to_string(r) + " closed the connection during setup");
}

void Rendezvous::follow(const std::vector<uint8_t>& payload) {
  const std::string& path = options_.path;
  const std::string me = "rank " + std::to_string(options_.rank);
  const std::string within = " within " + secondsText(options_.timeoutS);
  const sockaddr_un addr = socketAddress(path);
  const auto connectBy = after(options_.timeoutS);
  peerFds_.assign(1, -1);
  int& fd = peerFds_[0];
  for (;;) {
    fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
      throw Error(ErrorCode::kRendezvous, std::string("cannot create a socket: ") + std::strerror(errno));
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0) break;
    const int err = errno;
    closeFd(fd);
    if (err != ENOENT && err != ECONNREFUSED && err != EAGAIN && err != EINTR)
      throw Error(ErrorCode::kRendezvous, me + " cannot connect to the rendezvous at " + path + ": " +
                                              std::strerror(err));
    if (Clock::now() >= connectBy)
      throw Error(ErrorCode::kTimeout, "rank 0 did not open the rendezvous at " + path + within + " (" + me +
                                           " gave up waiting)");
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(20, remainingMs(connectBy) + 1)));
  }
  // Rank 0 was listening before we connected, so its own deadline ends before this one.
  const auto answerBy = Clock::now() +
                        std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options_.timeoutS)) +
                        kFollowerGrace;

  Header hello;
  hello.type = kHello;
  hello.rank = options_.rank;
  hello.nranks = options_.nranks;
  hello.layoutHash = options_.layoutHash;
  if (sendMessage(fd, hello, payload.data(), payload.size(), answerBy) != Io::kOk)
    throw Error(ErrorCode::kRendezvous, "rank 0 closed the connection during setup");

  Header h;
  std::vector<uint8_t> body;
  const size_t limit = static_cast<size_t>(options_.nranks) * (kMaxPayloadBytes + sizeof(uint64_t));
  const Io io = readMessage(fd, &h, &body, limit, answerBy);
  if (io == Io::kClosed)
    throw Error(ErrorCode::kRendezvous, "rank 0 closed the connection during setup (" + me +
                                            " was waiting for the other ranks)");
  if (io == Io::kTimeout)
    throw Error(ErrorCode::kTimeout, "rank 0 did not complete the rendezvous at " + path + within);
  if (!h.magic) throw Error(ErrorCode::kRendezvous, "rank 0 sent a malformed rendezvous message");
  if (h.type == kFailure) {
    failed_ = true;
    throw Error(static_cast<ErrorCode>(h.code), std::string(body.begin(), body.end()));
  }
  if (h.type != kPayloads || h.nranks != options_.nranks)
    throw Error(ErrorCode::kRendezvous, "rank 0 sent an unexpected rendezvous message");
  payloads_.clear();
  size_t at = 0;
  for (int r = 0; r < options_.nranks; ++r) {
    uint64_t n = 0;
    if (body.size() - at < sizeof n) throw Error(ErrorCode::kRendezvous, "rank 0 sent truncated payloads");
    std::memcpy(&n, body.data() + at, sizeof n);
    at += sizeof n;
    if (n > body.size() - at) throw Error(ErrorCode::kRendezvous, "rank 0 sent truncated payloads");
    payloads_.emplace_back(body.begin() + at, body.begin() + at + n);
    at += n;
  }
  if (payloads_[options_.rank] != payload)
    throw Error(ErrorCode::kRendezvous, "rank 0 returned a different payload for " + me);
}

void Rendezvous::abandon(const std::string& why) noexcept {
  if (failed_ || options_.nranks == 1) {
    failed_ = true;
    return;
  }
  failed_ = true;
  try {
    Header h;
    h.type = kFailure;
    h.rank = options_.rank;
    h.code = static_cast<uint32_t>(ErrorCode::kRendezvous);
    const std::string message =
        options_.rank == 0 ? "rank 0 failed: " + why : why;  // rank 0 names the others' reports itself
    const auto sendBy = after(1.0);
    for (int fd : peerFds_)
      if (fd >= 0) sendMessage(fd, h, message.data(), message.size(), sendBy);
  } catch (...) {
  }
}

void Rendezvous::barrier(const std::string& stage) {
  if (failed_)
    throw Error(ErrorCode::kRendezvous, "the rendezvous group at " + options_.path +
                                            " is broken by an earlier error; cannot pass " + stage);
  if (options_.nranks == 1) return;
  const std::string within = " within " + secondsText(options_.timeoutS);
  auto broken = [&](ErrorCode code, const std::string& message) {
    failed_ = true;
    throw Error(code, message);
  };

  if (options_.rank != 0) {
    Header h;
    h.type = kBarrier;
    h.rank = options_.rank;
    h.nranks = options_.nranks;
    const auto answerBy = after(options_.timeoutS) + kFollowerGrace;
    std::vector<uint8_t> body;
    if (sendMessage(peerFds_[0], h, stage.data(), stage.size(), answerBy) != Io::kOk) {
      // Rank 0 may have reported a failure and gone before our message left: its reason is still ours to read.
      if (readMessage(peerFds_[0], &h, &body, 64 * 1024, after(1.0)) == Io::kOk && h.magic && h.type == kFailure)
        broken(static_cast<ErrorCode>(h.code), std::string(body.begin(), body.end()));
      broken(ErrorCode::kRendezvous, "rank 0 closed the connection during " + stage);
    }
    const Io io = readMessage(peerFds_[0], &h, &body, 64 * 1024, answerBy);
    if (io == Io::kClosed) broken(ErrorCode::kRendezvous, "rank 0 closed the connection during " + stage);
    if (io == Io::kTimeout) broken(ErrorCode::kTimeout, "rank 0 did not finish " + stage + within);
    if (h.magic && h.type == kFailure)
      broken(static_cast<ErrorCode>(h.code), std::string(body.begin(), body.end()));
    if (!h.magic || h.type != kBarrierDone)
      broken(ErrorCode::kRendezvous, "rank 0 sent an unexpected message during " + stage);
    return;
  }

  auto fail = [&](ErrorCode code, const std::string& message) {
    Header h;
    h.type = kFailure;
    h.code = static_cast<uint32_t>(code);
    const auto sendBy = after(1.0);
    for (int fd : peerFds_)
      if (fd >= 0) sendMessage(fd, h, message.data(), message.size(), sendBy);
    broken(code, message);
  };
  const auto deadline = after(options_.timeoutS);
  std::vector<bool> reached(options_.nranks, false);
  reached[0] = true;
  int count = 1;
  while (count < options_.nranks) {
    std::vector<pollfd> fds;
    std::vector<int> ranks;
    for (int r = 1; r < options_.nranks; ++r)
      if (!reached[r]) {
        fds.push_back({peerFds_[r], POLLIN, 0});
        ranks.push_back(r);
      }
    const int ready = ::poll(fds.data(), fds.size(), remainingMs(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) {
      const int late = ranks.front();
      fail(ErrorCode::kTimeout, "rank " + std::to_string(late) + " did not reach " + stage + within);
    }
    for (size_t i = 0; i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      const int r = ranks[i];
      const std::string who = "rank " + std::to_string(r);
      Header h;
      std::vector<uint8_t> body;
      const Io io = readMessage(peerFds_[r], &h, &body, 64 * 1024, deadline);
      if (io == Io::kClosed) fail(ErrorCode::kRendezvous, who + " closed the connection during " + stage);
      if (io == Io::kTimeout) fail(ErrorCode::kTimeout, who + " did not reach " + stage + within);
      const std::string text(body.begin(), body.end());
      if (h.magic && h.type == kFailure) fail(ErrorCode::kRendezvous, who + " failed during " + stage + ": " + text);
      if (!h.magic || h.type != kBarrier)
        fail(ErrorCode::kRendezvous, who + " sent an unexpected message during " + stage);
      if (text != stage)
        fail(ErrorCode::kRendezvous, who + " is at " + text + " while rank 0 is at " + stage);
      reached[r] = true;
      ++count;
    }
  }
  Header done;
  done.type = kBarrierDone;
  const auto sendBy = after(options_.timeoutS);
  for (int r = 1; r < options_.nranks; ++r) sendMessage(peerFds_[r], done, nullptr, 0, sendBy);
}

}  // namespace megamoe
