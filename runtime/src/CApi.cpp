// The C ABI (megamoe.h): converts handles and structs, and turns every exception into a status plus a thread-local
// message. No exception crosses this boundary.
#include "megamoe/megamoe.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "compiler/abi/DeviceAbi.h"
#include "compiler/abi/Models.h"
#include "megamoe/Error.h"
#include "megamoe/Log.h"
#include "megamoe/MoeLayer.h"
#include "megamoe/Runtime.h"

static_assert(MEGAMOE_STAGE_COUNT == int(megamoe::Stage::kCount), "megamoe.h stages mirror MoeLayer.h");
static_assert(MEGAMOE_BACKWARD_STAGE_COUNT == int(megamoe::BackwardStage::kCount) &&
                  MEGAMOE_BACKWARD_STAGE_DGRAD_COMBINE == int(megamoe::BackwardStage::kDgradCombine),
              "megamoe.h backward stages mirror MoeLayer.h");
static_assert(MEGAMOE_LEG_FUSED == int(megamoe::Leg::kFused) && MEGAMOE_LEG_COMM_ONLY == int(megamoe::Leg::kCommOnly) &&
                  MEGAMOE_LEG_GEMM_ONLY == int(megamoe::Leg::kGemmOnly),
              "megamoe.h legs mirror MoeLayer.h");
static_assert(MEGAMOE_LOG_OFF == int(megamoe::LogLevel::kOff) && MEGAMOE_LOG_ERROR == int(megamoe::LogLevel::kError) &&
                  MEGAMOE_LOG_WARN == int(megamoe::LogLevel::kWarn) &&
                  MEGAMOE_LOG_INFO == int(megamoe::LogLevel::kInfo) &&
                  MEGAMOE_LOG_DEBUG == int(megamoe::LogLevel::kDebug),
              "megamoe.h's MEGAMOE_LOG_* are LogLevel's values");
static_assert(MEGAMOE_MAX_RANKS == megamoe::abi::kMaxRanks, "megamoe.h's rank bound mirrors DeviceAbi.h");
static_assert(MEGAMOE_MODEL_SHARED_EXPERTS == megamoe::abi::kSharedExperts &&
                  MEGAMOE_MODEL_EXPERT_BIASES == megamoe::abi::kExpertBiases &&
                  MEGAMOE_MODEL_SWIGLU_OAI == megamoe::abi::kSwigluOai &&
                  MEGAMOE_MODEL_WEIGHT_ON_INPUT == megamoe::abi::kWeightOnInput,
              "megamoe.h's MEGAMOE_MODEL_* are compiler/abi/Models.h's ModelFeature bits");

// The first published megamoe_layer_config (0.1.0) ends with sm_budget; its fields never move, later ones follow it.
constexpr size_t kLayerConfigFirstSize = offsetof(megamoe_layer_config, sm_budget) + sizeof(int64_t);
static_assert(offsetof(megamoe_layer_config, struct_size) == 0 &&
                  offsetof(megamoe_layer_config, hidden) == (sizeof(size_t) + 7) / 8 * 8 &&
                  kLayerConfigFirstSize == offsetof(megamoe_layer_config, hidden) + 10 * sizeof(int64_t),
              "megamoe_layer_config's published fields moved: that breaks every binary built against 0.1.0");
// A struct_size above this is garbage, not a newer header (and reading that far could fault).
constexpr size_t kStructSizeLimit = 4096;

struct megamoe_kernel {
  std::shared_ptr<const megamoe::Kernel> kernel;
};

struct megamoe_runtime {
  // Shared with the layers created from it, which launch through it: destroying the handle drops this reference.
  std::shared_ptr<megamoe::Runtime> runtime;
  std::mutex mutex;
  std::vector<std::unique_ptr<megamoe_kernel>> kernels;
};

struct megamoe_heap {
  std::unique_ptr<megamoe::SymmetricHeap> heap;
};

struct megamoe_workspace {
  std::shared_ptr<megamoe::Runtime> runtime;  // outlives `workspace` (declared first, destroyed last)
  std::shared_ptr<megamoe::Workspace> workspace;
};

struct megamoe_workspace_pending {
  std::shared_ptr<megamoe::Runtime> runtime;  // outlives `pending`
  std::unique_ptr<megamoe::Workspace::Pending> pending;
};

struct megamoe_layer {
  std::shared_ptr<megamoe::Runtime> runtime;  // outlives `layer` (declared first, destroyed last)
  std::unique_ptr<megamoe::MoeLayer> layer;   // keeps its workspace alive
};

namespace {

thread_local std::string lastError;

// Runs `body`, mapping exceptions to status codes.
template <typename Body>
int guarded(Body&& body) {
  lastError.clear();
  try {
    body();
    return MEGAMOE_OK;
  } catch (const megamoe::Error& e) {
    lastError = e.what();
    return static_cast<int>(e.code());
  } catch (const megamoe::cache::CacheError& e) {
    lastError = std::string("kernel cache: ") + e.what();
    return MEGAMOE_ERROR_INTERNAL;
  } catch (const std::bad_alloc&) {
    lastError = "out of host memory";
    return MEGAMOE_ERROR_INTERNAL;
  } catch (const std::exception& e) {
    lastError = e.what();
    return MEGAMOE_ERROR_INTERNAL;
  } catch (...) {
    lastError = "unknown exception";
    return MEGAMOE_ERROR_INTERNAL;
  }
}

template <typename T>
void requireArg(const T* p, const char* what) {
  if (!p) throw megamoe::Error(megamoe::ErrorCode::kInvalidArgument, std::string(what) + " must not be NULL");
}

std::string orEmpty(const char* s) { return s ? s : ""; }

[[noreturn]] void invalid(const std::string& message) {
  throw megamoe::Error(megamoe::ErrorCode::kInvalidArgument, message);
}

// A count of ranks, checked before any array of that many slots is read or written.
void requireRankCount(size_t nranks) {
  if (nranks < 1 || nranks > size_t(MEGAMOE_MAX_RANKS))
    invalid("nranks=" + std::to_string(nranks) + " must be 1.." + std::to_string(MEGAMOE_MAX_RANKS) + " (one node)");
}

// The caller's config as this library's struct: the fields its struct_size covers, 0 for the others (see megamoe.h,
// "Growing structs").
megamoe_layer_config readLayerConfig(const megamoe_layer_config* config) {
  requireArg(config, "config");
  const size_t size = config->struct_size;
  // Every field is an int64_t after struct_size: a size between two fields' ends is no header's.
  if (size < kLayerConfigFirstSize || size > kStructSizeLimit || (size - kLayerConfigFirstSize) % sizeof(int64_t))
    invalid("config->struct_size=" + std::to_string(size) + " is not a megamoe_layer_config size: set it to " +
            "sizeof(megamoe_layer_config) (" + std::to_string(sizeof(megamoe_layer_config)) +
            " bytes in this library's megamoe.h; a size must be at least " + std::to_string(kLayerConfigFirstSize) +
            " and end on a field boundary, a multiple of 8 bytes)");
  const auto* bytes = reinterpret_cast<const unsigned char*>(config);
  for (size_t i = sizeof(megamoe_layer_config); i < size; ++i)
    if (bytes[i])
      invalid("config->struct_size=" + std::to_string(size) + ": byte " + std::to_string(i) +
              " is not zero, and this libmegamoe " MEGAMOE_VERSION_STRING " knows only the first " +
              std::to_string(sizeof(megamoe_layer_config)) + " bytes (a field from a newer megamoe.h it cannot honour)");
  megamoe_layer_config out{};
  std::memcpy(&out, config, std::min(size, sizeof out));
  return out;
}

// The layer configuration for `ranks` ranks, checked in MoeLayer::validate's order (ranks, each field, their
// products, then dtype: the C value, which MoeLayerConfig cannot hold).
megamoe::MoeLayerConfig toConfig(const megamoe_layer_config* config, int ranks) {
  const megamoe_layer_config known = readLayerConfig(config);
  const megamoe_layer_config* c = &known;
  megamoe::MoeLayerConfig out;
  out.hidden = c->hidden;
  out.intermediate = c->intermediate;
  out.experts = c->experts;
  out.topk = c->topk;
  out.maxTokens = c->max_tokens;
  out.swigluClampMilli = c->swiglu_clamp_milli;
  out.training = c->training != 0;
  out.dedupTokens = c->dedup_tokens != 0;
  out.smBudget = c->sm_budget;
  out.receiveCapacity = c->receive_capacity;
  out.topkIdxInt64 = c->topk_idx_bits == 64;
  out.dropOverflow = c->drop_overflow != 0;
  // The fields first, as bf16 (a C value that no DType holds is named after them), then the dtype and its rules.
  out.dtype = megamoe::DType::kBf16;
  if (auto e = megamoe::MoeLayer::validate(out, ranks); !e.empty()) invalid("MoE layer: " + e);
  if (c->topk_idx_bits != 0 && c->topk_idx_bits != 32 && c->topk_idx_bits != 64)
    invalid("topk_idx_bits=" + std::to_string(c->topk_idx_bits) + " must be 32 (or 0) or 64: topk_idx is int32 or int64");
  if (c->dtype != MEGAMOE_DTYPE_BF16 && c->dtype != MEGAMOE_DTYPE_FP8_E4M3)
    invalid("dtype=" + std::to_string(c->dtype) + " must be MEGAMOE_DTYPE_BF16 (0) or MEGAMOE_DTYPE_FP8_E4M3 (1)");
  out.dtype = static_cast<megamoe::DType>(c->dtype);
  if (auto e = megamoe::MoeLayer::validate(out, ranks); !e.empty()) invalid("MoE layer: " + e);
  return out;
}

megamoe::Leg toLeg(int leg, const char* what) {
  if (leg < MEGAMOE_LEG_FUSED || leg > MEGAMOE_LEG_GEMM_ONLY)
    throw megamoe::Error(megamoe::ErrorCode::kInvalidArgument,
                         std::string(what) + "=" + std::to_string(leg) + " must be one of MEGAMOE_LEG_*");
  return static_cast<megamoe::Leg>(leg);
}

std::vector<megamoe::RegionSpec> toRegions(const megamoe_region_spec* regions, size_t count) {
  if (count) requireArg(regions, "regions");
  std::vector<megamoe::RegionSpec> out;
  for (size_t i = 0; i < count; ++i) {
    requireArg(regions[i].name, "region name");
    out.push_back({regions[i].name, regions[i].size, regions[i].alignment});
  }
  return out;
}

}  // namespace

extern "C" {

const char* megamoe_version(void) { return MEGAMOE_VERSION_STRING; }

const char* megamoe_last_error(void) { return lastError.c_str(); }

const char* megamoe_status_name(int status) {
  if (status < 0 || status > MEGAMOE_ERROR_STALE_KERNEL) return "unknown status";
  return megamoe::errorCodeName(static_cast<megamoe::ErrorCode>(status));
}

int megamoe_set_log_level(int level) {
  return guarded([&] {
    if (level < MEGAMOE_LOG_OFF || level > MEGAMOE_LOG_DEBUG)
      invalid("level=" + std::to_string(level) + " must be MEGAMOE_LOG_OFF (0) .. MEGAMOE_LOG_DEBUG (4)");
    megamoe::setLogLevel(static_cast<megamoe::LogLevel>(level));
  });
}

int megamoe_get_log_level(int* level) {
  return guarded([&] {
    requireArg(level, "level");
    *level = static_cast<int>(megamoe::logLevel());
  });
}

int megamoe_set_log_callback(megamoe_log_callback fn, void* user) {
  return guarded([&] {
    if (!fn) {
      megamoe::setLogSink(nullptr);
      return;
    }
    megamoe::setLogSink([fn, user](megamoe::LogLevel level, const std::string& message) {
      fn(static_cast<int>(level), message.c_str(), user);
    });
  });
}

int megamoe_runtime_create(const char* backend, int device, megamoe_runtime** out) {
  return guarded([&] {
    requireArg(out, "out");
    *out = nullptr;
    auto handle = std::make_unique<megamoe_runtime>();
    handle->runtime = std::make_shared<megamoe::Runtime>(orEmpty(backend), device, megamoe::parseEnv());
    *out = handle.release();
  });
}

int megamoe_runtime_destroy(megamoe_runtime* runtime) {
  return guarded([&] { delete runtime; });
}

int megamoe_device_count(const char* backend, int* count) {
  return guarded([&] {
    requireArg(count, "count");
    *count = 0;
    const std::string name = orEmpty(backend);
    if (name != "cuda" && name != "hip")
      throw megamoe::Error(megamoe::ErrorCode::kInvalidArgument, "backend must be \"cuda\" or \"hip\"");
    *count = megamoe::openBackend(name == "cuda" ? megamoe::BackendKind::kCuda : megamoe::BackendKind::kHip)
                 ->deviceCount();
  });
}

int megamoe_kernel_load(megamoe_runtime* runtime, const megamoe_kernel_key* key, const char* generate_hint,
                        megamoe_kernel** out) {
  return guarded([&] {
    requireArg(out, "out");
    *out = nullptr;
    requireArg(runtime, "runtime");
    requireArg(key, "key");
    requireArg(key->kernel, "key->kernel");
    if (key->spec_count) requireArg(key->spec, "key->spec");
    megamoe::cache::KernelKey k;
    k.kernel = key->kernel;
    for (size_t i = 0; i < key->spec_count; ++i) {
      requireArg(key->spec[i].name, "spec name");
      k.spec.emplace_back(key->spec[i].name, key->spec[i].value);
    }
    k.target = orEmpty(key->target);
    // NULL: the options megamoe-cache generates the target with, so that no caller keeps a copy of them.
    k.options = key->options ? std::string(key->options)
                             : megamoe::defaultTargetOptions(k.target.empty() ? runtime->runtime->device()->target()
                                                                              : k.target);
    k.fingerprint = orEmpty(key->fingerprint);
    auto kernel = std::make_unique<megamoe_kernel>();
    kernel->kernel = runtime->runtime->loadKernel(k, orEmpty(generate_hint));
    std::lock_guard<std::mutex> lock(runtime->mutex);
    runtime->kernels.push_back(std::move(kernel));
    *out = runtime->kernels.back().get();
  });
}

int megamoe_kernel_info(const megamoe_kernel* kernel, int* block_threads, int* shared_bytes) {
  return guarded([&] {
    requireArg(kernel, "kernel");
    if (block_threads) *block_threads = kernel->kernel->metadata().blockThreads;
    if (shared_bytes) *shared_bytes = kernel->kernel->metadata().sharedBytes;
  });
}

static_assert(MEGAMOE_ARG_PTR == int(megamoe::abi::ArgKind::kPtr) &&
                  MEGAMOE_ARG_I32 == int(megamoe::abi::ArgKind::kI32) &&
                  MEGAMOE_ARG_I64 == int(megamoe::abi::ArgKind::kI64) &&
                  MEGAMOE_ARG_CONTEXT == int(megamoe::abi::ArgKind::kContext) &&
                  MEGAMOE_ARG_TENSOR_MAP == int(megamoe::abi::ArgKind::kTensorMap),
              "megamoe.h's MEGAMOE_ARG_* are abi::ArgKind's values");

int megamoe_kernel_arg_count(const megamoe_kernel* kernel, size_t* count) {
  return guarded([&] {
    requireArg(kernel, "kernel");
    requireArg(count, "count");
    const megamoe::abi::KernelDecl* decl = kernel->kernel->decl();
    *count = decl ? decl->args.size() : 0;
  });
}

int megamoe_kernel_arg(const megamoe_kernel* kernel, size_t index, const char** name, int* kind, const char** elem) {
  return guarded([&] {
    requireArg(kernel, "kernel");
    const megamoe::abi::KernelDecl* decl = kernel->kernel->decl();
    if (!decl || index >= decl->args.size())
      invalid("index=" + std::to_string(index) + " must be below the kernel's " +
              std::to_string(decl ? decl->args.size() : 0) + " declared arguments");
    const megamoe::abi::ArgDecl& a = decl->args[index];
    if (name) *name = a.name.data();  // the declarations' names are NUL-terminated literals
    if (kind) *kind = int(a.kind);
    if (elem) *elem = megamoe::abi::elemName(a.elem);
  });
}

int megamoe_split_scratch_bytes(int64_t grid, uint64_t* bytes, uint64_t* zeroed_bytes) {
  return guarded([&] {
    if (grid < 1 || grid > 1024) invalid("grid=" + std::to_string(grid) + " must be 1..1024");
    if (bytes) *bytes = uint64_t(megamoe::abi::splitScratchBytes(grid));
    if (zeroed_bytes) *zeroed_bytes = uint64_t(megamoe::abi::splitCounterBytes(grid));
  });
}

namespace {
// The table's rows as megamoe_model, their strings (feature names, the refusal at the model's EP) made once.
const std::vector<megamoe_model>& modelRows() {
  static const struct Rows {
    std::vector<std::string> lacks, refusals;  // own the rows' strings (never resized after the rows point in)
    std::vector<megamoe_model> rows;
    Rows() {
      const auto& table = megamoe::abi::models();
      for (const megamoe::abi::Model& m : table) {
        lacks.push_back(megamoe::abi::lackedFeatureNames(m));
        refusals.push_back(megamoe::MoeLayer::validateModel(m, int(m.ep)));
      }
      for (size_t i = 0; i < table.size(); ++i) {
        const megamoe::abi::Model& m = table[i];
        rows.push_back({sizeof(megamoe_model), m.name, m.source, m.hidden, m.intermediate, m.experts, m.topk, m.ep,
                        m.sharedExperts, m.sharedIntermediate, m.lacks(), lacks[i].c_str(), refusals[i].c_str()});
      }
    }
  } table;
  return table.rows;
}
}  // namespace

int megamoe_model_count(size_t* count) {
  return guarded([&] {
    requireArg(count, "count");
    *count = modelRows().size();
  });
}

int megamoe_model_get(size_t index, megamoe_model* out) {
  return guarded([&] {
    requireArg(out, "out");
    const size_t size = out->struct_size;
    if (size < sizeof(megamoe_model) || size > kStructSizeLimit)
      invalid("out->struct_size=" + std::to_string(size) + " is not a megamoe_model size: set it to " +
              "sizeof(megamoe_model) (" + std::to_string(sizeof(megamoe_model)) + " bytes in this library's megamoe.h)");
    const std::vector<megamoe_model>& rows = modelRows();
    if (index >= rows.size())
      invalid("index=" + std::to_string(index) + " must be below megamoe_model_count (" + std::to_string(rows.size()) +
              ")");
    // The fields this library knows; a newer header's later ones are left as the caller set them.
    std::memcpy(reinterpret_cast<unsigned char*>(out) + sizeof(size_t),
                reinterpret_cast<const unsigned char*>(&rows[index]) + sizeof(size_t),
                sizeof(megamoe_model) - sizeof(size_t));
  });
}

int megamoe_launch(megamoe_runtime* runtime, const megamoe_kernel* kernel, const megamoe_launch_dims* dims,
                   void* stream, void** params, const megamoe_heap* heap) {
  return guarded([&] {
    requireArg(runtime, "runtime");
    requireArg(kernel, "kernel");
    requireArg(dims, "dims");
    requireArg(params, "params");
    megamoe::LaunchDims d;
    d.grid = {dims->grid[0], dims->grid[1], dims->grid[2]};
    d.block = {dims->block[0], dims->block[1], dims->block[2]};
    d.cluster = {dims->cluster[0], dims->cluster[1], dims->cluster[2]};
    d.sharedBytes = dims->shared_bytes;
    runtime->runtime->launch(*kernel->kernel, d, stream, params, heap ? heap->heap.get() : nullptr);
  });
}

int megamoe_kernel_tensor_map(const megamoe_kernel* kernel, const char* arg, uint64_t base, int64_t rows,
                              int64_t cols, void* out128) {
  return guarded([&] {
    requireArg(kernel, "kernel");
    requireArg(arg, "arg");
    requireArg(out128, "out128");
    const megamoe::TensorMapBytes map = megamoe::encodeTensorMap(*kernel->kernel, arg, base, rows, cols);
    std::memcpy(out128, map.data(), map.size());
  });
}

int megamoe_tensor_map_bf16(megamoe_runtime* runtime, uint64_t base, int rank, const uint64_t* dims,
                            const uint64_t* strides, const uint32_t* box, void* out128) {
  return guarded([&] {
    requireArg(runtime, "runtime");
    requireArg(dims, "dims");
    requireArg(box, "box");
    requireArg(out128, "out128");
    if (rank > 1) requireArg(strides, "strides");
    auto map = runtime->runtime->device()->encodeTensorMap(megamoe::Device::MapElem::kBf16, base, rank, dims,
                                                           strides, box);
    std::memcpy(out128, map.data(), map.size());
  });
}

int megamoe_heap_create(megamoe_runtime* runtime, const megamoe_region_spec* regions, size_t region_count, int rank,
                        int nranks, const char* rendezvous_path, megamoe_heap** out) {
  return guarded([&] {
    requireArg(out, "out");
    *out = nullptr;
    requireArg(runtime, "runtime");
    if (nranks > 1) requireArg(rendezvous_path, "rendezvous_path");
    auto heap = std::make_unique<megamoe_heap>();
    heap->heap = runtime->runtime->createHeap(toRegions(regions, region_count), rank, nranks, orEmpty(rendezvous_path));
    *out = heap.release();
  });
}

int megamoe_heap_create_local(megamoe_runtime* const* runtimes, size_t nranks, const megamoe_region_spec* regions,
                              size_t region_count, megamoe_heap** out_heaps) {
  return guarded([&] {
    requireArg(out_heaps, "out_heaps");
    requireArg(runtimes, "runtimes");
    requireRankCount(nranks);
    std::vector<std::shared_ptr<megamoe::Device>> devices;
    for (size_t i = 0; i < nranks; ++i) {
      requireArg(runtimes[i], ("runtimes[" + std::to_string(i) + "]").c_str());
      devices.push_back(runtimes[i]->runtime->device());
    }
    auto heaps = megamoe::SymmetricHeap::createSingleProcess(devices, toRegions(regions, region_count),
                                                             runtimes[0]->runtime->env());
    std::vector<std::unique_ptr<megamoe_heap>> handles;
    for (auto& h : heaps) {
      handles.push_back(std::make_unique<megamoe_heap>());
      handles.back()->heap = std::move(h);
    }
    for (size_t i = 0; i < nranks; ++i) out_heaps[i] = handles[i].release();
  });
}

int megamoe_heap_destroy(megamoe_heap* heap) {
  return guarded([&] { delete heap; });
}

int megamoe_heap_region(const megamoe_heap* heap, const char* name, uint64_t* device_address) {
  return guarded([&] {
    requireArg(heap, "heap");
    requireArg(name, "name");
    requireArg(device_address, "device_address");
    *device_address = heap->heap->regionAddress(name);
  });
}

int megamoe_heap_context(const megamoe_heap* heap, uint64_t* device_address) {
  return guarded([&] {
    requireArg(heap, "heap");
    requireArg(device_address, "device_address");
    *device_address = heap->heap->contextAddress();
  });
}

int megamoe_check_errors(megamoe_heap* heap, void* stream) {
  return guarded([&] {
    requireArg(heap, "heap");
    heap->heap->checkErrors(stream);
  });
}

namespace {
// The runtimes of a one-process group, each checked: nranks first, then every handle.
std::vector<megamoe::Runtime*> runtimesOf(megamoe_runtime* const* runtimes, size_t nranks) {
  requireArg(runtimes, "runtimes");
  requireRankCount(nranks);
  std::vector<megamoe::Runtime*> rts;
  for (size_t i = 0; i < nranks; ++i) {
    requireArg(runtimes[i], ("runtimes[" + std::to_string(i) + "]").c_str());
    rts.push_back(runtimes[i]->runtime.get());
  }
  return rts;
}
// A one-process-per-GPU member's arguments, in a fixed order: the configuration and the ranks, the rank, the path.
megamoe::MoeLayerConfig memberConfig(const megamoe_layer_config* config, int rank, int nranks, const char* path) {
  const megamoe::MoeLayerConfig checked = toConfig(config, nranks);
  if (rank < 0 || rank >= nranks)
    invalid("rank=" + std::to_string(rank) + " must be in [0, nranks=" + std::to_string(nranks) + ")");
  if (nranks > 1) requireArg(path, "rendezvous_path");
  return checked;
}
}  // namespace

int megamoe_layer_create(megamoe_runtime* runtime, const megamoe_layer_config* config, int rank, int nranks,
                         const char* rendezvous_path, megamoe_layer** out) {
  return guarded([&] {
    requireArg(out, "out");
    *out = nullptr;
    requireArg(runtime, "runtime");
    const megamoe::MoeLayerConfig checked = memberConfig(config, rank, nranks, rendezvous_path);
    auto handle = std::make_unique<megamoe_layer>();
    handle->runtime = runtime->runtime;
    handle->layer = megamoe::MoeLayer::create(*runtime->runtime, checked, rank, nranks, orEmpty(rendezvous_path));
    *out = handle.release();
  });
}

int megamoe_layer_create_local(megamoe_runtime* const* runtimes, size_t nranks, const megamoe_layer_config* config,
                               megamoe_layer** out_layers) {
  return guarded([&] {
    requireArg(out_layers, "out_layers");
    const std::vector<megamoe::Runtime*> rts = runtimesOf(runtimes, nranks);
    auto layers = megamoe::MoeLayer::createLocal(rts, toConfig(config, int(nranks)));
    std::vector<std::unique_ptr<megamoe_layer>> handles;
    for (size_t i = 0; i < nranks; ++i) {
      handles.push_back(std::make_unique<megamoe_layer>());
      handles.back()->runtime = runtimes[i]->runtime;  // layer i launches through runtimes[i]
      handles.back()->layer = std::move(layers[i]);
    }
    for (size_t i = 0; i < nranks; ++i) out_layers[i] = handles[i].release();
  });
}

int megamoe_workspace_bytes(const megamoe_layer_config* config, size_t nranks, uint64_t* heap_bytes,
                            uint64_t* buffer_bytes) {
  return guarded([&] {
    requireRankCount(nranks);
    const megamoe::WorkspaceBytes b = megamoe::Workspace::bytesFor(toConfig(config, int(nranks)), int(nranks));
    if (heap_bytes) *heap_bytes = b.heap;
    if (buffer_bytes) *buffer_bytes = b.buffers;
  });
}

int megamoe_layer_saved_bytes(const megamoe_layer_config* config, size_t nranks, uint64_t* bytes) {
  return guarded([&] {
    requireArg(bytes, "bytes");
    requireRankCount(nranks);
    *bytes = megamoe::MoeLayer::savedBytes(toConfig(config, int(nranks)), int(nranks));
  });
}

int megamoe_workspace_create(megamoe_runtime* runtime, const megamoe_layer_config* config, int rank, int nranks,
                             const char* rendezvous_path, megamoe_workspace** out) {
  return guarded([&] {
    requireArg(out, "out");
    *out = nullptr;
    requireArg(runtime, "runtime");
    const megamoe::MoeLayerConfig checked = memberConfig(config, rank, nranks, rendezvous_path);
    auto handle = std::make_unique<megamoe_workspace>();
    handle->runtime = runtime->runtime;
    handle->workspace = megamoe::Workspace::create(*runtime->runtime, checked, rank, nranks, orEmpty(rendezvous_path));
    *out = handle.release();
  });
}

int megamoe_workspace_create_local(megamoe_runtime* const* runtimes, size_t nranks, const megamoe_layer_config* config,
                                   megamoe_workspace** out_workspaces) {
  return guarded([&] {
    requireArg(out_workspaces, "out_workspaces");
    const std::vector<megamoe::Runtime*> rts = runtimesOf(runtimes, nranks);
    auto workspaces = megamoe::Workspace::createLocal(rts, toConfig(config, int(nranks)));
    std::vector<std::unique_ptr<megamoe_workspace>> handles;
    for (size_t i = 0; i < nranks; ++i) {
      handles.push_back(std::make_unique<megamoe_workspace>());
      handles.back()->runtime = runtimes[i]->runtime;
      handles.back()->workspace = std::move(workspaces[i]);
    }
    for (size_t i = 0; i < nranks; ++i) out_workspaces[i] = handles[i].release();
  });
}

int megamoe_workspace_destroy(megamoe_workspace* workspace) {
  return guarded([&] { delete workspace; });
}

int megamoe_workspace_dropped_picks(megamoe_workspace* workspace, void* stream, uint64_t* picks) {
  return guarded([&] {
    requireArg(workspace, "workspace");
    requireArg(picks, "picks");
    *picks = workspace->workspace->droppedPicks(static_cast<megamoe::StreamHandle>(stream));
  });
}

int megamoe_layer_dropped_picks(megamoe_layer* layer, void* stream, uint64_t* picks) {
  return guarded([&] {
    requireArg(layer, "layer");
    requireArg(picks, "picks");
    *picks = layer->layer->droppedPicks(static_cast<megamoe::StreamHandle>(stream));
  });
}

size_t megamoe_workspace_handle_size(void) { return megamoe::Workspace::handleBytes(); }

int megamoe_workspace_prepare(megamoe_runtime* runtime, const megamoe_layer_config* config, int rank, int nranks,
                              megamoe_workspace_pending** out) {
  return guarded([&] {
    requireArg(out, "out");
    *out = nullptr;
    requireArg(runtime, "runtime");
    const megamoe::MoeLayerConfig checked = memberConfig(config, rank, nranks, "");
    auto handle = std::make_unique<megamoe_workspace_pending>();
    handle->runtime = runtime->runtime;
    handle->pending = megamoe::Workspace::prepare(*runtime->runtime, checked, rank, nranks);
    *out = handle.release();
  });
}

int megamoe_workspace_export(const megamoe_workspace_pending* pending, void* handle, size_t size) {
  return guarded([&] {
    requireArg(pending, "pending");
    requireArg(handle, "handle");
    const std::vector<uint8_t>& bytes = pending->pending->handle();
    if (size != bytes.size())
      invalid("size=" + std::to_string(size) + " must be megamoe_workspace_handle_size()=" +
              std::to_string(bytes.size()));
    std::memcpy(handle, bytes.data(), bytes.size());
  });
}

int megamoe_workspace_join(megamoe_workspace_pending* pending, const void* handles, size_t size,
                           megamoe_workspace** out) {
  return guarded([&] {
    requireArg(out, "out");
    *out = nullptr;
    requireArg(pending, "pending");
    requireArg(handles, "handles");
    auto handle = std::make_unique<megamoe_workspace>();
    handle->runtime = pending->runtime;
    handle->workspace = megamoe::Workspace::join(*pending->pending, static_cast<const uint8_t*>(handles), size);
    *out = handle.release();
  });
}

int megamoe_workspace_pending_destroy(megamoe_workspace_pending* pending) {
  return guarded([&] { delete pending; });
}

int megamoe_workspace_group_digest(const megamoe_workspace* workspace, uint64_t* digest) {
  return guarded([&] {
    requireArg(workspace, "workspace");
    requireArg(digest, "digest");
    *digest = workspace->workspace->groupDigest();
  });
}

int megamoe_layer_create_on(megamoe_workspace* workspace, const megamoe_layer_config* config, megamoe_layer** out) {
  return guarded([&] {
    requireArg(out, "out");
    *out = nullptr;
    requireArg(workspace, "workspace");
    auto handle = std::make_unique<megamoe_layer>();
    handle->runtime = workspace->runtime;
    handle->layer = megamoe::MoeLayer::create(workspace->workspace,
                                              toConfig(config, workspace->workspace->ranks()));
    *out = handle.release();
  });
}

int megamoe_layer_destroy(megamoe_layer* layer) {
  return guarded([&] { delete layer; });
}

int megamoe_layer_forward(megamoe_layer* layer, uint64_t x, int64_t tokens, uint64_t topk_idx, uint64_t topk_weights,
                          uint64_t w1, uint64_t w2, uint64_t y, void* stream) {
  return guarded([&] {
    requireArg(layer, "layer");
    layer->layer->forward({x, tokens, topk_idx, topk_weights, w1, w2, y}, stream);
  });
}

int megamoe_layer_forward_fp8(megamoe_layer* layer, uint64_t x, uint64_t x_scales, int64_t tokens, uint64_t topk_idx,
                              uint64_t topk_weights, uint64_t w1, uint64_t w1_scales, uint64_t w2, uint64_t w2_scales,
                              uint64_t y, void* stream) {
  return guarded([&] {
    requireArg(layer, "layer");
    megamoe::ForwardArgs a{x, tokens, topk_idx, topk_weights, w1, w2, y};
    a.xScales = x_scales, a.w1Scales = w1_scales, a.w2Scales = w2_scales;
    layer->layer->forward(a, stream);
  });
}

int megamoe_layer_forward_saved(megamoe_layer* layer, uint64_t x, int64_t tokens, uint64_t topk_idx,
                                uint64_t topk_weights, uint64_t w1, uint64_t w2, uint64_t y, uint64_t saved,
                                void* stream) {
  return guarded([&] {
    requireArg(layer, "layer");
    megamoe::ForwardArgs a{x, tokens, topk_idx, topk_weights, w1, w2, y};
    a.saved = saved;
    layer->layer->forward(a, stream);
  });
}

int megamoe_layer_backward_saved(megamoe_layer* layer, uint64_t dy, uint64_t x, int64_t tokens, uint64_t topk_idx,
                                 uint64_t topk_weights, uint64_t w1, uint64_t w2, uint64_t dx, uint64_t d_topk_weights,
                                 uint64_t dw1, uint64_t dw2, uint64_t saved, void* stream) {
  return guarded([&] {
    requireArg(layer, "layer");
    megamoe::BackwardArgs a{dy, x, tokens, topk_idx, topk_weights, w1, w2, dx, d_topk_weights, dw1, dw2};
    a.saved = saved;
    layer->layer->backward(a, stream);
  });
}

int megamoe_layer_backward(megamoe_layer* layer, uint64_t dy, uint64_t x, int64_t tokens, uint64_t topk_idx,
                           uint64_t topk_weights, uint64_t w1, uint64_t w2, uint64_t dx, uint64_t d_topk_weights,
                           uint64_t dw1, uint64_t dw2, void* stream) {
  return guarded([&] {
    requireArg(layer, "layer");
    layer->layer->backward({dy, x, tokens, topk_idx, topk_weights, w1, w2, dx, d_topk_weights, dw1, dw2}, stream);
  });
}

int megamoe_layer_set_legs(megamoe_layer* layer, int dispatch_leg, int combine_leg) {
  return guarded([&] {
    requireArg(layer, "layer");
    layer->layer->setLegs(toLeg(dispatch_leg, "dispatch_leg"), toLeg(combine_leg, "combine_leg"));
  });
}

int megamoe_layer_set_profiling(megamoe_layer* layer, int on) {
  return guarded([&] {
    requireArg(layer, "layer");
    layer->layer->setProfiling(on != 0);
  });
}

int megamoe_layer_stage_ms(megamoe_layer* layer, float* ms) {
  return guarded([&] {
    requireArg(layer, "layer");
    requireArg(ms, "ms");
    auto times = layer->layer->stageMilliseconds();
    for (size_t i = 0; i < times.size(); ++i) ms[i] = times[i];
  });
}

int megamoe_layer_backward_stage_ms(megamoe_layer* layer, float* ms) {
  return guarded([&] {
    requireArg(layer, "layer");
    requireArg(ms, "ms");
    auto times = layer->layer->backwardStageMilliseconds();
    for (size_t i = 0; i < times.size(); ++i) ms[i] = times[i];
  });
}

int megamoe_layer_kept_bytes(const megamoe_layer* layer, uint64_t* kept, uint64_t* kept_without_recompute) {
  return guarded([&] {
    requireArg(layer, "layer");
    requireArg(kept, "kept");
    requireArg(kept_without_recompute, "kept_without_recompute");
    *kept = layer->layer->keptBytes();
    *kept_without_recompute = layer->layer->keptBytesWithoutRecompute();
  });
}

int megamoe_layer_activation_bytes(const megamoe_layer* layer, uint64_t* bytes) {
  return guarded([&] {
    requireArg(layer, "layer");
    requireArg(bytes, "bytes");
    *bytes = layer->layer->activationBytes();
  });
}

int megamoe_layer_sm_budget(const megamoe_layer* layer, int* sms) {
  return guarded([&] {
    requireArg(layer, "layer");
    requireArg(sms, "sms");
    *sms = layer->layer->smBudget();
  });
}

int megamoe_layer_check_errors(megamoe_layer* layer, void* stream) {
  return guarded([&] {
    requireArg(layer, "layer");
    layer->layer->checkErrors(stream);
  });
}

}  // extern "C"
