// KernelKey: every field enters the digest, the fingerprint alone stays out of the lookup digest, and the
// serialisation is unambiguous (moving characters between adjacent fields changes the digest).
#include <gtest/gtest.h>

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "compiler/cache/KernelCache.h"

namespace megamoe::cache {
namespace {

KernelKey baseKey() {
  KernelKey key;
  key.kernel = "swiglu_fwd";
  key.spec = {{"I", 2048}, {"clamp", 0}};
  key.target = "sm_90a";
  key.options = "num_warps=4;opt=3";
  key.fingerprint = "megamoe-0.1.0+llvm-22+gen-abc";
  return key;
}

bool isLowerHex64(const std::string& s) {
  if (s.size() != 64) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

TEST(KernelKey, DigestsAreStableHex) {
  KernelKey a = baseKey(), b = baseKey();
  EXPECT_TRUE(isLowerHex64(a.digest()));
  EXPECT_TRUE(isLowerHex64(a.lookupDigest()));
  EXPECT_EQ(a.digest(), b.digest());
  EXPECT_EQ(a.lookupDigest(), b.lookupDigest());
  EXPECT_NE(a.digest(), a.lookupDigest());
}

struct Mutation {
  const char* name;
  std::function<void(KernelKey&)> apply;
  bool changesLookupDigest;
};

TEST(KernelKey, EverySingleFieldChangeChangesTheDigest) {
  const std::vector<Mutation> mutations = {
      {"kernel", [](KernelKey& k) { k.kernel = "swiglu_bwd"; }, true},
      {"spec value", [](KernelKey& k) { k.spec[0].second = 4096; }, true},
      {"spec value sign", [](KernelKey& k) { k.spec[1].second = -1; }, true},
      {"spec name", [](KernelKey& k) { k.spec[1].first = "clamp2"; }, true},
      {"spec order", [](KernelKey& k) { std::swap(k.spec[0], k.spec[1]); }, true},
      {"spec extra", [](KernelKey& k) { k.spec.push_back({"E", 8}); }, true},
      {"spec dropped", [](KernelKey& k) { k.spec.pop_back(); }, true},
      {"spec empty", [](KernelKey& k) { k.spec.clear(); }, true},
      {"target", [](KernelKey& k) { k.target = "gfx950"; }, true},
      {"options", [](KernelKey& k) { k.options += " "; }, true},
      {"fingerprint", [](KernelKey& k) { k.fingerprint += "x"; }, false},
  };
  const KernelKey base = baseKey();
  std::set<std::string> digests = {base.digest()};
  std::set<std::string> lookupDigests = {base.lookupDigest()};
  for (const Mutation& m : mutations) {
    KernelKey key = baseKey();
    m.apply(key);
    EXPECT_TRUE(digests.insert(key.digest()).second) << m.name << " did not change the digest";
    if (m.changesLookupDigest) {
      EXPECT_TRUE(lookupDigests.insert(key.lookupDigest()).second) << m.name << " did not change the lookup digest";
    } else {
      EXPECT_EQ(key.lookupDigest(), base.lookupDigest()) << m.name << " must not enter the lookup digest";
    }
  }
}

// Pairs that a naive concatenation would serialise identically.
TEST(KernelKey, AdjacentFieldsCannotBleedIntoEachOther) {
  auto make = [](std::string kernel, std::vector<std::pair<std::string, int64_t>> spec, std::string target,
                 std::string options, std::string fingerprint) {
    KernelKey k;
    k.kernel = std::move(kernel);
    k.spec = std::move(spec);
    k.target = std::move(target);
    k.options = std::move(options);
    k.fingerprint = std::move(fingerprint);
    return k;
  };
  const std::vector<std::pair<KernelKey, KernelKey>> pairs = {
      {make("ab", {}, "c", "", ""), make("a", {}, "bc", "", "")},
      {make("k", {{"a", 12}}, "t", "", ""), make("k", {{"a1", 2}}, "t", "", "")},
      {make("k", {{"a", 1}, {"b", 2}}, "t", "", ""), make("k", {{"a", 1}}, "b2t", "", "")},
      {make("k", {}, "t", "", "x"), make("k", {}, "t", "x", "")},
      {make("k", {}, "t", "o", "f"), make("k", {}, "to", "", "f")},
      {make("k1", {}, "t", "", ""), make("k", {{"1", 0}}, "t", "", "")},
  };
  for (size_t i = 0; i < pairs.size(); ++i)
    EXPECT_NE(pairs[i].first.digest(), pairs[i].second.digest()) << "pair " << i;
  // The lookup digest must not collide with the full digest of a key whose fingerprint is empty.
  KernelKey noFingerprint = make("k", {}, "t", "o", "");
  EXPECT_NE(noFingerprint.digest(), noFingerprint.lookupDigest());
}

TEST(KernelKey, Describe) {
  EXPECT_EQ(baseKey().describe(), "swiglu_fwd[I=2048,clamp=0]@sm_90a");
  KernelKey key = baseKey();
  key.spec = {{"N", -3}};
  key.target = "gfx950";
  EXPECT_EQ(key.describe(), "swiglu_fwd[N=-3]@gfx950");
  key.spec.clear();
  EXPECT_EQ(key.describe(), "swiglu_fwd@gfx950");
  // Options and fingerprint are not part of the human-readable name.
  KernelKey other = baseKey();
  other.options = "different";
  other.fingerprint = "different";
  EXPECT_EQ(other.describe(), baseKey().describe());
}

}  // namespace
}  // namespace megamoe::cache
