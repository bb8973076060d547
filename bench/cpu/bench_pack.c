/*
 * bench_pack.c - time sph_pack on 1e4, 1e5 and 1e6 random sequence lengths per algorithm and
 * compare the bin count with the lower bound ceil(sum of padded lengths / capacity).
 *
 * usage: bench_pack [--reps R] [--capacity K] [--tp T --cp C] [--csv]
 * Two length distributions: "uniform" U[1, K/2] and "rl" (log-normal prompt + response,
 * median ~1.1K tokens, clipped to K), both from a fixed seed. Each configuration is checked
 * once (every sequence placed once, no bin over capacity) and then timed R times; the median,
 * p10 and p90 wall times (CLOCK_MONOTONIC) are printed.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_cpu.h"
#include "spanhead.h"

static uint64_t rng_state = 0x5eed5eed12345678ull;
static uint64_t next_u64(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double uniform01(void) { return (double)(next_u64() >> 11) * 0x1.0p-53; }
static double normal01(void) {
    double u1 = uniform01(), u2 = uniform01();
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static void machine_record(void) {
    char model[256] = "unknown";
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f)) {
            if (!strncmp(line, "model name", 10)) {
                char *c = strchr(line, ':');
                if (c) {
                    snprintf(model, sizeof model, "%s", c + 2);
                    model[strcspn(model, "\n")] = 0;
                }
                break;
            }
        }
        fclose(f);
    }
    time_t t = time(NULL);
    char date[64];
    strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", gmtime(&t));
#ifdef __VERSION__
    const char *cc = __VERSION__;
#else
    const char *cc = "unknown";
#endif
    printf("# machine: %s; compiler %s; spanhead %s; %s; single thread\n", model, cc,
           sph_version(), date);
}

static int check(const sph_pack_result *r, const int64_t *len, int64_t n, int64_t cap) {
    char *seen = calloc((size_t)n + 1, 1);
    int ok = seen != NULL && r->n_items == n;
    for (int64_t b = 0; ok && b < r->n_bins; b++) {
        if (r->bin_tokens[b] > cap || r->bin_offsets[b + 1] == r->bin_offsets[b]) ok = 0;
        for (int64_t j = r->bin_offsets[b]; ok && j < r->bin_offsets[b + 1]; j++) {
            int64_t i = r->items[j];
            if (i < 0 || i >= n || seen[i]) ok = 0;
            else seen[i] = 1;
        }
    }
    (void)len;
    free(seen);
    return ok;
}

int main(int argc, char **argv) {
    int reps = 5, csv = 0;
    int64_t cap = 16384, tp = 1, cp = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--capacity") && i + 1 < argc) cap = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--tp") && i + 1 < argc) tp = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--cp") && i + 1 < argc) cp = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--csv")) csv = 1;
        else {
            fprintf(stderr, "usage: bench_pack [--reps R] [--capacity K] [--tp T --cp C] [--csv]\n");
            return 2;
        }
    }
    if (reps < 1 || cap < 2 || tp < 1 || cp < 1) {
        fprintf(stderr, "bench_pack: bad arguments\n");
        return 2;
    }
    machine_record();
    printf("# capacity %lld, tp %lld, cp %lld, %d repetitions, times in ms\n", (long long)cap,
           (long long)tp, (long long)cp, reps);
    if (csv) printf("dist,n,algorithm,ms_median,ms_p10,ms_p90,bins,lower_bound,excess_pct,utilization\n");
    else printf("%-8s %8s %-9s %10s %10s %10s %9s %9s %8s %7s\n", "dist", "n", "algorithm",
                "ms(med)", "ms(p10)", "ms(p90)", "bins", "lower", "excess%", "util");
    const char *algos[3] = {"ffd", "mffd", "balanced"};
    const char *dists[2] = {"uniform", "rl"};
    sph_parallel par = {tp, cp, SPH_FP8_NONE};
    sph_alignment al;
    if (sph_alignment_get(&par, &al)) {
        fprintf(stderr, "bench_pack: %s\n", sph_last_error());
        return 1;
    }
    const int64_t cap_eff = cap / al.total * al.total;
    for (int dist = 0; dist < 2; dist++) {
        for (int64_t n = 10000; n <= 1000000; n *= 10) {
            int64_t *len = malloc(sizeof(int64_t) * (size_t)n);
            if (!len) return 1;
            int64_t sum = 0;
            for (int64_t i = 0; i < n; i++) {
                int64_t l;
                if (dist == 0) {
                    l = 1 + (int64_t)(uniform01() * (double)(cap / 2));
                } else {
                    double p = exp(log(300.0) + 0.8 * normal01());
                    double r = exp(log(700.0) + 1.0 * normal01());
                    l = (int64_t)(p + r) + 2;
                }
                if (l > cap_eff) l = cap_eff;
                if (l < 1) l = 1;
                len[i] = l;
                sum += (l + al.sequence - 1) / al.sequence * al.sequence;
            }
            const int64_t lower = (sum + cap_eff - 1) / cap_eff;
            for (int a = 0; a < 3; a++) {
                sph_pack_opts o = SPH_PACK_OPTS_INIT;
                o.capacity = cap;
                o.algorithm = (sph_pack_algo)a;
                o.par = par;
                double *ms = malloc(sizeof(double) * (size_t)reps);
                sph_pack_result *r = NULL;
                int64_t bins = 0;
                double util = 0;
                for (int k = 0; k < reps; k++) {
                    double t0 = now_s();
                    if (sph_pack(len, n, &o, &r)) {
                        fprintf(stderr, "bench_pack: %s\n", sph_last_error());
                        return 1;
                    }
                    ms[k] = 1e3 * (now_s() - t0);
                    if (k == 0 && !check(r, len, n, cap_eff)) {
                        fprintf(stderr, "bench_pack: invalid packing (%s, n=%lld)\n", algos[a],
                                (long long)n);
                        return 1;
                    }
                    bins = r->n_bins;
                    util = r->utilization;
                    sph_pack_free(r);
                }
                qsort(ms, (size_t)reps, sizeof(double), cmp_d);
                const double med = ms[reps / 2], p10 = ms[reps / 10],
                             p90 = ms[(reps * 9) / 10 < reps ? (reps * 9) / 10 : reps - 1];
                const double excess = 100.0 * (double)(bins - lower) / (double)lower;
                if (csv)
                    printf("%s,%lld,%s,%.3f,%.3f,%.3f,%lld,%lld,%.3f,%.5f\n", dists[dist],
                           (long long)n, algos[a], med, p10, p90, (long long)bins,
                           (long long)lower, excess, util);
                else
                    printf("%-8s %8lld %-9s %10.2f %10.2f %10.2f %9lld %9lld %8.3f %7.4f\n",
                           dists[dist], (long long)n, algos[a], med, p10, p90, (long long)bins,
                           (long long)lower, excess, util);
                fflush(stdout);
                free(ms);
            }
            free(len);
        }
    }
    return 0;
}
