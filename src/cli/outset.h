/*
 * outset.h - atomic output sets of the CLI (outset.c): the files of one run appear together, or
 * not at all. (A module of its own over npy.c, so that the toolbox below it, msg.c and
 * num.c, names nothing of the .npy writer the sets use.)
 */
#ifndef SPH_CLI_OUTSET_H
#define SPH_CLI_OUTSET_H

#include <stdint.h>

/* ---- atomic outputs ---------------------------------------------------------------------- */

/* A set of output files in one directory that appear together, from one run, or not at all
 * (outset.c has the scheme). begin(), called before any work: locks the directory (created
 * empty when missing) so a second run on it fails there, refuses any of the names that exists
 * and is not a regular file (a link, a FIFO), makes a private staging directory and arms a
 * SIGINT/SIGTERM/SIGHUP handler that removes the staging. Files are written into the staging;
 * commit() publishes them (one rename of the directory when begin created the target);
 * abort() (or a failed write) removes everything begin made. One set open at a time. */
#define SPH_CLI_MAX_OUT 16

typedef struct sph_cli_outset {
    char *dir;       /* the target */
    char *stage;     /* the private staging directory */
    int created_dir; /* begin made the target (an empty placeholder until commit) */
    int lock_fd;     /* the target's descriptor, flock()ed; -1 when none */
    int n;
    char *names[SPH_CLI_MAX_OUT]; /* every file the run may write (checked by begin) */
    int staged[SPH_CLI_MAX_OUT];
    char err[768];
} sph_cli_outset;

/* dir's parent must exist; files: the NULL-terminated names the run may write. 0, or 1 with
 * s->err (and nothing left behind). */
int sph_cli_outset_begin(sph_cli_outset *s, const char *dir, const char *const *files);
/* Stages DIR/name.npy holding an array of kind ('f', 'i', 'u', 'b') and element size. */
int sph_cli_outset_npy(sph_cli_outset *s, const char *name, char kind, int bytes, int ndim,
                       const int64_t *shape, const void *data);
/* Stages DIR/file (the whole name, e.g. "loss.json") holding text. */
int sph_cli_outset_text(sph_cli_outset *s, const char *file, const char *text);
/* Publishes every staged file. 0, or 1 with s->err (then what was not published is removed).
 * Releases s either way. */
int sph_cli_outset_commit(sph_cli_outset *s);
/* Removes what begin made and was staged; releases s. NULL-safe, and a no-op on a set that
 * was committed, aborted or never begun (zeroed with lock_fd = -1, or memset 0 and then begin
 * failed). */
void sph_cli_outset_abort(sph_cli_outset *s);

#endif
