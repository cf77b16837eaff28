// The declared contract of every generated kernel: its name, its specialisation constants (the cache key's) with
// their ranges and the rules between them, its arguments by name, type and meaning, and its launch rule. One
// declaration per kernel, written once in Kernels.def and read by both sides: the DSL declares a kernel's arguments
// from it, the compiler writes its signature hash into each cache entry, and the runtime refuses an entry whose
// signature differs from its own declaration and fills launch arguments by name (runtime/include/megamoe/
// KernelArgs.h). Each kernel also gets a typed spec here (e.g. abi::DispatchGroupedGemm: one field per constant,
// constants(), fromConstants(), validate()), so a misspelt constant does not compile. Plain C++, no LLVM:
// runtime/ includes it.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace megamoe::abi {

// Bumped when the meaning of a declaration changes without its text changing (e.g. an argument's units).
// 2: a tensor-map argument's box (element type, box shape by the kernel's constants, swizzle) is declared.
// 3: the heap's combine counters (`done`) hold abi::doneSlots(R) per epoch parity, the column chunks' with them.
inline constexpr int kKernelAbiVersion = 3;

enum class ArgKind : uint8_t {
  kPtr,        // a device address of `elem` elements (8 bytes)
  kI32,        // a 32-bit integer
  kI64,        // a 64-bit integer
  kContext,    // the rank's DeviceContext (a device address; compiler/abi/DeviceAbi.h)
  kTensorMap,  // a CUtensorMap passed by value (128 bytes) where the target has TMA (sm_90a); elsewhere an unused
               // 8-byte pointer, so the list is the same on every target
};
enum class Elem : uint8_t { kNone, kBf16, kF32, kI32, kI64, kE4m3 };  // kE4m3: FP8 OCP E4M3FN

// A kernel's specialisation constants, in its declaration's order (KernelDecl::constants).
using SpecConstants = std::vector<std::pair<std::string, int64_t>>;

// The shared-memory layout a TMA load writes (CU_TENSOR_MAP_SWIZZLE_128B: 16-byte chunks of each 128-byte row
// permuted by the row's index mod 8, the layout the MMA operand tiles are read in).
enum class Swizzle : uint8_t { k128B };

// What one TMA load through a tensor-map argument copies: a box of `cols` (innermost, elements) x `rows` of a 2-D
// row-major `elem` matrix, into shared memory in the `swizzle` layout. The kernel loads exactly this box and the
// runtime encodes its maps with it (tensorMapBox).
struct TensorMapBox {
  Elem elem;
  int64_t cols, rows;
  Swizzle swizzle;
  int64_t bytes() const;
  bool operator==(const TensorMapBox& o) const {
    return elem == o.elem && cols == o.cols && rows == o.rows && swizzle == o.swizzle;
  }
};
// A box that replaces the default one where constant `constant` has `value` (the first match wins).
struct BoxWhen {
  std::string_view constant;
  int64_t value;
  int64_t cols, rows;
};

struct ArgDecl {
  std::string_view name;
  ArgKind kind;
  Elem elem = Elem::kNone;  // kPtr only
  std::string_view meaning = {};  // its shape and role, for people (not in the signature)
  // kTensorMap only: the box, and where the kernel's constants select another shape.
  TensorMapBox box{Elem::kNone, 0, 0, Swizzle::k128B};
  std::vector<BoxWhen> boxWhen = {};
};

// How the host sizes a launch.
enum class GridRule : uint8_t {
  kOne,         // one block
  kCovering,    // enough blocks to cover the work (the kernel's loop bounds say how)
  kResident,    // persistent: every block resident at once (they wait for each other); at most the SM budget
  kResidentPairs,  // as kResident, in clusters of two where the build runs as cluster pairs: the grid is even
};

// A specialisation constant: its valid values are the multiples of `step` in [lo, hi].
struct ConstRange {
  int64_t lo, hi, step;
  bool contains(int64_t v) const { return v >= lo && v <= hi && v % step == 0; }
};
struct ConstDecl {
  std::string_view name;
  ConstRange range;
  std::string_view meaning;
};
// A rule between constants: a C++ condition over them (as written in Kernels.def) and why it holds.
struct RuleDecl {
  std::string_view condition, why;
};

struct KernelDecl {
  std::string_view name;
  std::string_view summary;            // one line on what it does
  std::vector<ConstDecl> constants;    // the specialisation, in the cache key's order
  std::vector<RuleDecl> rules;         // between constants, checked after each constant's range
  std::vector<ArgDecl> args;           // in parameter order
  GridRule grid;                       // (block threads: the build's, in the entry's metadata)

  // Index of argument `name`, or -1.
  int indexOf(std::string_view arg) const {
    for (size_t i = 0; i < args.size(); ++i)
      if (args[i].name == arg) return int(i);
    return -1;
  }
};

const char* argKindName(ArgKind kind);
const char* elemName(Elem elem);
int64_t elemBytes(Elem elem);  // 0 for kNone
const char* swizzleName(Swizzle swizzle);
// The canonical text of a declaration (what its hash covers): "v2 name(c1,c2) arg:kind:elem,...", a tensor map's
// "map_b:tensor_map:bf16:64x128:sw128[layout=1:64x64]".
std::string signatureText(const KernelDecl& decl);
// FNV-1a 64 of signatureText, as 16 lowercase hex digits.
std::string signatureHash(const KernelDecl& decl);

// Every kernel's declaration, and one by name (nullptr for a name no kernel has).
const std::vector<KernelDecl>& kernelDecls();
const KernelDecl* findKernelDecl(std::string_view name);

// "" when `constants` name exactly kernel's declared constants (any order), each in its range, and every rule
// holds; otherwise the first violation, named (an unknown kernel too).
std::string validateSpec(std::string_view kernel, const SpecConstants& constants);
const char* gridRuleName(GridRule grid);
// Every part of a declaration for people: the summary, each constant with its range and meaning, the rules, each
// argument with its kind and meaning, the grid rule (megamoe-cache kernels --describe).
std::string describeDecl(const KernelDecl& decl);

// The box of tensor-map argument `arg` of `decl` for a kernel of these constants (std::invalid_argument naming
// what is wrong when `arg` is no tensor-map argument of decl, or a constant its box depends on is missing).
TensorMapBox tensorMapBox(const KernelDecl& decl, std::string_view arg, const SpecConstants& constants);

// ---- the typed specs, one per declared kernel (Kernels.def): the constants as fields ----
// constants(): in the declared order; fromConstants(): std::invalid_argument naming a constant missing, unknown or
// given twice (values are not checked); validate(): as validateSpec; decl(): the declaration. <c>_range: each
// constant's range.
#define MEGAMOE_KERNEL(Type, name, grid, summary) \
  struct Type {                                   \
    static constexpr std::string_view kName = #name;
#define MEGAMOE_CONST(c, lo, hi, step, meaning) \
  int64_t c = 0;                                \
  static constexpr ConstRange c##_range{lo, hi, step};
#define MEGAMOE_END(Type)                                  \
  SpecConstants constants() const;                         \
  static Type fromConstants(const SpecConstants& constants); \
  std::string validate() const;                            \
  static const KernelDecl& decl();                         \
  };
#include "compiler/abi/Kernels.def"

}  // namespace megamoe::abi
