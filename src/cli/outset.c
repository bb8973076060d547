/*
 * outset.c - atomic output sets (see outset.h): a run's files appear together, from one run, or
 * not at all, whatever a signal or a neighbour does.
 *
 * The scheme, taken in sph_cli_outset_begin before any work:
 *   - the target directory is locked with flock() on its own descriptor (LOCK_EX | LOCK_NB); a
 *     missing target is first created empty (a placeholder) so that there is something to
 *     lock. A second run on the same target fails there, before computing. The lock dies
 *     with the process, so a killed run never leaves a stale lock behind.
 *   - every name the command may write is checked: one that exists and is not a regular file
 *     (a symbolic link, say to /dev/stderr, a FIFO, a device, a directory) is refused, naming
 *     the path, and nothing is written.
 *   - the files are written into a private staging directory (mkdtemp, mode 0700): beside the
 *     target when begin created it (".NAME.XXXXXX"), inside it otherwise (".spanhead.XXXXXX"),
 *     so every rename stays on one filesystem.
 *   - commit publishes in one step when the target was created: rename(staging, target)
 *     replaces the empty placeholder atomically (rename(2) replaces an empty directory). Into
 *     an existing target each file is renamed in turn under the lock, with SIGINT, SIGTERM and
 *     SIGHUP blocked, so no other run's file can come between them and a signal waits until
 *     the set is complete.
 *   - SIGINT, SIGTERM and SIGHUP (unless ignored, as under nohup) run a handler while a set is
 *     open: it unlinks the staged files and removes the staging directory and the placeholder
 *     (async-signal-safe calls only, on paths computed in begin), then re-raises the signal
 *     with its default action. SIGKILL cannot be caught: it leaves the hidden staging
 *     directory (and the placeholder) behind, never a partial set under the final names.
 */
#define _XOPEN_SOURCE 700
#define _DEFAULT_SOURCE /* flock */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include "msg.h"
#include "npy.h"
#include "outset.h"

#define OUT_PATH 4096

/* What the signal handler removes; written only while disarmed, read by the handler. */
static struct {
    volatile sig_atomic_t armed;
    int n;
    char file[SPH_CLI_MAX_OUT][OUT_PATH];
    char stage[OUT_PATH];
    char created[OUT_PATH]; /* the placeholder target, "" when the target existed */
} g_clean;

static const int k_sigs[3] = {SIGINT, SIGTERM, SIGHUP};
static struct sigaction g_old[3];
static int g_installed[3];

static void on_signal(int sig) {
    if (g_clean.armed) {
        for (int k = 0; k < g_clean.n; k++) unlink(g_clean.file[k]);
        rmdir(g_clean.stage);
        if (g_clean.created[0]) rmdir(g_clean.created);
        g_clean.armed = 0;
    }
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
    raise(sig); /* pending until the handler returns, then the default action: termination */
}

static void handlers_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    for (int k = 0; k < 3; k++) sigaddset(&sa.sa_mask, k_sigs[k]);
    for (int k = 0; k < 3; k++) {
        g_installed[k] = 0;
        if (sigaction(k_sigs[k], NULL, &g_old[k]) != 0) continue;
        if (g_old[k].sa_handler == SIG_IGN) continue; /* nohup, a background job: respected */
        g_installed[k] = sigaction(k_sigs[k], &sa, NULL) == 0;
    }
}

static void handlers_restore(void) {
    for (int k = 0; k < 3; k++)
        if (g_installed[k]) sigaction(k_sigs[k], &g_old[k], NULL), g_installed[k] = 0;
}

static void block_signals(sigset_t *old) {
    sigset_t set;
    sigemptyset(&set);
    for (int k = 0; k < 3; k++) sigaddset(&set, k_sigs[k]);
    sigprocmask(SIG_BLOCK, &set, old);
}

// ---- the set -------------------------------------------------------------------------------

static char *dupstr(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* Removes the staged files, the staging directory and the placeholder; disarms; unlocks;
 * frees. Safe on a set begin never finished. */
static void outset_release(sph_cli_outset *s, int remove_target) {
    for (int k = 0; k < s->n; k++) {
        if (s->staged[k] && s->stage) {
            char path[OUT_PATH];
            snprintf(path, sizeof path, "%s/%s", s->stage, s->names[k]);
            unlink(path);
        }
    }
    if (s->stage) rmdir(s->stage);
    if (remove_target && s->created_dir && s->dir) rmdir(s->dir); /* only when still empty */
    g_clean.armed = 0;
    handlers_restore();
    if (s->lock_fd >= 0) close(s->lock_fd); /* releases the lock */
    s->lock_fd = -1;
    for (int k = 0; k < s->n; k++) free(s->names[k]), s->names[k] = NULL;
    free(s->dir), free(s->stage);
    s->dir = s->stage = NULL;
    s->n = 0;
}

static int begin_fail(sph_cli_outset *s) {
    char keep[sizeof s->err];
    memcpy(keep, s->err, sizeof keep);
    outset_release(s, 1);
    memcpy(s->err, keep, sizeof keep);
    return 1;
}

/* Test hooks (tests/cli/test_outputs.sh only): SPH_CLI_TEST_WRITE_DELAY_MS pauses after each
 * staged file, so that a signal sent once the first file shows lands while the set is being
 * written, whatever the machine's speed (a polling test raced a fast write before);
 * SPH_CLI_TEST_BEGIN_DELAY_MS pauses right after the placeholder target is made, so that a
 * signal lands before the handlers are armed. */
static void test_delay(const char *var) {
    const char *v = getenv(var);
    long ms = v ? strtol(v, NULL, 10) : 0;
    if (ms <= 0 || ms > 10000) return;
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0 && errno == EINTR) {
    }
}

static int outset_begin(sph_cli_outset *s, const char *dir, const char *const *files) {
    memset(s, 0, sizeof *s);
    s->lock_fd = -1;
    if (g_clean.armed)
        return sph_cli_err(s->err, sizeof s->err, "--outputs %s: another output set is open", dir);
    struct stat st;
    if (stat(dir, &st) == 0) {
        if (!S_ISDIR(st.st_mode))
            return sph_cli_err(s->err, sizeof s->err, "--outputs %s: not a directory", dir);
    } else if (errno == ENOENT) {
        if (mkdir(dir, 0777) == 0) {
            s->created_dir = 1;
            test_delay("SPH_CLI_TEST_BEGIN_DELAY_MS");
        } else if (errno != EEXIST) { /* EEXIST: a neighbour made it just now; the lock decides */
            return sph_cli_err(s->err, sizeof s->err, "--outputs %s: %s", dir, strerror(errno));
        }
    } else {
        return sph_cli_err(s->err, sizeof s->err, "--outputs %s: %s", dir, strerror(errno));
    }
    if (!(s->dir = dupstr(dir))) {
        sph_cli_err(s->err, sizeof s->err, "--outputs %s: out of memory", dir);
        return begin_fail(s);
    }
    s->lock_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (s->lock_fd < 0) {
        sph_cli_err(s->err, sizeof s->err, "--outputs %s: %s", dir, strerror(errno));
        return begin_fail(s);
    }
    if (flock(s->lock_fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        s->created_dir = 0; /* whoever holds it owns it now */
        if (e == EWOULDBLOCK)
            sph_cli_err(s->err, sizeof s->err, "--outputs %s: another spanhead run is writing "
                        "there (it holds the directory's lock); nothing was computed or written",
                        dir);
        else
            sph_cli_err(s->err, sizeof s->err, "--outputs %s: cannot lock it: %s", dir,
                        strerror(e));
        return begin_fail(s);
    }
    /* the names: each at most once, and none that is (or links to) something else */
    for (int k = 0; files && files[k]; k++) {
        if (s->n == SPH_CLI_MAX_OUT) {
            sph_cli_err(s->err, sizeof s->err, "--outputs: more than %d files", SPH_CLI_MAX_OUT);
            return begin_fail(s);
        }
        char path[OUT_PATH];
        if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, files[k]) >= sizeof path - 32) {
            sph_cli_err(s->err, sizeof s->err, "--outputs %s: path too long", dir);
            return begin_fail(s);
        }
        if (lstat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
            sph_cli_err(s->err, sizeof s->err, "%s: %s, not a regular file: refused (outputs "
                        "are replaced atomically by regular files; remove it or choose another "
                        "--outputs); nothing was computed or written", path,
                        S_ISLNK(st.st_mode) ? "a symbolic link" : S_ISFIFO(st.st_mode) ? "a FIFO"
                        : S_ISDIR(st.st_mode) ? "a directory" : "a device or socket");
            return begin_fail(s);
        }
        if (!(s->names[s->n] = dupstr(files[k]))) {
            sph_cli_err(s->err, sizeof s->err, "--outputs %s: out of memory", dir);
            return begin_fail(s);
        }
        s->n++;
    }
    /* the staging directory: beside a created target (renamed onto it), inside an existing one */
    char tmpl[OUT_PATH];
    const char *slash = strrchr(dir, '/');
    int n;
    if (s->created_dir) {
        const char *base = slash ? slash + 1 : dir;
        n = slash ? snprintf(tmpl, sizeof tmpl, "%.*s/.%s.XXXXXX", (int)(slash - dir), dir, base)
                  : snprintf(tmpl, sizeof tmpl, ".%s.XXXXXX", base);
    } else {
        n = snprintf(tmpl, sizeof tmpl, "%s/.spanhead.XXXXXX", dir);
    }
    if (n < 0 || (size_t)n >= sizeof tmpl - 64) {
        sph_cli_err(s->err, sizeof s->err, "--outputs %s: path too long", dir);
        return begin_fail(s);
    }
    if (!mkdtemp(tmpl)) {
        sph_cli_err(s->err, sizeof s->err, "--outputs %s: cannot create a staging directory "
                    "(%s): %s", dir, tmpl, strerror(errno));
        return begin_fail(s);
    }
    if (!(s->stage = dupstr(tmpl))) {
        rmdir(tmpl);
        sph_cli_err(s->err, sizeof s->err, "--outputs %s: out of memory", dir);
        return begin_fail(s);
    }
    /* what the signal handler removes, then armed */
    g_clean.n = s->n;
    for (int k = 0; k < s->n; k++)
        snprintf(g_clean.file[k], OUT_PATH, "%s/%s", s->stage, s->names[k]);
    snprintf(g_clean.stage, OUT_PATH, "%s", s->stage);
    snprintf(g_clean.created, OUT_PATH, "%s", s->created_dir ? dir : "");
    g_clean.armed = 1;
    handlers_install();
    return 0;
}

int sph_cli_outset_begin(sph_cli_outset *s, const char *dir, const char *const *files) {
    /* A signal between the placeholder's mkdir and the handlers' arming would end the run
     * with the placeholder left behind (test_outputs.sh's "SIGTERM while computing" caught it
     * on a loaded machine): the three signals wait until begin is done. Armed, the handler
     * then removes what begin made; failed, begin removed it itself and the default action
     * follows. */
    sigset_t old;
    block_signals(&old);
    const int r = outset_begin(s, dir, files);
    sigprocmask(SIG_SETMASK, &old, NULL);
    return r;
}

/* Abort keeping the message that says why. */
static int outset_fail(sph_cli_outset *s) {
    char keep[sizeof s->err];
    memcpy(keep, s->err, sizeof keep);
    sph_cli_outset_abort(s);
    memcpy(s->err, keep, sizeof keep);
    return 1;
}

/* Stages STAGE/file written by put(f, ctx, err): the one body of the staged outputs. */
static int outset_stage(sph_cli_outset *s, const char *file,
                        int (*put)(FILE *f, const void *ctx, char *err, size_t errlen),
                        const void *ctx) {
    if (!s->stage) return sph_cli_err(s->err, sizeof s->err, "--outputs: no output set open");
    int k = 0;
    while (k < s->n && strcmp(s->names[k], file)) k++;
    if (k == s->n) {
        sph_cli_err(s->err, sizeof s->err, "--outputs %s: %s is not among the names begin "
                    "checked", s->dir, file);
        return outset_fail(s);
    }
    char path[OUT_PATH], final[OUT_PATH];
    snprintf(path, sizeof path, "%s/%s", s->stage, file);
    snprintf(final, sizeof final, "%s/%s", s->dir, file);
    s->staged[k] = 1;
    FILE *f = fopen(path, "wb");
    if (!f) {
        sph_cli_err(s->err, sizeof s->err, "%s: %s", final, strerror(errno));
        return outset_fail(s);
    }
    char err[512];
    int rc = put(f, ctx, err, sizeof err);
    errno = 0;
    if (fclose(f) != 0 && !rc) {
        snprintf(err, sizeof err, "write failed: %s", errno ? strerror(errno) : "I/O error");
        rc = -1;
    }
    if (rc) {
        sph_cli_err(s->err, sizeof s->err, "%s: %s", final, err);
        return outset_fail(s);
    }
    return 0;
}

typedef struct npy_put {
    char kind;
    int bytes, ndim;
    const int64_t *shape;
    const void *data;
} npy_put;

static int put_npy(FILE *f, const void *ctx, char *err, size_t errlen) {
    const npy_put *n = ctx;
    return npy_write_stream(f, n->kind, n->bytes, n->ndim, n->shape, n->data, err, errlen);
}

static int put_text(FILE *f, const void *ctx, char *err, size_t errlen) {
    const char *text = ctx;
    size_t len = strlen(text);
    if (fwrite(text, 1, len, f) != len) {
        snprintf(err, errlen, "write failed: %s", errno ? strerror(errno) : "I/O error");
        return -1;
    }
    return 0;
}

int sph_cli_outset_npy(sph_cli_outset *s, const char *name, char kind, int bytes, int ndim,
                       const int64_t *shape, const void *data) {
    char file[512];
    if ((size_t)snprintf(file, sizeof file, "%s.npy", name) >= sizeof file) {
        sph_cli_err(s->err, sizeof s->err, "--outputs: name %s too long", name);
        return outset_fail(s);
    }
    const npy_put n = {kind, bytes, ndim, shape, data};
    if (outset_stage(s, file, put_npy, &n)) return -1;
    test_delay("SPH_CLI_TEST_WRITE_DELAY_MS");
    return 0;
}

int sph_cli_outset_text(sph_cli_outset *s, const char *file, const char *text) {
    return outset_stage(s, file, put_text, text);
}

int sph_cli_outset_commit(sph_cli_outset *s) {
    if (!s->stage) return sph_cli_err(s->err, sizeof s->err, "--outputs: no output set open");
    sigset_t old;
    block_signals(&old); /* a signal now waits until the set is published or removed */
    int rc = 0;
    if (s->created_dir) {
        /* one step: the staging directory replaces the empty placeholder */
        mode_t um = umask(0);
        umask(um);
        chmod(s->stage, 0777 & ~um); /* mkdtemp made it 0700: the mode mkdir would give */
        if (rename(s->stage, s->dir) != 0) {
            rc = sph_cli_err(s->err, sizeof s->err, "--outputs %s: %s (something else was "
                             "written there during the run); nothing was published", s->dir,
                             strerror(errno));
        } else {
            for (int k = 0; k < s->n; k++) s->staged[k] = 0;
            free(s->stage);
            s->stage = NULL;
            s->created_dir = 0; /* it is the published set now */
        }
    } else {
        int done = 0, staged = 0;
        for (int k = 0; k < s->n; k++) staged += s->staged[k];
        for (int k = 0; k < s->n && !rc; k++) {
            if (!s->staged[k]) continue;
            char from[OUT_PATH], to[OUT_PATH];
            snprintf(from, sizeof from, "%s/%s", s->stage, s->names[k]);
            snprintf(to, sizeof to, "%s/%s", s->dir, s->names[k]);
            if (rename(from, to) != 0) {
                rc = sph_cli_err(s->err, sizeof s->err, "%s: %s (%d of the %d files were "
                                 "already published)", to, strerror(errno), done, staged);
                break;
            }
            s->staged[k] = 0;
            done++;
        }
    }
    outset_release(s, rc != 0);
    sigprocmask(SIG_SETMASK, &old, NULL);
    return rc;
}

void sph_cli_outset_abort(sph_cli_outset *s) {
    if (!s || !s->dir) return;
    outset_release(s, 1);
}
