/*
 * msg.c - see msg.h.
 */
#include "msg.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int sph_cli_fail(const char *cmd, int code, const char *fmt, ...) {
    va_list ap;
    fflush(stdout); /* what was printed before the failure comes first */
    fprintf(stderr, "spanhead %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return code;
}

int sph_cli_err(char *err, size_t errlen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (err && errlen) vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return 1;
}

int sph_cli_close_stdout(const char *cmd, int rc) {
    static int reported; /* a runner and main() both close: the error is said once */
    errno = 0;
    int bad = fflush(stdout) != 0 || ferror(stdout);
    if (!bad) return rc;
    int e = errno;
    if (reported++) return rc ? rc : 1;
    fprintf(stderr, "spanhead %s: writing standard output: %s\n", cmd,
            e ? strerror(e) : "write error");
    return rc ? rc : 1;
}
