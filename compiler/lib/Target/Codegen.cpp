// Codegen in process for both targets, plus the static facts over each object. See Codegen.h.
#include "megamoe/Target/Codegen.h"

#include "compiler/abi/KernelAbi.h"
#include "compiler/cache/Json.h"

#include <dlfcn.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <optional>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <regex>
#include <sstream>

#include "lld/Common/Driver.h"
#include "llvm/IR/LegacyPassManager.h"
#include "llvm/Transforms/Utils/Cloning.h"
#include "llvm/IR/Module.h"
#include "llvm/MC/TargetRegistry.h"
#include "llvm/Passes/PassBuilder.h"
#include "llvm/Support/CrashRecoveryContext.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Program.h"
#include "llvm/Support/TargetSelect.h"
#include "llvm/Support/raw_ostream.h"
#include "llvm/Target/TargetMachine.h"
#include "llvm/Target/TargetOptions.h"
#include "megamoe/Dialect/MegaMoe.h"
#include "megamoe/Dialect/Registration.h"
#include "megamoe/GeneratorHash.h"
#include "megamoe/Target/MmaAtoms.h"
#include "megamoe/Target/Pipeline.h"
#include "megamoe/Target/TargetLimits.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Target/LLVMIR/Export.h"

LLD_HAS_DRIVER(elf)

namespace megamoe {
namespace {

using Clock = std::chrono::steady_clock;
double msSince(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

// A JSON string literal of `s`, through the project's one writer (compiler/cache/Json.h).
std::string quoted(const std::string& s) {
  std::string out;
  json::appendQuoted(out, s);
  return out;
}

void initLlvmTargets() {
  static std::once_flag once;
  std::call_once(once, [] {
    llvm::InitializeAllTargetInfos();
    llvm::InitializeAllTargets();
    llvm::InitializeAllTargetMCs();
    llvm::InitializeAllAsmPrinters();
  });
}

std::unique_ptr<llvm::TargetMachine> makeTargetMachine(const TargetOptions& options, std::string* error) {
  initLlvmTargets();
  llvm::Triple triple(options.triple());
  std::string lookupError;
  const llvm::Target* target = llvm::TargetRegistry::lookupTarget(triple, lookupError);
  if (!target) {
    *error = "LLVM has no backend for " + options.triple() + ": " + lookupError;
    return nullptr;
  }
  auto level = options.optLevel() >= 3 ? llvm::CodeGenOptLevel::Aggressive : llvm::CodeGenOptLevel::Default;
  return std::unique_ptr<llvm::TargetMachine>(target->createTargetMachine(
      triple, options.cpu(), options.features(), llvm::TargetOptions(), llvm::Reloc::PIC_, std::nullopt, level));
}

void optimize(llvm::Module& module, llvm::TargetMachine& tm, int optLevel) {
  llvm::LoopAnalysisManager lam;
  llvm::FunctionAnalysisManager fam;
  llvm::CGSCCAnalysisManager cgam;
  llvm::ModuleAnalysisManager mam;
  llvm::PassBuilder pb(&tm);
  pb.registerModuleAnalyses(mam);
  pb.registerCGSCCAnalyses(cgam);
  pb.registerFunctionAnalyses(fam);
  pb.registerLoopAnalyses(lam);
  pb.crossRegisterProxies(lam, fam, cgam, mam);
  llvm::OptimizationLevel level = optLevel >= 3   ? llvm::OptimizationLevel::O3
                                  : optLevel == 2 ? llvm::OptimizationLevel::O2
                                  : optLevel == 1 ? llvm::OptimizationLevel::O1
                                                  : llvm::OptimizationLevel::O0;
  llvm::ModulePassManager mpm = level == llvm::OptimizationLevel::O0 ? pb.buildO0DefaultPipeline(level)
                                                                    : pb.buildPerModuleDefaultPipeline(level);
  mpm.run(module, mam);
}

bool emit(llvm::Module& module, llvm::TargetMachine& tm, llvm::CodeGenFileType type, std::string* out,
          std::string* error) {
  llvm::SmallString<0> buffer;
  llvm::raw_svector_ostream os(buffer);
  llvm::legacy::PassManager pm;
  if (tm.addPassesToEmitFile(pm, os, nullptr, type)) {
    *error = "the backend cannot emit this file type";
    return false;
  }
  pm.run(module);
  *out = std::string(buffer.str());
  return true;
}

int64_t firstInt(const std::string& text, const std::string& pattern, int64_t fallback) {
  std::smatch m;
  if (std::regex_search(text, m, std::regex(pattern))) return std::stoll(m[1].str());
  return fallback;
}

int64_t countOccurrences(const std::string& text, const std::string& needle) {
  int64_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + needle.size())) ++n;
  return n;
}

// Temporary files of one external step, removed on every path out of it.
class TempFiles {
 public:
  ~TempFiles() {
    for (const auto& p : paths_) llvm::sys::fs::remove(p);
  }
  // Creates one file per suffix; false (with *error) when one cannot be made.
  bool create(std::initializer_list<const char*> suffixes, const char* forWhat, std::string* error) {
    for (const char* suffix : suffixes) {
      llvm::SmallString<128> path;
      if (std::error_code ec = llvm::sys::fs::createTemporaryFile("megamoe", suffix, path)) {
        *error = std::string("cannot create temporary files for ") + forWhat + ": " + ec.message();
        return false;
      }
      paths_.push_back(path.str().str());
    }
    return true;
  }
  const std::string& operator[](size_t i) const { return paths_.at(i); }

 private:
  std::vector<std::string> paths_;
};

// Writes `bytes` to `path` whole: a short write (disk full, a file-size limit) is an error naming the file, never
// a truncated input for the next tool.
bool writeWhole(const std::string& path, llvm::StringRef bytes, std::string* error) {
  std::error_code ec;
  llvm::raw_fd_ostream os(path, ec);
  if (ec) {
    *error = "cannot open " + path + " for writing: " + ec.message();
    return false;
  }
  os << bytes;
  os.close();
  if (os.has_error()) {
    *error = "writing " + std::to_string(bytes.size()) + " bytes to " + path + " failed: " + os.error().message() +
             " (disk full or a file-size limit?)";
    os.clear_error();
    return false;
  }
  return true;
}

// The ptxas executable: $MEGAMOE_PTXAS, $CUDA_HOME/bin/ptxas, /usr/local/cuda/bin/ptxas, or ptxas on PATH.
std::string findPtxas() {
  for (const char* env : {"MEGAMOE_PTXAS", "CUDA_HOME"}) {
    const char* v = std::getenv(env);
    if (!v || !*v) continue;
    std::string path = std::string(v) + (std::string(env) == "CUDA_HOME" ? "/bin/ptxas" : "");
    if (::access(path.c_str(), X_OK) == 0) return path;
  }
  if (::access("/usr/local/cuda/bin/ptxas", X_OK) == 0) return "/usr/local/cuda/bin/ptxas";
  auto onPath = llvm::sys::findProgramByName("ptxas");
  return onPath ? *onPath : std::string();
}

// The version ptxas at `path` reports ("V13.0.88" from "Cuda compilation tools, release 13.0, V13.0.88"), asked once
// per path and process; "unknown" when it says none, "none" without a path.
std::string ptxasVersion(const std::string& path) {
  if (path.empty()) return "none";
  static std::mutex mutex;
  static std::map<std::string, std::string> known;
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = known.find(path); it != known.end()) return it->second;
  std::string version = "unknown", error;
  TempFiles files;
  if (files.create({"txt"}, "ptxas --version", &error)) {
    llvm::StringRef args[] = {path, "--version"};
    std::optional<llvm::StringRef> redirects[] = {std::nullopt, llvm::StringRef(files[0]), llvm::StringRef(files[0])};
    if (llvm::sys::ExecuteAndWait(path, args, std::nullopt, redirects, /*SecondsToWait=*/60) == 0) {
      std::ifstream in(files[0]);
      const std::string text((std::istreambuf_iterator<char>(in)), {});
      std::smatch m;
      if (std::regex_search(text, m, std::regex(R"(, (V[0-9][0-9.]*))"))) version = m[1];
    }
  }
  return known.emplace(path, version).first->second;
}

// PTX -> cubin with the ptxas executable, compiling the whole program: only then does ptxas give each
// warp-specialised role the registers its setmaxnreg names (nvJitLink compiles relocatably, like ptxas -c, and
// holds every role to the launch budget: 72 bytes of spills on the grouped GEMM's MMA warpgroups, measured).
bool assembleCubin(const std::string& ptx, CompiledKernel& k, std::string* error) {
  std::string ptxas = findPtxas();
  if (ptxas.empty()) {
    *error = "warp-specialised kernels need the ptxas executable (set MEGAMOE_PTXAS or CUDA_HOME): nvJitLink "
             "ignores their per-role register budgets";
    return false;
  }
  TempFiles files;
  if (!files.create({"ptx", "cubin", "log"}, "ptxas", error) || !writeWhole(files[0], ptx, error)) return false;
  const std::string &in = files[0], &out = files[1], &log = files[2];
  llvm::StringRef args[] = {ptxas, "-arch=sm_90a", "-O3", "-v", in, "-o", out};
  std::optional<llvm::StringRef> redirects[] = {std::nullopt, llvm::StringRef(log), llvm::StringRef(log)};
  std::string execError;
  int rc = llvm::sys::ExecuteAndWait(ptxas, args, std::nullopt, redirects, 0, 0, &execError);
  std::ifstream bin(out, std::ios::binary), text(log);
  k.binary.assign(std::istreambuf_iterator<char>(bin), {});
  std::string info((std::istreambuf_iterator<char>(text)), {});
  if (rc != 0 || k.binary.empty()) {
    *error = "ptxas (" + ptxas + ") could not build the cubin: " + execError + info;
    return false;
  }
  return readPtxasLog(info, k.facts, error);
}

// nvJitLink, opened with dlopen on first use: only sm_90a code needs it, so gfx950 generation runs on a machine
// without the CUDA toolkit, and the compiler builds without it. The few types and functions we call are declared
// here (CUDA 13's nvJitLink.h). Its inline wrappers call versioned exports (__nvJitLinkCreate_13_0, ...); we resolve
// the same names, so a library of another major version is refused by name rather than called blindly.
struct NvJitLinkState;
using NvJitLinkHandle = NvJitLinkState*;
using NvJitLinkResult = int;
constexpr NvJitLinkResult kNvJitLinkSuccess = 0;
constexpr int kNvJitLinkInputPtx = 2;  // NVJITLINK_INPUT_PTX

template <typename Signature>
using Fn = Signature*;

#define MEGAMOE_NVJITLINK_ENTRY_POINTS(X)                                             \
  X(Create, NvJitLinkResult(NvJitLinkHandle*, uint32_t, const char* const*))          \
  X(Destroy, NvJitLinkResult(NvJitLinkHandle*))                                       \
  X(AddData, NvJitLinkResult(NvJitLinkHandle, int, const void*, size_t, const char*)) \
  X(Complete, NvJitLinkResult(NvJitLinkHandle))                                       \
  X(GetLinkedCubinSize, NvJitLinkResult(NvJitLinkHandle, size_t*))                    \
  X(GetLinkedCubin, NvJitLinkResult(NvJitLinkHandle, void*))                          \
  X(GetErrorLogSize, NvJitLinkResult(NvJitLinkHandle, size_t*))                       \
  X(GetErrorLog, NvJitLinkResult(NvJitLinkHandle, char*))                             \
  X(GetInfoLogSize, NvJitLinkResult(NvJitLinkHandle, size_t*))                        \
  X(GetInfoLog, NvJitLinkResult(NvJitLinkHandle, char*))

struct NvJitLink {
  std::string path;
  std::string version = "unknown";  // nvJitLinkVersion's "major.minor"
#define MEGAMOE_DECLARE_ENTRY(name, signature) Fn<signature> name = nullptr;
  MEGAMOE_NVJITLINK_ENTRY_POINTS(MEGAMOE_DECLARE_ENTRY)
#undef MEGAMOE_DECLARE_ENTRY
};

// Candidates in order: $MEGAMOE_NVJITLINK_LIBRARY alone when set (an explicit choice never falls back); else the
// loader's search path, versioned then unversioned, then $CUDA_HOME/lib64 and the toolkit configured at build time.
std::vector<std::string> nvJitLinkCandidates() {
  if (const char* v = std::getenv("MEGAMOE_NVJITLINK_LIBRARY"); v && *v) return {v};
  std::vector<std::string> out = {"libnvJitLink.so.13", "libnvJitLink.so"};
  if (const char* home = std::getenv("CUDA_HOME"); home && *home) out.push_back(std::string(home) + "/lib64/libnvJitLink.so.13");
  out.push_back(std::string(MEGAMOE_CUDA_HOME_DEFAULT) + "/lib64/libnvJitLink.so.13");
  return out;
}

// The library, looked up once per process and never closed (as the runtime keeps its driver libraries); on failure
// *error names every candidate, why it failed, and how to point at the library.
const NvJitLink* nvJitLink(std::string* error) {
  struct Loaded {
    std::optional<NvJitLink> lib;
    std::string why;
  };
  static const Loaded loaded = [] {
    Loaded out;
    std::string tried;
    for (const std::string& path : nvJitLinkCandidates()) {
      void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (!handle) {
        const char* why = ::dlerror();
        tried += "\n  " + path + ": " + (why ? why : "dlopen failed");
        continue;
      }
      NvJitLink lib;
      lib.path = path;
      std::string missing;
#define MEGAMOE_RESOLVE_ENTRY(name, signature)                                                      \
  lib.name = reinterpret_cast<Fn<signature>>(::dlsym(handle, "__nvJitLink" #name "_13_0"));         \
  if (!lib.name) missing += std::string(missing.empty() ? "" : ", ") + "__nvJitLink" #name "_13_0";
      MEGAMOE_NVJITLINK_ENTRY_POINTS(MEGAMOE_RESOLVE_ENTRY)
#undef MEGAMOE_RESOLVE_ENTRY
      if (missing.empty()) {
        // nvJitLinkVersion is an unversioned export (it has to answer whichever major version the library is).
        using VersionFn = NvJitLinkResult(unsigned*, unsigned*);
        unsigned major = 0, minor = 0;
        if (auto version = reinterpret_cast<Fn<VersionFn>>(::dlsym(handle, "nvJitLinkVersion"));
            version && version(&major, &minor) == kNvJitLinkSuccess)
          lib.version = std::to_string(major) + "." + std::to_string(minor);
        out.lib = lib;
        return out;
      }
      tried += "\n  " + path + ": lacks " + missing + " (not CUDA 13's nvJitLink)";
    }
    const char* chosen = std::getenv("MEGAMOE_NVJITLINK_LIBRARY");
    out.why = "sm_90a code needs NVIDIA's nvJitLink from the CUDA 13 toolkit (libnvJitLink.so.13), and none could be "
              "loaded; tried:" + tried + "\n" +
              (chosen && *chosen ? "MEGAMOE_NVJITLINK_LIBRARY is set, so nothing else was tried: point it at CUDA 13's "
                                   "libnvJitLink.so.13, or unset it to search the loader's path and the toolkit."
                                 : "Set MEGAMOE_NVJITLINK_LIBRARY to the library's path (e.g. "
                                   "/usr/local/cuda/lib64/libnvJitLink.so.13) or CUDA_HOME to the toolkit.");
    return out;
  }();
  if (!loaded.lib) *error = loaded.why;
  return loaded.lib ? &*loaded.lib : nullptr;
}

// PTX -> cubin with nvJitLink; its info log (ptxas -v) gives registers, stack frame, spills and shared memory.
bool linkCubin(const std::string& ptx, CompiledKernel& k, std::string* error) {
  const NvJitLink* nv = nvJitLink(error);
  if (!nv) return false;
  const char* opts[] = {"-arch=sm_90a", "-O3", "-Xptxas=-v"};
  NvJitLinkHandle h = nullptr;
  if (nv->Create(&h, 3, opts) != kNvJitLinkSuccess) {
    *error = "nvJitLinkCreate failed (" + nv->path + ")";
    return false;
  }
  auto log = [&](bool info) {
    size_t size = 0;
    (info ? nv->GetInfoLogSize : nv->GetErrorLogSize)(h, &size);
    std::string s(size, '\0');
    if (size) (info ? nv->GetInfoLog : nv->GetErrorLog)(h, s.data());
    return s;
  };
  bool ok = nv->AddData(h, kNvJitLinkInputPtx, ptx.data(), ptx.size(), k.name.c_str()) == kNvJitLinkSuccess &&
            nv->Complete(h) == kNvJitLinkSuccess;
  if (!ok) {
    *error = "nvJitLink could not build the cubin: " + log(false);
    nv->Destroy(&h);
    return false;
  }
  size_t size = 0;
  nv->GetLinkedCubinSize(h, &size);
  k.binary.resize(size);
  nv->GetLinkedCubin(h, k.binary.data());
  std::string info = log(true);
  nv->Destroy(&h);
  return readPtxasLog(info, k.facts, error);
}

// Object -> shared HSACO with lld in process (lld keeps global state: one link at a time). lld ends the process
// on a fatal error unless crash recovery is enabled, so it is, around the link only; after a fatal error lld's
// state is not safe to reuse, and later links in this process are refused instead.
bool linkHsaco(const std::string& object, CompiledKernel& k, std::string* error) {
  static std::mutex lldMutex;
  static bool lldBroken = false;
  std::lock_guard<std::mutex> lock(lldMutex);
  if (lldBroken) {
    *error = "an earlier in-process lld link failed fatally; lld cannot link again in this process (restart it)";
    return false;
  }
  TempFiles files;
  if (!files.create({"o", "hsaco"}, "lld", error) || !writeWhole(files[0], object, error)) return false;
  std::string lldLog;
  llvm::raw_string_ostream lldOut(lldLog);
  const char* args[] = {"ld.lld", "-shared", "--no-undefined", files[0].c_str(), "-o", files[1].c_str()};
  llvm::CrashRecoveryContext::Enable();
  lld::Result r = lld::lldMain(args, lldOut, lldOut, {{lld::Gnu, &lld::elf::link}});
  llvm::CrashRecoveryContext::Disable();
  lldBroken = !r.canRunAgain;
  std::ifstream f(files[1], std::ios::binary);
  k.binary.assign(std::istreambuf_iterator<char>(f), {});
  if (r.retCode != 0 || k.binary.empty()) {
    *error = "lld could not link the HSACO: " + lldLog;
    return false;
  }
  return true;
}

// gfx950 facts from the assembly's code-object metadata.
void readGfx950Facts(const std::string& asmText, StaticFacts& f) {
  f.registers = firstInt(asmText, R"(\.vgpr_count:\s+(\d+))", -1);
  f.agprs = firstInt(asmText, R"(\.agpr_count:\s+(\d+))", 0);
  f.sgprs = firstInt(asmText, R"(\.sgpr_count:\s+(\d+))", 0);
  f.scratchBytes = firstInt(asmText, R"(\.private_segment_fixed_size:\s+(\d+))", 0);
  f.sharedBytes = firstInt(asmText, R"(\.group_segment_fixed_size:\s+(\d+))", 0);
  // bf16 kernels' MFMA, else the FP8 one (a kernel multiplies one or the other).
  for (const char* mnemonic : {atoms::Mfma32x32x16Bf16::kIsa, atoms::Mfma32x32x16Fp8::kIsa}) {
    f.mmaMnemonic = mnemonic;
    f.mmaInstructions = countOccurrences(asmText, f.mmaMnemonic);
    if (f.mmaInstructions) break;
  }
}

// Budgets: no scratch / spills, registers within what one block needs, shared memory within the chip,
// and the matrix instruction present wherever the kernel used an MMA tile.
void checkBudgets(const TargetOptions& options, CompiledKernel& k) {
  StaticFacts& f = k.facts;
  auto fail = [&](const std::string& s) { f.violations.push_back(s); };
  if (options.arch() == Arch::sm_90a) {
    if (f.spillBytes) fail("register spills: " + std::to_string(f.spillBytes) + " bytes (budget 0)");
    if (f.scratchBytes) fail("stack frame: " + std::to_string(f.scratchBytes) + " bytes (budget 0)");
    const TargetLimits& limits = kSm90aLimits;
    if (f.registers > limits.registersPerThread)
      fail("registers per thread: " + std::to_string(f.registers) + " (limit " +
           std::to_string(limits.registersPerThread) + ")");
    if (f.registers * k.blockThreads > limits.registersPerBlock) fail("registers per block exceed the 64K register file");
    if (f.sharedBytes + k.dynamicSharedBytes > limits.sharedBytesPerBlock)
      fail("shared memory over " + std::to_string(limits.sharedBytesPerBlock / 1024) + " KB per block");
    // Serialized, each wgmma waits for the one before it, in every loop of the kernel: measured 7% slower on whole
    // tiles (bench/results/2026-12-01-h200-half-tiles).
    if (!f.wgmmaSerialized.empty()) fail("ptxas serialized the wgmma pipeline: " + f.wgmmaSerialized);
  } else {
    if (f.scratchBytes) fail("scratch: " + std::to_string(f.scratchBytes) + " bytes (budget 0)");
    if (f.registers < 0) fail("no .vgpr_count in the code-object metadata");
    const TargetLimits& limits = kGfx950Limits;
    if (f.registers + f.agprs > limits.registersPerThread)
      fail("VGPR + AGPR = " + std::to_string(f.registers + f.agprs) + " (limit " +
           std::to_string(limits.registersPerThread) + ")");
    if (f.sharedBytes + k.dynamicSharedBytes > limits.sharedBytesPerBlock)
      fail("LDS over " + std::to_string(limits.sharedBytesPerBlock / 1024) + " KB per work-group");
  }
  if (f.expectsMma && f.mmaInstructions == 0) fail("the kernel uses an MMA tile but no " + f.mmaMnemonic + " was emitted");
  if (!f.expectsMma && f.mmaInstructions) fail("unexpected " + f.mmaMnemonic + " in a kernel without an MMA tile");
}

}  // namespace

bool readPtxasLog(const std::string& log, StaticFacts& f, std::string* error) {
  f.registers = firstInt(log, R"(Used (\d+) registers)", -1);
  f.scratchBytes = firstInt(log, R"((\d+) bytes stack frame)", 0);
  f.spillBytes = firstInt(log, R"((\d+) bytes spill stores)", 0) + firstInt(log, R"((\d+) bytes spill loads)", 0);
  f.sharedBytes = firstInt(log, R"((\d+) bytes smem)", 0);
  std::smatch m;
  static const std::regex serialized(
      R"(Potential Performance Loss: wgmma\.mma_async instructions are serialized ([^\r\n]*))");
  f.wgmmaSerialized = std::regex_search(log, m, serialized) ? m[1].str() : std::string();
  if (size_t at = f.wgmmaSerialized.find(" in the function '"); at != std::string::npos) f.wgmmaSerialized.resize(at);
  if (f.registers < 0) {
    *error = "the ptxas log has no register count: " + log;
    return false;
  }
  return true;
}

std::string StaticFacts::json() const {
  std::ostringstream o;
  o << "{\"target\":" << quoted(target) << ",\"registers\":" << registers << ",\"agprs\":" << agprs << ",\"sgprs\":" << sgprs
    << ",\"scratch_bytes\":" << scratchBytes << ",\"spill_bytes\":" << spillBytes << ",\"shared_bytes\":" << sharedBytes
    << ",\"mma_instructions\":" << mmaInstructions << ",\"mma_mnemonic\":" << quoted(mmaMnemonic)
    << ",\"expects_mma\":" << (expectsMma ? "true" : "false");
  if (!wgmmaSerialized.empty()) o << ",\"wgmma_serialized\":" << quoted(wgmmaSerialized);
  o << ",\"violations\":[";
  for (size_t i = 0; i < violations.size(); ++i) o << (i ? "," : "") << quoted(violations[i]);
  o << "]}";
  return o.str();
}

std::string CompiledKernel::metadataJson() const {
  std::ostringstream o;
  o << "{\"symbol\":" << quoted(name) << ",\"block_threads\":" << blockThreads << ",\"shared_bytes\":" << dynamicSharedBytes
    << ",\"signature\":" << quoted(signature) << ",\"abi_version\":" << abi::kKernelAbiVersion
    << ",\"compile_ms\":{\"lower\":" << lowerMs << ",\"optimize\":" << optimizeMs << ",\"codegen\":" << codegenMs
    << ",\"link\":" << linkMs << "},\"static\":" << facts.json() << "}";
  return o.str();
}

std::string toolkitFingerprint() {
  std::string ignored;
  const NvJitLink* nv = nvJitLink(&ignored);
  return std::string("nvJitLink ") + (nv ? nv->version : "none") + "; ptxas " + ptxasVersion(findPtxas());
}

std::string compilerFingerprint(const std::string& target) {
  std::string out = std::string("megamoe ") + MEGAMOE_VERSION + "; LLVM " + MEGAMOE_LLVM_VERSION + "; generator " +
                    MEGAMOE_GENERATOR_HASH;
  if (target == "sm_90a") out += "; " + toolkitFingerprint();
  return out;
}

std::optional<CompiledKernel> compileKernel(mlir::ModuleOp source, const TargetOptions& options, std::string* error) {
  CompiledKernel k;
  k.facts.target = options.name();
  mlir::OwningOpRef<mlir::ModuleOp> module(source.clone());
  mlir::MLIRContext* ctx = module->getContext();

  // Kernel identity and launch facts from the target-neutral IR.
  module->walk([&](mlir::LLVM::LLVMFuncOp f) {
    if (!f->hasAttr("megamoe.kernel")) return;
    k.name = f.getName().str();
    if (auto t = f->getAttrOfType<mlir::IntegerAttr>("megamoe.block_threads")) k.blockThreads = t.getInt();
    if (auto s = f->getAttrOfType<mlir::IntegerAttr>("megamoe.dynamic_shared_bytes")) k.dynamicSharedBytes = s.getInt();
    if (auto sig = f->getAttrOfType<mlir::StringAttr>("megamoe.signature")) k.signature = sig.str();
  });
  module->walk([&](MmaTileOp) { k.facts.expectsMma = true; });
  if (k.name.empty()) {
    *error = "the module has no function marked megamoe.kernel";
    return std::nullopt;
  }

  auto t0 = Clock::now();
  std::string diagnostics;
  {
    mlir::ScopedDiagnosticHandler handler(ctx, [&](mlir::Diagnostic& d) {
      diagnostics += d.str() + "\n";
      return mlir::success();
    });
    mlir::PassManager pm(ctx);
    buildPipeline(pm, options);
    if (mlir::failed(pm.run(*module))) {
      *error = "lowering " + k.name + " for " + options.name() + " failed: " + diagnostics;
      return std::nullopt;
    }
  }
  mlir::gpu::GPUModuleOp gpuModule;
  module->walk([&](mlir::gpu::GPUModuleOp m) { gpuModule = m; });
  if (!gpuModule) {
    *error = "the kernel module has no gpu.module";
    return std::nullopt;
  }
  llvm::LLVMContext llvmContext;
  std::unique_ptr<llvm::Module> llvmModule = mlir::translateModuleToLLVMIR(gpuModule, llvmContext, k.name);
  if (!llvmModule) {
    *error = "translating " + k.name + " to LLVM IR failed";
    return std::nullopt;
  }
  k.lowerMs = msSince(t0);

  auto tm = makeTargetMachine(options, error);
  if (!tm) return std::nullopt;
  llvmModule->setTargetTriple(tm->getTargetTriple());
  llvmModule->setDataLayout(tm->createDataLayout());
  if (options.arch() == Arch::gfx950)
    llvmModule->addModuleFlag(llvm::Module::Error, "amdhsa_code_object_version", 500);
  auto t1 = Clock::now();
  optimize(*llvmModule, *tm, options.optLevel());
  k.optimizeMs = msSince(t1);

  auto t2 = Clock::now();
  if (options.arch() == Arch::sm_90a) {
    if (!emit(*llvmModule, *tm, llvm::CodeGenFileType::AssemblyFile, &k.assembly, error)) return std::nullopt;
    k.facts.mmaMnemonic = "wgmma.mma_async";
    k.facts.mmaInstructions = countOccurrences(k.assembly, "wgmma.mma_async.sync");
    k.codegenMs = msSince(t2);
    auto t3 = Clock::now();
    bool warpSpecialized = k.assembly.find("setmaxnreg") != std::string::npos;
    if (!(warpSpecialized ? assembleCubin : linkCubin)(k.assembly, k, error)) return std::nullopt;
    k.linkMs = msSince(t3);
  } else {
    std::string object;
    std::unique_ptr<llvm::Module> copy = llvm::CloneModule(*llvmModule);
    if (!emit(*llvmModule, *tm, llvm::CodeGenFileType::AssemblyFile, &k.assembly, error)) return std::nullopt;
    if (!emit(*copy, *tm, llvm::CodeGenFileType::ObjectFile, &object, error)) return std::nullopt;
    readGfx950Facts(k.assembly, k.facts);
    k.codegenMs = msSince(t2);
    auto t3 = Clock::now();
    if (!linkHsaco(object, k, error)) return std::nullopt;
    k.linkMs = msSince(t3);
  }
  checkBudgets(options, k);
  return k;
}

}  // namespace megamoe
