/*
 * msg.h - the CLI's messages: a failure as one line "spanhead <cmd>: ..." on stderr, a message
 * into a caller's buffer, and the check that standard output was written (a full disk, a
 * closed pipe).
 */
#ifndef SPH_CLI_MSG_H
#define SPH_CLI_MSG_H

#include <stddef.h>

/* "spanhead <cmd>: <message>" on stderr, one line; returns code. */
int sph_cli_fail(const char *cmd, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Formats into err (always NUL-terminated); returns 1 so that `return sph_cli_err(...)` reads
 * as a failure in the readers' convention. */
int sph_cli_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Flushes stdout and reports a write error on it (a full disk, a closed pipe) as
 * "spanhead <cmd>: writing standard output: <reason>"; returns rc, or 1 when rc was 0 and
 * the output failed. */
int sph_cli_close_stdout(const char *cmd, int rc);

#endif
