/*
 * status.c - status strings, this thread's last-error message, logging.
 * The message buffer is thread-local so concurrent contexts never garble each other's text.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"

#define SPH_MSG_CAP 1024

static _Thread_local char g_msg[SPH_MSG_CAP];

const char *sph_status_str(sph_status s) {
    switch (s) {
    case SPH_OK: return "ok";
    case SPH_ERR_INVALID_ARG: return "invalid argument";
    case SPH_ERR_SHAPE: return "shape mismatch";
    case SPH_ERR_DTYPE: return "unsupported or mismatched dtype";
    case SPH_ERR_DEVICE: return "wrong device";
    case SPH_ERR_ALLOC: return "allocation failed";
    case SPH_ERR_OVERFLOW: return "integer overflow";
    case SPH_ERR_UNSUPPORTED: return "unsupported";
    case SPH_ERR_CUDA: return "CUDA error";
    case SPH_ERR_MPI: return "MPI error";
    case SPH_ERR_NCCL: return "NCCL error";
    case SPH_ERR_PARSE: return "parse error";
    case SPH_ERR_INFEASIBLE: return "infeasible request";
    case SPH_ERR_IO: return "I/O error";
    case SPH_ERR_WORKSPACE: return "workspace too small";
    case SPH_ERR_MISMATCH: return "ranks disagree";
    case SPH_ERR_NO_DEVICE: return "no CUDA device";
    case SPH_ERR_INTERNAL: return "internal error";
    case SPH_ERR_NONFINITE: return "non-finite values";
    }
    return "unknown status";
}

const char *sph_last_error(void) { return g_msg; }

#define SPH_STR_(x) #x
#define SPH_STR(x) SPH_STR_(x)
const char *sph_version(void) {
    return SPH_STR(SPH_VERSION_MAJOR) "." SPH_STR(SPH_VERSION_MINOR) "." SPH_STR(SPH_VERSION_PATCH);
}

void sph_clear_error(void) { g_msg[0] = '\0'; }

sph_status sph_err(sph_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_msg, sizeof g_msg, fmt, ap);
    va_end(ap);
    sph_log(3, "error (%s): %s", sph_status_str(s), g_msg);
    return s;
}

sph_status sph_err_prefix(sph_status s, const char *fmt, ...) {
    char prefix[256], old[SPH_MSG_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, g_msg, sizeof old);
    size_t np = strlen(prefix);
    if (np >= sizeof g_msg) np = sizeof g_msg - 1;
    memcpy(g_msg, prefix, np);
    size_t rest = 0;
    while (rest < sizeof old - 1 && old[rest]) rest++;
    if (rest > sizeof g_msg - 1 - np) rest = sizeof g_msg - 1 - np;
    memcpy(g_msg + np, old, rest);
    g_msg[np + rest] = '\0';
    return s;
}

/* ---- logging ---------------------------------------------------------------------------- */

static sph_log_fn g_log_fn;
static void *g_log_user;

void sph_set_log_callback(sph_log_fn fn, void *user) {
    g_log_fn = fn;
    g_log_user = user;
}

static int env_log_level(void) {
    const char *e = getenv("SPH_LOG");
    if (!e) return -1;
    if (!strcmp(e, "debug")) return 3;
    if (!strcmp(e, "info")) return 2;
    if (!strcmp(e, "warn")) return 1;
    if (!strcmp(e, "error")) return 0;
    return -1;
}

void sph_log(int level, const char *fmt, ...) {
    int env = g_log_fn ? -1 : env_log_level();
    if (!g_log_fn && level > env) return;
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (g_log_fn) {
        g_log_fn(level, buf, g_log_user);
    } else {
        static const char *names[] = {"error", "warn", "info", "debug"};
        fprintf(stderr, "spanhead %s: %s\n", names[level < 0 ? 0 : level > 3 ? 3 : level], buf);
    }
}
