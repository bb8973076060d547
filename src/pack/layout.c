/*
 * layout.c - token alignment, packed segment layouts and CP-local rows (docs/design.md
 * sections 3.2-3.4).
 *
 * With TP size T and CP size C:
 *   sequence alignment  a_s = 2TC if C > 1 else 1
 *   total alignment     a_t = lcm(2TC if C > 1 else T, f), f the FP8 token alignment
 *                       (none: 1; MXFP8: 32TC; blockwise: 128TC if T > 1 else 16C)
 *   unpacked alignment  a_u = lcm(T, f) when C = 1; 0 (no unpacked layout) when C > 1
 * A packed layout of raw lengths L_k pads each to a_s (P_k = ceil(L_k / a_s) a_s), then grows
 * the final segment so sum P_k is a multiple of a_t; cu_seqlens_padded is the prefix sum.
 * Under CP a padded segment P is cut into 2C chunks of P/(2C) rows; rank r holds chunk r then
 * chunk 2C-1-r, which balances causal-attention work (early chunks are cheap, late ones dear).
 * Every size is checked against int64 overflow (SPH_ERR_OVERFLOW).
 */
#include "core/internal.h"
#include "pack/pack_internal.h"

/* lcm with overflow detection; a, b >= 1. */
static bool lcm_i64(int64_t a, int64_t b, int64_t *r) {
    int64_t g = sph_gcd(a, b);
    return sph_mul_i64(a / g, b, r);
}

sph_status sph_parallel_check(const sph_parallel *par, const char *name) {
    SPH_CHECK(par, SPH_ERR_INVALID_ARG, "%s: is NULL, expected a sph_parallel", name);
    SPH_CHECK(par->tp >= 1, SPH_ERR_INVALID_ARG, "%s.tp: %lld, expected >= 1", name,
              (long long)par->tp);
    SPH_CHECK(par->cp >= 1, SPH_ERR_INVALID_ARG, "%s.cp: %lld, expected >= 1", name,
              (long long)par->cp);
    SPH_CHECK(par->fp8 == SPH_FP8_NONE || par->fp8 == SPH_FP8_BLOCKWISE ||
                  par->fp8 == SPH_FP8_MXFP8,
              SPH_ERR_INVALID_ARG, "%s.fp8: %d, expected SPH_FP8_NONE, _BLOCKWISE or _MXFP8",
              name, (int)par->fp8);
    return SPH_OK;
}

sph_status sph_alignment_get(const sph_parallel *par, sph_alignment *out) {
    SPH_TRY(sph_parallel_check(par, "par"));
    SPH_CHECK(out, SPH_ERR_INVALID_ARG, "out: is NULL, expected a sph_alignment");
    const int64_t T = par->tp, C = par->cp;
    int64_t tc, two_tc = 0, fp8 = 1;
    if (!sph_mul_i64(T, C, &tc))
        return sph_err(SPH_ERR_OVERFLOW, "par: tp*cp overflows int64 (tp=%lld, cp=%lld)",
                       (long long)T, (long long)C);
    /* 2*tp*cp is the sequence alignment of context parallelism only: with cp = 1 it is never
     * formed, so tp = 2^62 (alignments that fit) is not refused for it (issue 26 case 17) */
    if (C > 1 && !sph_mul_i64(2, tc, &two_tc))
        return sph_err(SPH_ERR_OVERFLOW, "par: 2*tp*cp overflows int64 (tp=%lld, cp=%lld)",
                       (long long)T, (long long)C);
    bool ok = true;
    if (par->fp8 == SPH_FP8_MXFP8) ok = sph_mul_i64(32, tc, &fp8);
    else if (par->fp8 == SPH_FP8_BLOCKWISE) ok = T > 1 ? sph_mul_i64(128, tc, &fp8)
                                                        : sph_mul_i64(16, C, &fp8);
    if (!ok)
        return sph_err(SPH_ERR_OVERFLOW, "par: FP8 token alignment overflows int64 (tp=%lld, "
                       "cp=%lld)", (long long)T, (long long)C);
    sph_alignment a;
    a.sequence = C > 1 ? two_tc : 1;
    if (!lcm_i64(C > 1 ? two_tc : T, fp8, &a.total))
        return sph_err(SPH_ERR_OVERFLOW, "par: total alignment overflows int64 (tp=%lld, "
                       "cp=%lld)", (long long)T, (long long)C);
    a.unpacked = 0;
    if (C == 1 && !lcm_i64(T, fp8, &a.unpacked))
        return sph_err(SPH_ERR_OVERFLOW, "par: unpacked alignment overflows int64 (tp=%lld)",
                       (long long)T);
    *out = a;
    return SPH_OK;
}

sph_status sph_round_up(int64_t x, int64_t a, int64_t *r) {
    /* x >= 0, a >= 1 */
    int64_t rem = x % a, y = x;
    if (rem && !sph_add_i64(x, a - rem, &y)) return SPH_ERR_OVERFLOW;
    *r = y;
    return SPH_OK;
}

sph_status sph_layout_packed(const sph_parallel *par, const int64_t *lengths, int64_t n,
                             int64_t *padded, int64_t *cu_seqlens_padded) {
    sph_alignment al;
    SPH_TRY(sph_alignment_get(par, &al));
    SPH_CHECK(n >= 0, SPH_ERR_INVALID_ARG, "n: %lld, expected >= 0", (long long)n);
    SPH_CHECK(n == 0 || lengths, SPH_ERR_INVALID_ARG, "lengths: is NULL with n = %lld",
              (long long)n);
    SPH_CHECK(n == 0 || padded, SPH_ERR_INVALID_ARG, "padded: is NULL with n = %lld",
              (long long)n);
    SPH_CHECK(cu_seqlens_padded, SPH_ERR_INVALID_ARG,
              "cu_seqlens_padded: is NULL, expected n + 1 = %lld entries", (long long)n + 1);
    /* Validate everything before writing anything. */
    int64_t total = 0;
    for (int64_t k = 0; k < n; k++) {
        int64_t p;
        SPH_CHECK(lengths[k] >= 1, SPH_ERR_INVALID_ARG, "lengths[%lld]: %lld, expected >= 1",
                  (long long)k, (long long)lengths[k]);
        if (sph_round_up(lengths[k], al.sequence, &p) != SPH_OK || !sph_add_i64(total, p, &total))
            return sph_err(SPH_ERR_OVERFLOW,
                           "lengths: padded sum overflows int64 at lengths[%lld] = %lld",
                           (long long)k, (long long)lengths[k]);
    }
    int64_t grown;
    if (sph_round_up(total, al.total, &grown) != SPH_OK)
        return sph_err(SPH_ERR_OVERFLOW, "lengths: padded total %lld rounded to the total "
                       "alignment %lld overflows int64", (long long)total, (long long)al.total);
    cu_seqlens_padded[0] = 0;
    for (int64_t k = 0; k < n; k++) {
        int64_t p = 0;
        (void)sph_round_up(lengths[k], al.sequence, &p); /* checked above */
        if (k == n - 1) p += grown - total;              /* final segment absorbs the slack */
        padded[k] = p;
        cu_seqlens_padded[k + 1] = cu_seqlens_padded[k] + p;
    }
    return SPH_OK;
}

sph_status sph_cp_local_rows(int64_t P, int64_t cp, int64_t cp_rank, int64_t *rows) {
    SPH_CHECK(cp >= 1, SPH_ERR_INVALID_ARG, "cp: %lld, expected >= 1", (long long)cp);
    SPH_CHECK(cp_rank >= 0 && cp_rank < cp, SPH_ERR_INVALID_ARG,
              "cp_rank: %lld, expected in [0, %lld)", (long long)cp_rank, (long long)cp);
    SPH_CHECK(P >= 0, SPH_ERR_INVALID_ARG, "P: %lld, expected >= 0", (long long)P);
    if (cp == 1) {
        /* chunk 0 followed by chunk 1 is the whole segment in order, whatever its parity */
        SPH_CHECK(P == 0 || rows, SPH_ERR_INVALID_ARG, "rows: is NULL, expected %lld entries",
                  (long long)P);
        for (int64_t i = 0; i < P; i++) rows[i] = i;
        return SPH_OK;
    }
    int64_t two_c;
    SPH_CHECK(sph_mul_i64(2, cp, &two_c), SPH_ERR_OVERFLOW, "cp: 2*cp overflows (cp=%lld)",
              (long long)cp);
    SPH_CHECK(P % two_c == 0, SPH_ERR_INVALID_ARG,
              "P: %lld is not divisible by 2*cp = %lld (pad segments to the sequence alignment)",
              (long long)P, (long long)two_c);
    const int64_t ch = P / two_c;
    SPH_CHECK(ch == 0 || rows, SPH_ERR_INVALID_ARG, "rows: is NULL, expected %lld entries",
              (long long)(2 * ch));
    const int64_t a = cp_rank * ch, b = (two_c - 1 - cp_rank) * ch;
    for (int64_t i = 0; i < ch; i++) {
        rows[i] = a + i;
        rows[ch + i] = b + i;
    }
    return SPH_OK;
}
