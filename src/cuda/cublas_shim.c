/*
 * cublas_shim.c - fills the cuBLAS table of cublas_shim.h at the first CUDA context.
 */
#include "cuda/cublas_shim.h"

#include "core/dynload.h"

#define SPH_STR_(x) #x
#define SPH_STR(x) SPH_STR_(x)

sph_cublas_api sph_cublas_fn;

static sph_dynlib g_lib = SPH_DYNLIB_INIT;

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
    /* the table's fields are function pointers in SPH_CUBLAS_FUNCS order */
    return sph_dynlib_load(&g_lib, "cuBLAS", "SPANHEAD_CUBLAS_LIB", sonames, fallback, syms,
                           &sph_cublas_fn, sizeof sph_cublas_fn, NULL);
}

const char *sph_cublas_path(void) { return g_lib.path; }
