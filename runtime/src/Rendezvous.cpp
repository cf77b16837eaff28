// Unix-domain-socket rendezvous for the one-process-per-GPU heap (see Rendezvous.h; wire format in RendezvousWire.h;
// who may join, and why the socket is made the way it is: docs/decisions/rendezvous-security.md).
#include "megamoe/Rendezvous.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "RendezvousWire.h"
#include "megamoe/Error.h"
#include "megamoe/Log.h"

namespace megamoe {

namespace wire {
namespace {

void putU32(std::vector<uint8_t>& out, uint32_t v) {
  out.insert(out.end(), reinterpret_cast<const uint8_t*>(&v), reinterpret_cast<const uint8_t*>(&v) + sizeof v);
}
void putU64(std::vector<uint8_t>& out, uint64_t v) {
  out.insert(out.end(), reinterpret_cast<const uint8_t*>(&v), reinterpret_cast<const uint8_t*>(&v) + sizeof v);
}

// Reads from a body without ever running past its end.
class Reader {
 public:
  explicit Reader(const std::vector<uint8_t>& body) : body_(body) {}
  bool u32(uint32_t* v) { return take(v, sizeof *v); }
  bool u64(uint64_t* v) { return take(v, sizeof *v); }
  bool text(std::string* s) {
    uint32_t n = 0;
    if (!u32(&n) || n > left()) return false;
    s->assign(reinterpret_cast<const char*>(body_.data() + at_), n);
    at_ += n;
    return true;
  }
  bool bytes(std::vector<uint8_t>* out, uint64_t n) {
    if (n > left()) return false;
    out->assign(body_.begin() + static_cast<std::ptrdiff_t>(at_), body_.begin() + static_cast<std::ptrdiff_t>(at_ + n));
    at_ += n;
    return true;
  }
  size_t left() const { return body_.size() - at_; }

 private:
  bool take(void* v, size_t n) {
    if (n > left()) return false;
    std::memcpy(v, body_.data() + at_, n);
    at_ += n;
    return true;
  }
  const std::vector<uint8_t>& body_;
  size_t at_ = 0;
};

constexpr uint64_t kFnvOffset = 14695981039346656037ull;
uint64_t fnv1a(uint64_t state, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) {
    state ^= p[i];
    state *= 1099511628211ull;
  }
  return state;
}
uint64_t fnv1aText(uint64_t state, const std::string& s) {
  const uint64_t n = s.size();  // length first: "ab"+"c" and "a"+"bc" must differ
  return fnv1a(fnv1a(state, &n, sizeof n), s.data(), s.size());
}

}  // namespace

size_t agreementBytes(const RendezvousAgreement& agreement) {
  size_t n = 0;
  for (const auto& [name, value] : agreement) n += 8 + name.size() + value.size();
  return n;
}

std::vector<uint8_t> encodeHello(const RendezvousAgreement& agreement, const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> out;
  out.reserve(4 + agreementBytes(agreement) + payload.size());
  putU32(out, static_cast<uint32_t>(agreement.size()));
  for (const auto& [name, value] : agreement) {
    putU32(out, static_cast<uint32_t>(name.size()));
    out.insert(out.end(), name.begin(), name.end());
    putU32(out, static_cast<uint32_t>(value.size()));
    out.insert(out.end(), value.begin(), value.end());
  }
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

bool decodeHello(const std::vector<uint8_t>& body, RendezvousAgreement* agreement, std::vector<uint8_t>* payload) {
  Reader in(body);
  uint32_t count = 0;
  if (!in.u32(&count) || count > in.left() / 8) return false;  // each entry spends at least 8 bytes
  agreement->clear();
  std::set<std::string> names;
  for (uint32_t i = 0; i < count; ++i) {
    std::string name, value;
    if (!in.text(&name) || !in.text(&value) || name.empty() || !names.insert(name).second) return false;
    agreement->emplace_back(std::move(name), std::move(value));
  }
  if (body.size() - in.left() - 4 > Rendezvous::kMaxAgreementBytes || in.left() > Rendezvous::kMaxPayloadBytes)
    return false;
  return in.bytes(payload, in.left());
}

std::vector<uint8_t> encodePayloads(const std::vector<RankEntry>& entries) {
  std::vector<uint8_t> out;
  for (const RankEntry& e : entries) {
    putU64(out, e.layoutHash);
    putU64(out, e.agreementDigest);
    putU64(out, e.payload.size());
    out.insert(out.end(), e.payload.begin(), e.payload.end());
  }
  return out;
}

bool decodePayloads(const std::vector<uint8_t>& body, int nranks, std::vector<RankEntry>* entries) {
  Reader in(body);
  entries->assign(static_cast<size_t>(nranks), {});
  for (RankEntry& e : *entries) {
    uint64_t n = 0;
    if (!in.u64(&e.layoutHash) || !in.u64(&e.agreementDigest) || !in.u64(&n) || !in.bytes(&e.payload, n))
      return false;
  }
  return in.left() == 0;
}

uint64_t agreementDigest(const RendezvousAgreement& agreement) {
  RendezvousAgreement sorted = agreement;
  std::sort(sorted.begin(), sorted.end());
  uint64_t state = fnv1aText(kFnvOffset, "megamoe rendezvous agreement");
  for (const auto& [name, value] : sorted) state = fnv1aText(fnv1aText(state, name), value);
  return state;
}

uint64_t secretDigest(const std::string& secret) {
  return fnv1aText(fnv1aText(kFnvOffset, "megamoe rendezvous secret"), secret);
}

// A value as a message shows it: whole when short, else the stretch where it departs from `other`.
static std::string shownValue(const std::string& value, const std::string& other) {
  constexpr size_t kWhole = 96, kContext = 40;
  if (value.size() <= kWhole) return value;
  const size_t at = static_cast<size_t>(
      std::mismatch(value.begin(), value.end(), other.begin(), other.end()).first - value.begin());
  const size_t from = at > kContext ? at - kContext : 0;
  const size_t to = std::min(value.size(), at + kContext);
  return (from ? "..." : "") + value.substr(from, to - from) + (to < value.size() ? "..." : "");
}

std::string agreementDifference(const RendezvousAgreement& mine, const RendezvousAgreement& theirs,
                                const std::string& who, const std::string& reference) {
  for (const auto& [name, value] : mine) {
    auto it = std::find_if(theirs.begin(), theirs.end(), [&](const auto& e) { return e.first == name; });
    if (it == theirs.end())
      return who + " does not declare " + name + " (" + reference + "'s " + name + "=" + shownValue(value, "") + ")";
    if (it->second != value)
      return who + "'s " + name + "=" + shownValue(it->second, value) + " differs from " + reference + "'s " + name + "=" +
             shownValue(value, it->second);
  }
  for (const auto& [name, value] : theirs) {
    auto it = std::find_if(mine.begin(), mine.end(), [&](const auto& e) { return e.first == name; });
    if (it == mine.end())
      return who + " declares " + name + "=" + shownValue(value, "") + ", which " + reference + " does not declare";
  }
  return "";
}

std::string agreementNamesError(const RendezvousAgreement& agreement) {
  std::set<std::string> names;
  for (const auto& [name, value] : agreement)
    if (name.empty() || !names.insert(name).second)
      return "agreement names must be non-empty and distinct ('" + name + "')";
  return "";
}

static uint64_t handleDigest(const HandleHeader& h, const std::vector<uint8_t>& body) {
  uint64_t state = fnv1a(kFnvOffset, &h.rank, sizeof h.rank);
  state = fnv1a(state, &h.nranks, sizeof h.nranks);
  state = fnv1a(state, &h.layoutHash, sizeof h.layoutHash);
  state = fnv1a(state, &h.nonce, sizeof h.nonce);
  return fnv1a(state, body.data(), body.size());
}

uint64_t randomNonce() {
  std::random_device entropy;
  return (uint64_t(entropy()) << 32) ^ uint64_t(entropy());
}

uint64_t groupDigest(const std::vector<std::vector<uint8_t>>& perRank) {
  uint64_t state = fnv1aText(kFnvOffset, "megamoe group digest");
  for (const std::vector<uint8_t>& bytes : perRank) {
    const uint64_t n = bytes.size();
    state = fnv1a(fnv1a(state, &n, sizeof n), bytes.data(), bytes.size());
  }
  return state;
}

std::vector<uint8_t> encodeHandle(const HandleHeader& fields, const RendezvousAgreement& agreement,
                                  const std::vector<uint8_t>& payload) {
  const std::vector<uint8_t> body = encodeHello(agreement, payload);
  if (sizeof(HandleHeader) + body.size() > kHandleBytes)
    throw Error(ErrorCode::kInvalidArgument, "the rendezvous handle needs " +
                                                 std::to_string(sizeof(HandleHeader) + body.size()) +
                                                 " bytes (its agreement and payload), more than its " +
                                                 std::to_string(kHandleBytes));
  HandleHeader h = fields;
  h.magic = kHandleMagic;
  h.version = kHandleVersion;
  h.bodyBytes = body.size();
  h.digest = handleDigest(h, body);
  std::vector<uint8_t> out(kHandleBytes, 0);
  std::memcpy(out.data(), &h, sizeof h);
  std::memcpy(out.data() + sizeof h, body.data(), body.size());
  return out;
}

std::string decodeHandle(const uint8_t* bytes, DecodedHandle* out) {
  HandleHeader& h = out->header;
  std::memcpy(&h, bytes, sizeof h);
  if (h.magic != kHandleMagic) return "is not a megamoe rendezvous handle (magic " + std::to_string(h.magic) + ")";
  if (h.version != kHandleVersion)
    return "has handle format version " + std::to_string(h.version) + ", this megamoe reads " +
           std::to_string(kHandleVersion) + " (ranks of different megamoe versions?)";
  if (h.bodyBytes > kHandleBytes - sizeof h) return "declares a body of " + std::to_string(h.bodyBytes) + " bytes";
  const std::vector<uint8_t> body(bytes + sizeof h, bytes + sizeof h + h.bodyBytes);
  if (handleDigest(h, body) != h.digest)
    return "is damaged (its checksum does not match)";
  for (size_t i = sizeof h + h.bodyBytes; i < kHandleBytes; ++i)
    if (bytes[i] != 0) return "is damaged (bytes after its body are not zero)";
  if (!decodeHello(body, &out->agreement, &out->payload)) return "is damaged (its agreement list does not parse)";
  return "";
}

}  // namespace wire

namespace {

using Clock = std::chrono::steady_clock;
using wire::Header;

// A follower waits this much past timeoutS for rank 0's answer, so that rank 0's report of the cause wins.
constexpr std::chrono::milliseconds kFollowerGrace{1000};
// Connections rank 0 holds before they have said who they are; more, and the one silent longest is dropped.
constexpr size_t kMaxPending = 64;
// A body larger than this on an identified link is garbage (failure reports, barrier stage names).
constexpr size_t kMaxNoteBytes = 64 * 1024;

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

// Reads one message from an identified peer. `bodyLimit` guards against garbage sizes; a bad magic or version
// reads as kOk with header->magic left 0 for the caller to reject.
Io readMessage(int fd, Header* header, std::vector<uint8_t>* body, size_t bodyLimit, Clock::time_point deadline) {
  const Io io = readFull(fd, header, sizeof *header, deadline);
  if (io != Io::kOk) return io;
  body->clear();
  if (header->magic != wire::kMagic || header->version != wire::kProtocolVersion || header->bytes > bodyLimit) {
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
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);  // checked by the constructor: fits, no NUL
  return addr;
}

// Whose process is at the other end of a connected Unix socket (either side: the kernel records both).
bool peerOf(int fd, ucred* cred) {
  socklen_t n = sizeof *cred;
  return ::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, cred, &n) == 0 && n == sizeof *cred;
}

std::string pidText(const ucred& cred) { return "pid " + std::to_string(cred.pid); }

// What is at `path`, for messages: "a directory", "a socket owned by uid 65534", "nothing".
std::string occupantOf(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0)
    return errno == ENOENT ? "nothing" : std::string("something it cannot inspect (") + std::strerror(errno) + ")";
  const std::string owner = st.st_uid == ::geteuid() ? "" : " owned by uid " + std::to_string(st.st_uid);
  if (S_ISSOCK(st.st_mode)) return "a socket" + owner;
  if (S_ISDIR(st.st_mode)) return "a directory" + owner;
  if (S_ISREG(st.st_mode)) return "a regular file" + owner;
  if (S_ISLNK(st.st_mode)) return "a symbolic link" + owner;
  return "a special file" + owner;
}

// Connections (or listeners) refused as not belonging to this group: kept for the error text, so that a group
// that fails later says what else knocked, while the strangers themselves never fail it.
// Each distinct refusal is also logged (warn) when first seen, up to the number the error text shows.
class RefusalLog {
 public:
  // `logPrefix`: "rendezvous at <path>: rank 0 dropped " (what follows is the refusal's text).
  explicit RefusalLog(std::string logPrefix) : logPrefix_(std::move(logPrefix)) {}
  void add(const std::string& what) {
    ++count_;
    for (auto& [text, times] : shown_)
      if (text == what) {
        ++times;  // a follower retrying meets the same listener again and again
        return;
      }
    if (shown_.size() < kShown) {
      shown_.emplace_back(what, 1);
      MEGAMOE_LOG(kWarn, logPrefix_ + what);
    } else if (unshown_++ == 0) {
      MEGAMOE_LOG(kWarn, logPrefix_ + "more than " + std::to_string(kShown) +
                         " kinds of strangers; further ones are counted, not logged");
    }
  }
  size_t count() const { return count_; }
  // "; rank 0 refused 2 connections that were not part of this group: ...; ..." (empty when none).
  std::string suffix(const std::string& who, const std::string& what) const {
    if (count_ == 0) return "";
    std::string out = "; " + who + " refused " + std::to_string(count_) + " " + what + (count_ == 1 ? "" : "s") +
                      " that " + (count_ == 1 ? "was" : "were") + " not part of this group: ";
    for (size_t i = 0; i < shown_.size(); ++i)
      out += (i ? "; " : "") + shown_[i].first +
             (shown_[i].second > 1 ? " (" + std::to_string(shown_[i].second) + " times)" : "");
    if (unshown_) out += "; and " + std::to_string(unshown_) + " more";
    return out;
  }

 private:
  static constexpr size_t kShown = 16;
  std::string logPrefix_;
  std::vector<std::pair<std::string, size_t>> shown_;  // distinct texts, how often each
  size_t count_ = 0, unshown_ = 0;
};

double secondsSince(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

}  // namespace

Rendezvous::Rendezvous(const RendezvousOptions& options, const std::vector<uint8_t>& payload) : options_(options) {
  auto invalid = [](const std::string& message) { throw Error(ErrorCode::kInvalidArgument, message); };
  if (options.nranks < 1) invalid("rendezvous needs at least one rank, got " + std::to_string(options.nranks));
  if (options.rank < 0 || options.rank >= options.nranks)
    invalid("rank " + std::to_string(options.rank) + " is outside 0.." + std::to_string(options.nranks - 1));
  if (!(options.timeoutS > 0)) invalid("rendezvous timeout must be positive");
  if (payload.size() > kMaxPayloadBytes)
    invalid("rendezvous payload of " + std::to_string(payload.size()) + " bytes exceeds " +
            std::to_string(kMaxPayloadBytes));
  if (const std::string wrong = wire::agreementNamesError(options.agreement); !wrong.empty())
    invalid("rendezvous " + wrong);
  if (wire::agreementBytes(options.agreement) > kMaxAgreementBytes)
    invalid("rendezvous agreement list of " + std::to_string(wire::agreementBytes(options.agreement)) +
            " bytes exceeds " + std::to_string(kMaxAgreementBytes));
  if (options.nranks == 1) {
    payloads_.push_back(payload);
    return;
  }
  const size_t pathLimit = sizeof(sockaddr_un::sun_path) - 1;
  if (options.path.empty() || options.path.size() > pathLimit)
    invalid("rendezvous socket path '" + options.path + "' must be 1 to " + std::to_string(pathLimit) +
            " bytes long");
  // A leading NUL would make an abstract socket, which has no permissions at all; a NUL elsewhere would cut the
  // path short.
  if (options.path.find('\0') != std::string::npos)
    invalid("rendezvous socket path must be a filesystem path without NUL bytes (abstract socket names, which "
            "anyone may connect to, are refused)");
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
  closeFd(listenFd_);
  removeOwnSocket();
  for (int& fd : peerFds_) closeFd(fd);
}

void Rendezvous::removeOwnSocket() noexcept {
  if (!ownsSocket_) return;
  ownsSocket_ = false;
  // Only the file this rank bound: anything else now at the path (a user's file, another group's socket) stays.
  struct stat st {};
  if (::lstat(options_.path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode) &&
      static_cast<uint64_t>(st.st_dev) == socketDevice_ && static_cast<uint64_t>(st.st_ino) == socketInode_)
    ::unlink(options_.path.c_str());
}

void Rendezvous::openSocket() {
  const std::string& path = options_.path;
  const sockaddr_un addr = socketAddress(path);
  listenFd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (listenFd_ < 0)
    throw Error(ErrorCode::kRendezvous, std::string("cannot create the rendezvous socket: ") + std::strerror(errno));
  // Linux gives the file bind() creates the socket's own mode, less the umask: set before bind, the file is
  // owner-only from its first moment whatever the umask (which can only take bits away). No window to close.
  if (::fchmod(listenFd_, 0600) != 0)
    throw Error(ErrorCode::kRendezvous, std::string("cannot restrict the rendezvous socket to its owner: ") +
                                            std::strerror(errno));
  if (::bind(listenFd_, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    const int err = errno;
    closeFd(listenFd_);
    // bind never replaces anything: whatever is there stays, and the message says what it is.
    if (err == EADDRINUSE) {
      const std::string occupant = occupantOf(path);
      std::string advice = "choose a path where nothing exists yet";
      if (occupant.rfind("a socket", 0) == 0)
        advice = "another rendezvous may be using it, or an earlier run died and left it; rank 0 removes only a "
                 "socket it created itself: remove it or " + advice;
      else if (occupant.rfind("a regular file", 0) == 0 || occupant.rfind("a directory", 0) == 0)
        advice = "left untouched; " + advice;
      throw Error(ErrorCode::kRendezvous, "rank 0 cannot open the rendezvous at " + path + ": " + occupant +
                                              " is already at that path (" + advice + ")");
    }
    throw Error(ErrorCode::kRendezvous, "rank 0 cannot create the rendezvous socket " + path + ": " +
                                            std::strerror(err));
  }
  // What bind made, checked: our socket, owner-only. Another user's process cannot create a file we own, so a
  // replacement between bind and this lstat shows as a foreign owner (and is not ours to remove).
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode) || st.st_uid != ::geteuid()) {
    const std::string occupant = occupantOf(path);
    closeFd(listenFd_);
    throw Error(ErrorCode::kRendezvous, "the rendezvous socket rank 0 created at " + path +
                                            " was replaced at once (now " + occupant +
                                            "): other users can write to its directory; choose a private one");
  }
  ownsSocket_ = true;
  socketDevice_ = static_cast<uint64_t>(st.st_dev);
  socketInode_ = static_cast<uint64_t>(st.st_ino);
  const unsigned mode = st.st_mode & 0777;
  if ((mode & 077) != 0 || (mode & 0600) != 0600) {
    std::ostringstream text;
    text << "the rendezvous socket " << path << " has mode 0" << std::oct << mode
         << " where rank 0 needs 0600 (owner-only, and the owner may connect): "
         << ((mode & 077) ? "its filesystem ignores the mode set before bind" : "the umask removes owner bits");
    throw Error(ErrorCode::kRendezvous, text.str());
  }
  if (::listen(listenFd_, 128) != 0)
    throw Error(ErrorCode::kRendezvous, "rank 0 cannot listen on the rendezvous socket " + path + ": " +
                                            std::strerror(errno));
}

void Rendezvous::lead(const std::vector<uint8_t>& payload) {
  const std::string& path = options_.path;
  const int nranks = options_.nranks;
  const std::string within = " within " + secondsText(options_.timeoutS);
  const auto deadline = after(options_.timeoutS);
  const uint64_t mySecret = wire::secretDigest(options_.secret);
  const auto start = Clock::now();
  std::vector<wire::RankEntry> entries(nranks);
  entries[0] = {options_.layoutHash, wire::agreementDigest(options_.agreement), payload};
  peerFds_.assign(nranks, -1);
  const std::string logAt = "rendezvous at " + path + ": ";
  RefusalLog refused(logAt + "rank 0 dropped ");

  // Accepted, of this user, not yet identified as a rank: what it has sent so far.
  struct Pending {
    int fd = -1;
    ucred cred{};
    std::vector<uint8_t> bytes;
  };
  std::vector<Pending> pending;
  auto refuse = [&](Pending& p, const std::string& why) {
    refused.add(why + " (" + pidText(p.cred) + ")");
    closeFd(p.fd);
  };

  // Members (and `alsoTell`, a process identified as a rank of this group) hear why setup failed before rank 0
  // throws; strangers hear nothing.
  auto fail = [&](ErrorCode code, const std::string& cause, int alsoTell = -1) {
    const std::string message = cause + refused.suffix("rank 0", "connection");
    Header h;
    h.type = wire::kFailure;
    h.code = static_cast<uint32_t>(code);
    const auto sendBy = after(1.0);
    for (int fd : peerFds_)
      if (fd >= 0) sendMessage(fd, h, message.data(), message.size(), sendBy);
    if (alsoTell >= 0) sendMessage(alsoTell, h, message.data(), message.size(), sendBy);
    for (Pending& p : pending) closeFd(p.fd);
    failed_ = true;
    throw Error(code, message);
  };

  openSocket();
  MEGAMOE_LOG(kInfo, logAt + "rank 0 waiting for " + std::to_string(nranks - 1) + (nranks == 2 ? " rank" : " ranks") +
                     " to join" + within);

  // A pending connection whose hello is complete, checked field by field. Returns the rank it joined as, or -1
  // when it was refused as a stranger (wrong secret, rank count or rank: not a member of this group).
  auto admit = [&](Pending& p) -> int {
    Header h;
    std::memcpy(&h, p.bytes.data(), sizeof h);
    const std::vector<uint8_t> body(p.bytes.begin() + sizeof h, p.bytes.end());
    RendezvousAgreement agreement;
    std::vector<uint8_t> theirPayload;
    if (!wire::decodeHello(body, &agreement, &theirPayload)) {
      refuse(p, "a malformed hello (its agreement list or payload does not parse)");
      return -1;
    }
    const std::string who = "rank " + std::to_string(h.rank);
    if (peerFds_[h.rank] >= 0)
      fail(ErrorCode::kRendezvous, who + " joined the rendezvous at " + path + " twice (two processes claim " + who +
                                       ")", p.fd);
    // The named values first: they say which field differs, where the layout hash can only say that one does.
    const std::string difference =
        wire::agreementDifference(options_.agreement, agreement, "rank " + std::to_string(h.rank), "rank 0");
    if (!difference.empty()) fail(ErrorCode::kRendezvous, difference, p.fd);
    if (h.layoutHash != options_.layoutHash)
      fail(ErrorCode::kRendezvous, who + "'s heap layout (hash " + hex(h.layoutHash) + ") differs from rank 0's (" +
                                       hex(options_.layoutHash) +
                                       "): every rank must declare the same heap regions with the same sizes",
           p.fd);
    entries[h.rank] = {h.layoutHash, wire::agreementDigest(agreement), std::move(theirPayload)};
    peerFds_[h.rank] = p.fd;
    p.fd = -1;
    return h.rank;
  };

  // Reads what has arrived on a pending connection, never blocking; refuses it as soon as what it sent cannot be
  // a hello of a rank of this group. Returns true when a whole hello is in.
  auto receive = [&](Pending& p) -> bool {
    Header h;
    const bool haveHeader = p.bytes.size() >= sizeof h;
    if (haveHeader) std::memcpy(&h, p.bytes.data(), sizeof h);
    const size_t want = haveHeader ? sizeof h + h.bytes - p.bytes.size() : sizeof h - p.bytes.size();
    const size_t had = p.bytes.size();
    p.bytes.resize(had + want);
    const ssize_t got = ::recv(p.fd, p.bytes.data() + had, want, MSG_DONTWAIT);
    p.bytes.resize(had + static_cast<size_t>(std::max<ssize_t>(got, 0)));
    if (got < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        refuse(p, std::string("a connection that failed: ") + std::strerror(errno));
      return false;
    }
    if (got == 0) {
      refuse(p, had == 0 ? "a connection closed without a word"
                         : "a connection closed after " + std::to_string(had) + " bytes, before a whole hello");
      return false;
    }
    if (!haveHeader && p.bytes.size() == sizeof h) {
      std::memcpy(&h, p.bytes.data(), sizeof h);
      const std::string claim = "a hello claiming rank " + std::to_string(h.rank);
      if (h.magic != wire::kMagic) refuse(p, std::to_string(sizeof h) + " bytes that are not a megamoe hello");
      else if (h.version != wire::kProtocolVersion)
        refuse(p, "a megamoe hello of protocol version " + std::to_string(h.version) + " (this is version " +
                      std::to_string(wire::kProtocolVersion) + ")");
      else if (h.type != wire::kHello)
        refuse(p, "a megamoe message of type " + std::to_string(h.type) + ", not a hello");
      else if (h.bytes > wire::kMaxHelloBytes)
        refuse(p, "a hello announcing " + std::to_string(h.bytes) + " bytes (at most " +
                      std::to_string(wire::kMaxHelloBytes) + ")");
      else if (h.secretDigest != mySecret)
        refuse(p, claim + " without this group's rendezvous secret (MEGAMOE_RENDEZVOUS_SECRET)");
      else if (h.nranks != nranks)
        refuse(p, claim + ": rank " + std::to_string(h.rank) + " expects " + std::to_string(h.nranks) +
                      " ranks but rank 0 expects " + std::to_string(nranks));
      else if (h.rank < 1 || h.rank >= nranks)
        refuse(p, claim + ", outside 1.." + std::to_string(nranks - 1));
      if (p.fd < 0) return false;
    }
    return p.bytes.size() >= sizeof h && p.bytes.size() == sizeof h + h.bytes;
  };

  int joined = 0;
  while (joined < nranks - 1) {
    if (Clock::now() >= deadline) {
      std::vector<int> missing;
      for (int r = 1; r < nranks; ++r)
        if (peerFds_[r] < 0) missing.push_back(r);
      std::string who;
      for (size_t i = 0; i < missing.size(); ++i) who += (i ? ", " : "") + std::to_string(missing[i]);
      fail(ErrorCode::kTimeout, (missing.size() == 1 ? "rank " : "ranks ") + who +
                                    " did not join the rendezvous at " + path + within);
    }
    std::vector<pollfd> fds;
    fds.push_back({listenFd_, POLLIN, 0});
    for (const Pending& p : pending) fds.push_back({p.fd, POLLIN, 0});
    for (int r = 1; r < nranks; ++r)
      if (peerFds_[r] >= 0) fds.push_back({peerFds_[r], POLLIN, 0});
    const int ready = ::poll(fds.data(), fds.size(), remainingMs(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) fail(ErrorCode::kRendezvous, std::string("rendezvous poll failed: ") + std::strerror(errno));
    if (ready == 0) continue;  // the deadline, reported above

    // Ranks already joined must stay quiet until the payloads go out: anything readable is a hang-up.
    for (size_t i = 1 + pending.size(); i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      const int r = static_cast<int>(std::find(peerFds_.begin(), peerFds_.end(), fds[i].fd) - peerFds_.begin());
      Header h;
      std::vector<uint8_t> body;
      if (readMessage(fds[i].fd, &h, &body, kMaxNoteBytes, after(0.5)) == Io::kOk && h.magic &&
          h.type == wire::kFailure)
        fail(ErrorCode::kRendezvous,
             "rank " + std::to_string(r) + " failed during setup: " + std::string(body.begin(), body.end()));
      fail(ErrorCode::kRendezvous, "rank " + std::to_string(r) + " closed the connection during setup");
    }
    for (size_t i = 0; i < pending.size(); ++i)
      if (fds[1 + i].revents && receive(pending[i])) {
        const int r = admit(pending[i]);
        if (r <= 0) continue;
        ++joined;
        MEGAMOE_LOG(kInfo, logAt + "rank " + std::to_string(r) + " joined (" + pidText(pending[i].cred) + "), " +
                           std::to_string(joined) + " of " + std::to_string(nranks - 1) + " after " +
                           formatDuration(secondsSince(start)));
      }
    pending.erase(std::remove_if(pending.begin(), pending.end(), [](const Pending& p) { return p.fd < 0; }),
                  pending.end());

    if (fds[0].revents & POLLIN) {
      for (;;) {
        Pending p;
        p.fd = ::accept4(listenFd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (p.fd < 0) {
          if (errno == EINTR || errno == ECONNABORTED) continue;
          if (errno == EAGAIN || errno == EWOULDBLOCK) break;
          fail(ErrorCode::kRendezvous, std::string("rendezvous accept failed: ") + std::strerror(errno));
        }
        // Identified by the kernel, not by what it says: another user's process is dropped before a byte is
        // read or sent.
        if (!peerOf(p.fd, &p.cred)) {
          refused.add(std::string("a connection whose credentials cannot be read: ") + std::strerror(errno));
          closeFd(p.fd);
          continue;
        }
        if (p.cred.uid != ::geteuid()) {
          refuse(p, "a process of uid " + std::to_string(p.cred.uid) + ", not this user (uid " +
                        std::to_string(::geteuid()) + ")");
          continue;
        }
        if (pending.size() >= kMaxPending) {
          refuse(pending.front(), "a connection that sent no whole hello while " + std::to_string(kMaxPending) +
                                      " newer ones waited");
          pending.erase(pending.begin());
        }
        pending.push_back(std::move(p));
      }
    }
  }
  closeFd(listenFd_);
  removeOwnSocket();
  for (Pending& p : pending) closeFd(p.fd);  // strangers still silent: closed unanswered

  const std::vector<uint8_t> all = wire::encodePayloads(entries);
  Header h;
  h.type = wire::kPayloads;
  h.nranks = nranks;
  h.layoutHash = options_.layoutHash;
  h.secretDigest = mySecret;
  const auto sendBy = after(options_.timeoutS);
  for (int r = 1; r < nranks; ++r)
    if (sendMessage(peerFds_[r], h, all.data(), all.size(), sendBy) != Io::kOk)
      fail(ErrorCode::kRendezvous, "rank " + std::to_string(r) + " closed the connection during setup");
  payloads_.clear();
  for (wire::RankEntry& e : entries) payloads_.push_back(std::move(e.payload));
  const size_t strangers = refused.count();
  MEGAMOE_LOG(kInfo, logAt + "all " + std::to_string(nranks) + " ranks met; done in " +
                     formatDuration(secondsSince(start)) +
                     (strangers ? " (" + std::to_string(strangers) + (strangers == 1 ? " stranger" : " strangers") +
                                      " dropped)"
                                : std::string()));
}

void Rendezvous::follow(const std::vector<uint8_t>& payload) {
  const std::string& path = options_.path;
  const int nranks = options_.nranks;
  const std::string me = "rank " + std::to_string(options_.rank);
  const std::string within = " within " + secondsText(options_.timeoutS);
  const sockaddr_un addr = socketAddress(path);
  const auto connectBy = after(options_.timeoutS);
  const uint64_t mySecret = wire::secretDigest(options_.secret);
  const uint64_t myAgreement = wire::agreementDigest(options_.agreement);
  const auto start = Clock::now();
  const std::string logAt = "rendezvous at " + path + ": ";
  RefusalLog refused(logAt + me + " refused ");
  MEGAMOE_LOG(kInfo, logAt + me + " waiting for rank 0" + within);
  // What the last attempt found at the path, for an honest message if rank 0 never answers.
  enum class Found { kNothing, kNotListening, kDenied, kForeign } found = Found::kNothing;
  ucred rankZero{};
  peerFds_.assign(1, -1);
  int& fd = peerFds_[0];
  for (;;) {
    // Non-blocking: a connect to a full backlog fails with EAGAIN and is retried, never waits unbounded.
    fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
      throw Error(ErrorCode::kRendezvous, std::string("cannot create a socket: ") + std::strerror(errno));
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0) {
      // The listener must be this user's: nothing is sent to anyone else's socket at the path.
      if (peerOf(fd, &rankZero) && rankZero.uid == ::geteuid()) break;
      refused.add("a listener of uid " + std::to_string(rankZero.uid) + " (" + pidText(rankZero) +
                  "), not this user (uid " + std::to_string(::geteuid()) + ")");
      found = Found::kForeign;
      closeFd(fd);
    } else {
      const int err = errno;
      closeFd(fd);
      if (err == ENOENT) found = Found::kNothing;
      else if (err == ECONNREFUSED) found = Found::kNotListening;
      else if (err == EACCES || err == EPERM) found = Found::kDenied;
      else if (err != EAGAIN && err != EINTR)
        throw Error(ErrorCode::kRendezvous, me + " cannot connect to the rendezvous at " + path + ": " +
                                                std::strerror(err));
    }
    if (Clock::now() >= connectBy) {
      const std::string occupant = occupantOf(path);
      if (occupant == "nothing" && found != Found::kForeign) found = Found::kNothing;
      std::string message;
      switch (found) {
        case Found::kNothing:
          message = "rank 0 did not open the rendezvous at " + path + within + " (nothing is at that path: rank 0 "
                    "has not started, or it already failed and removed its socket; " + me + " gave up waiting)";
          break;
        case Found::kNotListening:
          message = "no rank 0 accepted " + me + " at " + path + within + ": " + occupant + " is there" +
                    (occupant.rfind("a socket", 0) == 0
                         ? " but nobody accepts connections on it (rank 0 closed it or failed, or an earlier run "
                           "died and left it behind)"
                         : ", not a rendezvous socket");
          break;
        case Found::kDenied:
          message = "no rank 0 accepted " + me + " at " + path + within + ": " + occupant +
                    " is there and refuses this user (permission denied)";
          break;
        case Found::kForeign:
          message = "no rank 0 of this user accepted " + me + " at " + path + within;
          break;
      }
      throw Error(ErrorCode::kTimeout, message + refused.suffix(me, "listener"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(20, remainingMs(connectBy) + 1)));
  }
  const std::string rankZeroText = "rank 0 (" + pidText(rankZero) + ")";
  MEGAMOE_LOG(kInfo, logAt + me + " joined " + rankZeroText + " after " + formatDuration(secondsSince(start)));
  // Rank 0 was listening before we connected, so its own deadline ends before this one.
  const auto answerBy = after(options_.timeoutS) + kFollowerGrace;

  Header hello;
  hello.type = wire::kHello;
  hello.rank = options_.rank;
  hello.nranks = nranks;
  hello.layoutHash = options_.layoutHash;
  hello.secretDigest = mySecret;
  // Rank 0 tells every rank it accepted why it fails; a hang-up without a word means it refused this hello (it
  // may do so before the hello has been sent in full), or died.
  const Error refusedUs(ErrorCode::kRendezvous,
                        rankZeroText + " closed the connection without answering " + me + ": it refused " + me +
                            "'s hello (another rank count, rank number, protocol version or rendezvous secret; "
                            "rank 0's own error says which), or it died");
  Header h;
  std::vector<uint8_t> answer;
  const size_t limit = static_cast<size_t>(nranks) * (kMaxPayloadBytes + 3 * sizeof(uint64_t));
  const std::vector<uint8_t> body = wire::encodeHello(options_.agreement, payload);
  if (sendMessage(fd, hello, body.data(), body.size(), answerBy) != Io::kOk) {
    if (readMessage(fd, &h, &answer, kMaxNoteBytes, after(0.5)) == Io::kOk && h.magic && h.type == wire::kFailure)
      throw Error(static_cast<ErrorCode>(h.code), std::string(answer.begin(), answer.end()));
    throw refusedUs;
  }
  const Io io = readMessage(fd, &h, &answer, limit, answerBy);
  if (io == Io::kClosed) throw refusedUs;
  if (io == Io::kTimeout)
    throw Error(ErrorCode::kTimeout, "rank 0 did not complete the rendezvous at " + path + within);
  if (!h.magic) throw Error(ErrorCode::kRendezvous, rankZeroText + " sent a malformed rendezvous message");
  if (h.type == wire::kFailure) {
    failed_ = true;
    throw Error(static_cast<ErrorCode>(h.code), std::string(answer.begin(), answer.end()));
  }
  if (h.type != wire::kPayloads || h.nranks != nranks)
    throw Error(ErrorCode::kRendezvous, rankZeroText + " sent an unexpected rendezvous message");
  if (h.secretDigest != mySecret)
    throw Error(ErrorCode::kRendezvous, rankZeroText + " at " + path + " does not hold this group's rendezvous "
                                                                       "secret (MEGAMOE_RENDEZVOUS_SECRET)");
  // Rank 0 checked every hello against its own; checked again here, per payload, so that a rank 0 that did not
  // (another build, a forgery of this user) cannot hand out a payload made for another layout.
  std::vector<wire::RankEntry> entries;
  if (!wire::decodePayloads(answer, nranks, &entries))
    throw Error(ErrorCode::kRendezvous, rankZeroText + " sent truncated payloads");
  if (h.layoutHash != options_.layoutHash)
    throw Error(ErrorCode::kRendezvous, "rank 0's heap layout (hash " + hex(h.layoutHash) + ") differs from " + me +
                                            "'s (" + hex(options_.layoutHash) + ")");
  for (int r = 0; r < nranks; ++r) {
    if (entries[r].layoutHash != options_.layoutHash)
      throw Error(ErrorCode::kRendezvous, "rank " + std::to_string(r) + "'s heap layout (hash " +
                                              hex(entries[r].layoutHash) + ", as handed out by rank 0) differs from " +
                                              me + "'s (" + hex(options_.layoutHash) + ")");
    if (entries[r].agreementDigest != myAgreement)
      throw Error(ErrorCode::kRendezvous, "rank " + std::to_string(r) + "'s agreed values (as handed out by rank 0) "
                                              "differ from " + me + "'s");
  }
  if (entries[options_.rank].payload != payload)
    throw Error(ErrorCode::kRendezvous, "rank 0 returned a different payload for " + me);
  payloads_.clear();
  for (wire::RankEntry& e : entries) payloads_.push_back(std::move(e.payload));
  MEGAMOE_LOG(kInfo, logAt + me + " received the payloads of all " + std::to_string(nranks) + " ranks; done in " +
                     formatDuration(secondsSince(start)));
}

void Rendezvous::abandon(const std::string& why) noexcept {
  if (failed_ || options_.nranks == 1) {
    failed_ = true;
    return;
  }
  failed_ = true;
  try {
    Header h;
    h.type = wire::kFailure;
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
  const auto start = Clock::now();
  auto passed = [&] {
    MEGAMOE_LOG(kDebug, "rendezvous at " + options_.path + ": rank " + std::to_string(options_.rank) + " passed " +
                        stage + " in " + formatDuration(secondsSince(start)));
  };
  auto broken = [&](ErrorCode code, const std::string& message) {
    failed_ = true;
    throw Error(code, message);
  };

  if (options_.rank != 0) {
    Header h;
    h.type = wire::kBarrier;
    h.rank = options_.rank;
    h.nranks = options_.nranks;
    const auto answerBy = after(options_.timeoutS) + kFollowerGrace;
    std::vector<uint8_t> body;
    if (sendMessage(peerFds_[0], h, stage.data(), stage.size(), answerBy) != Io::kOk) {
      // Rank 0 may have reported a failure and gone before our message left: its reason is still ours to read.
      if (readMessage(peerFds_[0], &h, &body, kMaxNoteBytes, after(1.0)) == Io::kOk && h.magic &&
          h.type == wire::kFailure)
        broken(static_cast<ErrorCode>(h.code), std::string(body.begin(), body.end()));
      broken(ErrorCode::kRendezvous, "rank 0 closed the connection during " + stage);
    }
    const Io io = readMessage(peerFds_[0], &h, &body, kMaxNoteBytes, answerBy);
    if (io == Io::kClosed) broken(ErrorCode::kRendezvous, "rank 0 closed the connection during " + stage);
    if (io == Io::kTimeout) broken(ErrorCode::kTimeout, "rank 0 did not finish " + stage + within);
    if (h.magic && h.type == wire::kFailure)
      broken(static_cast<ErrorCode>(h.code), std::string(body.begin(), body.end()));
    if (!h.magic || h.type != wire::kBarrierDone)
      broken(ErrorCode::kRendezvous, "rank 0 sent an unexpected message during " + stage);
    passed();
    return;
  }

  auto fail = [&](ErrorCode code, const std::string& message) {
    Header h;
    h.type = wire::kFailure;
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
      const Io io = readMessage(peerFds_[r], &h, &body, kMaxNoteBytes, deadline);
      if (io == Io::kClosed) fail(ErrorCode::kRendezvous, who + " closed the connection during " + stage);
      if (io == Io::kTimeout) fail(ErrorCode::kTimeout, who + " did not reach " + stage + within);
      const std::string text(body.begin(), body.end());
      if (h.magic && h.type == wire::kFailure)
        fail(ErrorCode::kRendezvous, who + " failed during " + stage + ": " + text);
      if (!h.magic || h.type != wire::kBarrier)
        fail(ErrorCode::kRendezvous, who + " sent an unexpected message during " + stage);
      if (text != stage)
        fail(ErrorCode::kRendezvous, who + " is at " + text + " while rank 0 is at " + stage);
      reached[r] = true;
      ++count;
    }
  }
  Header done;
  done.type = wire::kBarrierDone;
  const auto sendBy = after(options_.timeoutS);
  for (int r = 1; r < options_.nranks; ++r) sendMessage(peerFds_[r], done, nullptr, 0, sendBy);
  passed();
}

}  // namespace megamoe
