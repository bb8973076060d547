/* test_prop_pack.c - bin packing properties on seeded random inputs: every sequence placed
 * exactly once, no bin over capacity (balanced: only a lone oversized item), every bin's packed
 * layout fits, bin tokens equal the padded costs, first-fit packers leave at most one bin at most
 * half full, the bin-count adjustment hits its target with non-empty bins, output is
 * deterministic. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static int64_t round_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

static const char *algo_name(sph_pack_algo a) {
    return a == SPH_PACK_FFD ? "ffd" : a == SPH_PACK_MFFD ? "mffd" : "balanced";
}

static void gen_lengths(sph_rng *rng, int64_t *len, int64_t n, int64_t cap) {
    const int kind = (int)rng_range(rng, 0, 3);
    for (int64_t i = 0; i < n; i++) {
        int64_t l;
        switch (kind) {
        case 0: l = rng_range(rng, 1, cap); break;                       /* anything */
        case 1: l = rng_range(rng, 1, cap / 8 + 1); break;               /* small */
        case 2: l = rng_uniform(rng) < 0.3 ? rng_range(rng, cap / 2, cap) /* bimodal */
                                           : rng_range(rng, 1, cap / 5 + 1);
                break;
        default: l = 1 + (int64_t)(rng_range(rng, 0, 5) * (cap / 6)); break; /* many ties */
        }
        len[i] = l < 1 ? 1 : l;
    }
}

static int same_result(const sph_pack_result *a, const sph_pack_result *b) {
    if (a->n_bins != b->n_bins || a->n_items != b->n_items) return 0;
    return !memcmp(a->bin_offsets, b->bin_offsets, sizeof(int64_t) * (size_t)(a->n_bins + 1)) &&
           !memcmp(a->items, b->items, sizeof(int64_t) * (size_t)a->n_items) &&
           !memcmp(a->bin_tokens, b->bin_tokens, sizeof(int64_t) * (size_t)a->n_bins);
}

/* Checks everything that must hold for any packing; returns the bin count. */
static int64_t check_packing(const char *cs, const sph_pack_result *r, const int64_t *len,
                             int64_t n, const sph_pack_opts *o, const sph_alignment *al,
                             int first_fit_unadjusted) {
    const int64_t cap_eff = o->capacity / al->total * al->total;
    char *seen = calloc((size_t)n + 1, 1);
    int64_t *bl = malloc(sizeof(int64_t) * (size_t)(n + 1));
    int64_t *pad = malloc(sizeof(int64_t) * (size_t)(n + 1));
    int64_t *cu = malloc(sizeof(int64_t) * (size_t)(n + 2));
    assert_non_null(seen);
    assert_non_null(bl);
    assert_non_null(pad);
    assert_non_null(cu);
    assert_int_equal(r->n_items, n);
    assert_int_equal(r->bin_offsets[0], 0);
    assert_int_equal(r->bin_offsets[r->n_bins], n);
    int64_t sum = 0, half_full = 0;
    for (int64_t b = 0; b < r->n_bins; b++) {
        const int64_t s = r->bin_offsets[b], e = r->bin_offsets[b + 1];
        if (e <= s) {
            print_error("%s: bin %lld is empty\n", cs, (long long)b);
            fail();
        }
        int64_t tok = 0;
        for (int64_t j = s; j < e; j++) {
            const int64_t i = r->items[j];
            if (i < 0 || i >= n || seen[i]) {
                print_error("%s: item %lld out of range or placed twice\n", cs, (long long)i);
                fail();
            }
            if (j > s) assert_true(r->items[j - 1] < i); /* increasing index inside a bin */
            seen[i] = 1;
            tok += round_up(len[i], al->sequence);
            bl[j - s] = len[i];
        }
        assert_int_equal(r->bin_tokens[b], tok);
        sum += tok;
        const int oversized_alone = o->algorithm == SPH_PACK_BALANCED && e - s == 1 && tok > cap_eff;
        if (!oversized_alone) {
            if (tok > cap_eff) {
                print_error("%s: bin %lld holds %lld > capacity %lld\n", cs, (long long)b,
                            (long long)tok, (long long)cap_eff);
                fail();
            }
            /* the packed layout of the bin (final segment grown) still fits */
            expect_ok(sph_layout_packed(&o->par, bl, e - s, pad, cu));
            assert_true(cu[e - s] <= o->capacity);
        }
        if (2 * tok <= cap_eff) half_full++;
    }
    for (int64_t i = 0; i < n; i++) assert_true(seen[i]);
    if (first_fit_unadjusted && half_full > 1) {
        print_error("%s: %lld bins at most half full\n", cs, (long long)half_full);
        fail();
    }
    /* lower bound on bins */
    if (n) assert_true(r->n_bins >= (sum + cap_eff - 1) / cap_eff || o->algorithm == SPH_PACK_BALANCED);
    const double util = r->n_bins ? (double)sum / ((double)r->n_bins * (double)o->capacity) : 0;
    assert_true(r->utilization == util);
    free(seen);
    free(bl);
    free(pad);
    free(cu);
    return r->n_bins;
}

static void test_pack_properties(void **state) {
    (void)state;
    sph_rng rng;
    rng_seed(&rng, test_seed() ^ 0x9ac4);
    int64_t *len = malloc(sizeof(int64_t) * 5001);
    assert_non_null(len);
    int n_checked = 0, n_adjusted = 0;
    for (int trial = 0; trial < 6000; trial++) {
        const int64_t n = trial % 50 == 0 ? rng_range(&rng, 1000, 5000) : rng_range(&rng, 0, 120);
        const int64_t cap = rng_range(&rng, 1, trial % 3 ? 300 : 20000);
        sph_pack_opts o = SPH_PACK_OPTS_INIT;
        o.capacity = cap;
        o.algorithm = (sph_pack_algo)(trial % 3);
        o.par.tp = rng_range(&rng, 1, 4);
        o.par.cp = rng_uniform(&rng) < 0.5 ? 1 : rng_range(&rng, 2, 3);
        o.par.fp8 = rng_uniform(&rng) < 0.8 ? SPH_FP8_NONE : (sph_fp8)rng_range(&rng, 1, 2);
        sph_alignment al;
        expect_ok(sph_alignment_get(&o.par, &al));
        const int64_t cap_eff = cap / al.total * al.total;
        char cs[200];
        snprintf(cs, sizeof cs, "pack(%s, n=%lld, cap=%lld, tp=%lld, cp=%lld, fp8=%d, seed=%llu)",
                 algo_name(o.algorithm), (long long)n, (long long)cap, (long long)o.par.tp,
                 (long long)o.par.cp, (int)o.par.fp8, (unsigned long long)test_seed());
        gen_lengths(&rng, len, n, cap_eff > 0 ? cap_eff : cap);
        if (n && trial % 7 == 0) /* an oversized sequence: balanced takes it, the others refuse */
            len[rng_range(&rng, 0, n - 1)] = cap + rng_range(&rng, 1, 1000);
        sph_pack_result *r = NULL, *r2 = NULL;
        if (cap_eff == 0) {
            expect_status(sph_pack(len, n, &o, &r), SPH_ERR_INVALID_ARG, "below the total alignment");
            continue;
        }
        int64_t too_long = 0;
        for (int64_t i = 0; i < n; i++) too_long |= round_up(len[i], al.sequence) > cap_eff;
        if (too_long && o.algorithm != SPH_PACK_BALANCED) {
            expect_status(sph_pack(len, n, &o, &r), SPH_ERR_INVALID_ARG, "exceeds the bin capacity");
            continue;
        }
        sph_status st = sph_pack(len, n, &o, &r);
        n_checked++;
        if (st != SPH_OK) {
            print_error("%s: %s\n", cs, sph_last_error());
            fail();
        }
        const int64_t nb0 = check_packing(cs, r, len, n, &o, &al, o.algorithm != SPH_PACK_BALANCED);
        expect_ok(sph_pack(len, n, &o, &r2));
        if (!same_result(r, r2)) {
            print_error("%s: two runs differ\n", cs);
            fail();
        }
        sph_pack_free(r);
        sph_pack_free(r2);
        /* bin-count targets */
        o.min_bins = rng_range(&rng, 0, nb0 + 6);
        o.bin_multiple = rng_range(&rng, 0, 5);
        const int64_t d = o.bin_multiple > 1 ? o.bin_multiple : 1;
        int64_t target = nb0 > o.min_bins ? nb0 : o.min_bins;
        target = round_up(target, d);
        st = sph_pack(len, n, &o, &r);
        if (o.algorithm != SPH_PACK_BALANCED && target > n) {
            if (st != SPH_ERR_INFEASIBLE) {
                print_error("%s: target %lld > n: got status %d\n", cs, (long long)target, st);
                fail();
            }
            continue;
        }
        if (st == SPH_ERR_INFEASIBLE) { /* balanced: its own target can exceed n only then */
            assert_true(o.algorithm == SPH_PACK_BALANCED);
            assert_true(round_up(o.min_bins, d) > n || target > n);
            continue;
        }
        if (st != SPH_OK) {
            print_error("%s min_bins=%lld multiple=%lld: %s\n", cs, (long long)o.min_bins,
                        (long long)o.bin_multiple, sph_last_error());
            fail();
        }
        const int64_t nb = check_packing(cs, r, len, n, &o, &al, 0);
        n_adjusted += nb > nb0;
        assert_true(nb % d == 0);
        assert_true(nb >= o.min_bins);
        if (o.algorithm != SPH_PACK_BALANCED) assert_int_equal(nb, target);
        sph_pack_free(r);
    }
    fprintf(stderr, "checked %d packings, %d with bins added by the adjustment\n", n_checked,
            n_adjusted);
    assert_true(n_checked > 4000 && n_adjusted > 1200); /* the generator reaches the cases */
    free(len);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_pack_properties)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
