/*
 * json_util.c - see json_util.h. JSON numbers arrive as doubles (cJSON); an integer field must
 * be integral and strictly within +-2^53, where doubles still count every integer exactly; any
 * integer text at or beyond 2^53 parses to a double at or beyond it and is refused, so no value
 * is silently rounded.
 */
#include "json_util.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "msg.h"
#include "num.h"

#define MAX_EXACT 9007199254740992.0 /* 2^53: larger texts round onto or past it */

#define fail sph_cli_err

/* The text must hold nothing but the document: no NUL byte (a C reader would stop there
 * silently), and after the value only white space. */
static int no_nul(const char *text, size_t len, char *err, size_t errlen) {
    const char *z = memchr(text, '\0', len);
    if (z) return fail(err, errlen, "byte %zu: NUL byte in the input", (size_t)(z - text));
    return 0;
}

static int parse_doc(const char *text, size_t len, cJSON **root, char *err, size_t errlen) {
    const char *end = NULL;
    *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!*root) {
        const size_t at = end && end >= text ? (size_t)(end - text) : 0;
        return fail(err, errlen, "malformed JSON near byte %zu", at);
    }
    size_t at = end && end >= text ? (size_t)(end - text) : len;
    while (at < len && isspace((unsigned char)text[at])) at++;
    if (at < len) {
        cJSON_Delete(*root);
        *root = NULL;
        int shown = 0; /* an excerpt of printable characters, so the message stays one line */
        while (shown < 16 && at + (size_t)shown < len && isprint((unsigned char)text[at + (size_t)shown]))
            shown++;
        return fail(err, errlen, "byte %zu: data after the JSON document ('%.*s')", at, shown,
                    text + at);
    }
    return 0;
}

int sph_cli_read_file(const char *path, char **text, size_t *len, char *err, size_t errlen) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) return fail(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n + 1 >= cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - 1 - n, f);
        n += got;
        if (got == 0) break;
    }
    int bad = f != stdin ? ferror(f) : ferror(stdin);
    if (f != stdin) fclose(f);
    if (!buf) return fail(err, errlen, "%s: out of memory while reading", path);
    if (bad) {
        free(buf);
        return fail(err, errlen, "%s: read error", path);
    }
    buf[n] = '\0';
    *text = buf;
    *len = n;
    return 0;
}

// ---- JSON values ------------------------------------------------------------------------------

/* An integral JSON number within +-2^53. */
static int json_i64(const cJSON *v, int64_t *out) {
    if (!cJSON_IsNumber(v)) return 1;
    const double d = v->valuedouble;
    if (!(d > -MAX_EXACT && d < MAX_EXACT) || d != floor(d)) return 1;
    *out = (int64_t)d;
    return 0;
}

typedef struct why {
    char s[128];
} why;

static const char *kind(const cJSON *v);

/* What keeps v from being an exact integer, as a message says it (issue 26 case 17: a value
 * past 2^53 used to read "out of range, expected an integer >= 1"). */
static why why_not_i64(const cJSON *v) {
    why w;
    if (!cJSON_IsNumber(v)) {
        snprintf(w.s, sizeof w.s, "is %s", kind(v));
    } else {
        const double d = v->valuedouble;
        if (!(d > -MAX_EXACT && d < MAX_EXACT))
            snprintf(w.s, sizeof w.s, "%.17g, outside +-(2^53 - 1) (past it a JSON number is no "
                     "longer an exact integer)", d);
        else
            snprintf(w.s, sizeof w.s, "%.17g, not an integer", d);
    }
    return w;
}

static const char *kind(const cJSON *v) {
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsObject(v)) return "an object";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsNull(v)) return "null";
    return "invalid";
}

/* A 0/1 mask entry: 0, 1, false or true. */
static int json_bit(const cJSON *v, uint8_t *out) {
    if (cJSON_IsBool(v)) {
        *out = cJSON_IsTrue(v) ? 1 : 0;
        return 0;
    }
    int64_t x;
    if (json_i64(v, &x) || (x != 0 && x != 1)) return 1;
    *out = (uint8_t)x;
    return 0;
}

/* A rows x cols matrix of bits. Row sizes are checked before anything is allocated, so the
 * allocation never exceeds the number of values actually present in the input. */
static int parse_bits(const cJSON *m, const char *key, int64_t rows, int64_t cols, uint8_t **out,
                      char *err, size_t errlen) {
    if (!cJSON_IsArray(m)) return fail(err, errlen, "%s: is %s, expected an array of rows", key, kind(m));
    if (cJSON_GetArraySize(m) != rows)
        return fail(err, errlen, "%s: %d rows, expected %lld (the rows of loss_mask)", key,
                    cJSON_GetArraySize(m), (long long)rows);
    int64_t b = 0;
    const cJSON *row;
    cJSON_ArrayForEach(row, m) {
        if (!cJSON_IsArray(row))
            return fail(err, errlen, "%s[%lld]: is %s, expected an array", key, (long long)b, kind(row));
        if (cJSON_GetArraySize(row) != cols)
            return fail(err, errlen, "%s[%lld]: %d entries, expected %lld", key, (long long)b,
                        cJSON_GetArraySize(row), (long long)cols);
        b++;
    }
    uint8_t *buf = malloc((size_t)(rows * cols) + 1);
    if (!buf) return fail(err, errlen, "%s: out of memory for %lld x %lld", key, (long long)rows, (long long)cols);
    b = 0;
    cJSON_ArrayForEach(row, m) {
        int64_t c = 0;
        const cJSON *v;
        cJSON_ArrayForEach(v, row) {
            if (json_bit(v, &buf[b * cols + c])) {
                free(buf);
                return fail(err, errlen, "%s[%lld][%lld]: is %s, expected 0 or 1", key, (long long)b,
                            (long long)c, kind(v));
            }
            c++;
        }
        b++;
    }
    *out = buf;
    return 0;
}

void sph_cli_batch_free(sph_cli_batch *b) {
    if (!b) return;
    free(b->loss_mask);
    free(b->attention_mask);
    free(b->sub_seq_lengths);
    free(b->sub_seq_counts);
    b->loss_mask = b->attention_mask = NULL;
    b->sub_seq_lengths = b->sub_seq_counts = NULL;
}

static int batch_from(const cJSON *root, sph_cli_batch *bt, char *err, size_t errlen) {
    if (!cJSON_IsObject(root)) return fail(err, errlen, "top level: is %s, expected an object", kind(root));
    const cJSON *it;
    cJSON_ArrayForEach(it, root) {
        for (const cJSON *jt = root->child; jt != it; jt = jt->next)
            if (!strcmp(jt->string, it->string))
                return fail(err, errlen, "key \"%.64s\" given twice", it->string);
        static const char *known[] = {"layout", "sequence_length", "num_actions", "loss_mask",
                                      "attention_mask", "sub_seq_lengths"};
        int ok = 0;
        for (size_t k = 0; k < sizeof known / sizeof known[0]; k++) ok |= !strcmp(it->string, known[k]);
        if (!ok) return fail(err, errlen, "unknown key \"%.64s\"", it->string);
    }
    sph_batch_desc d = SPH_BATCH_DESC_INIT;
    const cJSON *lay = cJSON_GetObjectItemCaseSensitive(root, "layout");
    if (!cJSON_IsString(lay))
        return fail(err, errlen, "layout: %s, expected \"packed\" or \"unpacked\"",
                    lay ? kind(lay) : "missing");
    if (!strcmp(lay->valuestring, "packed")) d.layout = SPH_LAYOUT_PACKED;
    else if (!strcmp(lay->valuestring, "unpacked")) d.layout = SPH_LAYOUT_UNPACKED;
    else return fail(err, errlen, "layout: \"%.64s\", expected \"packed\" or \"unpacked\"", lay->valuestring);
    const cJSON *sv = cJSON_GetObjectItemCaseSensitive(root, "sequence_length");
    if (!sv) return fail(err, errlen, "sequence_length: missing, expected an integer >= 1");
    if (json_i64(sv, &d.seq_len))
        return fail(err, errlen, "sequence_length: %s, expected an integer >= 1",
                    cJSON_IsNumber(sv) ? why_not_i64(sv).s : kind(sv));
    if (d.seq_len < 1)
        return fail(err, errlen, "sequence_length: %lld, expected an integer >= 1", (long long)d.seq_len);
    const cJSON *av = cJSON_GetObjectItemCaseSensitive(root, "num_actions");
    if (!av) return fail(err, errlen, "num_actions: missing, expected an integer >= 0");
    if (json_i64(av, &d.num_actions))
        return fail(err, errlen, "num_actions: %s, expected an integer >= 0",
                    cJSON_IsNumber(av) ? why_not_i64(av).s : kind(av));
    if (d.num_actions < 0)
        return fail(err, errlen, "num_actions: %lld, expected an integer >= 0", (long long)d.num_actions);
    if (d.num_actions > d.seq_len - 1)
        return fail(err, errlen, "num_actions: %lld, expected <= sequence_length - 1 = %lld",
                    (long long)d.num_actions, (long long)(d.seq_len - 1));
    const cJSON *lm = cJSON_GetObjectItemCaseSensitive(root, "loss_mask");
    if (!cJSON_IsArray(lm))
        return fail(err, errlen, "loss_mask: %s, expected an array of rows", lm ? kind(lm) : "missing");
    d.batch = cJSON_GetArraySize(lm);
    if (parse_bits(lm, "loss_mask", d.batch, d.num_actions, &bt->loss_mask, err, errlen)) return 1;
    d.loss_mask = bt->loss_mask;
    const cJSON *am = cJSON_GetObjectItemCaseSensitive(root, "attention_mask");
    if (am && !cJSON_IsNull(am)) {
        if (parse_bits(am, "attention_mask", d.batch, d.seq_len, &bt->attention_mask, err, errlen))
            return 1;
        d.attention_mask = bt->attention_mask;
    }
    const cJSON *ss = cJSON_GetObjectItemCaseSensitive(root, "sub_seq_lengths");
    if (ss && !cJSON_IsNull(ss)) {
        if (!cJSON_IsArray(ss)) return fail(err, errlen, "sub_seq_lengths: is %s, expected an array of rows", kind(ss));
        if (cJSON_GetArraySize(ss) != d.batch)
            return fail(err, errlen, "sub_seq_lengths: %d rows, expected %lld (the rows of loss_mask)",
                        cJSON_GetArraySize(ss), (long long)d.batch);
        int64_t total = 0;
        const cJSON *row;
        cJSON_ArrayForEach(row, ss) {
            if (!cJSON_IsArray(row)) return fail(err, errlen, "sub_seq_lengths[]: is %s, expected an array", kind(row));
            total += cJSON_GetArraySize(row);
        }
        bt->sub_seq_counts = malloc(sizeof(int64_t) * (size_t)(d.batch + 1));
        bt->sub_seq_lengths = malloc(sizeof(int64_t) * (size_t)(total + 1));
        if (!bt->sub_seq_counts || !bt->sub_seq_lengths) return fail(err, errlen, "sub_seq_lengths: out of memory");
        int64_t b = 0, k = 0;
        cJSON_ArrayForEach(row, ss) {
            bt->sub_seq_counts[b] = cJSON_GetArraySize(row);
            int64_t j = 0;
            const cJSON *v;
            cJSON_ArrayForEach(v, row) {
                if (json_i64(v, &bt->sub_seq_lengths[k]))
                    return fail(err, errlen, "sub_seq_lengths[%lld][%lld]: %s, expected an integer",
                                (long long)b, (long long)j, why_not_i64(v).s);
                k++;
                j++;
            }
            b++;
        }
        d.sub_seq_lengths = bt->sub_seq_lengths;
        d.sub_seq_counts = bt->sub_seq_counts;
    }
    bt->desc = d;
    return 0;
}

int sph_cli_batch_parse(const char *text, size_t len, sph_cli_batch *out, char *err,
                        size_t errlen) {
    memset(out, 0, sizeof *out);
    cJSON *root = NULL;
    if (no_nul(text, len, err, errlen) || parse_doc(text, len, &root, err, errlen)) return 1;
    int rc = batch_from(root, out, err, errlen);
    cJSON_Delete(root);
    if (rc) sph_cli_batch_free(out);
    return rc;
}

// ---- lengths ----------------------------------------------------------------------------------

int sph_cli_lengths_parse(const char *text, size_t len, int64_t **lengths, int64_t *n, char *err,
                          size_t errlen) {
    *lengths = NULL;
    *n = 0;
    if (no_nul(text, len, err, errlen)) return 1;
    size_t i = 0;
    while (i < len && isspace((unsigned char)text[i])) i++;
    if (i < len && text[i] == '[') {
        cJSON *root = NULL;
        if (parse_doc(text, len, &root, err, errlen)) return 1;
        if (!cJSON_IsArray(root)) {
            cJSON_Delete(root);
            return fail(err, errlen, "expected a JSON array of lengths");
        }
        const int64_t m = cJSON_GetArraySize(root);
        int64_t *v = malloc(sizeof(int64_t) * (size_t)(m + 1));
        if (!v) {
            cJSON_Delete(root);
            return fail(err, errlen, "out of memory for %lld lengths", (long long)m);
        }
        int64_t k = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, root) {
            if (json_i64(e, &v[k])) {
                int rc = fail(err, errlen, "lengths[%lld]: %s, expected an integer", (long long)k,
                              why_not_i64(e).s);
                free(v);
                cJSON_Delete(root);
                return rc;
            }
            k++;
        }
        cJSON_Delete(root);
        *lengths = v;
        *n = m;
        return 0;
    }
    /* one integer per line */
    int64_t cap = 1024, m = 0, line = 1;
    int64_t *v = malloc(sizeof(int64_t) * (size_t)cap);
    if (!v) return fail(err, errlen, "out of memory");
    size_t p = 0;
    while (p < len) {
        size_t e = p;
        while (e < len && text[e] != '\n') e++;
        size_t a = p, b = e;
        while (a < b && isspace((unsigned char)text[a])) a++;
        while (b > a && isspace((unsigned char)text[b - 1])) b--;
        if (b > a) {
            char tok[32];
            int64_t x;
            if (b - a >= sizeof tok) {
                free(v);
                return fail(err, errlen, "line %lld: '%.20s...' is not an integer", (long long)line, text + a);
            }
            memcpy(tok, text + a, b - a);
            tok[b - a] = '\0';
            if (sph_cli_parse_i64(tok, INT64_MIN, INT64_MAX, &x)) {
                free(v);
                return fail(err, errlen, "line %lld: '%s' is not an integer", (long long)line, tok);
            }
            if (m == cap) {
                int64_t *nv = realloc(v, sizeof(int64_t) * (size_t)(cap * 2));
                if (!nv) {
                    free(v);
                    return fail(err, errlen, "out of memory");
                }
                v = nv;
                cap *= 2;
            }
            v[m++] = x;
        }
        p = e + 1;
        line++;
    }
    *lengths = v;
    *n = m;
    return 0;
}

// ---- output ------------------------------------------------------------------------------------

void sph_cli_write_i64_array(FILE *f, const int64_t *v, int64_t n) {
    fputc('[', f);
    for (int64_t i = 0; i < n; i++) fprintf(f, i ? ",%lld" : "%lld", (long long)v[i]);
    fputc(']', f);
}

void sph_cli_write_u8_array(FILE *f, const uint8_t *v, int64_t n) {
    fputc('[', f);
    for (int64_t i = 0; i < n; i++) {
        if (i) fputc(',', f);
        fputc(v[i] ? '1' : '0', f);
    }
    fputc(']', f);
}

void sph_cli_json_str(FILE *f, const char *s) {
    if (!s) {
        fputs("null", f);
        return;
    }
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20 || c == 0x7f) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

void sph_cli_json_num(FILE *f, const char *fmt, double x) {
    if (isfinite(x)) fprintf(f, fmt, x);
    else fputs("null", f);
}
