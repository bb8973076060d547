/*
 * dynload.h - run-time loading of the shared libraries spanhead shares with its host process
 * (cuBLAS, NCCL). libspanhead has no DT_NEEDED entry for them: a process that already holds
 * one (PyTorch loads its own cuBLAS and NCCL from its wheels) must not get a second, older
 * copy from the system first, which would shadow the one its other libraries were built for.
 *
 * Search order of sph_dynload, first match wins:
 *   1. a library of one of `sonames` already loaded in the process (dlopen RTLD_NOLOAD):
 *      whatever the host loaded, from wherever;
 *   2. the path in the environment variable `env` (an explicit choice, e.g. SPANHEAD_NCCL_LIB);
 *   3. each soname through the dynamic linker's usual search (LD_LIBRARY_PATH, ld.so.cache);
 *   4. each soname under `fallback_dir` (the toolkit's library folder seen at build time).
 * The handle is opened RTLD_LOCAL (symbols are taken from it with dlsym only) and never closed.
 */
#ifndef SPH_CORE_DYNLOAD_H
#define SPH_CORE_DYNLOAD_H

#include <pthread.h>
#include <stddef.h>

#include "core/internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Opens the library (see the order above) into *handle and writes the path or soname it came
 * from into where (may be NULL). On failure SPH_ERR_UNSUPPORTED with a message naming `what`,
 * every place tried and the last dlerror. `sonames` ends with NULL. */
sph_status sph_dynload(const char *what, const char *env, const char *const *sonames,
                       const char *fallback_dir, void **handle, char *where, size_t where_len);

/* Resolves each of syms[i] (NULL-terminated) into fns[i]; on a missing symbol
 * SPH_ERR_UNSUPPORTED naming it and the library (`where`). */
sph_status sph_dynsyms(void *handle, const char *what, const char *where,
                       const char *const *syms, void **fns);

/* One run-time loaded library and its table of function pointers, loaded once per process
 * (the first call of sph_dynlib_load) with a sticky outcome: a failure is remembered and
 * replayed, status and message, by every later call. Define it static with
 * SPH_DYNLIB_INIT. */
typedef struct sph_dynlib {
    pthread_mutex_t lock;
    int state;             /* 0 not tried, 1 loaded, -1 failed (sticky) */
    sph_status failed;     /* the failure's status and message */
    char failed_msg[1024];
    char path[512];        /* where the library came from (sph_dynload's `where`) */
} sph_dynlib;
#define SPH_DYNLIB_INIT {PTHREAD_MUTEX_INITIALIZER, 0, SPH_OK, "", ""}

/* Loads lib (sph_dynload with what, env, sonames, fallback_dir), resolves syms (NULL-
 * terminated) and copies them, in order, into table (table_bytes: one pointer per symbol).
 * Once loaded, SPH_OK at once; once failed, the failure again, its message prefixed with
 * "who: " when who is not NULL. Thread-safe. */
sph_status sph_dynlib_load(sph_dynlib *lib, const char *what, const char *env,
                           const char *const *sonames, const char *fallback_dir,
                           const char *const *syms, void *table, size_t table_bytes,
                           const char *who);

#ifdef __cplusplus
}
#endif
#endif
