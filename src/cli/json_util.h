/*
 * json_util.h - input readers and output writers shared by the CLI's metadata subcommands
 * (pack, layout, spans) and by the fuzz targets: whole-file reading, the batch-description and
 * length-list parsers (cJSON) and compact JSON writers. Uses only
 * the public header. Every reader returns 0 on success or fills err with a one-line message
 * naming the offending key, index or value and returns non-zero; nothing here exits.
 */
#ifndef SPH_CLI_JSON_UTIL_H
#define SPH_CLI_JSON_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "spanhead.h"

/* Reads the file at path ("-" = stdin) into a NUL-terminated malloc'd buffer. */
int sph_cli_read_file(const char *path, char **text, size_t *len, char *err, size_t errlen);

/* A batch description parsed from JSON, owning its arrays. */
typedef struct sph_cli_batch {
    sph_batch_desc desc;
    uint8_t *loss_mask;       /* [B, A] */
    uint8_t *attention_mask;  /* [B, S] or NULL */
    int64_t *sub_seq_lengths; /* flattened, or NULL */
    int64_t *sub_seq_counts;  /* [B], or NULL */
} sph_cli_batch;

/* Parses {"layout":"packed"|"unpacked","sequence_length":S,"num_actions":A,
 * "loss_mask":[[..A..] x B],"attention_mask":[[..S..] x B] (optional),
 * "sub_seq_lengths":[[..] x B] (optional)}. Mask entries are 0/1 or false/true. Unknown keys
 * are refused (they are usually typos), and so is a key given twice, a NUL byte or data
 * after the document. Range checks that need the parallel configuration are
 * left to sph_spans_build. On failure *out holds nothing to free. */
int sph_cli_batch_parse(const char *text, size_t len, sph_cli_batch *out, char *err,
                        size_t errlen);
void sph_cli_batch_free(sph_cli_batch *b); /* NULL-safe, idempotent */

/* Sequence lengths from a JSON array of integers, or from text with one integer per line
 * (blank lines ignored). Values are not range-checked here (sph_pack does it). *lengths is
 * malloc'd (possibly with *n = 0). A NUL byte anywhere, or data after the JSON array, is an
 * error. */
int sph_cli_lengths_parse(const char *text, size_t len, int64_t **lengths, int64_t *n, char *err,
                          size_t errlen);

/* Compact JSON writers. Strings are quoted and escaped (", \, control characters as \u00XX;
 * NULL is null); a number is printed with fmt when finite and as null when not (JSON has no
 * inf or NaN: a non-finite value in any output of the CLI reads as null). */
void sph_cli_json_str(FILE *f, const char *s);
void sph_cli_json_num(FILE *f, const char *fmt, double x);
void sph_cli_write_i64_array(FILE *f, const int64_t *v, int64_t n);
void sph_cli_write_u8_array(FILE *f, const uint8_t *v, int64_t n);

#endif
