// megamoe-cache: offline kernel-cache generation for model shapes, and cache maintenance (list, verify, prune).
#include <unistd.h>
#include <algorithm>
#include <cerrno>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "compiler/abi/Models.h"
#include "compiler/cache/CacheReport.h"
#include "kernels/Jit.h"
#include "llvm/Config/llvm-config.h"
#include "megamoe/MoeLayer.h"
#include "megamoe/Version.h"

using namespace megamoe;

namespace {

const char* kHelp = R"(megamoe-cache: generate and maintain the megamoe kernel cache.

Kernels are compiled for each model shape and target and stored on disk, keyed by kernel name, specialisation
constants, target, options and compiler fingerprint (for sm_90a also the nvJitLink and ptxas versions: a toolkit
change rebuilds). The runtime then loads them without a compiler.

Usage:
  megamoe-cache generate [shape] [--ep 2,8] [--targets sm_90a,gfx950] [options]
  megamoe-cache list     [--json FILE]
  megamoe-cache verify
  megamoe-cache prune    [--keep-all-fingerprints]
  megamoe-cache presets          the model table: shape, EP, shared experts, and whether the layer runs it
  megamoe-cache kernels [--describe [--kernel NAME]]   the kernels and their constants; --describe: what each
                                 does, every constant's range and meaning, the rules between them, every argument's
                                 meaning and the grid rule (compiler/abi/Kernels.def)
  megamoe-cache --version

Shape (one of):
  --preset NAME                 a model of the model table (see `presets`), e.g. deepseek-v3; a model the layer
                                refuses at an --ep is bad input, named with the rule
  --hidden H --intermediate I --experts E --topk K
  --kernel NAME --spec A=1,B=2  one kernel with explicit constants (see `kernels`)

Options:
  --ep LIST          expert-parallel rank counts (default 8)
  --dtype bf16|fp8   with a shape: bf16 (default) builds the layer's kernels; fp8 the FP8 layer's kernels (e4m3
                     with 128 x 128 block scales, inference) and the FP8 grouped GEMMs at its L1 and L2 shapes
  --targets LIST     sm_90a, gfx950 (default both)
  --cache-dir DIR    cache root (default: $MEGAMOE_CACHE_DIR, else $XDG_CACHE_HOME/megamoe, else ~/.cache/megamoe)
  --json FILE        also write the results as JSON
  --emit-asm DIR     write the PTX / AMDGCN assembly of every kernel compiled in this run into DIR
  --force            recompile even when the cache has the kernel
  --quiet            no progress bar

Examples:
  megamoe-cache generate --preset deepseek-v3 --ep 2,8
  megamoe-cache generate --preset deepseek-v3 --ep 8 --dtype fp8 --targets sm_90a
  megamoe-cache generate --hidden 4096 --intermediate 1536 --experts 128 --topk 8 --ep 8 --targets sm_90a
  megamoe-cache generate --kernel gemm_nt --spec N=4096,K=7168 --targets gfx950
  MEGAMOE_CACHE_DIR=/tmp/cache megamoe-cache verify

Exit status: 0 on success, 1 when a kernel failed to compile or a static check failed, 2 on bad input.
)";

struct Usage : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::vector<std::string> splitList(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

int64_t parseInt(const std::string& flag, const std::string& v) {
  try {
    size_t used = 0;
    long long x = std::stoll(v, &used);
    if (used != v.size()) throw std::invalid_argument(v);
    return x;
  } catch (const std::exception&) {
    throw Usage(flag + " expects an integer, got '" + v + "'");
  }
}

struct Args {
  std::string command;
  std::map<std::string, std::string> flags;
  bool has(const std::string& f) const { return flags.count(f) != 0; }
  std::string get(const std::string& f, const std::string& def = "") const {
    auto it = flags.find(f);
    return it == flags.end() ? def : it->second;
  }
};

Args parseArgs(int argc, char** argv) {
  static const std::set<std::string> valued = {"--preset", "--hidden", "--intermediate", "--experts", "--topk", "--ep",
                                               "--targets", "--cache-dir", "--json", "--kernel", "--spec",
                                               "--emit-asm", "--dtype"};
  static const std::set<std::string> switches = {"--force", "--quiet", "--keep-all-fingerprints", "--help", "-h",
                                                 "--version", "--describe"};
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    if (valued.count(s)) {
      if (i + 1 >= argc) throw Usage(s + " needs a value");
      a.flags[s] = argv[++i];
    } else if (switches.count(s)) {
      a.flags[s] = "1";
    } else if (s.rfind("--", 0) == 0) {
      throw Usage("unknown option " + s + " (see --help)");
    } else if (a.command.empty()) {
      a.command = s;
    } else {
      throw Usage("unexpected argument '" + s + "'");
    }
  }
  return a;
}

// Metadata facts and the --json report come from compiler/cache/CacheReport.h (host-tested, LLVM-free).
using Row = cache::GenerateRow;

void progress(bool quiet, size_t done, size_t total, const std::string& what) {
  if (quiet) return;
  const int width = 30;
  int filled = total ? int(width * done / total) : width;
  std::fprintf(stderr, "\r[%s%s] %zu/%zu %-60.60s", std::string(filled, '#').c_str(),
               std::string(width - filled, '.').c_str(), done, total, what.c_str());
  if (done == total) std::fprintf(stderr, "\n");
  std::fflush(stderr);
}

// Writes `text` to `path` and closes it: a failure to open, write or flush (a full disk, /dev/full) is an error,
// not a success with a missing or truncated file.
void writeFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.close();
  if (!out) throw std::runtime_error("cannot write " + path + ": " + std::strerror(errno));
}

// Why the layer refuses model `m` at `ep` ranks (MoeLayer::validateModel), "" if it runs it; where only a feature
// is missing (the shape itself is served), with the explicit shape that builds its kernels anyway.
std::string presetRefusal(const abi::Model& m, int64_t ep) {
  std::string rule = MoeLayer::validateModel(m, int(ep));
  abi::Model shapeOnly = m;
  shapeOnly.features = 0;
  if (!rule.empty() && MoeLayer::validateModel(shapeOnly, int(ep)).empty())
    rule += "; its shape alone: --hidden " + std::to_string(m.hidden) + " --intermediate " +
            std::to_string(m.intermediate) + " --experts " + std::to_string(m.experts) + " --topk " +
            std::to_string(m.topk);
  return rule;
}

// `presets`: the model table, one row a model, with what the layer does at the model's EP.
int printPresets() {
  std::printf("%-19s %6s %6s %5s %5s %3s  %-8s %-30s %s\n", "preset", "H", "I", "E", "topk", "EP", "shared",
              "layer lacks", "at its EP");
  for (const abi::Model& m : abi::models()) {
    const std::string lacks = abi::lackedFeatureNames(m);
    const std::string shared =
        m.sharedExperts ? std::to_string(m.sharedExperts) + "x" + std::to_string(m.sharedIntermediate) : "-";
    const std::string rule = MoeLayer::validateModel(m, int(m.ep));
    std::printf("%-19s %6lld %6lld %5lld %5lld %3lld  %-8s %-30s %s\n", m.name, (long long)m.hidden,
                (long long)m.intermediate, (long long)m.experts, (long long)m.topk, (long long)m.ep, shared.c_str(),
                lacks.empty() ? "-" : lacks.c_str(), rule.empty() ? "runs" : ("refused: " + rule).c_str());
  }
  std::printf("\nshared experts run beside the layer (a dense MLP of the caller's); numbers from each model's "
              "config.json (compiler/abi/Models.cpp names the repository)\n");
  return 0;
}

int generate(const Args& a) {
  struct Work {
    kernels::KernelSpec spec;
    std::string ranks;
  };
  std::vector<Work> work;
  std::vector<int64_t> eps;
  for (const auto& e : splitList(a.get("--ep", "8"))) eps.push_back(parseInt("--ep", e));
  std::string shapeName;
  const std::string dtype = a.get("--dtype", "bf16");
  if (dtype != "bf16" && dtype != "fp8") throw Usage("--dtype must be bf16 or fp8 (got '" + dtype + "')");
  if (a.has("--kernel") && a.has("--dtype"))
    throw Usage("--dtype goes with a shape (--preset or --hidden ...); a --kernel names its own types");
  if (a.has("--kernel")) {
    const kernels::KernelInfo* info = kernels::find(a.get("--kernel"));
    if (!info) throw Usage("unknown kernel '" + a.get("--kernel") + "' (see `megamoe-cache kernels`)");
    kernels::KernelSpec spec{info->name, {}};
    std::map<std::string, int64_t> given;
    for (const auto& kv : splitList(a.get("--spec"))) {
      size_t eq = kv.find('=');
      if (eq == std::string::npos) throw Usage("--spec expects NAME=VALUE pairs, got '" + kv + "'");
      given[kv.substr(0, eq)] = parseInt("--spec " + kv.substr(0, eq), kv.substr(eq + 1));
    }
    for (const auto& name : info->constantNames()) {
      if (!given.count(name)) throw Usage(info->name + " needs --spec " + name + "=...");
      spec.constants.push_back({name, given[name]});
      given.erase(name);
    }
    if (!given.empty()) throw Usage(info->name + " has no constant '" + given.begin()->first + "'");
    work.push_back({spec, "-"});
    shapeName = spec.describe();
  } else {
    kernels::ModelShape shape;
    if (a.has("--preset")) {
      const kernels::ModelShape* p = kernels::findPreset(a.get("--preset"));
      if (!p) throw Usage("unknown preset '" + a.get("--preset") + "' (see `megamoe-cache presets`)");
      shape = *p;
      for (int64_t ep : eps)
        if (std::string rule = presetRefusal(*abi::findModel(p->name), ep); !rule.empty())
          throw Usage(shape.name + " at EP" + std::to_string(ep) + ": " + rule);
    } else if (a.has("--hidden")) {
      for (const char* f : {"--intermediate", "--experts", "--topk"})
        if (!a.has(f)) throw Usage(std::string("an explicit shape needs ") + f);
      shape = {"custom", parseInt("--hidden", a.get("--hidden")), parseInt("--intermediate", a.get("--intermediate")),
               parseInt("--experts", a.get("--experts")), parseInt("--topk", a.get("--topk"))};
    } else {
      throw Usage("generate needs --preset, an explicit shape, or --kernel (see --help)");
    }
    shapeName = shape.name + (dtype == "fp8" ? " (FP8)" : "");
    std::map<std::string, std::string> seen;  // describe() -> EP list it serves
    std::vector<kernels::KernelSpec> order;
    for (int64_t ep : eps) {
      std::string err = kernels::validateShape(shape, ep);
      if (!err.empty()) throw Usage(shape.name + " at EP" + std::to_string(ep) + ": " + err);
      std::vector<kernels::KernelSpec> specs;
      try {
        specs = dtype == "fp8" ? kernels::fp8Kernels(shape, ep) : kernels::layerKernels(shape, ep);
      } catch (const std::invalid_argument& e) {
        throw Usage(std::string(e.what()) + " at EP" + std::to_string(ep));
      }
      for (auto& s : specs) {
        std::string d = s.describe();
        if (!seen.count(d)) order.push_back(s);
        seen[d] += (seen[d].empty() ? "" : ",") + std::to_string(ep);
      }
    }
    for (auto& s : order) work.push_back({s, seen[s.describe()]});
  }

  std::vector<TargetOptions> targets;
  for (const auto& t : splitList(a.get("--targets", "sm_90a,gfx950"))) {
    std::string err;
    auto opt = TargetOptions::parse(t, &err);
    if (!opt) throw Usage(err);
    targets.push_back(*opt);
  }
  cache::KernelCache cache(a.has("--cache-dir") ? a.get("--cache-dir") : cache::KernelCache::defaultRoot());
  bool quiet = a.has("--quiet") || !isatty(2);
  if (a.has("--emit-asm")) {
    std::error_code ec;
    std::filesystem::create_directories(a.get("--emit-asm"), ec);
    if (ec)
      throw std::runtime_error("--emit-asm " + a.get("--emit-asm") + ": cannot create the directory (" + ec.message() +
                               ")");
  }

  auto t0 = std::chrono::steady_clock::now();
  std::vector<Row> rows;
  size_t total = work.size() * targets.size(), done = 0;
  int failures = 0;
  for (const auto& w : work) {
    for (const auto& t : targets) {
      Row r;
      r.kernel = w.spec.describe();
      r.target = t.name();
      r.ranks = w.ranks;
      progress(quiet, done, total, r.kernel + "@" + r.target);
      try {
        kernels::JitResult j = kernels::getKernel(w.spec, t, cache, a.has("--force"));
        r.hit = j.hit;
        r.ms = j.ms;
        std::string metadataProblem;
        const bool metadataOk = cache::readKernelFacts(j.entry.metadata, r.facts, metadataProblem);
        // The load path the runtime takes: lookup + read of the stored entry.
        const cache::KernelKey key = kernels::keyFor(w.spec, t);
        auto h0 = std::chrono::steady_clock::now();
        auto again = cache.lookup(key);
        r.loadMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - h0).count();
        bool ok = again && metadataOk && r.facts.staticChecksPassed();
        if (!ok) {
          ++failures;
          r.status = "FAIL";
          r.error = !again        ? "a lookup of " + key.describe() + " (digest " + key.digest() + ") in " + cache.root() +
                                        " found no entry after " + (j.hit ? "a hit" : "it was stored")
                    : !metadataOk ? "invalid entry: " + metadataProblem
                                  : "static checks: " + megamoe::json::render(r.facts.staticFacts);
        } else {
          r.status = "ok";
        }
        if (j.compiled && a.has("--emit-asm")) {
          std::string file = a.get("--emit-asm") + "/" + r.kernel + "." + r.target + (t.arch() == Arch::sm_90a ? ".ptx" : ".s");
          std::ofstream asmFile(file);
          asmFile << j.compiled->assembly;
          if (!asmFile.flush()) {
            ++failures;
            r.status = "FAIL";
            r.error = "--emit-asm: cannot write " + file;
          }
        }
      } catch (const std::exception& e) {
        ++failures;
        r.status = "FAIL";
        r.error = e.what();
      }
      rows.push_back(std::move(r));
      progress(quiet, ++done, total, rows.back().kernel + "@" + rows.back().target);
    }
  }
  double totalMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

  std::printf("megamoe kernel cache: %s, EP %s, %zu kernels x %zu targets\n", shapeName.c_str(),
              a.get("--ep", "8").c_str(), work.size(), targets.size());
  std::printf("cache: %s\nfingerprint: %s\n", cache.root().c_str(), compilerFingerprint().c_str());
  if (std::any_of(targets.begin(), targets.end(), [](const TargetOptions& t) { return t.name() == "sm_90a"; }))
    std::printf("sm_90a toolkit: %s\n", toolkitFingerprint().c_str());
  std::printf("\n");
  std::printf("%-34s %-7s %-5s %-5s %9s %8s %5s %5s %7s %8s %5s  %s\n", "kernel", "target", "EP", "cache", "build ms",
              "load ms", "regs", "agpr", "scratch", "shared", "mma", "status");
  double maxCold = 0;
  for (const auto& r : rows) {
    if (!r.hit && r.status == "ok") maxCold = std::max(maxCold, r.ms);
    std::printf("%-34s %-7s %-5s %-5s %9.1f %8.2f %5s %5s %7s %8s %5s  %s\n", r.kernel.c_str(), r.target.c_str(),
                r.ranks.c_str(), r.hit ? "hit" : "miss", r.hit ? 0.0 : r.ms, r.loadMs,
                r.facts.column("registers").c_str(), r.facts.column("agprs").c_str(),
                r.facts.column("scratch_bytes").c_str(), r.facts.sharedColumn().c_str(),
                r.facts.column("mma_instructions").c_str(), r.status.c_str());
    if (!r.error.empty()) std::printf("    error: %s\n", r.error.c_str());
  }
  std::printf("\n%zu entries, %d failed; total %.2f s; slowest cold JIT %.0f ms\n", rows.size(), failures,
              totalMs / 1000, maxCold);
  std::printf("gfx950 objects are checked statically only (no AMD GPU runs them here).\n");

  if (a.has("--json"))
    writeFile(a.get("--json"),
              cache::generateJson({shapeName, cache.root(), compilerFingerprint(), totalMs, failures}, rows));
  return failures ? 1 : 0;
}

int list(const Args& a, bool verify) {
  cache::KernelCache cache(a.has("--cache-dir") ? a.get("--cache-dir") : cache::KernelCache::defaultRoot());
  auto entries = verify ? cache.verify() : cache.list();
  std::printf("cache: %s (%zu entries)\n", cache.root().c_str(), entries.size());
  int bad = 0, badIndex = 0;
  for (const auto& e : entries) {
    std::printf("%-8s %-12.12s %-48s %10llu B  %s\n", e.valid ? "ok" : "INVALID", e.digest.c_str(),
                e.description.c_str(), (unsigned long long)e.bytes, e.problem.c_str());
    if (!e.indexProblem.empty()) std::printf("%-8s %s\n", "INDEX", e.indexProblem.c_str());  // verify only
    bad += !e.valid;
    badIndex += !e.indexProblem.empty();
  }
  if (verify) std::printf("%d invalid, %d with a bad index\n", bad, badIndex);
  if (a.has("--json")) writeFile(a.get("--json"), cache::entriesJson(entries));
  return verify && (bad || badIndex) ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Args a = parseArgs(argc, argv);
    if (a.has("--version")) {
      std::printf("megamoe-cache %s (LLVM %s)\ncompiler fingerprint: %s\nsm_90a toolkit: %s\n", MEGAMOE_VERSION_STRING,
                  LLVM_VERSION_STRING, compilerFingerprint().c_str(), toolkitFingerprint().c_str());
      return 0;
    }
    if (a.has("--help") || a.has("-h") || a.command.empty() || a.command == "help") {
      std::fputs(kHelp, stdout);
      return a.command.empty() && !a.has("--help") && !a.has("-h") ? 2 : 0;
    }
    if (a.command == "generate") return generate(a);
    if (a.command == "list") return list(a, false);
    if (a.command == "verify") return list(a, true);
    if (a.command == "prune") {
      cache::KernelCache cache(a.has("--cache-dir") ? a.get("--cache-dir") : cache::KernelCache::defaultRoot());
      std::vector<std::string> leftAlone;
      // Entries of this compiler for either target. Without a toolkit here, which sm_90a toolkit is current cannot
      // be told: sm_90a entries of this compiler are kept, whatever toolkit built them.
      const std::string common = compilerFingerprint(), sm90a = compilerFingerprint("sm_90a");
      const bool noToolkit = toolkitFingerprint() == "nvJitLink none; ptxas none";
      auto keep = [&](const std::string& f) {
        return a.has("--keep-all-fingerprints") || f == common || f == sm90a ||
               (noToolkit && f.rfind(common + "; nvJitLink ", 0) == 0);
      };
      int n = cache.prune(keep, &leftAlone);
      std::printf("pruned %d entries from %s\n", n, cache.root().c_str());
      for (const auto& why : leftAlone) std::printf("  %s\n", why.c_str());
      return 0;
    }
    if (a.command == "presets") return printPresets();
    if (a.command == "kernels") {
      if (a.has("--describe")) {
        const std::string only = a.get("--kernel");
        if (!only.empty() && !kernels::find(only))
          throw Usage("unknown kernel '" + only + "' (see `megamoe-cache kernels`)");
        for (const auto& k : kernels::registry())
          if (only.empty() || k.name == only) std::printf("%s\n", abi::describeDecl(k.decl()).c_str());
        return 0;
      }
      for (const auto& k : kernels::registry()) {
        std::string names;
        for (const auto& n : k.constantNames()) names += (names.empty() ? "" : ",") + n + "=...";
        std::printf("%-12s --spec %-20s %s\n", k.name.c_str(), names.c_str(), std::string(k.summary()).c_str());
      }
      return 0;
    }
    throw Usage("unknown command '" + a.command + "' (see --help)");
  } catch (const Usage& e) {
    std::fprintf(stderr, "megamoe-cache: %s\n", e.what());
    return 2;
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "megamoe-cache: %s\n", e.what());
    return 2;
  } catch (const cache::CacheError& e) {
    std::fprintf(stderr, "megamoe-cache: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "megamoe-cache: error: %s\n", e.what());
    return 1;
  }
}
