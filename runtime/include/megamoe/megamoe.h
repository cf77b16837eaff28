/* C ABI of the megamoe runtime, for C, ctypes and Rust FFI: opaque handles, plain structs of fixed-width
 * integers, and an int status from every function (0 = MEGAMOE_OK). After a failure, megamoe_last_error() returns
 * the message on the calling thread; every call clears it first, so after a success it is "".
 *
 * Handles and lifetimes. Every *_destroy accepts NULL; destroying a handle twice, or using one after its destroy,
 * is undefined (nothing can detect it), except as said here:
 *   - a layer keeps its runtime alive: megamoe_runtime_destroy drops the caller's reference only, and a layer
 *     created from the runtime (megamoe_layer_create, _create_local) stays usable until megamoe_layer_destroy;
 *   - a heap does not need its runtime: it stays valid after megamoe_runtime_destroy;
 *   - a kernel (megamoe_kernel_load) belongs to its runtime and is invalid once the runtime is destroyed.
 * Device work is asynchronous: a call that enqueues kernels (megamoe_launch, megamoe_layer_forward, _backward)
 * returns MEGAMOE_OK once they are enqueued, even when a kernel then records a device error; the error surfaces at
 * the next megamoe_check_errors / megamoe_layer_check_errors.
 *
 * Growing structs. A struct that starts with `size_t struct_size` (megamoe_layer_config) may gain fields at its end
 * in later releases without breaking binaries: the caller sets struct_size to sizeof(the struct) as its header
 * declares it (MEGAMOE_LAYER_CONFIG_INIT does), and the library reads only the fields that size covers, taking 0
 * for the rest. A size smaller than the struct's first release, or above 4096, is refused, and so is a larger one
 * whose bytes past the fields this library knows are not all zero (a newer header's field this library would
 * ignore). */
#ifndef MEGAMOE_MEGAMOE_H
#define MEGAMOE_MEGAMOE_H

#include <stddef.h>
#include <stdint.h>

#include "megamoe/Version.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define MEGAMOE_API __attribute__((visibility("default")))
#else
#define MEGAMOE_API
#endif

/* Status codes: mirror megamoe::ErrorCode (runtime/include/megamoe/Error.h). */
#define MEGAMOE_OK 0
#define MEGAMOE_ERROR_INVALID_ARGUMENT 1
#define MEGAMOE_ERROR_DRIVER_NOT_FOUND 2
#define MEGAMOE_ERROR_DRIVER 3
#define MEGAMOE_ERROR_KERNEL_NOT_FOUND 4
#define MEGAMOE_ERROR_BAD_METADATA 5
#define MEGAMOE_ERROR_RENDEZVOUS 6
#define MEGAMOE_ERROR_TIMEOUT 7
#define MEGAMOE_ERROR_DEVICE 8
#define MEGAMOE_ERROR_HEAP_UNUSABLE 9
#define MEGAMOE_ERROR_INVALID_ENV 10
#define MEGAMOE_ERROR_UNSUPPORTED 11
#define MEGAMOE_ERROR_INTERNAL 12
#define MEGAMOE_ERROR_STALE_KERNEL 13 /* a cache entry built for another argument signature or generator: regenerate it */

/* Most ranks (GPUs of one node) a heap or a layer spans: the bound of every nranks. */
#define MEGAMOE_MAX_RANKS 8

typedef struct megamoe_runtime megamoe_runtime; /* one device */
typedef struct megamoe_kernel megamoe_kernel;   /* owned by its runtime; valid until the runtime is destroyed */
typedef struct megamoe_heap megamoe_heap;       /* one rank's symmetric heap */

typedef struct megamoe_spec_entry {
  const char* name;
  int64_t value;
} megamoe_spec_entry;

typedef struct megamoe_kernel_key {
  const char* kernel;             /* e.g. "swiglu_fwd" */
  const megamoe_spec_entry* spec; /* compile-time constants in the kernel's declared order; may be NULL if count 0 */
  size_t spec_count;
  const char* target;      /* "sm_90a" | "gfx950"; NULL or "" = the device's */
  const char* options;     /* canonical options text; NULL = the target's defaults (megamoe-cache's) */
  const char* fingerprint; /* NULL or "" = newest entry of any compiler fingerprint */
} megamoe_kernel_key;

typedef struct megamoe_region_spec {
  const char* name;
  uint64_t size;
  uint64_t alignment; /* power of two, at most 256 */
} megamoe_region_spec;

typedef struct megamoe_launch_dims {
  uint32_t grid[3];
  uint32_t block[3];
  uint32_t cluster[3]; /* all zero: no cluster */
  uint32_t shared_bytes;
} megamoe_launch_dims;

/* The version the library was built as ("0.1.0"); MEGAMOE_VERSION_STRING is the header's. Never NULL; like
 * megamoe_last_error and megamoe_status_name, it leaves the last error as it was. */
MEGAMOE_API const char* megamoe_version(void);
/* Message of the last failed call on this thread ("" if the last call succeeded). Never NULL. */
MEGAMOE_API const char* megamoe_last_error(void);
/* Short name of a status code ("kernel not found"). Never NULL. */
MEGAMOE_API const char* megamoe_status_name(int status);

/* ---- the log (docs/decisions/logging.md; C++: megamoe/Log.h) ----
 * One level and one sink for the whole library. The level starts as MEGAMOE_LOG_LEVEL (off | error | warn | info
 * | debug, read at the first message; default warn) until megamoe_set_log_level replaces it. The default sink
 * writes one line per message to stderr, "megamoe [info] kernel cache hit: ...". A callback replaces it:
 *   - it is called on the thread that logs, with `message` valid for the call only, and no lock of the library
 *     held: it may call any megamoe_* function (megamoe_set_log_level and megamoe_set_log_callback included; a new
 *     callback takes effect from the next message), and what it calls may log, calling it again on that thread;
 *   - it may be called from several threads at once (the library does not serialise it);
 *   - megamoe_set_log_callback returns once no other thread is inside the callback it replaced, so `user` of the
 *     old one may be freed then; a callback must not wait for a thread that is replacing the callback.
 * Status and errors go through the return values as always: the log never replaces megamoe_last_error. This is
 * libmegamoe's own log: a program that also links the C++ runtime statically has a second one (megamoe/Log.h). */
#define MEGAMOE_LOG_OFF 0
#define MEGAMOE_LOG_ERROR 1
#define MEGAMOE_LOG_WARN 2
#define MEGAMOE_LOG_INFO 3
#define MEGAMOE_LOG_DEBUG 4
typedef void (*megamoe_log_callback)(int level, const char* message, void* user);
/* level: MEGAMOE_LOG_OFF..MEGAMOE_LOG_DEBUG (anything else: MEGAMOE_ERROR_INVALID_ARGUMENT). */
MEGAMOE_API int megamoe_set_log_level(int level);
MEGAMOE_API int megamoe_get_log_level(int* level);
/* fn NULL: the default sink again (stderr); user is passed to fn as is. */
MEGAMOE_API int megamoe_set_log_callback(megamoe_log_callback fn, void* user);

/* backend: "cuda", "hip", or NULL/"auto" (MEGAMOE_BACKEND, else CUDA then HIP). */
MEGAMOE_API int megamoe_runtime_create(const char* backend, int device, megamoe_runtime** out);
/* NULL is accepted. Kernels of the runtime become invalid; heaps stay valid; layers keep the runtime alive (the
 * device and its loaded kernels) until the last of them is destroyed. */
MEGAMOE_API int megamoe_runtime_destroy(megamoe_runtime* runtime);
MEGAMOE_API int megamoe_device_count(const char* backend, int* count);

/* Finds the kernel in the cache (MEGAMOE_CACHE_DIR), else asks the JIT when linked in, else fails with
 * MEGAMOE_ERROR_KERNEL_NOT_FOUND naming the key, the cache and generate_hint (the command that builds it; NULL or "":
 * the megamoe-cache command for the key). */
MEGAMOE_API int megamoe_kernel_load(megamoe_runtime* runtime, const megamoe_kernel_key* key,
                                    const char* generate_hint, megamoe_kernel** out);
/* block_threads and shared_bytes may each be NULL (not wanted). */
MEGAMOE_API int megamoe_kernel_info(const megamoe_kernel* kernel, int* block_threads, int* shared_bytes);

/* The kernel's declared arguments (its signature), in parameter order, so that callers fill params by name:
 * megamoe_kernel_arg_count gives how many; megamoe_kernel_arg the index-th one's name, kind (MEGAMOE_ARG_*) and, for
 * pointers, element type ("bf16", "f32", "i32", "i64"; "" otherwise). Strings live as long as the library. A kernel
 * no declaration names (none the project generates) has count 0. */
#define MEGAMOE_ARG_PTR 0        /* 8-byte device address */
#define MEGAMOE_ARG_I32 1        /* 4-byte integer */
#define MEGAMOE_ARG_I64 2        /* 8-byte integer */
#define MEGAMOE_ARG_CONTEXT 3    /* 8-byte device address of the rank's context (megamoe_heap_context) */
#define MEGAMOE_ARG_TENSOR_MAP 4 /* 128 bytes (megamoe_tensor_map_bf16); an unused pointer off CUDA */
MEGAMOE_API int megamoe_kernel_arg_count(const megamoe_kernel* kernel, size_t* count);
MEGAMOE_API int megamoe_kernel_arg(const megamoe_kernel* kernel, size_t index, const char** name, int* kind,
                                   const char** elem);
/* Bytes of the split scratch a grouped_gemm_*_tma launch of `grid` blocks takes, and how many of its first bytes
 * must be zero before the first launch (each launch leaves them zero). */
MEGAMOE_API int megamoe_split_scratch_bytes(int64_t grid, uint64_t* bytes, uint64_t* zeroed_bytes);

/* params: the usual array of pointers to each argument (never NULL). heap may be NULL; a heap that saw a device error refuses
 * (MEGAMOE_ERROR_HEAP_UNUSABLE). stream: the native stream handle, NULL for the default stream. The arguments reach
 * the kernel as given: a kernel's contract is its caller's (e.g. the grouped GEMMs' offsets non-decreasing within
 * [0, rows] and their `grid` the launched block count: kernels/Kernels.h). */
MEGAMOE_API int megamoe_launch(megamoe_runtime* runtime, const megamoe_kernel* kernel,
                               const megamoe_launch_dims* dims, void* stream, void** params,
                               const megamoe_heap* heap);

/* The map for tensor-map argument `arg` of a loaded kernel (pass the address of its 128 bytes in params): over a
 * row-major [rows, cols] matrix at device address `base`, in the box the kernel's declaration gives for its
 * constants (the box the kernel loads; compiler/abi/KernelAbi.h). All zeros off CUDA, where the argument is an
 * unused pointer. MEGAMOE_ERROR_INVALID_ARGUMENT for a name that is no tensor-map argument of the kernel. */
MEGAMOE_API int megamoe_kernel_tensor_map(const megamoe_kernel* kernel, const char* arg, uint64_t base, int64_t rows,
                                          int64_t cols, void* out128);
/* A CUtensorMap of any box (megamoe_kernel_tensor_map takes a kernel argument's own): a bf16
 * tensor at device address `base` with `rank` (1..5) dimensions innermost first, dims in elements, strides in bytes
 * for dimensions 1..rank-1, boxes of `box` elements, 128-byte swizzle, zeros outside the tensor. */
MEGAMOE_API int megamoe_tensor_map_bf16(megamoe_runtime* runtime, uint64_t base, int rank, const uint64_t* dims,
                                        const uint64_t* strides, const uint32_t* box, void* out128);

/* One process per GPU: this process is `rank` of `nranks`; all meet at rendezvous_path (ignored when nranks is 1). */
MEGAMOE_API int megamoe_heap_create(megamoe_runtime* runtime, const megamoe_region_spec* regions, size_t region_count,
                                    int rank, int nranks, const char* rendezvous_path, megamoe_heap** out);
/* One process drives all GPUs: heap i (rank i) on runtimes[i]'s device; nranks is 1..MEGAMOE_MAX_RANKS, runtimes
 * and out_heaps have nranks slots. out_heaps is written on success only. */
MEGAMOE_API int megamoe_heap_create_local(megamoe_runtime* const* runtimes, size_t nranks,
                                          const megamoe_region_spec* regions, size_t region_count,
                                          megamoe_heap** out_heaps);
/* NULL is accepted. */
MEGAMOE_API int megamoe_heap_destroy(megamoe_heap* heap);
MEGAMOE_API int megamoe_heap_region(const megamoe_heap* heap, const char* name, uint64_t* device_address);
/* Device address of the rank's DeviceContext (what communicating kernels take). */
MEGAMOE_API int megamoe_heap_context(const megamoe_heap* heap, uint64_t* device_address);
/* Synchronises stream, reads the device error record; a recorded error returns MEGAMOE_ERROR_DEVICE and marks the
 * heap unusable for good. */
MEGAMOE_API int megamoe_check_errors(megamoe_heap* heap, void* stream);

/* ---- the model table (compiler/abi/Models.h, declared once; `megamoe-cache presets` prints it) ----
 * Public MoE models: their routed experts' shape as each config.json gives it, the usual expert-parallel degree,
 * and what each does that the layer does not yet. megamoe_model_count gives how many; megamoe_model_get the
 * index-th, writing every field this library knows after out->struct_size (set it to sizeof(megamoe_model); a size
 * below this first release's or above 4096 is refused). Its strings live as long as the library. */
#define MEGAMOE_MODEL_SHARED_EXPERTS 1u  /* experts every token passes through beside its routed ones */
#define MEGAMOE_MODEL_EXPERT_BIASES 2u   /* a bias per expert after L1 and L2 (gpt-oss) */
#define MEGAMOE_MODEL_SWIGLU_OAI 4u      /* gpt-oss's clamped gate * sigmoid(1.702 gate) * (up + 1) */
#define MEGAMOE_MODEL_WEIGHT_ON_INPUT 8u /* the routing weight scales the expert's input, not its output (Llama 4) */
typedef struct megamoe_model {
  size_t struct_size;          /* sizeof(megamoe_model) as the caller was compiled */
  const char* name;            /* the preset's name (megamoe-cache generate --preset NAME) */
  const char* source;          /* the Hugging Face repository whose config.json gives the numbers */
  int64_t hidden;              /* H */
  int64_t intermediate;        /* I of a routed expert */
  int64_t experts;             /* routed experts E */
  int64_t topk;
  int64_t ep;                  /* the usual expert-parallel degree */
  int64_t shared_experts;      /* always-on experts beside the routed ones (0: none) */
  int64_t shared_intermediate; /* I of one shared expert */
  uint64_t lacks;              /* MEGAMOE_MODEL_* bits: what the model does that the layer does not */
  const char* lacks_names;     /* the same as names joined by ',' ("shared_experts,expert_biases"; "" for none) */
  const char* refusal;         /* "" when the layer runs the model's routed experts at `ep` ranks (shared experts
                                  run beside it); else the first rule it refuses them with */
} megamoe_model;
MEGAMOE_API int megamoe_model_count(size_t* count);
MEGAMOE_API int megamoe_model_get(size_t index, megamoe_model* out);

/* ---- the MoE layer (runtime/include/megamoe/MoeLayer.h has the layouts and the semantics) ---- */
typedef struct megamoe_layer megamoe_layer;

typedef struct megamoe_layer_config {
  size_t struct_size;         /* sizeof(megamoe_layer_config) as the caller was compiled (see "Growing structs") */
  int64_t hidden;             /* H */
  int64_t intermediate;       /* I */
  int64_t experts;            /* E over all ranks; rank r owns [r * E/R, (r + 1) * E/R) */
  int64_t topk;
  int64_t max_tokens;         /* per rank and call */
  int64_t swiglu_clamp_milli; /* 0 = no clamp */
  int64_t training;           /* non-zero: forward keeps h and megamoe_layer_backward is available */
  int64_t dtype;              /* MEGAMOE_DTYPE_BF16, or MEGAMOE_DTYPE_FP8_E4M3 (inference: megamoe_layer_forward_fp8) */
  int64_t dedup_tokens;       /* non-zero: a token crosses to each owner rank once (MoeLayerConfig::dedupTokens) */
  int64_t sm_budget;          /* SMs of this rank's kernels (even); 0 = MEGAMOE_SM_BUDGET, else every SM shared by
                                 the ranks of one process on a device (MoeLayerConfig::smBudget) */
  int64_t receive_capacity;   /* rows a rank may receive per call (MoeLayerConfig::receiveCapacity); 0 = the worst
                                 case; added after 0.1.0: a caller's struct_size without it reads 0 */
  int64_t topk_idx_bits;      /* 0 or 32: topk_idx is int32; 64: int64 (torch.topk, DeepEP); anything else refused */
  int64_t drop_overflow;      /* non-zero: picks past the receive capacity are dropped and counted instead of failing
                                 the call (MoeLayerConfig::dropOverflow; megamoe_workspace_dropped_picks) */
  /* Later releases add fields here, and to MEGAMOE_LAYER_CONFIG_INIT. */
} megamoe_layer_config;
#define MEGAMOE_DTYPE_BF16 0
#define MEGAMOE_DTYPE_FP8_E4M3 1 /* e4m3 weights with 128 x 128 fp32 block scales (MoeLayer.h DType::kFp8E4m3) */
/* struct_size set, every other field 0 (dtype MEGAMOE_DTYPE_BF16): megamoe_layer_config c = MEGAMOE_LAYER_CONFIG_INIT; */
#define MEGAMOE_LAYER_CONFIG_INIT {sizeof(megamoe_layer_config), 0, 0, 0, 0, 0, 0, 0, MEGAMOE_DTYPE_BF16, 0, 0, 0, 0, 0}

/* Legs (benchmarks): what each fused operator runs. */
#define MEGAMOE_LEG_FUSED 0
#define MEGAMOE_LEG_COMM_ONLY 1
#define MEGAMOE_LEG_GEMM_ONLY 2
/* Stages of one forward (indices of megamoe_layer_stage_ms). */
#define MEGAMOE_STAGE_PROLOGUE 0
#define MEGAMOE_STAGE_DISPATCH_GEMM 1
#define MEGAMOE_STAGE_GEMM_COMBINE 2
#define MEGAMOE_STAGE_COUNT 3
/* Stages of one backward (indices of megamoe_layer_backward_stage_ms; MoeLayer.h says what each does). */
#define MEGAMOE_BACKWARD_STAGE_DGRAD_DISPATCH 0
#define MEGAMOE_BACKWARD_STAGE_SWIGLU 1
#define MEGAMOE_BACKWARD_STAGE_WGRAD_W2 2
#define MEGAMOE_BACKWARD_STAGE_WGRAD_W1_DISPATCH 3
#define MEGAMOE_BACKWARD_STAGE_DGRAD_COMBINE 4
#define MEGAMOE_BACKWARD_STAGE_COUNT 5

/* A CUtensorMap for an sm_90a kernel's tensor-map argument (pass the address of its 128 bytes in params): a bf16
 * tensor at device address `base` with `rank` (1..5) dimensions innermost first, dims in elements, strides in bytes
 * for dimensions 1..rank-1, boxes of `box` elements, 128-byte swizzle, zeros outside the tensor. */
MEGAMOE_API int megamoe_tensor_map_bf16(megamoe_runtime* runtime, uint64_t base, int rank, const uint64_t* dims,
                                        const uint64_t* strides, const uint32_t* box, void* out128);

/* One process per GPU: this process is `rank` of `nranks`; all meet at rendezvous_path (may be NULL when nranks
 * is 1). An invalid call names its first violated constraint, in this order: config->struct_size, the configuration
 * with nranks (as MoeLayer::validate), rank, rendezvous_path. */
MEGAMOE_API int megamoe_layer_create(megamoe_runtime* runtime, const megamoe_layer_config* config, int rank,
                                     int nranks, const char* rendezvous_path, megamoe_layer** out);
/* One process drives all GPUs: layer i (rank i) on runtimes[i]'s device; nranks is 1..MEGAMOE_MAX_RANKS, runtimes
 * and out_layers have nranks slots. out_layers is written on success only. */
MEGAMOE_API int megamoe_layer_create_local(megamoe_runtime* const* runtimes, size_t nranks,
                                           const megamoe_layer_config* config, megamoe_layer** out_layers);
/* NULL is accepted. */
MEGAMOE_API int megamoe_layer_destroy(megamoe_layer* layer);

/* A workspace (megamoe/Workspace.h): the symmetric heap and working buffers every layer of a model shares on one
 * rank, sized for the largest layer `config` describes; layers created on it (megamoe_layer_create_on) keep it
 * alive, so it may be destroyed before them. Calls of all its layers are ordered on one stream. */
typedef struct megamoe_workspace megamoe_workspace;
/* Sizing before creation, allocating nothing: the workspace's heap and buffer bytes on each rank, and the bytes of
 * the saved state one training forward of a layer writes (0 without training). NULL outputs are skipped. */
MEGAMOE_API int megamoe_workspace_bytes(const megamoe_layer_config* config, size_t nranks, uint64_t* heap_bytes,
                                        uint64_t* buffer_bytes);
MEGAMOE_API int megamoe_layer_saved_bytes(const megamoe_layer_config* config, size_t nranks, uint64_t* bytes);
/* As megamoe_layer_create / _create_local, for a workspace. */
MEGAMOE_API int megamoe_workspace_create(megamoe_runtime* runtime, const megamoe_layer_config* config, int rank,
                                         int nranks, const char* rendezvous_path, megamoe_workspace** out);
MEGAMOE_API int megamoe_workspace_create_local(megamoe_runtime* const* runtimes, size_t nranks,
                                               const megamoe_layer_config* config,
                                               megamoe_workspace** out_workspaces);
MEGAMOE_API int megamoe_workspace_destroy(megamoe_workspace* workspace); /* NULL is accepted */
/* The picks this rank's forwards on the workspace dropped so far (drop_overflow); synchronises stream. */
MEGAMOE_API int megamoe_workspace_dropped_picks(megamoe_workspace* workspace, void* stream, uint64_t* picks);
MEGAMOE_API int megamoe_layer_dropped_picks(megamoe_layer* layer, void* stream, uint64_t* picks);
/* Rendezvous through the caller (an all-gather over its process group, MPI, anything; no socket, no path):
 *   1. megamoe_workspace_prepare allocates this rank's share and makes its handle: megamoe_workspace_handle_size()
 *      bytes, the same size on every rank, written by megamoe_workspace_export;
 *   2. the caller gathers every rank's handle, in rank order, into nranks * handle_size bytes;
 *   3. megamoe_workspace_join checks every handle (format, rank, ranks, configuration: a difference names the rank
 *      and the field) and maps every peer's heap. Every rank's workspace is usable once every rank's join has
 *      returned MEGAMOE_OK: the caller meets its ranks (a barrier) before the first layer call.
 * The pending object is destroyed by the caller after join, whatever join returned (after a successful join it
 * holds nothing). Before destroying a workspace made this way, the caller synchronises its stream and meets its
 * ranks (a barrier): a peer may write into this rank's heap until its last call has finished. */
typedef struct megamoe_workspace_pending megamoe_workspace_pending;
MEGAMOE_API size_t megamoe_workspace_handle_size(void);
MEGAMOE_API int megamoe_workspace_prepare(megamoe_runtime* runtime, const megamoe_layer_config* config, int rank,
                                          int nranks, megamoe_workspace_pending** out);
MEGAMOE_API int megamoe_workspace_export(const megamoe_workspace_pending* pending, void* handle, size_t size);
MEGAMOE_API int megamoe_workspace_join(megamoe_workspace_pending* pending, const void* handles, size_t size,
                                       megamoe_workspace** out);
MEGAMOE_API int megamoe_workspace_pending_destroy(megamoe_workspace_pending* pending); /* NULL is accepted */
/* The group digest: one value over every handle the join was given (created workspaces: over what their ranks
 * exchanged), equal on every rank of one group. Handles carry a random nonce, so ranks handed another group's
 * handle (another job of the same configuration) get different digests: after the join the caller all-gathers
 * the digest over its ranks and refuses a mix before the barrier (the Python package does). */
MEGAMOE_API int megamoe_workspace_group_digest(const megamoe_workspace* workspace, uint64_t* digest);
/* A layer on `workspace`; its config must fit the workspace's (each size at most the workspace's, the same experts). */
MEGAMOE_API int megamoe_layer_create_on(megamoe_workspace* workspace, const megamoe_layer_config* config,
                                        megamoe_layer** out);
/* Forward and backward with a caller-owned saved state (megamoe_layer_saved_bytes bytes, 16-byte aligned): the
 * training forward writes it, its backward reads it; any number of forwards may be outstanding and their backwards
 * run in any order. saved = 0 uses the layer's own (only a layer with a workspace of its own has one). */
MEGAMOE_API int megamoe_layer_forward_saved(megamoe_layer* layer, uint64_t x, int64_t tokens, uint64_t topk_idx,
                                            uint64_t topk_weights, uint64_t w1, uint64_t w2, uint64_t y,
                                            uint64_t saved, void* stream);
MEGAMOE_API int megamoe_layer_backward_saved(megamoe_layer* layer, uint64_t dy, uint64_t x, int64_t tokens,
                                             uint64_t topk_idx, uint64_t topk_weights, uint64_t w1, uint64_t w2,
                                             uint64_t dx, uint64_t d_topk_weights, uint64_t dw1, uint64_t dw2,
                                             uint64_t saved, void* stream);
/* Device addresses; y [tokens, hidden] bf16 is written. Nothing is synchronised; stream NULL = default stream.
 * x, y, w1, w2 are 16-byte aligned, topk_idx 4-byte (8-byte when int64) and topk_weights 4-byte aligned. Every call of one layer (forward,
 * backward, stage times, check_errors) must be ordered on one stream, or the caller orders the streams: the layer's
 * buffers are reused by the next call without a host synchronisation. MEGAMOE_OK means enqueued (see above). */
MEGAMOE_API int megamoe_layer_forward(megamoe_layer* layer, uint64_t x, int64_t tokens, uint64_t topk_idx,
                                      uint64_t topk_weights, uint64_t w1, uint64_t w2, uint64_t y, void* stream);
/* The forward of a MEGAMOE_DTYPE_FP8_E4M3 layer: w1 / w2 e4m3 codes in the bf16 layouts with fp32 block scales
 * w1_scales [E/R, 2I/128, H/128] and w2_scales [E/R, H/128, I/128] (4-byte aligned, required); x bf16 with
 * x_scales = 0 (the layer quantises it per token and 128 channels), or e4m3 codes with x_scales fp32
 * [tokens, H/128]; y bf16. Otherwise as megamoe_layer_forward. A bf16 layer refuses non-zero scales. */
MEGAMOE_API int megamoe_layer_forward_fp8(megamoe_layer* layer, uint64_t x, uint64_t x_scales, int64_t tokens,
                                          uint64_t topk_idx, uint64_t topk_weights, uint64_t w1, uint64_t w1_scales,
                                          uint64_t w2, uint64_t w2_scales, uint64_t y, void* stream);
/* The backward of the last forward (training layers): dx [tokens, hidden] bf16, d_topk_weights fp32 [tokens, topk],
 * dW1 / dW2 in w1's / w2's layouts. Alignment and stream ordering as the forward's; d_topk_weights 4-byte aligned. */
MEGAMOE_API int megamoe_layer_backward(megamoe_layer* layer, uint64_t dy, uint64_t x, int64_t tokens, uint64_t topk_idx,
                                       uint64_t topk_weights, uint64_t w1, uint64_t w2, uint64_t dx,
                                       uint64_t d_topk_weights, uint64_t dw1, uint64_t dw2, void* stream);
MEGAMOE_API int megamoe_layer_set_legs(megamoe_layer* layer, int dispatch_leg, int combine_leg);
MEGAMOE_API int megamoe_layer_set_profiling(megamoe_layer* layer, int on);
/* Synchronises; ms has MEGAMOE_STAGE_COUNT slots (the last forward's stage times, profiling on). */
MEGAMOE_API int megamoe_layer_stage_ms(megamoe_layer* layer, float* ms);
/* Synchronises; ms has MEGAMOE_BACKWARD_STAGE_COUNT slots (the last backward's, profiling on). */
MEGAMOE_API int megamoe_layer_backward_stage_ms(megamoe_layer* layer, float* ms);
MEGAMOE_API int megamoe_layer_activation_bytes(const megamoe_layer* layer, uint64_t* bytes);
/* What a training forward keeps for the backward, and what it would keep without recomputing the dispatched x. */
MEGAMOE_API int megamoe_layer_kept_bytes(const megamoe_layer* layer, uint64_t* kept, uint64_t* kept_without_recompute);
/* The SMs this rank's kernels use (config.sm_budget resolved). */
MEGAMOE_API int megamoe_layer_sm_budget(const megamoe_layer* layer, int* sms);
/* As megamoe_check_errors, for the layer's heap. */
MEGAMOE_API int megamoe_layer_check_errors(megamoe_layer* layer, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* MEGAMOE_MEGAMOE_H */
