/* A C program built with only `cc $(pkg-config --cflags --libs megamoe)` against an installed megamoe
 * (scripts/test-install.sh): the version call and the error codes that need no device. */
#include <stdio.h>
#include <string.h>

#include "megamoe/megamoe.h"

int main(int argc, char** argv) {
  megamoe_runtime* runtime = NULL;
  megamoe_layer_config config = MEGAMOE_LAYER_CONFIG_INIT;
  megamoe_layer* layer = NULL;
  int failures = 0;
  if (argc != 2) {
    fprintf(stderr, "usage: consumer-c EXPECTED_VERSION\n");
    return 2;
  }
  if (strcmp(megamoe_version(), argv[1]) != 0 || strcmp(MEGAMOE_VERSION_STRING, argv[1]) != 0) {
    fprintf(stderr, "consumer-c: version %s (header %s), expected %s\n", megamoe_version(), MEGAMOE_VERSION_STRING,
            argv[1]);
    ++failures;
  }
  if (megamoe_runtime_create("opencl", 0, &runtime) != MEGAMOE_ERROR_INVALID_ARGUMENT || runtime != NULL) {
    fprintf(stderr, "consumer-c: runtime_create(opencl): %s\n", megamoe_last_error());
    ++failures;
  }
  if (config.struct_size != sizeof config ||
      megamoe_layer_create(NULL, &config, 0, 1, NULL, &layer) != MEGAMOE_ERROR_INVALID_ARGUMENT) {
    fprintf(stderr, "consumer-c: layer_create(NULL runtime): %s\n", megamoe_last_error());
    ++failures;
  }
  if (failures) return 1;
  printf("consumer-c: all checks passed (megamoe %s)\n", megamoe_version());
  return 0;
}
