/* test_prop_spans.c - layout, CP-local row and span properties on seeded random inputs.
 *   layouts: segments padded to the sequence alignment, ordered, total a multiple of the total
 *            alignment, only the final segment grows past its own padding;
 *   CP rows: the ranks' rows partition every segment, two chunks each in the 2C-chunk order;
 *   spans:   the forward mask matches an independent token-level reference for every layout
 *            variant, each CP rank's local mask matches the reference mapping, the ranks' local
 *            active counts add up to the forward count, spans cover exactly the active rows up
 *            to inactive gaps of at most G, consecutive spans are more than G apart. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static int64_t round_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

static sph_parallel random_par(sph_rng *rng) {
    sph_parallel p = {rng_range(rng, 1, 4), rng_uniform(rng) < 0.4 ? 1 : rng_range(rng, 2, 4),
                      rng_uniform(rng) < 0.7 ? SPH_FP8_NONE : (sph_fp8)rng_range(rng, 1, 2)};
    return p;
}

static void test_layout_properties(void **state) {
    (void)state;
    sph_rng rng;
    rng_seed(&rng, test_seed() ^ 0x1a70);
    int64_t len[64], pad[64], cu[65];
    for (int trial = 0; trial < 3000; trial++) {
        sph_parallel p = random_par(&rng);
        sph_alignment al;
        expect_ok(sph_alignment_get(&p, &al));
        assert_true(al.total % al.sequence == 0);
        const int64_t n = rng_range(&rng, 0, 64);
        int64_t base = 0;
        for (int64_t k = 0; k < n; k++) {
            len[k] = rng_range(&rng, 1, rng_uniform(&rng) < 0.5 ? 20 : 5000);
            base += round_up(len[k], al.sequence);
        }
        expect_ok(sph_layout_packed(&p, len, n, pad, cu));
        assert_int_equal(cu[0], 0);
        for (int64_t k = 0; k < n; k++) {
            assert_int_equal(cu[k + 1] - cu[k], pad[k]);
            assert_true(pad[k] >= len[k] && pad[k] % al.sequence == 0);
            if (k < n - 1) assert_int_equal(pad[k], round_up(len[k], al.sequence));
            if (p.cp > 1) assert_true(pad[k] % (2 * p.cp) == 0);
        }
        assert_true(cu[n] % al.total == 0);
        assert_true(cu[n] - base >= 0 && cu[n] - base < al.total);
    }
}

static void test_cp_rows_partition(void **state) {
    (void)state;
    sph_rng rng;
    rng_seed(&rng, test_seed() ^ 0xc0de);
    int64_t rows[4096];
    int count[4096];
    for (int trial = 0; trial < 2000; trial++) {
        const int64_t C = rng_range(&rng, 1, 8), P = 2 * C * rng_range(&rng, 0, 4096 / (2 * C));
        memset(count, 0, sizeof count);
        for (int64_t r = 0; r < C; r++) {
            for (int64_t i = 0; i < P / C; i++) rows[i] = -1;
            expect_ok(sph_cp_local_rows(P, C, r, rows));
            const int64_t ch = P / (2 * C);
            for (int64_t i = 0; i < P / C; i++) {
                assert_true(rows[i] >= 0 && rows[i] < P);
                count[rows[i]]++;
                /* chunk r then chunk 2C-1-r, each contiguous */
                const int64_t chunk = i < ch ? r : 2 * C - 1 - r;
                if (C > 1) assert_int_equal(rows[i], chunk * ch + (i < ch ? i : i - ch));
            }
        }
        for (int64_t i = 0; i < P; i++) assert_int_equal(count[i], 1);
    }
}

/* A random batch whose loss mask only marks tokens some row predicts. Arrays are malloc'd into
 * the out pointers. variant: 0 unpacked, 1 packed rows, 2 sub-sequences, 3 attention mask. */
typedef struct batch {
    sph_batch_desc d;
    uint8_t *loss, *att;
    int64_t *sub, *counts;
    /* token-level reference: per row and column, the sequence id (-1 none) and its offset */
    int64_t *seq_of, *q_of, *seq_len, n_seq;
} batch;

static void batch_free(batch *b) {
    free(b->loss);
    free(b->att);
    free(b->sub);
    free(b->counts);
    free(b->seq_of);
    free(b->q_of);
    free(b->seq_len);
}

static void gen_batch(sph_rng *rng, batch *bt, int variant, int64_t B, int64_t S, int64_t A) {
    memset(bt, 0, sizeof *bt);
    sph_batch_desc d = SPH_BATCH_DESC_INIT;
    d.layout = variant == 0 ? SPH_LAYOUT_UNPACKED : SPH_LAYOUT_PACKED;
    d.batch = B;
    d.seq_len = S;
    d.num_actions = A;
    bt->loss = calloc((size_t)(B * A + 1), 1);
    bt->seq_of = malloc(sizeof(int64_t) * (size_t)(B * S + 1));
    bt->q_of = malloc(sizeof(int64_t) * (size_t)(B * S + 1));
    bt->seq_len = calloc((size_t)(B * S + 1), sizeof(int64_t));
    bt->sub = malloc(sizeof(int64_t) * (size_t)(B * S + 1));
    bt->counts = calloc((size_t)B + 1, sizeof(int64_t));
    assert_non_null(bt->loss);
    assert_non_null(bt->seq_of);
    assert_non_null(bt->q_of);
    assert_non_null(bt->seq_len);
    assert_non_null(bt->sub);
    assert_non_null(bt->counts);
    int64_t ns = 0, nsub = 0;
    if (variant == 3) {
        bt->att = malloc((size_t)(B * S + 1));
        assert_non_null(bt->att);
    }
    const double density = rng_uniform(rng) < 0.2 ? (rng_uniform(rng) < 0.5 ? 0.0 : 1.0)
                                                   : rng_uniform(rng);
    for (int64_t b = 0; b < B; b++) {
        int64_t *so = bt->seq_of + b * S, *qo = bt->q_of + b * S;
        for (int64_t p = 0; p < S; p++) so[p] = qo[p] = -1;
        if (variant <= 1) {
            for (int64_t p = 0; p < S; p++) so[p] = ns, qo[p] = p;
            bt->seq_len[ns++] = S;
        } else if (variant == 2) {
            int64_t col = 0;
            const int64_t fill = rng_uniform(rng) < 0.3 ? S : rng_range(rng, 0, S);
            while (col < fill) {
                int64_t l = rng_range(rng, 1, rng_uniform(rng) < 0.5 ? 8 : S);
                if (l > fill - col) l = fill - col;
                for (int64_t q = 0; q < l; q++) so[col + q] = ns, qo[col + q] = q;
                bt->seq_len[ns++] = l;
                bt->sub[nsub++] = l;
                bt->counts[b]++;
                col += l;
            }
        } else {
            const double keep = rng_uniform(rng);
            int64_t q = 0;
            for (int64_t p = 0; p < S; p++) {
                bt->att[b * S + p] = rng_uniform(rng) < keep;
                if (bt->att[b * S + p]) so[p] = ns, qo[p] = q++;
            }
            if (q) bt->seq_len[ns++] = q;
        }
        for (int64_t a = 0; a < A; a++) {
            const int64_t p = S - A + a;
            if (qo[p] >= 1) bt->loss[b * A + a] = rng_uniform(rng) < density;
        }
    }
    bt->n_seq = ns;
    d.loss_mask = bt->loss;
    if (variant == 2) {
        d.sub_seq_lengths = bt->sub;
        d.sub_seq_counts = bt->counts;
    }
    if (variant == 3) d.attention_mask = bt->att;
    bt->d = d;
}

static void check_spans(const char *cs, const sph_spans *s, int64_t gap) {
    expect_ok(sph_spans_validate(s->spans, s->n_spans, s->local_rows, s->local_mask));
    for (int64_t k = 0; k < s->n_spans; k++) {
        const int64_t st = s->spans[2 * k], en = s->spans[2 * k + 1];
        if (!s->local_mask[st] || !s->local_mask[en - 1]) {
            print_error("%s: span [%lld, %lld) does not start and end on active rows\n", cs,
                        (long long)st, (long long)en);
            fail();
        }
        int64_t run = 0;
        for (int64_t i = st; i < en; i++) {
            run = s->local_mask[i] ? 0 : run + 1;
            if (run > gap) {
                print_error("%s: span [%lld, %lld) has an inactive gap > %lld\n", cs,
                            (long long)st, (long long)en, (long long)gap);
                fail();
            }
        }
        if (k > 0) assert_true(st - s->spans[2 * k - 1] > gap);
    }
}

static void test_spans_properties(void **state) {
    (void)state;
    sph_rng rng;
    rng_seed(&rng, test_seed() ^ 0x59a5);
    int n_built = 0, n_cp = 0, n_rejected = 0;
    for (int trial = 0; trial < 1500; trial++) {
        const int variant = trial % 4;
        const int64_t B = rng_range(&rng, 0, 6), S = rng_range(&rng, 1, trial % 10 ? 64 : 700);
        const int64_t A = rng_range(&rng, 0, S - 1);
        batch bt;
        gen_batch(&rng, &bt, variant, B, S, A);
        sph_spans_opts o = SPH_SPANS_OPTS_INIT;
        o.par = random_par(&rng);
        const int64_t gaps[5] = {0, 1, 3, 128, rng_range(&rng, 0, 40)};
        o.gap = gaps[rng_range(&rng, 0, 4)];
        sph_alignment al;
        expect_ok(sph_alignment_get(&o.par, &al));
        char cs[256];
        snprintf(cs, sizeof cs, "spans(variant=%d B=%lld S=%lld A=%lld tp=%lld cp=%lld fp8=%d "
                 "gap=%lld seed=%llu)", variant, (long long)B, (long long)S, (long long)A,
                 (long long)o.par.tp, (long long)o.par.cp, (int)o.par.fp8, (long long)o.gap,
                 (unsigned long long)test_seed());
        sph_spans *s = NULL;
        if (variant == 0) {
            if (o.par.cp > 1 || S % al.unpacked) {
                expect_status(sph_spans_build(&bt.d, &o, &s), SPH_ERR_INVALID_ARG, "unpacked spans");
                n_rejected++;
                batch_free(&bt);
                continue;
            }
            expect_ok(sph_spans_build(&bt.d, &o, &s));
            assert_int_equal(s->global_rows, B * S);
            for (int64_t b = 0; b < B; b++)
                for (int64_t p = 0; p < S; p++) {
                    /* row p predicts token p+1, which carries loss column p+1-(S-A) */
                    const int64_t a = p + 1 - (S - A);
                    const uint8_t want = a >= 0 && a < A ? bt.loss[b * A + a] : 0;
                    assert_int_equal(s->active_mask[b * S + p], want);
                }
            assert_memory_equal(s->local_mask, s->active_mask, (size_t)(B * S));
            check_spans(cs, s, o.gap);
            n_built++;
            sph_spans_free(s);
            batch_free(&bt);
            continue;
        }
        /* reference packed layout and forward mask */
        int64_t *cu = malloc(sizeof(int64_t) * (size_t)(bt.n_seq + 1));
        assert_non_null(cu);
        cu[0] = 0;
        for (int64_t k = 0; k < bt.n_seq; k++) cu[k + 1] = cu[k] + round_up(bt.seq_len[k], al.sequence);
        if (bt.n_seq) cu[bt.n_seq] = round_up(cu[bt.n_seq], al.total);
        const int64_t G = cu[bt.n_seq];
        uint8_t *ref = calloc((size_t)G + 1, 1);
        assert_non_null(ref);
        for (int64_t b = 0; b < B; b++)
            for (int64_t a = 0; a < A; a++) {
                const int64_t p = S - A + a, sq = bt.seq_of[b * S + p], q = bt.q_of[b * S + p];
                if (bt.loss[b * A + a]) ref[cu[sq] + q - 1] = 1;
            }
        int64_t ref_active = 0, sum_local_active = 0;
        for (int64_t i = 0; i < G; i++) ref_active += ref[i];
        for (int64_t r = 0; r < o.par.cp; r++) {
            o.cp_rank = r;
            sph_status st = sph_spans_build(&bt.d, &o, &s);
            if (st != SPH_OK) {
                print_error("%s rank %lld: %s\n", cs, (long long)r, sph_last_error());
                fail();
            }
            assert_int_equal(s->global_rows, G);
            assert_int_equal(s->n_segments, bt.n_seq);
            assert_memory_equal(s->cu_seqlens_padded, cu, sizeof(int64_t) * (size_t)(bt.n_seq + 1));
            if (G) assert_memory_equal(s->active_mask, ref, (size_t)G);
            assert_int_equal(s->active_rows, ref_active);
            assert_int_equal(s->local_rows, G / o.par.cp);
            /* reference CP mapping: chunk r then chunk 2C-1-r of each segment */
            int64_t li = 0;
            for (int64_t k = 0; k < bt.n_seq; k++) {
                const int64_t P = cu[k + 1] - cu[k], C = o.par.cp;
                for (int64_t i = 0; i < P / C; i++) {
                    int64_t g;
                    if (C == 1) {
                        g = i;
                    } else {
                        const int64_t ch = P / (2 * C);
                        g = i < ch ? r * ch + i : (2 * C - 1 - r) * ch + (i - ch);
                    }
                    if (s->local_mask[li] != ref[cu[k] + g]) {
                        print_error("%s rank %lld: local row %lld (segment %lld row %lld) is %d, "
                                    "expected %d\n", cs, (long long)r, (long long)li,
                                    (long long)k, (long long)g, s->local_mask[li], ref[cu[k] + g]);
                        fail();
                    }
                    li++;
                }
            }
            assert_int_equal(li, s->local_rows);
            sum_local_active += s->local_active_rows;
            if (o.par.cp == 1) assert_int_equal(s->local_active_rows, s->active_rows);
            check_spans(cs, s, o.gap);
            sph_spans_free(s);
            n_built++;
        }
        n_cp += o.par.cp > 1;
        assert_int_equal(sum_local_active, ref_active);
        /* a loss on a token no row predicts is refused */
        for (int64_t b = 0; b < B && A > 0; b++) {
            int64_t a = rng_range(&rng, 0, A - 1), p = S - A + a;
            if (bt.q_of[b * S + p] < 1 && !bt.loss[b * A + a]) {
                bt.loss[b * A + a] = 1;
                o.cp_rank = 0;
                expect_status(sph_spans_build(&bt.d, &o, &s), SPH_ERR_INVALID_ARG, "loss_mask[");
                n_rejected++;
                break;
            }
        }
        free(cu);
        free(ref);
        batch_free(&bt);
    }
    fprintf(stderr, "built %d span sets (%d trials under CP), %d rejections checked\n", n_built,
            n_cp, n_rejected);
    assert_true(n_built > 1000 && n_cp > 300 && n_rejected > 100);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_properties),
        cmocka_unit_test(test_cp_rows_partition),
        cmocka_unit_test(test_spans_properties),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
