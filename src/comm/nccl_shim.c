/*
 * nccl_shim.c - fills the NCCL table of nccl_shim.h at the first NCCL communicator.
 */
#ifdef SPH_HAVE_NCCL
#include "comm/nccl_shim.h"

#include "core/dynload.h"

#define SPH_STR_(x) #x
#define SPH_STR(x) SPH_STR_(x)

sph_nccl_api sph_nccl_fn;

static sph_dynlib g_lib = SPH_DYNLIB_INIT;

sph_status sph_nccl_load(const char *who) {
    static const char *const sonames[] = {"libnccl.so." SPH_STR(NCCL_MAJOR), "libnccl.so", NULL};
#define SPH_NCCL_SYM(field, sym, ret, params) sym,
    static const char *const syms[] = {SPH_NCCL_FUNCS(SPH_NCCL_SYM) NULL};
#undef SPH_NCCL_SYM
    enum { N_SYMS = sizeof syms / sizeof syms[0] - 1 };
    _Static_assert(sizeof(sph_nccl_api) == N_SYMS * sizeof(void *),
                   "sph_nccl_api: one pointer per symbol");
#ifdef SPH_NCCL_LIBDIR
    const char *fallback = SPH_NCCL_LIBDIR;
#else
    const char *fallback = NULL;
#endif
    return sph_dynlib_load(&g_lib, "NCCL", "SPANHEAD_NCCL_LIB", sonames, fallback, syms,
                           &sph_nccl_fn, sizeof sph_nccl_fn, who);
}

const char *sph_nccl_path(void) { return g_lib.path; }
#else
#include "core/internal.h"

/* A build without NCCL: the same entry points, saying so (the tests call them either way). */
sph_status sph_nccl_load(const char *who);
const char *sph_nccl_path(void);

sph_status sph_nccl_load(const char *who) {
    return sph_err(SPH_ERR_UNSUPPORTED, "%s%sspanhead was built without NCCL (SPANHEAD_NCCL_LIB "
                   "cannot help: no NCCL code is in this build)", who ? who : "", who ? ": " : "");
}

const char *sph_nccl_path(void) { return ""; }
#endif
