/*
 * cublas_shim.c - fills the cuBLAS table of cublas_shim.h at the first CUDA context.
 */
#include "cuda/cublas_shim.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "core/dynload.h"

#define SPH_STR_(x) #x
#define SPH_STR(x) SPH_STR_(x)

sph_cublas_api sph_cublas_fn;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int state;         /* 0 not tried, 1 loaded, -1 failed (sticky) */
static sph_status failed; /* the failure's status and message, replayed on later calls */
static char failed_msg[1024];
static char path[512];

sph_status sph_cublas_load(void) {
    static const char *const sonames[] = {"libcublas.so." SPH_STR(CUBLAS_VER_MAJOR), NULL};
#define SPH_CUBLAS_SYM(field, sym, ret, params) sym,
    static const char *const syms[] = {SPH_CUBLAS_FUNCS(SPH_CUBLAS_SYM) NULL};
#undef SPH_CUBLAS_SYM
    enum { N_SYMS = sizeof syms / sizeof syms[0] - 1 };
    _Static_assert(sizeof(sph_cublas_api) == N_SYMS * sizeof(void *),
                   "sph_cublas_api: one pointer per symbol");
#ifdef SPH_CUDA_LIBDIR
    const char *fallback = SPH_CUDA_LIBDIR;
#else
    const char *fallback = NULL;
#endif
    pthread_mutex_lock(&lock);
    sph_status st = SPH_OK;
    if (state == 1) goto done;
    if (state == -1) {
        st = sph_err(failed, "%s", failed_msg);
        goto done;
    }
    void *h = NULL, *fns[N_SYMS];
    char where[sizeof path];
    st = sph_dynload("cuBLAS", "SPANHEAD_CUBLAS_LIB", sonames, fallback, &h, where,
                     sizeof where);
    if (st == SPH_OK) st = sph_dynsyms(h, "cuBLAS", where, syms, fns);
    if (st != SPH_OK) {
        state = -1;
        failed = st;
        snprintf(failed_msg, sizeof failed_msg, "%s", sph_last_error());
        goto done;
    }
    /* the table's fields are function pointers in SPH_CUBLAS_FUNCS order */
    memcpy(&sph_cublas_fn, fns, sizeof sph_cublas_fn);
    memcpy(path, where, sizeof path);
    state = 1;
done:
    pthread_mutex_unlock(&lock);
    return st;
}

const char *sph_cublas_path(void) { return path; }
