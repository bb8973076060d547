/*
 * cli_row_types.c - compiled, never run (tests/CMakeLists.txt: unit_cli_row_types_ok and
 * unit_cli_row_types_bad): the shared option rows of the run tables (src/cli/opts.h,
 * SPH_CLI_ROW_*) placed with an options struct whose fields have the rows' types compile;
 * with SPH_TEST_BAD_ROW_TYPE one field has another type (int64_t temperature instead of
 * double), and SPH_CLI_OFF must make that a compile error, not a row that writes a double
 * over an integer.
 */
#include <stdint.h>

#include "opts.h"

typedef struct row_types {
    int device, json;
#ifdef SPH_TEST_BAD_ROW_TYPE
    int64_t temperature;
#else
    double temperature;
#endif
    double softcap;
    int64_t threads;
    const char *kernel;
} row_types;

const sph_cli_opt row_types_table[] = {
    SPH_CLI_ROW_DEVICE(row_types, "where"), SPH_CLI_ROW_TEMPERATURE(row_types),
    SPH_CLI_ROW_SOFTCAP(row_types),         SPH_CLI_ROW_THREADS(row_types),
    SPH_CLI_ROW_KERNEL(row_types),          SPH_CLI_ROW_JSON(row_types),
    SPH_CLI_OPT_END};
