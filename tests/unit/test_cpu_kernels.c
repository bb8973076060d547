/*
 * test_cpu_kernels.c - the CPU backend's per-ISA epilogue loops (src/head/cpu_kernels.h) of
 * one kernel set (argv[1]: generic, avx2 or avx512; ctest runs one entry per set and a set
 * this CPU lacks exits 77, a visible skip), against float64 computations of what
 * cpu_kernels.h says they compute:
 *   cvt        all 65536 bf16 and f16 patterns, bitwise equal to the scalar conversion (NaN
 *              to NaN), at every start offset and length mod the vector width (the tails)
 *   tile_stats (xm, s, d, sz) of rows of every length 1..70 and 256, 257, 1000, shifted
 *              before the scaling (y = (x - xm) inv_t); a NaN in a row; entries whose e^y
 *              is 0; x left bitwise as it was; a row with a large offset at a low
 *              temperature (|z| ~ 1e5) whose spread is a few units of z
 *   tile_grad  du = (e^(y - ls) (A + e (dm - y)) + C) inv_t with y = (x - xs) ys, the
 *              same lengths and the same offset rows
 * Budgets: tolerances.h (f32 arithmetic of <= 1000 terms: TOL_CPU_F32).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/ctx.h"
#include "head/cpu_kernels.h"
#include "testutil.h"

static sph_head_kern g_k;
static const char *g_name;

static int pick(const char *name) {
    if (!strcmp(name, "generic")) {
        g_k = (sph_head_kern){sph_head_tile_stats_generic, sph_head_tile_grad_generic,
                              sph_head_cvt_generic};
    } else if (!strcmp(name, "avx2")) {
        g_k = (sph_head_kern){sph_head_tile_stats_avx2, sph_head_tile_grad_avx2,
                              sph_head_cvt_avx2};
    } else if (!strcmp(name, "avx512")) {
        g_k = (sph_head_kern){sph_head_tile_stats_avx512, sph_head_tile_grad_avx512,
                              sph_head_cvt_avx512};
    } else {
        return 0;
    }
    return 1;
}

static void test_cvt(void **state) {
    (void)state;
    uint16_t *src = malloc(65536 * 2 + 64);
    float *dst = malloc(65536 * 4 + 128);
    assert_non_null(src), assert_non_null(dst);
    int64_t bad = 0;
    for (int bf = 0; bf < 2; bf++) {
        for (uint32_t u = 0; u < 65536; u++) src[u] = (uint16_t)u;
        /* the whole table, then short runs at every offset mod 16 and every length <= 40 */
        for (int pass = 0; pass < 2; pass++) {
            int64_t runs = pass == 0 ? 1 : 16 * 41;
            for (int64_t q = 0; q < runs; q++) {
                int64_t off = pass == 0 ? 0 : (q / 41) + 997 * (q % 7), n = pass == 0 ? 65536 : q % 41;
                if (off + n > 65536) continue;
                memset(dst, 0xa5, (size_t)(n + 8) * 4);
                g_k.cvt(src + off, dst, n, bf);
                for (int64_t j = 0; j < n; j++) {
                    float want = bf ? sph_bf16_to_f32(src[off + j]) : sph_f16_to_f32(src[off + j]);
                    int same = isnan(want) ? isnan(dst[j]) != 0 : !memcmp(&want, &dst[j], 4);
                    if (!same && bad++ < 10)
                        print_error("%s cvt(%s) pattern %04x: %.9g, expected %.9g\n", g_name,
                                    bf ? "bf16" : "f16", src[off + j], dst[j], want);
                }
                uint32_t guard;
                memcpy(&guard, &dst[n], 4);
                if (guard != 0xa5a5a5a5u && bad++ < 10)
                    print_error("%s cvt: wrote past n = %lld\n", g_name, (long long)n);
            }
        }
    }
    free(src), free(dst);
    assert_int_equal(bad, 0);
}

static const int64_t LENS_EXTRA[] = {256, 257, 1000};

static int64_t len_at(int k) { return k < 70 ? k + 1 : LENS_EXTRA[k - 70]; }
#define N_LENS 73

static void test_tile_stats(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed());
    float *x = malloc(1100 * 4), *x0 = malloc(1100 * 4);
    assert_non_null(x), assert_non_null(x0);
    int ok = 1;
    for (int k = 0; k < N_LENS; k++)
        for (int rep = 0; rep < 4; rep++) {
            const int64_t n = len_at(k);
            /* rep 2: a peaked row; rep 3: offset 12 at T = 1e-4, spread ~ 3 in z */
            const float inv_t = rep == 1 ? (float)(1 / 0.7) : rep == 3 ? 1e4f : 1.0f;
            const double scale = rep == 2 ? 30 : rep == 3 ? 3e-4 : 3;
            for (int64_t j = 0; j < n; j++)
                x0[j] = x[j] = (float)((rep == 3 ? 12 : 0) + rng_normal(&r) * scale);
            float out[4];
            g_k.tile_stats(x, n, inv_t, out);
            double m = -INFINITY, s = 0, d = 0, sz = 0, sabs = 0;
            for (int64_t j = 0; j < n; j++) {
                if (memcmp(&x0[j], &x[j], 4)) {
                    print_error("%s tile_stats n=%lld: x[%lld] = %.9g changed, was %.9g\n",
                                g_name, (long long)n, (long long)j, x[j], x0[j]);
                    ok = 0;
                    break;
                }
                if (x0[j] > m) m = x0[j];
                sz += (double)x0[j] * inv_t, sabs += fabs((double)x0[j] * inv_t);
            }
            for (int64_t j = 0; j < n; j++) {
                double y = ((double)x0[j] - m) * inv_t, p = exp(y);
                s += p, d += p * y;
            }
            char cs[96];
            snprintf(cs, sizeof cs, "tile_stats(%s,n=%lld,inv_t=%g,scale=%g)", g_name,
                     (long long)n, (double)inv_t, scale);
            double got[3] = {out[1], out[2], out[3]}, ref[3] = {s, d, sz};
            /* d is shifted: its budget is that of its own terms, not of |m| s */
            double bound[3] = {TOL_CPU_F32 * s, TOL_CPU_F32 * (fabs(d) + s), TOL_CPU_F32 * (sabs + 1)};
            ok &= (double)out[0] == m;
            if ((double)out[0] != m)
                print_error("%s: max %.9g, expected %.9g\n", cs, (double)out[0], m);
            ok &= check_within("tile_stats", cs, got, ref, bound, 3);
        }
    /* a NaN makes s and d NaN; entries far below the max (e^(z - m) = 0) add nothing */
    for (int k = 0; k < N_LENS; k += 5) {
        const int64_t n = len_at(k);
        for (int64_t j = 0; j < n; j++) x[j] = (float)rng_normal(&r);
        x[n / 2] = NAN;
        float out[4];
        g_k.tile_stats(x, n, 1.0f, out);
        if (!isnan(out[1]) || !isnan(out[2])) {
            print_error("%s tile_stats n=%lld with a NaN: s %g d %g, expected NaN\n", g_name,
                        (long long)n, out[1], out[2]);
            ok = 0;
        }
        if (n < 2) continue;
        for (int64_t j = 0; j < n; j++) x[j] = j == 0 ? 0.5f : -1e30f;
        g_k.tile_stats(x, n, 1.0f, out);
        if (out[0] != 0.5f || out[1] != 1.0f || out[2] != 0.0f) {
            print_error("%s tile_stats n=%lld, one finite entry: (%g, %g, %g)\n", g_name,
                        (long long)n, out[0], out[1], out[2]);
            ok = 0;
        }
    }
    free(x), free(x0);
    assert_true(ok);
}

static void test_tile_grad(void **state) {
    (void)state;
    sph_rng r;
    rng_seed(&r, test_seed() + 1);
    float *x = malloc(1100 * 4), *z = malloc(1100 * 4);
    double *ref = malloc(1100 * 8), *bd = malloc(1100 * 8), *got = malloc(1100 * 8);
    assert_non_null(x), assert_non_null(z), assert_non_null(ref), assert_non_null(bd);
    assert_non_null(got);
    int ok = 1;
    for (int k = 0; k < N_LENS; k++)
        for (int rep = 0; rep < 3; rep++) {
            const int64_t n = len_at(k);
            /* rep 2: offset 12 at T = 1e-4 (|z| ~ 1e5), spread ~ 3 in z */
            const float inv_t = rep == 1 ? 1.25f : rep == 2 ? 1e4f : 1.0f;
            const double off = rep == 2 ? 12 : 0, scale = rep == 2 ? 3e-4 : 3;
            double xm = -INFINITY, s = 0;
            for (int64_t j = 0; j < n; j++) {
                z[j] = (float)(off + rng_normal(&r) * scale);
                if (z[j] > xm) xm = z[j];
            }
            for (int64_t j = 0; j < n; j++) s += exp(((double)z[j] - xm) * inv_t);
            const float xs = (float)xm, ys = inv_t, ls = (float)log(s), dm = (float)(rng_normal(&r));
            const float A = (float)rng_normal(&r), e = (float)rng_normal(&r);
            const float C = (float)(rng_normal(&r) * 1e-3);
            memcpy(x, z, (size_t)n * 4);
            g_k.tile_grad(x, n, xs, ys, ls, A, e, dm, C, inv_t);
            for (int64_t j = 0; j < n; j++) {
                double y = ((double)z[j] - xs) * ys, p = exp(y - ls);
                ref[j] = (p * (A + e * ((double)dm - y)) + C) * inv_t;
                bd[j] = TOL_CPU_F32 * ((p * (fabs(A) + fabs(e) * (fabs(dm) + fabs(y))) +
                                        fabs(C)) * inv_t + 1e-30);
                got[j] = x[j];
            }
            char cs[96];
            snprintf(cs, sizeof cs, "tile_grad(%s,n=%lld,inv_t=%g)", g_name, (long long)n,
                     (double)inv_t);
            ok &= check_within("tile_grad", cs, got, ref, bd, (size_t)n);
        }
    free(x), free(z), free(ref), free(bd), free(got);
    assert_true(ok);
}

int main(int argc, char **argv) {
    g_name = test_kernel_arg(argc, argv, "generic");
    char why[512];
    int avail = test_kernel_available(g_name, why, sizeof why);
    if (avail <= 0 || !pick(g_name)) {
        printf("%s: %s\n", avail == 0 ? "SKIP" : "FAIL",
               avail <= 0 ? why : "not an epilogue kernel set (generic, avx2, avx512)");
        return avail == 0 ? 77 : 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cvt),
        cmocka_unit_test(test_tile_stats),
        cmocka_unit_test(test_tile_grad),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    tol_report(g_name);
    return test_exit(failed);
}
