/* Test-side view of the fake libamdhip64 (FakeHip.cpp): what a launch recorded, and the query functions' names.
 * Plain C so that the C ABI test can use it too. */
#ifndef MEGAMOE_TESTS_FAKE_HIP_CONTROL_H
#define MEGAMOE_TESTS_FAKE_HIP_CONTROL_H
#include <stdint.h>

typedef struct FakeHipLaunch {
  char name[64];
  unsigned grid[3];
  unsigned block[3];
  unsigned sharedBytes;
  void* stream;
  int device;
  int nparams;
  uint64_t params[32]; /* each parameter's first 8 bytes (the first 32 parameters) */
} FakeHipLaunch;

#endif
