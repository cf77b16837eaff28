// The rendezvous's wire format (Rendezvous.cpp), declared apart so that the host tests can forge what a stranger or
// a broken rank would send. Every message is a Header, then `bytes` of body; integers in host order (the peers share
// a machine).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "megamoe/Rendezvous.h"

namespace megamoe::wire {

constexpr uint32_t kMagic = 0x454f4d4du;  // "MMOE"
constexpr uint32_t kProtocolVersion = 2;

enum MessageType : uint32_t { kHello = 1, kPayloads = 2, kFailure = 3, kBarrier = 4, kBarrierDone = 5 };

struct Header {
  uint32_t magic = kMagic;
  uint32_t version = kProtocolVersion;
  uint32_t type = 0;
  int32_t rank = 0;
  int32_t nranks = 0;
  uint32_t code = 0;  // ErrorCode of a kFailure
  uint64_t layoutHash = 0;
  uint64_t secretDigest = 0;  // kHello and kPayloads: secretDigest(RendezvousOptions::secret)
  uint64_t bytes = 0;
};
static_assert(sizeof(Header) == 48, "wire header must not change silently");

// The largest kHello body rank 0 reads: the agreement list and one payload.
constexpr size_t kMaxHelloBytes = 4 + Rendezvous::kMaxAgreementBytes + Rendezvous::kMaxPayloadBytes;

// kHello body: u32 entry count, then per entry u32 name bytes, name, u32 value bytes, value; the rest is the payload.
std::vector<uint8_t> encodeHello(const RendezvousAgreement& agreement, const std::vector<uint8_t>& payload);
// False when the body does not parse (cut short, a length past the end, an empty or repeated name).
bool decodeHello(const std::vector<uint8_t>& body, RendezvousAgreement* agreement, std::vector<uint8_t>* payload);
// Bytes encodeHello spends on `agreement`.
size_t agreementBytes(const RendezvousAgreement& agreement);

// One rank's entry of the kPayloads body, as rank 0 accepted it from that rank's hello.
struct RankEntry {
  uint64_t layoutHash = 0;
  uint64_t agreementDigest = 0;
  std::vector<uint8_t> payload;
};
// kPayloads body: per rank, in rank order: u64 layoutHash, u64 agreementDigest, u64 payload bytes, payload.
std::vector<uint8_t> encodePayloads(const std::vector<RankEntry>& entries);
// False unless the body holds exactly `nranks` entries.
bool decodePayloads(const std::vector<uint8_t>& body, int nranks, std::vector<RankEntry>* entries);

// Independent of the entries' order: two ranks agree when they declare the same names with the same values.
uint64_t agreementDigest(const RendezvousAgreement& agreement);
// What the hello carries instead of the secret itself.
uint64_t secretDigest(const std::string& secret);
// "" when every name is non-empty and no name repeats, else which one breaks that.
std::string agreementNamesError(const RendezvousAgreement& agreement);
// How `theirs` differs from `mine` ("" when it does not), naming the first field: "rank 1's intermediate=1024
// differs from rank 0's intermediate=2048" for who = "rank 1", reference = "rank 0".
std::string agreementDifference(const RendezvousAgreement& mine, const RendezvousAgreement& theirs,
                                const std::string& who, const std::string& reference);

// The handle of a rendezvous the caller carries out (SymmetricHeap::prepareExchange): kHandleBytes on every rank,
// a HandleHeader, then a kHello body (agreement and payload), then zeros.
constexpr uint32_t kHandleMagic = 0x484d4d4du;  // "MMMH"
constexpr uint32_t kHandleVersion = 2;  // 2: the nonce
constexpr size_t kHandleBytes = 4096;
struct HandleHeader {
  uint32_t magic = kHandleMagic;
  uint32_t version = kHandleVersion;
  int32_t rank = 0;
  int32_t nranks = 0;
  uint64_t layoutHash = 0;
  uint64_t bodyBytes = 0;
  uint64_t nonce = 0;   // drawn at random by prepare(): no two prepared heaps' handles are alike
  uint64_t digest = 0;  // FNV-1a of rank, nranks, layoutHash, nonce and the body
};
static_assert(sizeof(HandleHeader) == 48, "handle header must not change silently");
// kHandleBytes; Error(kInvalidArgument) when the agreement and payload do not fit.
std::vector<uint8_t> encodeHandle(const HandleHeader& fields, const RendezvousAgreement& agreement,
                                  const std::vector<uint8_t>& payload);
struct DecodedHandle {
  HandleHeader header;
  RendezvousAgreement agreement;
  std::vector<uint8_t> payload;
};
// Reads kHandleBytes at `bytes`: "" when they are a well-formed handle, else what is wrong ("is damaged (...)").
std::string decodeHandle(const uint8_t* bytes, DecodedHandle* out);
// A random 64-bit value from the operating system's entropy source (std::random_device).
uint64_t randomNonce();
// The group digest: one value over every rank's bytes in rank order (handles in mode C, payloads in mode B), equal
// on the ranks of one group and, through the handles' nonces, different for any other set of ranks.
uint64_t groupDigest(const std::vector<std::vector<uint8_t>>& perRank);

}  // namespace megamoe::wire
