/*
 * dynload.c - sph_dynload: the shared search of the run-time loaded libraries (dynload.h).
 */
#define _GNU_SOURCE
#include "core/dynload.h"

#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The file a handle maps (for messages and tests: which copy was taken). */
static void handle_path(void *h, const char *fallback, char *where, size_t len) {
    if (!where || !len) return;
    struct link_map *lm = NULL;
    const char *p = fallback;
    if (dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && *lm->l_name) p = lm->l_name;
    snprintf(where, len, "%s", p);
}

sph_status sph_dynload(const char *what, const char *env, const char *const *sonames,
                       const char *fallback_dir, void **handle, char *where, size_t where_len) {
    char tried[1024] = "";
    size_t used = 0;
    const char *last = NULL;
    void *h = NULL;
    *handle = NULL;
#define TRIED(s)                                                                              \
    do {                                                                                      \
        int n_ = snprintf(tried + used, sizeof tried - used, "%s%s", used ? ", " : "", (s));  \
        if (n_ > 0) used = used + (size_t)n_ < sizeof tried ? used + (size_t)n_ : sizeof tried - 1; \
    } while (0)
    /* 1. already in the process: the host's copy */
    for (const char *const *s = sonames; *s; s++) {
        h = dlopen(*s, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
        if (h) {
            handle_path(h, *s, where, where_len);
            *handle = h;
            return SPH_OK;
        }
    }
    /* 2. the caller's explicit choice */
    const char *path = env ? getenv(env) : NULL;
    if (path && *path) {
        h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            last = dlerror();
            return sph_err(SPH_ERR_UNSUPPORTED, "%s: cannot load %s=%s: %s", what, env, path,
                           last ? last : "?");
        }
        handle_path(h, path, where, where_len);
        *handle = h;
        return SPH_OK;
    }
    /* 3. the dynamic linker's search, 4. the build's toolkit folder */
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1 && (!fallback_dir || !*fallback_dir)) break;
        for (const char *const *s = sonames; *s; s++) {
            char buf[1024];
            const char *name = *s;
            if (pass == 1) {
                snprintf(buf, sizeof buf, "%s/%s", fallback_dir, *s);
                name = buf;
            }
            h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
            if (h) {
                handle_path(h, name, where, where_len);
                *handle = h;
                return SPH_OK;
            }
            last = dlerror();
            TRIED(name);
        }
    }
#undef TRIED
    return sph_err(SPH_ERR_UNSUPPORTED,
                   "%s: cannot load the library (none is loaded in the process; tried %s): %s; "
                   "install it or set %s to its path",
                   what, tried, last ? last : "?", env ? env : "LD_LIBRARY_PATH");
}

sph_status sph_dynsyms(void *handle, const char *what, const char *where,
                       const char *const *syms, void **fns) {
    for (int i = 0; syms[i]; i++) {
        dlerror();
        fns[i] = dlsym(handle, syms[i]);
        if (!fns[i])
            return sph_err(SPH_ERR_UNSUPPORTED, "%s: %s has no symbol %s (too old a version?)",
                           what, where && *where ? where : "the library", syms[i]);
    }
    return SPH_OK;
}

sph_status sph_dynlib_load(sph_dynlib *lib, const char *what, const char *env,
                           const char *const *sonames, const char *fallback_dir,
                           const char *const *syms, void *table, size_t table_bytes,
                           const char *who) {
    pthread_mutex_lock(&lib->lock);
    sph_status st = SPH_OK;
    if (lib->state == 0) {
        void *h = NULL, **fns = sph_malloc(table_bytes ? table_bytes : 1);
        char where[sizeof lib->path];
        st = fns ? SPH_OK : sph_err(SPH_ERR_ALLOC, "%s: out of host memory", what);
        if (st == SPH_OK)
            st = sph_dynload(what, env, sonames, fallback_dir, &h, where, sizeof where);
        if (st == SPH_OK) st = sph_dynsyms(h, what, where, syms, fns);
        if (st == SPH_OK) {
            memcpy(table, fns, table_bytes); /* the table: pointers in syms order */
            memcpy(lib->path, where, sizeof lib->path);
            lib->state = 1;
        } else {
            lib->state = -1;
            lib->failed = st;
            snprintf(lib->failed_msg, sizeof lib->failed_msg, "%s", sph_last_error());
        }
        sph_free(fns);
    }
    if (lib->state == -1)
        st = who ? sph_err(lib->failed, "%s: %s", who, lib->failed_msg)
                 : sph_err(lib->failed, "%s", lib->failed_msg);
    pthread_mutex_unlock(&lib->lock);
    return st;
}
