/*
 * spans.c - active masks and active spans from an RL loss mask (docs/design.md sections
 * 3.5 and 3.6).
 *
 * A length-S row carries loss_mask[b, 0..A-1] on its last A token positions S-A .. S-1.
 * Prediction row s of a sequence predicts the sequence's token s+1, so the token at offset
 * q >= 1 of a sequence is predicted by that sequence's row q-1 and the final row of every
 * sequence predicts nothing.
 *
 *   unpacked: row b occupies flattened rows [bS, (b+1)S); rows S-1-A .. S-2 carry the mask.
 *             Only valid when C = 1 and S is a multiple of the unpacked alignment: padding or
 *             CP sharding would move rows, and spans over moved rows zero real gradients.
 *   packed:   every sequence (a sub-sequence, the attended columns of a row, or a whole row)
 *             is one segment of the packed layout (sph_layout_packed); the active row of a
 *             token at offset q is cu_seqlens_padded[k] + q - 1; padding rows stay inactive.
 *             The layout is then cut into this CP rank's rows (sph_cp_local_rows per segment).
 *
 * Spans are the ordered [start, end) runs of active local rows, merged when the inactive gap
 * between them is at most G rows, so a kernel walking spans touches every active row once and
 * a few inactive ones. The builder validates its own output (coverage, counts) and reports a
 * broken invariant as SPH_ERR_INTERNAL rather than handing out spans that skip real tokens.
 */
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "pack/pack_internal.h"

// ---- spans over a mask ---------------------------------------------------------------------

sph_status sph_spans_from_mask(const uint8_t *mask, int64_t n, int64_t gap, int64_t *spans,
                               int64_t *n_spans) {
    SPH_CHECK(n >= 0, SPH_ERR_INVALID_ARG, "n: %lld, expected >= 0", (long long)n);
    SPH_CHECK(gap >= 0, SPH_ERR_INVALID_ARG, "gap: %lld, expected >= 0", (long long)gap);
    SPH_CHECK(n == 0 || mask, SPH_ERR_INVALID_ARG, "mask: is NULL with n = %lld",
              (long long)n);
    SPH_CHECK(n == 0 || spans, SPH_ERR_INVALID_ARG,
              "spans: is NULL, expected room for 2 * ((n + 1) / 2) = %lld entries",
              (long long)(2 * ((n + 1) / 2)));
    SPH_CHECK(n_spans, SPH_ERR_INVALID_ARG, "n_spans: is NULL");
    int64_t k = 0;
    for (int64_t i = 0; i < n;) {
        if (!mask[i]) {
            i++;
            continue;
        }
        int64_t j = i + 1;
        while (j < n && mask[j]) j++;
        /* run [i, j); the gap to the previous span is i - end_prev inactive rows */
        if (k > 0 && i - spans[2 * k - 1] <= gap) {
            spans[2 * k - 1] = j;
        } else {
            spans[2 * k] = i;
            spans[2 * k + 1] = j;
            k++;
        }
        i = j;
    }
    *n_spans = k;
    return SPH_OK;
}

sph_status sph_spans_validate(const int64_t *spans, int64_t n_spans, int64_t n,
                              const uint8_t *mask) {
    SPH_CHECK(n >= 0, SPH_ERR_INVALID_ARG, "n: %lld, expected >= 0", (long long)n);
    SPH_CHECK(n_spans >= 0, SPH_ERR_INVALID_ARG, "n_spans: %lld, expected >= 0",
              (long long)n_spans);
    SPH_CHECK(n_spans == 0 || spans, SPH_ERR_INVALID_ARG, "spans: is NULL with n_spans = %lld",
              (long long)n_spans);
    int64_t prev_end = 0;
    for (int64_t k = 0; k < n_spans; k++) {
        const int64_t s = spans[2 * k], e = spans[2 * k + 1];
        SPH_CHECK(s >= 0 && s < e && e <= n, SPH_ERR_INVALID_ARG,
                  "spans[%lld]: [%lld, %lld), expected 0 <= start < end <= n = %lld",
                  (long long)k, (long long)s, (long long)e, (long long)n);
        SPH_CHECK(s >= prev_end, SPH_ERR_INVALID_ARG,
                  "spans[%lld]: starts at %lld before the previous span's end %lld "
                  "(spans must be ordered and disjoint)",
                  (long long)k, (long long)s, (long long)prev_end);
        if (mask)
            for (int64_t i = prev_end; i < s; i++)
                SPH_CHECK(!mask[i], SPH_ERR_INVALID_ARG,
                          "spans: active row %lld lies outside every span", (long long)i);
        prev_end = e;
    }
    if (mask)
        for (int64_t i = prev_end; i < n; i++)
            SPH_CHECK(!mask[i], SPH_ERR_INVALID_ARG,
                      "spans: active row %lld lies outside every span", (long long)i);
    return SPH_OK;
}

void sph_spans_free(sph_spans *s) {
    if (!s) return;
    sph_free(s->active_mask);
    sph_free(s->local_mask);
    sph_free(s->spans);
    sph_free(s->cu_seqlens_padded);
    sph_free(s);
}

// ---- batch description checks ---------------------------------------------------------------

static sph_status check_01(const uint8_t *m, int64_t rows, int64_t cols, const char *name) {
    for (int64_t b = 0; b < rows; b++)
        for (int64_t c = 0; c < cols; c++)
            SPH_CHECK(m[b * cols + c] <= 1, SPH_ERR_INVALID_ARG,
                      "%s[%lld][%lld]: %u, expected 0 or 1", name, (long long)b, (long long)c,
                      (unsigned)m[b * cols + c]);
    return SPH_OK;
}

static sph_status check_desc(const sph_batch_desc *d, const sph_spans_opts *o) {
    SPH_CHECK(d, SPH_ERR_INVALID_ARG, "desc: is NULL");
    SPH_CHECK(o, SPH_ERR_INVALID_ARG, "opts: is NULL (use SPH_SPANS_OPTS_INIT)");
    SPH_CHECK(d->struct_size >= sizeof(sph_batch_desc), SPH_ERR_INVALID_ARG,
              "desc.struct_size: %zu, expected %zu (use SPH_BATCH_DESC_INIT)", d->struct_size,
              sizeof(sph_batch_desc));
    SPH_CHECK(o->struct_size >= sizeof(sph_spans_opts), SPH_ERR_INVALID_ARG,
              "opts.struct_size: %zu, expected %zu (use SPH_SPANS_OPTS_INIT)", o->struct_size,
              sizeof(sph_spans_opts));
    SPH_TRY(sph_parallel_check(&o->par, "opts.par"));
    SPH_CHECK(o->cp_rank >= 0 && o->cp_rank < o->par.cp, SPH_ERR_INVALID_ARG,
              "opts.cp_rank: %lld, expected in [0, %lld)", (long long)o->cp_rank,
              (long long)o->par.cp);
    SPH_CHECK(o->gap >= 0, SPH_ERR_INVALID_ARG, "opts.gap: %lld, expected >= 0",
              (long long)o->gap);
    SPH_CHECK(d->layout == SPH_LAYOUT_UNPACKED || d->layout == SPH_LAYOUT_PACKED,
              SPH_ERR_INVALID_ARG, "desc.layout: %d, expected SPH_LAYOUT_UNPACKED or _PACKED",
              (int)d->layout);
    SPH_CHECK(d->batch >= 0, SPH_ERR_INVALID_ARG, "desc.batch: %lld, expected >= 0",
              (long long)d->batch);
    SPH_CHECK(d->seq_len >= 1, SPH_ERR_INVALID_ARG, "desc.seq_len: %lld, expected >= 1",
              (long long)d->seq_len);
    SPH_CHECK(d->num_actions >= 0 && d->num_actions <= d->seq_len - 1, SPH_ERR_INVALID_ARG,
              "desc.num_actions: %lld, expected 0 <= A <= seq_len - 1 = %lld",
              (long long)d->num_actions, (long long)(d->seq_len - 1));
    int64_t bs, ba;
    SPH_CHECK(sph_mul_i64(d->batch, d->seq_len, &bs), SPH_ERR_OVERFLOW,
              "desc: batch * seq_len overflows int64 (%lld * %lld)", (long long)d->batch,
              (long long)d->seq_len);
    (void)sph_mul_i64(d->batch, d->num_actions, &ba); /* A < S: cannot overflow when B*S fits */
    SPH_CHECK(ba == 0 || d->loss_mask, SPH_ERR_INVALID_ARG,
              "desc.loss_mask: is NULL, expected [%lld, %lld]", (long long)d->batch,
              (long long)d->num_actions);
    if (ba) SPH_TRY(check_01(d->loss_mask, d->batch, d->num_actions, "loss_mask"));
    if (d->attention_mask && bs)
        SPH_TRY(check_01(d->attention_mask, d->batch, d->seq_len, "attention_mask"));
    if (d->sub_seq_lengths || d->sub_seq_counts) {
        SPH_CHECK(d->layout == SPH_LAYOUT_PACKED, SPH_ERR_INVALID_ARG,
                  "desc.sub_seq_lengths: given with the unpacked layout (packed only)");
        SPH_CHECK(d->batch == 0 || d->sub_seq_counts, SPH_ERR_INVALID_ARG,
                  "desc.sub_seq_counts: is NULL while sub_seq_lengths is given");
        SPH_CHECK(!d->attention_mask, SPH_ERR_INVALID_ARG,
                  "desc: both attention_mask and sub_seq_lengths given, expected at most one");
        int64_t idx = 0;
        for (int64_t b = 0; b < d->batch; b++) {
            const int64_t c = d->sub_seq_counts[b];
            SPH_CHECK(c >= 0 && c <= d->seq_len, SPH_ERR_INVALID_ARG,
                      "sub_seq_counts[%lld]: %lld, expected 0 <= count <= seq_len = %lld",
                      (long long)b, (long long)c, (long long)d->seq_len);
            SPH_CHECK(c == 0 || d->sub_seq_lengths, SPH_ERR_INVALID_ARG,
                      "desc.sub_seq_lengths: is NULL while sub_seq_counts[%lld] = %lld",
                      (long long)b, (long long)c);
            int64_t sum = 0;
            for (int64_t j = 0; j < c; j++, idx++) {
                const int64_t l = d->sub_seq_lengths[idx];
                SPH_CHECK(l >= 1 && l <= d->seq_len, SPH_ERR_INVALID_ARG,
                          "sub_seq_lengths[%lld][%lld]: %lld, expected 1 <= length <= seq_len "
                          "= %lld", (long long)b, (long long)j, (long long)l,
                          (long long)d->seq_len);
                sum += l; /* each <= S and sum checked below: no overflow */
                SPH_CHECK(sum <= d->seq_len, SPH_ERR_SHAPE,
                          "sub_seq_lengths[%lld]: sum of lengths exceeds seq_len = %lld",
                          (long long)b, (long long)d->seq_len);
            }
        }
    }
    return SPH_OK;
}

// ---- builders -------------------------------------------------------------------------------

static sph_status alloc_out(sph_spans **out, int64_t global_rows, int64_t local_rows,
                            int64_t n_segments, bool packed) {
    sph_spans *s = sph_calloc(1, sizeof *s);
    if (!s) return sph_err(SPH_ERR_ALLOC, "sph_spans_build: out of host memory");
    s->global_rows = global_rows;
    s->local_rows = local_rows;
    s->n_segments = n_segments;
    s->active_mask = sph_calloc((size_t)global_rows + 1, 1);
    s->local_mask = sph_calloc((size_t)local_rows + 1, 1);
    s->spans = sph_malloc(sizeof(int64_t) * (size_t)(2 * ((local_rows + 1) / 2) + 2));
    if (packed) s->cu_seqlens_padded = sph_malloc(sizeof(int64_t) * (size_t)(n_segments + 1));
    if (!s->active_mask || !s->local_mask || !s->spans || (packed && !s->cu_seqlens_padded)) {
        sph_spans_free(s);
        return sph_err(SPH_ERR_ALLOC, "sph_spans_build: out of host memory for %lld rows",
                       (long long)global_rows);
    }
    *out = s;
    return SPH_OK;
}

/* Finishes a result whose active_mask and local_mask are filled: counts, spans, validation. */
static sph_status finish(sph_spans *s, const sph_spans_opts *o) {
    int64_t na = 0, nl = 0;
    for (int64_t i = 0; i < s->global_rows; i++) na += s->active_mask[i];
    for (int64_t i = 0; i < s->local_rows; i++) nl += s->local_mask[i];
    s->active_rows = na;
    s->local_active_rows = nl;
    SPH_TRY(sph_spans_from_mask(s->local_mask, s->local_rows, o->gap, s->spans, &s->n_spans));
    if (sph_spans_validate(s->spans, s->n_spans, s->local_rows, s->local_mask) != SPH_OK)
        return sph_err_prefix(SPH_ERR_INTERNAL, "sph_spans_build: built spans fail validation: ");
    if (nl > na || (o->par.cp == 1 && nl != na))
        return sph_err(SPH_ERR_INTERNAL,
                       "sph_spans_build: %lld local active rows against %lld forward active "
                       "rows (cp = %lld)", (long long)nl, (long long)na, (long long)o->par.cp);
    return SPH_OK;
}

static sph_status build_unpacked(const sph_batch_desc *d, const sph_spans_opts *o,
                                 sph_spans **out) {
    sph_alignment al;
    SPH_TRY(sph_alignment_get(&o->par, &al));
    SPH_CHECK(o->par.cp == 1, SPH_ERR_INVALID_ARG,
              "unpacked spans: cp = %lld, expected 1 (CP sharding moves rows; use the packed "
              "layout)", (long long)o->par.cp);
    SPH_CHECK(d->seq_len % al.unpacked == 0, SPH_ERR_INVALID_ARG,
              "unpacked spans: seq_len %lld is not a multiple of the unpacked alignment %lld "
              "(tp = %lld, fp8 = %d): padding would move rows; use the packed layout",
              (long long)d->seq_len, (long long)al.unpacked, (long long)o->par.tp,
              (int)o->par.fp8);
    const int64_t B = d->batch, S = d->seq_len, A = d->num_actions;
    sph_spans *s;
    SPH_TRY(alloc_out(&s, B * S, B * S, B, false));
    for (int64_t b = 0; b < B; b++)
        for (int64_t a = 0; a < A; a++) s->active_mask[b * S + S - 1 - A + a] = d->loss_mask[b * A + a];
    if (B * S > 0) memcpy(s->local_mask, s->active_mask, (size_t)(B * S));
    sph_status st = finish(s, o);
    if (st != SPH_OK) {
        sph_spans_free(s);
        return st;
    }
    *out = s;
    return SPH_OK;
}

/* Sequences of a packed description: lengths[] (one per segment) and, per row, the index of its
 * first segment. Rows without a sequence (no attended column, zero sub-sequences) have none. */
static sph_status packed_segments(const sph_batch_desc *d, int64_t **lengths_out, int64_t *n_out,
                                  int64_t **first_out) {
    const int64_t B = d->batch, S = d->seq_len;
    int64_t n = 0;
    if (d->sub_seq_lengths || d->sub_seq_counts) {
        for (int64_t b = 0; b < B; b++) n += d->sub_seq_counts[b]; /* each <= S, B*S fits */
    } else {
        n = B;
    }
    int64_t *len = sph_malloc(sizeof(int64_t) * (size_t)(n + 1));
    int64_t *first = sph_malloc(sizeof(int64_t) * (size_t)(B + 1));
    if (!len || !first) {
        sph_free(len);
        sph_free(first);
        return sph_err(SPH_ERR_ALLOC, "sph_spans_build: out of host memory");
    }
    int64_t k = 0;
    for (int64_t b = 0; b < B; b++) {
        first[b] = k;
        if (d->sub_seq_lengths || d->sub_seq_counts) {
            for (int64_t j = 0; j < d->sub_seq_counts[b]; j++, k++) len[k] = d->sub_seq_lengths[k];
        } else if (d->attention_mask) {
            int64_t c = 0;
            for (int64_t p = 0; p < S; p++) c += d->attention_mask[b * S + p];
            if (c) len[k++] = c;
        } else {
            len[k++] = S;
        }
    }
    first[B] = k;
    *lengths_out = len;
    *n_out = k;
    *first_out = first;
    return SPH_OK;
}

/* Marks the active rows of row b in s->active_mask (segments start at first[b]). A loss on a
 * token no row predicts (padding, an unattended column, a sequence's first token) is an error:
 * silently dropping it would zero a real gradient. */
static sph_status mark_row(const sph_batch_desc *d, const int64_t *len, const int64_t *first,
                           const int64_t *cu, int64_t b, uint8_t *active) {
    const int64_t S = d->seq_len, A = d->num_actions;
    const bool subseq = d->sub_seq_lengths || d->sub_seq_counts;
    int64_t seg = first[b], seg_start = 0, attended_before = 0;
    if (d->attention_mask)
        for (int64_t p = 0; p < S - A; p++) attended_before += d->attention_mask[b * S + p];
    for (int64_t a = 0; a < A; a++) {
        const int64_t p = S - A + a; /* token column carrying loss_mask[b][a] */
        int64_t q;                   /* its offset inside its sequence */
        if (subseq) {
            while (seg < first[b + 1] && p >= seg_start + len[seg]) seg_start += len[seg++];
        }
        const bool on = d->loss_mask[b * A + a] != 0;
        if (subseq) {
            if (seg == first[b + 1]) {
                SPH_CHECK(!on, SPH_ERR_INVALID_ARG,
                          "loss_mask[%lld][%lld]: is 1 but column %lld of row %lld is padding "
                          "(its sub-sequences hold %lld tokens)",
                          (long long)b, (long long)a, (long long)p, (long long)b,
                          (long long)seg_start);
                continue;
            }
            q = p - seg_start;
        } else if (d->attention_mask) {
            const bool att = d->attention_mask[b * S + p] != 0;
            q = attended_before;
            attended_before += att;
            SPH_CHECK(!on || att, SPH_ERR_INVALID_ARG,
                      "loss_mask[%lld][%lld]: is 1 but column %lld of row %lld is not attended",
                      (long long)b, (long long)a, (long long)p, (long long)b);
            if (!att) continue;
        } else {
            q = p;
        }
        if (!on) continue;
        SPH_CHECK(q >= 1, SPH_ERR_INVALID_ARG,
                  "loss_mask[%lld][%lld]: is 1 on column %lld, the first token of its sequence, "
                  "which no row predicts", (long long)b, (long long)a, (long long)p);
        active[cu[seg] + q - 1] = 1;
    }
    return SPH_OK;
}

static sph_status build_packed(const sph_batch_desc *d, const sph_spans_opts *o,
                               sph_spans **out) {
    int64_t *len = NULL, *first = NULL, *padded = NULL, *cu = NULL, *rows = NULL, n = 0;
    sph_spans *s = NULL;
    sph_status st = packed_segments(d, &len, &n, &first);
    if (st != SPH_OK) return st;
    padded = sph_malloc(sizeof(int64_t) * (size_t)(n + 1));
    cu = sph_malloc(sizeof(int64_t) * (size_t)(n + 1));
    if (!padded || !cu) {
        st = sph_err(SPH_ERR_ALLOC, "sph_spans_build: out of host memory");
        goto fail;
    }
    st = sph_layout_packed(&o->par, len, n, padded, cu);
    if (st != SPH_OK) goto fail;
    const int64_t C = o->par.cp, total = cu[n];
    int64_t max_p = 0;
    for (int64_t k = 0; k < n; k++) max_p = padded[k] > max_p ? padded[k] : max_p;
    if (total % (C > 1 ? 2 * C : 1) != 0) {
        st = sph_err(SPH_ERR_INTERNAL, "sph_spans_build: packed total %lld not divisible by 2C",
                     (long long)total);
        goto fail;
    }
    st = alloc_out(&s, total, total / C, n, true);
    if (st != SPH_OK) goto fail;
    memcpy(s->cu_seqlens_padded, cu, sizeof(int64_t) * (size_t)(n + 1));
    for (int64_t b = 0; b < d->batch; b++) {
        st = mark_row(d, len, first, cu, b, s->active_mask);
        if (st != SPH_OK) goto fail;
    }
    rows = sph_malloc(sizeof(int64_t) * (size_t)(max_p / C + 1));
    if (!rows) {
        st = sph_err(SPH_ERR_ALLOC, "sph_spans_build: out of host memory");
        goto fail;
    }
    int64_t li = 0;
    for (int64_t k = 0; k < n; k++) {
        st = sph_cp_local_rows(padded[k], C, o->cp_rank, rows);
        if (st != SPH_OK) {
            st = sph_err_prefix(SPH_ERR_INTERNAL, "sph_spans_build: segment %lld: ", (long long)k);
            goto fail;
        }
        for (int64_t i = 0; i < padded[k] / C; i++) s->local_mask[li++] = s->active_mask[cu[k] + rows[i]];
    }
    if (li != s->local_rows) {
        st = sph_err(SPH_ERR_INTERNAL, "sph_spans_build: %lld local rows, expected %lld",
                     (long long)li, (long long)s->local_rows);
        goto fail;
    }
    st = finish(s, o);
    if (st != SPH_OK) goto fail;
    *out = s;
    s = NULL;
fail:
    sph_spans_free(s);
    sph_free(len);
    sph_free(first);
    sph_free(padded);
    sph_free(cu);
    sph_free(rows);
    return st;
}

sph_status sph_spans_build(const sph_batch_desc *desc, const sph_spans_opts *opts,
                           sph_spans **out) {
    SPH_CHECK(out, SPH_ERR_INVALID_ARG, "out: is NULL");
    *out = NULL;
    SPH_TRY(check_desc(desc, opts));
    if (desc->layout == SPH_LAYOUT_UNPACKED) return build_unpacked(desc, opts, out);
    return build_packed(desc, opts, out);
}
