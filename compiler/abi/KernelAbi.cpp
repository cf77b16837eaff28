// Every kernel's declaration and typed spec (KernelAbi.h), both from the one list in Kernels.def.
#include "compiler/abi/KernelAbi.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

namespace megamoe::abi {
namespace {

std::vector<KernelDecl> declarations() {
  std::vector<KernelDecl> all;
#define MEGAMOE_KERNEL(Type, name, grid, summary) \
  {                                               \
    KernelDecl d{#name, summary, {}, {}, {}, GridRule::grid};
#define MEGAMOE_CONST(c, lo, hi, step, meaning) d.constants.push_back({#c, {lo, hi, step}, meaning});
#define MEGAMOE_RULE(condition, why) d.rules.push_back({#condition, why});
#define MEGAMOE_ARG(n, kind, elem, meaning) d.args.push_back({#n, ArgKind::k##kind, Elem::k##elem, meaning});
#define MEGAMOE_MAP(n, elem, cols, rows, meaning) \
  d.args.push_back({#n, ArgKind::kTensorMap, Elem::kNone, meaning, {Elem::k##elem, cols, rows, Swizzle::k128B}, {}});
#define MEGAMOE_MAP_WHEN(c, value, cols, rows) d.args.back().boxWhen.push_back({#c, value, cols, rows});
#define MEGAMOE_END(Type)     \
  all.push_back(std::move(d)); \
  }
#include "compiler/abi/Kernels.def"
  return all;
}

}  // namespace

const char* argKindName(ArgKind kind) {
  switch (kind) {
    case ArgKind::kPtr: return "ptr";
    case ArgKind::kI32: return "i32";
    case ArgKind::kI64: return "i64";
    case ArgKind::kContext: return "context";
    case ArgKind::kTensorMap: return "tensor_map";
  }
  return "?";
}

const char* elemName(Elem elem) {
  switch (elem) {
    case Elem::kNone: return "";
    case Elem::kBf16: return "bf16";
    case Elem::kF32: return "f32";
    case Elem::kI32: return "i32";
    case Elem::kI64: return "i64";
    case Elem::kE4m3: return "e4m3";
  }
  return "?";
}

int64_t elemBytes(Elem elem) {
  switch (elem) {
    case Elem::kNone: return 0;
    case Elem::kE4m3: return 1;
    case Elem::kBf16: return 2;
    case Elem::kF32:
    case Elem::kI32: return 4;
    case Elem::kI64: return 8;
  }
  return 0;
}

const char* swizzleName(Swizzle swizzle) {
  switch (swizzle) {
    case Swizzle::k128B: return "sw128";
  }
  return "?";
}

int64_t TensorMapBox::bytes() const { return cols * rows * elemBytes(elem); }

std::string signatureText(const KernelDecl& d) {
  std::string s = "v" + std::to_string(kKernelAbiVersion) + " " + std::string(d.name) + "(";
  for (size_t i = 0; i < d.constants.size(); ++i) s += (i ? "," : "") + std::string(d.constants[i].name);
  s += ")";
  for (size_t i = 0; i < d.args.size(); ++i) {
    const ArgDecl& a = d.args[i];
    s += (i ? "," : " ") + std::string(a.name) + ":" + argKindName(a.kind);
    if (a.kind == ArgKind::kPtr) s += std::string(":") + elemName(a.elem);
    if (a.kind == ArgKind::kTensorMap) {
      s += std::string(":") + elemName(a.box.elem) + ":" + std::to_string(a.box.cols) + "x" +
           std::to_string(a.box.rows) + ":" + swizzleName(a.box.swizzle);
      for (size_t w = 0; w < a.boxWhen.size(); ++w)
        s += (w ? "," : "[") + std::string(a.boxWhen[w].constant) + "=" + std::to_string(a.boxWhen[w].value) + ":" +
             std::to_string(a.boxWhen[w].cols) + "x" + std::to_string(a.boxWhen[w].rows) +
             (w + 1 == a.boxWhen.size() ? "]" : "");
    }
  }
  return s;
}

std::string signatureHash(const KernelDecl& decl) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : signatureText(decl)) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

const std::vector<KernelDecl>& kernelDecls() {
  static const std::vector<KernelDecl> all = declarations();
  return all;
}

const KernelDecl* findKernelDecl(std::string_view name) {
  for (const KernelDecl& d : kernelDecls())
    if (d.name == name) return &d;
  return nullptr;
}

TensorMapBox tensorMapBox(const KernelDecl& decl, std::string_view arg, const SpecConstants& constants) {
  const int at = decl.indexOf(arg);
  if (at < 0 || decl.args[size_t(at)].kind != ArgKind::kTensorMap)
    throw std::invalid_argument(std::string(decl.name) + " has no tensor-map argument '" + std::string(arg) + "'");
  const ArgDecl& a = decl.args[size_t(at)];
  for (const BoxWhen& w : a.boxWhen) {
    const std::pair<std::string, int64_t>* found = nullptr;
    for (const auto& c : constants)
      if (c.first == w.constant) found = &c;
    if (!found)
      throw std::invalid_argument(std::string(decl.name) + "." + std::string(arg) + ": the box depends on constant '" +
                                  std::string(w.constant) + "', which the spec does not give");
    if (found->second == w.value) return {a.box.elem, w.cols, w.rows, a.box.swizzle};
  }
  return a.box;
}

namespace {
// "" when v is in r, else "<name>=<v> must be <the bound it breaks> (<meaning>)".
std::string rangeError(std::string_view name, int64_t v, ConstRange r, std::string_view meaning) {
  if (r.contains(v)) return "";
  std::string s = std::string(name) + "=" + std::to_string(v) + " must be ";
  if (r.lo == r.hi)
    s += std::to_string(r.lo);
  else if (v % r.step != 0)
    s += "a multiple of " + std::to_string(r.step);
  else
    s += v < r.lo ? ">= " + std::to_string(r.lo) : "<= " + std::to_string(r.hi);
  return s + " (" + std::string(meaning) + ")";
}

// The value of constant `name` in `in` (the caller checked that it is there exactly once).
int64_t valueOf(const SpecConstants& in, std::string_view name) {
  for (const auto& [k, v] : in)
    if (k == name) return v;
  return 0;
}

// std::invalid_argument unless `in` names exactly decl's constants, each once.
void checkNames(const KernelDecl& decl, const SpecConstants& in) {
  for (const ConstDecl& c : decl.constants) {
    const auto n = std::count_if(in.begin(), in.end(), [&](const auto& kv) { return kv.first == c.name; });
    if (n != 1)
      throw std::invalid_argument(std::string(decl.name) + ": constant '" + std::string(c.name) + "' is " +
                                  (n ? "given twice" : "missing"));
  }
  for (const auto& kv : in)
    if (std::none_of(decl.constants.begin(), decl.constants.end(), [&](const ConstDecl& c) { return c.name == kv.first; }))
      throw std::invalid_argument(std::string(decl.name) + " has no constant '" + kv.first + "'");
}
}  // namespace

// The typed specs' members (KernelAbi.h), one pass over Kernels.def for each.
#define MEGAMOE_KERNEL(Type, name, grid, summary) \
  SpecConstants Type::constants() const {         \
    SpecConstants out;
#define MEGAMOE_CONST(c, lo, hi, step, meaning) out.push_back({#c, c});
#define MEGAMOE_END(Type) \
  return out;             \
  }
#include "compiler/abi/Kernels.def"

#define MEGAMOE_KERNEL(Type, name, grid, summary)                      \
  Type Type::fromConstants([[maybe_unused]] const SpecConstants& in) { \
    checkNames(decl(), in);                                             \
    Type s;
#define MEGAMOE_CONST(c, lo, hi, step, meaning) s.c = valueOf(in, #c);
#define MEGAMOE_END(Type) \
  return s;               \
  }
#include "compiler/abi/Kernels.def"

#define MEGAMOE_KERNEL(Type, name, grid, summary) \
  const KernelDecl& Type::decl() {                \
    static const KernelDecl& d = *findKernelDecl(kName);
#define MEGAMOE_END(Type) \
  return d;               \
  }
#include "compiler/abi/Kernels.def"

#define MEGAMOE_KERNEL(Type, name, grid, summary) \
  std::string Type::validate() const {            \
    std::string e;
#define MEGAMOE_CONST(c, lo, hi, step, meaning) \
  if (e.empty()) e = rangeError(#c, c, c##_range, meaning);
#define MEGAMOE_RULE(condition, why) \
  if (e.empty() && !(condition)) e = std::string(#condition) + " must hold (" + why + ")";
#define MEGAMOE_END(Type) \
  return e;               \
  }
#include "compiler/abi/Kernels.def"

std::string validateSpec(std::string_view kernel, const SpecConstants& constants) {
  try {
#define MEGAMOE_KERNEL(Type, name, grid, summary) \
  if (kernel == Type::kName) return Type::fromConstants(constants).validate();
#include "compiler/abi/Kernels.def"
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "no kernel is named '" + std::string(kernel) + "'";
}

const char* gridRuleName(GridRule grid) {
  switch (grid) {
    case GridRule::kOne: return "one block";
    case GridRule::kCovering: return "covering: enough blocks for the work";
    case GridRule::kResident: return "resident: every block at once, at most the SM budget";
    case GridRule::kResidentPairs: return "resident, in clusters of two where the build runs as pairs (an even grid)";
  }
  return "?";
}

std::string describeDecl(const KernelDecl& d) {
  std::string s = std::string(d.name) + ": " + std::string(d.summary) + "\n";
  for (const ConstDecl& c : d.constants) {
    std::string range = std::to_string(c.range.lo) + ".." + std::to_string(c.range.hi);
    if (c.range.step > 1) range += " step " + std::to_string(c.range.step);
    char line[160];
    std::snprintf(line, sizeof line, "  const %-12s %-22s ", std::string(c.name).c_str(), range.c_str());
    s += line + std::string(c.meaning) + "\n";
  }
  for (const RuleDecl& r : d.rules) s += "  rule  " + std::string(r.condition) + ": " + std::string(r.why) + "\n";
  for (const ArgDecl& a : d.args) {
    std::string kind = argKindName(a.kind);
    if (a.kind == ArgKind::kPtr) kind += std::string(":") + elemName(a.elem);
    if (a.kind == ArgKind::kTensorMap)
      kind += std::string(":") + elemName(a.box.elem) + ":" + std::to_string(a.box.cols) + "x" +
              std::to_string(a.box.rows);
    char line[160];
    std::snprintf(line, sizeof line, "  arg   %-14s %-20s ", std::string(a.name).c_str(), kind.c_str());
    s += line + std::string(a.meaning) + "\n";
  }
  return s + "  grid  " + gridRuleName(d.grid) + "\n";
}

}  // namespace megamoe::abi
