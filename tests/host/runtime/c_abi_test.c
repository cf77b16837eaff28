/* The C ABI compiled as C: the header must be valid C, and every error path must come back as a status plus a
 * message, never a crash. Runs on the fake HIP library (MEGAMOE_FAKE_HIP_PATH) so that it needs no GPU. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>
#include <unistd.h>

#include "megamoe/megamoe.h"

static int failures = 0;

#define CHECK(cond)                                                  \
  do {                                                               \
    if (!(cond)) {                                                   \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                    \
    }                                                                \
  } while (0)

#define CHECK_STATUS(call, expected)                                                                  \
  do {                                                                                                \
    int status_ = (call);                                                                             \
    if (status_ != (expected)) {                                                                      \
      fprintf(stderr, "%s:%d: %s returned %d (%s), expected %d; last error: %s\n", __FILE__, __LINE__, \
              #call, status_, megamoe_status_name(status_), (expected), megamoe_last_error());        \
      ++failures;                                                                                     \
    }                                                                                                 \
  } while (0)

static int contains(const char* haystack, const char* needle) { return strstr(haystack, needle) != NULL; }

/* What the log callback saw (the library calls it on this thread: the test has no other). */
static int log_calls = 0;
static int log_last_level = -1;
static char log_text[4096];
static void* log_user = NULL;
static void record_log(int level, const char* message, void* user) {
  size_t used = strlen(log_text);
  ++log_calls;
  log_last_level = level;
  log_user = user;
  if (used + strlen(message) + 2 < sizeof log_text) {
    strcat(log_text, message);
    strcat(log_text, "\n");
  }
}

/* Device error record words (compiler/abi/DeviceAbi.h): code, rank, flag, seen, expected, block. */
static void inject_wait_timeout(uint64_t context_address) {
  /* On the fake backend device memory is host memory; DeviceContext.error is the word after heap_base,
   * peer_offset[8], rank+nranks and timeout_ns. */
  const uint64_t* context = (const uint64_t*)(uintptr_t)context_address;
  uint64_t* record = (uint64_t*)(uintptr_t)context[1 + 8 + 1 + 1];
  record[1] = 0;
  record[2] = 7;
  record[3] = 3;
  record[4] = 4;
  record[5] = 12;
  record[0] = 1;
}

int main(void) {
  char cache_dir[] = "/tmp/megamoe-capi-XXXXXX";
  megamoe_runtime* runtime = NULL;
  megamoe_kernel* kernel = NULL;
  megamoe_heap* heap = NULL;
  uint64_t address = 0;
  int count = -1;

  CHECK(strcmp(megamoe_last_error(), "") == 0);
  CHECK(strcmp(megamoe_status_name(MEGAMOE_ERROR_KERNEL_NOT_FOUND), "kernel not found") == 0);

  { /* The library's version is the header's (one build), and the macros spell it. */
    char spelled[32];
    snprintf(spelled, sizeof spelled, "%d.%d.%d", MEGAMOE_VERSION_MAJOR, MEGAMOE_VERSION_MINOR, MEGAMOE_VERSION_PATCH);
    CHECK(strcmp(megamoe_version(), MEGAMOE_VERSION_STRING) == 0);
    CHECK(strcmp(spelled, MEGAMOE_VERSION_STRING) == 0);
    CHECK(MEGAMOE_VERSION_NUMBER == MEGAMOE_VERSION_MAJOR * 10000 + MEGAMOE_VERSION_MINOR * 100 + MEGAMOE_VERSION_PATCH);
  }
  CHECK(strcmp(megamoe_status_name(-3), "unknown status") == 0);

  { /* The model table from C: a row by index, its strings, and a refusal that names the rule. */
    size_t models = 0, i;
    int found = 0;
    megamoe_model model;
    memset(&model, 0, sizeof model);
    model.struct_size = sizeof model;
    CHECK_STATUS(megamoe_model_count(&models), MEGAMOE_OK);
    CHECK(models >= 11);
    for (i = 0; i < models; ++i) {
      CHECK_STATUS(megamoe_model_get(i, &model), MEGAMOE_OK);
      CHECK(model.struct_size == sizeof model);
      if (strcmp(model.name, "deepseek-v3") == 0) {
        found |= 1;
        CHECK(model.hidden == 7168 && model.intermediate == 2048 && model.experts == 256 && model.topk == 8);
        CHECK(model.lacks == MEGAMOE_MODEL_SHARED_EXPERTS && strcmp(model.lacks_names, "shared_experts") == 0);
        CHECK(strcmp(model.refusal, "") == 0);
      }
      if (strcmp(model.name, "gpt-oss-20b") == 0) {
        found |= 2;
        CHECK(model.lacks == (MEGAMOE_MODEL_EXPERT_BIASES | MEGAMOE_MODEL_SWIGLU_OAI));
        CHECK(contains(model.refusal, "hidden=2880 must be a positive multiple of 128"));
      }
    }
    CHECK(found == 3);
    CHECK_STATUS(megamoe_model_get(models, &model), MEGAMOE_ERROR_INVALID_ARGUMENT);
    CHECK(contains(megamoe_last_error(), "must be below megamoe_model_count"));
    model.struct_size = sizeof model - 8;
    CHECK_STATUS(megamoe_model_get(0, &model), MEGAMOE_ERROR_INVALID_ARGUMENT);
    CHECK(contains(megamoe_last_error(), "out->struct_size="));
    CHECK_STATUS(megamoe_model_count(NULL), MEGAMOE_ERROR_INVALID_ARGUMENT);
  }

  /* Null arguments. */
  CHECK_STATUS(megamoe_runtime_create("hip", 0, NULL), MEGAMOE_ERROR_INVALID_ARGUMENT);
  CHECK(contains(megamoe_last_error(), "out must not be NULL"));
  CHECK_STATUS(megamoe_runtime_destroy(NULL), MEGAMOE_OK);
  CHECK(strcmp(megamoe_last_error(), "") == 0);
  CHECK_STATUS(megamoe_heap_destroy(NULL), MEGAMOE_OK);
  CHECK_STATUS(megamoe_check_errors(NULL, NULL), MEGAMOE_ERROR_INVALID_ARGUMENT);
  CHECK_STATUS(megamoe_launch(NULL, NULL, NULL, NULL, NULL, NULL), MEGAMOE_ERROR_INVALID_ARGUMENT);

  /* Missing driver and bad names. */
  setenv("MEGAMOE_CUDA_LIBRARY", "/nonexistent/libcuda.so.1", 1);
  CHECK_STATUS(megamoe_runtime_create("cuda", 0, &runtime), MEGAMOE_ERROR_DRIVER_NOT_FOUND);
  CHECK(runtime == NULL);
  CHECK(contains(megamoe_last_error(), "CUDA driver /nonexistent/libcuda.so.1 not found"));
  CHECK_STATUS(megamoe_runtime_create("opencl", 0, &runtime), MEGAMOE_ERROR_INVALID_ARGUMENT);
  setenv("MEGAMOE_WAIT_TIMEOUT_MS", "soon", 1);
  CHECK_STATUS(megamoe_runtime_create("hip", 0, &runtime), MEGAMOE_ERROR_INVALID_ENV);
  CHECK(contains(megamoe_last_error(), "MEGAMOE_WAIT_TIMEOUT_MS='soon'"));
  unsetenv("MEGAMOE_WAIT_TIMEOUT_MS");
  setenv("MEGAMOE_LOG_LEVEL", "loud", 1);
  CHECK_STATUS(megamoe_runtime_create("hip", 0, &runtime), MEGAMOE_ERROR_INVALID_ENV);
  CHECK(contains(megamoe_last_error(), "MEGAMOE_LOG_LEVEL='loud'"));
  unsetenv("MEGAMOE_LOG_LEVEL");

  /* A runtime on the fake HIP device. */
  if (!mkdtemp(cache_dir)) return 2;
  setenv("MEGAMOE_CACHE_DIR", cache_dir, 1);
  setenv("MEGAMOE_HIP_LIBRARY", MEGAMOE_FAKE_HIP_PATH, 1);
  CHECK_STATUS(megamoe_device_count("hip", &count), MEGAMOE_OK);
  CHECK(count == 4);
  CHECK_STATUS(megamoe_runtime_create("hip", 9, &runtime), MEGAMOE_ERROR_INVALID_ARGUMENT);
  CHECK(contains(megamoe_last_error(), "HIP device 9 does not exist"));
  { /* The log: level, callback and the default sink again. */
    int level = -1;
    int marker = 0;
    CHECK_STATUS(megamoe_set_log_level(5), MEGAMOE_ERROR_INVALID_ARGUMENT);
    CHECK(contains(megamoe_last_error(), "level=5"));
    CHECK_STATUS(megamoe_set_log_level(-1), MEGAMOE_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(megamoe_get_log_level(NULL), MEGAMOE_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(megamoe_set_log_level(MEGAMOE_LOG_INFO), MEGAMOE_OK);
    CHECK_STATUS(megamoe_get_log_level(&level), MEGAMOE_OK);
    CHECK(level == MEGAMOE_LOG_INFO);
    CHECK_STATUS(megamoe_set_log_callback(record_log, &marker), MEGAMOE_OK);
    CHECK_STATUS(megamoe_runtime_create("hip", 0, &runtime), MEGAMOE_OK);
    CHECK(log_calls >= 1);
    CHECK(log_last_level == MEGAMOE_LOG_INFO);
    CHECK(log_user == &marker);
    CHECK(contains(log_text, "runtime: hip device 0 (Fake gfx950 #0, gfx950, 256 SMs) through "));
    CHECK(contains(log_text, cache_dir));
    CHECK_STATUS(megamoe_runtime_destroy(runtime), MEGAMOE_OK);
    runtime = NULL;
    /* Off: nothing reaches the callback. */
    log_calls = 0;
    CHECK_STATUS(megamoe_set_log_level(MEGAMOE_LOG_OFF), MEGAMOE_OK);
    CHECK_STATUS(megamoe_runtime_create("hip", 0, &runtime), MEGAMOE_OK);
    CHECK(log_calls == 0);
    CHECK_STATUS(megamoe_runtime_destroy(runtime), MEGAMOE_OK);
    runtime = NULL;
    CHECK_STATUS(megamoe_set_log_callback(NULL, NULL), MEGAMOE_OK);
    CHECK_STATUS(megamoe_set_log_level(MEGAMOE_LOG_WARN), MEGAMOE_OK);
  }
  CHECK_STATUS(megamoe_runtime_create("hip", 0, &runtime), MEGAMOE_OK);
  if (!runtime) return 1;

  {
    megamoe_spec_entry spec[2] = {{"I", 2048}, {"clamp", 0}};
    megamoe_kernel_key key;
    memset(&key, 0, sizeof key);
    key.kernel = "swiglu_fwd";
    key.spec = spec;
    key.spec_count = 2;
    CHECK_STATUS(megamoe_kernel_load(runtime, &key, "megamoe-cache generate swiglu_fwd", &kernel),
                 MEGAMOE_ERROR_KERNEL_NOT_FOUND);
    CHECK(kernel == NULL);
    CHECK(contains(megamoe_last_error(), "swiglu_fwd[I=2048,clamp=0]@gfx950"));
    CHECK(contains(megamoe_last_error(), cache_dir));
    CHECK(contains(megamoe_last_error(), "megamoe-cache generate swiglu_fwd"));
    key.kernel = NULL;
    CHECK_STATUS(megamoe_kernel_load(runtime, &key, NULL, &kernel), MEGAMOE_ERROR_INVALID_ARGUMENT);
  }

  {
    megamoe_region_spec regions[2] = {{"flags", 4096, 256}, {"pool", 1u << 20, 128}};
    megamoe_region_spec bad[1] = {{"zero", 0, 16}};
    CHECK_STATUS(megamoe_heap_create(runtime, bad, 1, 0, 1, NULL, &heap), MEGAMOE_ERROR_INVALID_ARGUMENT);
    CHECK(contains(megamoe_last_error(), "'zero' has size 0"));
    CHECK_STATUS(megamoe_heap_create(runtime, regions, 2, 0, 2, NULL, &heap), MEGAMOE_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(megamoe_heap_create(runtime, regions, 2, 0, 1, NULL, &heap), MEGAMOE_OK);
    if (!heap) return 1;
    CHECK_STATUS(megamoe_heap_region(heap, "flags", &address), MEGAMOE_OK);
    CHECK(address != 0 && address % 256 == 0);
    CHECK_STATUS(megamoe_heap_region(heap, "nope", &address), MEGAMOE_ERROR_INVALID_ARGUMENT);
    CHECK(contains(megamoe_last_error(), "no region 'nope'"));
    CHECK_STATUS(megamoe_heap_context(heap, &address), MEGAMOE_OK);
    CHECK_STATUS(megamoe_check_errors(heap, NULL), MEGAMOE_OK);
    inject_wait_timeout(address);
    CHECK_STATUS(megamoe_check_errors(heap, NULL), MEGAMOE_ERROR_DEVICE);
    CHECK(contains(megamoe_last_error(), "rank 0: cross-rank wait timed out on flag 7 (seen 3, expected 4) in block 12"));
    CHECK_STATUS(megamoe_check_errors(heap, NULL), MEGAMOE_ERROR_HEAP_UNUSABLE);
    CHECK_STATUS(megamoe_heap_destroy(heap), MEGAMOE_OK);
  }

  {
    megamoe_heap* heaps[2] = {NULL, NULL};
    megamoe_runtime* second = NULL;
    megamoe_runtime* both[2];
    megamoe_region_spec regions[1] = {{"flags", 64, 64}};
    CHECK_STATUS(megamoe_runtime_create("hip", 1, &second), MEGAMOE_OK);
    both[0] = runtime;
    both[1] = second;
    CHECK_STATUS(megamoe_heap_create_local(both, 2, regions, 1, heaps), MEGAMOE_OK);
    CHECK(heaps[0] != NULL && heaps[1] != NULL);
    CHECK_STATUS(megamoe_heap_destroy(heaps[0]), MEGAMOE_OK);
    CHECK_STATUS(megamoe_heap_destroy(heaps[1]), MEGAMOE_OK);
    CHECK_STATUS(megamoe_runtime_destroy(second), MEGAMOE_OK);
  }

  { /* Hardening item 9: the rank count is checked before anything is written; on an error nothing is. */
    megamoe_runtime* many[MEGAMOE_MAX_RANKS + 1];
    megamoe_heap* heaps[MEGAMOE_MAX_RANKS + 1];
    megamoe_layer* layers[MEGAMOE_MAX_RANKS + 1];
    megamoe_region_spec regions[1] = {{"flags", 64, 64}};
    megamoe_layer_config good = {sizeof(megamoe_layer_config), 512, 256, 16, 4, 64, 0, 0, MEGAMOE_DTYPE_BF16, 0, 0, 0, 0, 0};
    const size_t counts[3] = {(size_t)-1, 0, MEGAMOE_MAX_RANKS + 1};
    size_t c, i;
    for (i = 0; i <= MEGAMOE_MAX_RANKS; ++i) many[i] = runtime;
    for (c = 0; c < 3; ++c) {
      int untouched = 1;
      for (i = 0; i <= MEGAMOE_MAX_RANKS; ++i) {
        heaps[i] = (megamoe_heap*)8;
        layers[i] = (megamoe_layer*)8;
      }
      CHECK_STATUS(megamoe_heap_create_local(many, counts[c], regions, 1, heaps), MEGAMOE_ERROR_INVALID_ARGUMENT);
      CHECK(contains(megamoe_last_error(), "nranks="));
      CHECK_STATUS(megamoe_layer_create_local(many, counts[c], &good, layers), MEGAMOE_ERROR_INVALID_ARGUMENT);
      CHECK(contains(megamoe_last_error(), "nranks="));
      for (i = 0; i <= MEGAMOE_MAX_RANKS; ++i) untouched &= heaps[i] == (megamoe_heap*)8 && layers[i] == (megamoe_layer*)8;
      CHECK(untouched);
    }
    many[1] = NULL;
    CHECK_STATUS(megamoe_heap_create_local(many, 2, regions, 1, heaps), MEGAMOE_ERROR_INVALID_ARGUMENT);
    CHECK(contains(megamoe_last_error(), "runtimes[1] must not be NULL"));
    CHECK(heaps[0] == (megamoe_heap*)8);
    CHECK_STATUS(megamoe_layer_create_local(many, 2, &good, layers), MEGAMOE_ERROR_INVALID_ARGUMENT);
    CHECK(contains(megamoe_last_error(), "runtimes[1] must not be NULL"));
    CHECK(layers[0] == (megamoe_layer*)8);
    CHECK_STATUS(megamoe_layer_create_local(many, 1, NULL, layers), MEGAMOE_ERROR_INVALID_ARGUMENT);
    CHECK(contains(megamoe_last_error(), "config must not be NULL"));
  }

  { /* The layer: bad configurations name the constraint; an empty cache names the command that fills it. */
    megamoe_layer* layer = (megamoe_layer*)1;
    megamoe_layer_config bad = {sizeof(megamoe_layer_config), 7100, 2048, 256, 8, 8192, 0, 0, MEGAMOE_DTYPE_BF16, 0, 0, 0, 0, 0};
    megamoe_layer_config good = {sizeof(megamoe_layer_config), 512, 256, 16, 4, 64, 0, 1, MEGAMOE_DTYPE_BF16, 1, 0, 0, 0, 0};
    megamoe_layer_config fp8 = {sizeof(megamoe_layer_config), 512, 256, 16, 4, 64, 0, 1, 7, 0, 0, 0, 0, 0};
    megamoe_layer_config garbage, wraps;
    float ms[MEGAMOE_STAGE_COUNT];
    CHECK_STATUS(megamoe_layer_create(NULL, &good, 0, 1, NULL, &layer), MEGAMOE_ERROR_INVALID_ARGUMENT);
    CHECK(layer == NULL);
    CHECK_STATUS(megamoe_layer_create(runtime, &bad, 0, 1, NULL, &layer), MEGAMOE_ERROR_INVALID_ARGUMENT);
    CHECK(contains(megamoe_last_error(), "hidden=7100"));
    CHECK_STATUS(megamoe_layer_create(runtime, &fp8, 0, 1, NULL, &layer), MEGAMOE_ERROR_INVALID_ARGUMENT);
    CHECK(contains(megamoe_last_error(), "dtype=7"));
    fp8.dtype = MEGAMOE_DTYPE_FP8_E4M3; /* FP8 is inference only: `good` trains */
    CHECK_STATUS(megamoe_layer_create(runtime, &fp8, 0, 1, NULL, &layer), MEGAMOE_ERROR_INVALID_ARGUMENT);
    CHECK(contains(megamoe_last_error(), "training=true with dtype fp8_e4m3"));
    fp8.training = 0;
    CHECK_STATUS(megamoe_layer_create(runtime, &fp8, 0, 1, NULL, &layer), MEGAMOE_ERROR_KERNEL_NOT_FOUND);
    CHECK(contains(megamoe_last_error(), "megamoe-cache generate --kernel"));
    CHECK(layer == NULL);
    CHECK_STATUS(megamoe_layer_forward_fp8(NULL, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, NULL), MEGAMOE_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(megamoe_layer_create(runtime, &good, 0, 1, NULL, &layer), MEGAMOE_ERROR_KERNEL_NOT_FOUND);
    CHECK(contains(megamoe_last_error(), "megamoe-cache generate --kernel dispatch_prologue"));
    CHECK(layer == NULL);
    /* Hardening item 2: an uninitialised config names its first field in check order; products of fields that
     * wrap around int64 are refused by the fields' bounds (they used to pass, down to the kernel lookup). */
    memset(&garbage, 0xff, sizeof garbage);
    garbage.struct_size = sizeof garbage;
    CHECK_STATUS(megamoe_layer_create(runtime, &garbage, 0, 1, NULL, &layer), MEGAMOE_ERROR_INVALID_ARGUMENT);
    CHECK(contains(megamoe_last_error(), "experts=-1"));
    memset(&garbage, 0x7f, sizeof garbage);
    garbage.struct_size = sizeof garbage;
    CHECK_STATUS(megamoe_layer_create(runtime, &garbage, 0, 1, NULL, &layer), MEGAMOE_ERROR_INVALID_ARGUMENT);
    CHECK(contains(megamoe_last_error(), "experts=9187201950435737471"));
    wraps = good;
    wraps.max_tokens = ((int64_t)1 << 62) + 1;
    CHECK_STATUS(megamoe_layer_create(runtime, &wraps, 0, 1, NULL, &layer), MEGAMOE_ERROR_INVALID_ARGUMENT);
    CHECK(contains(megamoe_last_error(), "max_tokens=4611686018427387905"));
    wraps = good;
    wraps.intermediate = (int64_t)1 << 62;
    CHECK_STATUS(megamoe_layer_create(runtime, &wraps, 0, 1, NULL, &layer), MEGAMOE_ERROR_INVALID_ARGUMENT);
    CHECK(contains(megamoe_last_error(), "intermediate=4611686018427387904"));
    CHECK(layer == NULL);
    /* Hardening item 17: the config and the ranks are checked before the rendezvous path. */
    CHECK_STATUS(megamoe_layer_create(runtime, &good, 0, 9, NULL, &layer), MEGAMOE_ERROR_INVALID_ARGUMENT);
    CHECK(contains(megamoe_last_error(), "ranks=9"));
    wraps = good;
    wraps.experts = 3;
    CHECK_STATUS(megamoe_layer_create(runtime, &wraps, 0, 2, NULL, &layer), MEGAMOE_ERROR_INVALID_ARGUMENT);
    CHECK(contains(megamoe_last_error(), "experts=3"));
    CHECK_STATUS(megamoe_layer_create(runtime, &good, 2, 2, NULL, &layer), MEGAMOE_ERROR_INVALID_ARGUMENT);
    CHECK(contains(megamoe_last_error(), "rank=2 must be in [0, nranks=2)"));
    CHECK_STATUS(megamoe_layer_create(runtime, &good, 0, 2, NULL, &layer), MEGAMOE_ERROR_INVALID_ARGUMENT);
    CHECK(contains(megamoe_last_error(), "rendezvous_path must not be NULL"));
    CHECK_STATUS(megamoe_layer_forward(NULL, 0, 0, 0, 0, 0, 0, 0, NULL), MEGAMOE_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(megamoe_layer_set_legs(NULL, 0, 0), MEGAMOE_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(megamoe_layer_stage_ms(NULL, ms), MEGAMOE_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(megamoe_layer_destroy(NULL), MEGAMOE_OK);
  }

  { /* struct_size: a known size is read up to that size only; unknown sizes are refused, naming the field. An
     * accepted config gets as far as the kernel lookup (the cache is empty). */
    megamoe_layer* layer = NULL;
    megamoe_layer* layers[1] = {NULL};
    megamoe_layer_config init = MEGAMOE_LAYER_CONFIG_INIT, c;
    struct {
      megamoe_layer_config config;
      unsigned char tail[16];
    } grown;
    CHECK(init.struct_size == sizeof(megamoe_layer_config));
    CHECK(init.hidden == 0 && init.dtype == MEGAMOE_DTYPE_BF16 && init.sm_budget == 0);
    c = init;
    c.hidden = 512;
    c.intermediate = 256;
    c.experts = 16;
    c.topk = 4;
    c.max_tokens = 64;
    CHECK_STATUS(megamoe_layer_create(runtime, &c, 0, 1, NULL, &layer), MEGAMOE_ERROR_KERNEL_NOT_FOUND);
    c.struct_size = 0;
    CHECK_STATUS(megamoe_layer_create(runtime, &c, 0, 1, NULL, &layer), MEGAMOE_ERROR_INVALID_ARGUMENT);
    CHECK(contains(megamoe_last_error(), "config->struct_size=0 is not a megamoe_layer_config size"));
    CHECK_STATUS(megamoe_layer_create_local(&runtime, 1, &c, layers), MEGAMOE_ERROR_INVALID_ARGUMENT);
    CHECK(contains(megamoe_last_error(), "config->struct_size=0"));
    CHECK(layers[0] == NULL);
    /* topk_idx is int32 or int64, nothing else. */
    c.struct_size = sizeof c;
    c.topk_idx_bits = 16;
    CHECK_STATUS(megamoe_layer_create(runtime, &c, 0, 1, NULL, &layer), MEGAMOE_ERROR_INVALID_ARGUMENT);
    CHECK(contains(megamoe_last_error(), "topk_idx_bits=16 must be 32 (or 0) or 64"));
    c.topk_idx_bits = 0;
    /* A 0.1.0 caller's struct (it ends with sm_budget): accepted, receive_capacity read as 0 (the worst case). */
    c.struct_size = offsetof(megamoe_layer_config, receive_capacity);
    c.receive_capacity = -5; /* beyond its struct_size: never read */
    CHECK_STATUS(megamoe_layer_create(runtime, &c, 0, 1, NULL, &layer), MEGAMOE_ERROR_KERNEL_NOT_FOUND);
    c.receive_capacity = 0;
    c.struct_size = offsetof(megamoe_layer_config, sm_budget); /* shorter than the first release's */
    CHECK_STATUS(megamoe_layer_create(runtime, &c, 0, 1, NULL, &layer), MEGAMOE_ERROR_INVALID_ARGUMENT);
    CHECK(contains(megamoe_last_error(), "config->struct_size="));
    /* Hardening round 2, item 4: a size inside a field is no header's. */
    c.struct_size = offsetof(megamoe_layer_config, receive_capacity) + 3;
    CHECK_STATUS(megamoe_layer_create(runtime, &c, 0, 1, NULL, &layer), MEGAMOE_ERROR_INVALID_ARGUMENT);
    CHECK(contains(megamoe_last_error(), "end on a field boundary"));
    c.struct_size = (size_t)1 << 40;
    CHECK_STATUS(megamoe_layer_create(runtime, &c, 0, 1, NULL, &layer), MEGAMOE_ERROR_INVALID_ARGUMENT);
    CHECK(contains(megamoe_last_error(), "config->struct_size=1099511627776"));
    /* A newer caller's larger struct: fields this library does not know must be zero. */
    memset(&grown, 0, sizeof grown);
    grown.config = c;
    grown.config.struct_size = sizeof grown;
    CHECK_STATUS(megamoe_layer_create(runtime, &grown.config, 0, 1, NULL, &layer), MEGAMOE_ERROR_KERNEL_NOT_FOUND);
    grown.tail[5] = 1;
    CHECK_STATUS(megamoe_layer_create(runtime, &grown.config, 0, 1, NULL, &layer), MEGAMOE_ERROR_INVALID_ARGUMENT);
    CHECK(contains(megamoe_last_error(), "is not zero"));
    /* Bytes past the caller's struct_size are never read. */
    grown.config.struct_size = sizeof grown.config;
    memset(grown.tail, 0xff, sizeof grown.tail);
    CHECK_STATUS(megamoe_layer_create(runtime, &grown.config, 0, 1, NULL, &layer), MEGAMOE_ERROR_KERNEL_NOT_FOUND);
    CHECK(layer == NULL);
  }

  CHECK_STATUS(megamoe_runtime_destroy(runtime), MEGAMOE_OK);
  {
    char command[128];
    snprintf(command, sizeof command, "rm -rf '%s'", cache_dir);
    if (system(command) != 0) fprintf(stderr, "could not remove %s\n", cache_dir);
  }
  if (failures) fprintf(stderr, "%d check(s) failed\n", failures);
  else printf("c_abi_test: all checks passed\n");
  return failures ? 1 : 0;
}
