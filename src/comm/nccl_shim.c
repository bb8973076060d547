/*
 * nccl_shim.c - fills the NCCL table of nccl_shim.h at the first NCCL communicator.
 */
#ifdef SPH_HAVE_NCCL
#include "comm/nccl_shim.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "core/dynload.h"

#define SPH_STR_(x) #x
#define SPH_STR(x) SPH_STR_(x)

sph_nccl_api sph_nccl_fn;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int state; /* 0 not tried, 1 loaded, -1 failed (sticky) */
static sph_status failed;
static char failed_msg[1024];
static char path[512];

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
    pthread_mutex_lock(&lock);
    sph_status st = SPH_OK;
    if (state == 0) {
        void *h = NULL, *fns[N_SYMS];
        char where[sizeof path];
        st = sph_dynload("NCCL", "SPANHEAD_NCCL_LIB", sonames, fallback, &h, where,
                         sizeof where);
        if (st == SPH_OK) st = sph_dynsyms(h, "NCCL", where, syms, fns);
        if (st == SPH_OK) {
            memcpy(&sph_nccl_fn, fns, sizeof sph_nccl_fn);
            memcpy(path, where, sizeof path);
            state = 1;
        } else {
            state = -1;
            failed = st;
            snprintf(failed_msg, sizeof failed_msg, "%s", sph_last_error());
        }
    }
    if (state == -1)
        st = who ? sph_err(failed, "%s: %s", who, failed_msg) : sph_err(failed, "%s", failed_msg);
    pthread_mutex_unlock(&lock);
    return st;
}

const char *sph_nccl_path(void) { return path; }
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
