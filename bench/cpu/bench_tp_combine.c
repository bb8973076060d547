/*
 * bench_tp_combine.c - the cost of the tensor-parallel combine on the CPU with MPI: bytes and
 * latency of the one collective per forward against the forward's compute.
 *
 * Run under mpirun with T ranks (one TP group): mpirun -np T bench_tp_combine [options].
 * Each rank holds V/T vocab rows. Per forward, the head reduces its shard to one record of
 * SPH_PARTIAL_FIELDS float64 values per row (m, s, b, zt, sz) and allgathers it (combine.c):
 * bytes sent per rank = N * 5 * 8, received = T times that. The benchmark times
 *   1. the allgather alone (comm->ops->allgather on the real communicator), for a sweep of N;
 *   2. sph_head_forward with the TP communicator (compute + combine), and the same forward
 *      with no communicator (the shard's compute only); the difference is the combine's share
 *      as the head sees it (the gather plus the merge of T records per row).
 * Each figure is the slowest rank's time per repetition (MPI_Reduce MAX), median and p10/p90
 * over --reps repetitions after one warm-up; a barrier starts every repetition.
 *
 * Validation: before timing, the TP forward's logprob/entropy are compared with a
 * single-process forward over the full vocabulary on rank 0 (which holds all of W).
 *
 * With more ranks than cores (CI machines: 2) the ranks are oversubscribed: latencies then
 * include scheduling, and the report says so.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if defined(__has_include)
#if __has_include(<mpi.h>)
#define BENCH_HAVE_MPI 1
#endif
#endif

#ifndef BENCH_HAVE_MPI
int main(void) {
    puts("bench_tp_combine: built without MPI; nothing to measure");
    return 0;
}
#else
#include <mpi.h>

#include "comm/comm.h"
#include "head/plan.h"
#include "head/host.h"
#include "bench_cpu.h"
#include "spanhead.h"

static int g_rank, g_size;

#define DIE(...)                                                                              \
    do {                                                                                      \
        fprintf(stderr, "[rank %d] ", g_rank);                                                \
        fprintf(stderr, __VA_ARGS__);                                                         \
        fputc('\n', stderr);                                                                  \
        MPI_Abort(MPI_COMM_WORLD, 1);                                                         \
    } while (0)
#define TRY(call)                                                                             \
    do {                                                                                      \
        sph_status s_ = (call);                                                               \
        if (s_) DIE("%s: %s", #call, sph_last_error());                                       \
    } while (0)

typedef struct stats { double med, p10, p90; } stats;

static stats summarize(double *t, int n) {
    qsort(t, (size_t)n, sizeof *t, cmp_d);
    stats s = {t[n / 2], t[n / 10], t[(n * 9) / 10 < n ? (n * 9) / 10 : n - 1]};
    return s;
}

/* Slowest rank's time of this repetition. */
static double slowest(double t) {
    double m = 0;
    MPI_Allreduce(&t, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return m;
}

static uint64_t g_s = 12345;
static float frand(void) {
    g_s = g_s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(g_s >> 11) * 0x1.0p-53 * 2 - 1);
}

/* The combine's collective alone: allgather of n records per rank, slowest rank per rep. */
static stats time_allgather(sph_comm_t comm, int64_t n, int reps, double *t) {
    const int64_t T = comm->size;
    size_t bytes = (size_t)n * SPH_PARTIAL_FIELDS * sizeof(double);
    double *send = malloc(bytes), *recv = malloc(bytes * (size_t)T);
    if (!send || !recv) DIE("out of memory");
    for (size_t i = 0; i < bytes / sizeof(double); i++) send[i] = g_rank + (double)i;
    TRY(comm->ops->allgather(comm, send, recv, bytes, NULL)); /* warm-up, validated */
    for (size_t i = 0; i < bytes / sizeof(double); i++)
        if (recv[(size_t)(T - 1) * bytes / sizeof(double) + i] != (double)(T - 1) + (double)i)
            DIE("allgather returned wrong data");
    for (int r = 0; r < reps; r++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        TRY(comm->ops->allgather(comm, send, recv, bytes, NULL));
        t[r] = slowest(MPI_Wtime() - t0);
    }
    free(send);
    free(recv);
    return summarize(t, reps);
}

typedef struct head_in {
    int64_t N, H, V_loc, v0, V;
    float *h, *w;
    int64_t *t;
    float *lp, *en, *st;
} head_in;

static double time_forward(sph_ctx_t ctx, head_in *x, void **ws, size_t *ws_bytes) {
    int64_t sh[2] = {x->N, x->H}, sw[2] = {x->V_loc, x->H}, sn[1] = {x->N}, ss[2] = {x->N, 3};
    sph_tensor th = {x->h, {SPH_DEVICE_CPU, 0}, 2, SPH_F32, sh, NULL, 0};
    sph_tensor tw = {x->w, {SPH_DEVICE_CPU, 0}, 2, SPH_F32, sw, NULL, 0};
    sph_tensor tt = {x->t, {SPH_DEVICE_CPU, 0}, 1, SPH_I64, sn, NULL, 0};
    sph_tensor tl = {x->lp, {SPH_DEVICE_CPU, 0}, 1, SPH_F32, sn, NULL, 0};
    sph_tensor te = {x->en, {SPH_DEVICE_CPU, 0}, 1, SPH_F32, sn, NULL, 0};
    sph_tensor ts = {x->st, {SPH_DEVICE_CPU, 0}, 2, SPH_F32, ss, NULL, 0};
    sph_head_args a = SPH_HEAD_ARGS_INIT;
    a.hidden = &th;
    a.weight = &tw;
    a.targets = &tt;
    a.vocab_start = x->v0;
    a.vocab_total = x->V;
    a.logprob = &tl;
    a.entropy = &te;
    a.stats = &ts;
    size_t need = 0;
    TRY(sph_head_workspace_size(ctx, SPH_HEAD_FORWARD, &a, &need));
    if (need > *ws_bytes) {
        free(*ws);
        *ws = malloc(need);
        if (!*ws) DIE("out of memory for %zu workspace bytes", need);
        *ws_bytes = need;
    }
    double t0 = MPI_Wtime();
    TRY(sph_head_forward(ctx, &a, *ws, *ws_bytes));
    return MPI_Wtime() - t0;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    int64_t N = 512, H = 256, V = 8192;
    int reps = 10;
    const char *kernel = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--N")) N = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--H")) H = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--V")) V = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--kernel")) kernel = argv[i + 1];
        else DIE("unknown option %s (--N --H --V --reps --kernel)", argv[i]);
    }
    if (N < 1 || H < 1 || V < g_size || reps < 1) DIE("bad sizes");
    const int64_t T = g_size, base = V / T, v0 = g_rank * base,
                  V_loc = g_rank == T - 1 ? V - v0 : base;

    sph_comm_config cfg = SPH_COMM_CONFIG_INIT;
    cfg.tp = T;
    cfg.vocab_total = V;
    cfg.vocab_start = v0;
    cfg.vocab_local = V_loc;
    sph_comm_t comm = NULL;
    MPI_Comm w = MPI_COMM_WORLD;
    TRY(sph_comm_create_mpi(&comm, &w, &cfg));
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    o.force_kernel = kernel;
    sph_ctx_t local = NULL, tp = NULL;
    TRY(sph_ctx_create(&local, &o));
    o.tp_comm = comm;
    TRY(sph_ctx_create(&tp, &o));

    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (g_rank == 0) {
        char ver[MPI_MAX_LIBRARY_VERSION_STRING];
        int len = 0;
        MPI_Get_library_version(ver, &len);
        char *nl = strchr(ver, '\n');
        if (nl) *nl = '\0';
        char host[256] = "?";
        gethostname(host, sizeof host);
        time_t now = time(NULL);
        char date[64];
        strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", gmtime(&now));
        printf("# machine: %s, %ld cores online; %s; %s; spanhead %s; %s\n", host, cores, ver,
               sph_ctx_describe(tp), sph_version(), date);
        printf("# TP = %lld ranks on %ld cores%s\n", (long long)T, cores,
               T > cores ? " (OVERSUBSCRIBED: latencies include scheduling)" : "");
    }

    /* ---- 1. the collective alone, sweep over N -------------------------------------------- */
    if (g_rank == 0)
        printf("\n## allgather of the combine records (SPH_PARTIAL_FIELDS=%d float64 per row)\n"
               "| T | N rows | bytes sent/rank | bytes recv/rank | median ms | p10 ms | p90 ms | "
               "GB/s recv |\n|---|---|---|---|---|---|---|---|\n",
               SPH_PARTIAL_FIELDS);
    int64_t sweep[] = {1024, 4096, 16384, 65536, 262144};
    double *t = malloc(sizeof(double) * (size_t)reps);
    if (!t) DIE("out of memory");
    for (size_t k = 0; k < sizeof sweep / sizeof sweep[0]; k++) {
        stats s = time_allgather(comm, sweep[k], reps, t);
        size_t bytes = (size_t)sweep[k] * SPH_PARTIAL_FIELDS * sizeof(double);
        if (g_rank == 0)
            printf("| %lld | %lld | %zu | %zu | %.3f | %.3f | %.3f | %.2f |\n", (long long)T,
                   (long long)sweep[k], bytes, bytes * (size_t)T, s.med * 1e3, s.p10 * 1e3,
                   s.p90 * 1e3, (double)bytes * (double)T / s.med / 1e9);
    }

    /* ---- 2. forward with and without the combine ---------------------------------------- */
    head_in x = {N, H, V_loc, v0, V, NULL, NULL, NULL, NULL, NULL, NULL};
    x.h = malloc(sizeof(float) * (size_t)(N * H));
    x.w = malloc(sizeof(float) * (size_t)(V * H)); /* all of W: rank 0 validates with it */
    x.t = malloc(sizeof(int64_t) * (size_t)N);
    x.lp = malloc(sizeof(float) * (size_t)N);
    x.en = malloc(sizeof(float) * (size_t)N);
    x.st = malloc(sizeof(float) * (size_t)(N * 3));
    float *lp_full = malloc(sizeof(float) * (size_t)N);
    float *en_full = malloc(sizeof(float) * (size_t)N);
    if (!x.h || !x.w || !x.t || !x.lp || !x.en || !x.st || !lp_full || !en_full)
        DIE("out of memory");
    for (int64_t i = 0; i < N * H; i++) x.h[i] = frand();
    for (int64_t i = 0; i < V * H; i++) x.w[i] = frand() * 0.2f;
    for (int64_t i = 0; i < N; i++) x.t[i] = (int64_t)((uint64_t)(i * 2654435761u) % (uint64_t)V);
    void *ws = NULL;
    size_t ws_bytes = 0;
    float *w_all = x.w;
    x.w = w_all + (size_t)v0 * (size_t)H;

    /* validation: the TP forward against rank 0's full-vocabulary forward */
    time_forward(tp, &x, &ws, &ws_bytes);
    if (g_rank == 0) {
        head_in full = x;
        full.w = w_all;
        full.V_loc = V;
        full.v0 = 0;
        full.lp = lp_full;
        full.en = en_full;
        time_forward(local, &full, &ws, &ws_bytes);
        double worst = 0;
        for (int64_t i = 0; i < N; i++) {
            double e1 = fabs(x.lp[i] - lp_full[i]) / (1e-4 + 1e-4 * fabs(lp_full[i]));
            double e2 = fabs(x.en[i] - en_full[i]) / (1e-4 + 1e-4 * fabs(en_full[i]));
            worst = fmax(worst, fmax(e1, e2));
        }
        printf("\n# validation: TP forward vs one-process forward, worst |err|/(1e-4+1e-4|ref|) = "
               "%.3f %s\n", worst, worst <= 1 ? "(ok)" : "(FAIL)");
        if (!(worst <= 1)) DIE("TP forward does not match the one-process forward");
    }

    double *t_tp = malloc(sizeof(double) * (size_t)reps);
    double *t_loc = malloc(sizeof(double) * (size_t)reps);
    if (!t_tp || !t_loc) DIE("out of memory");
    time_forward(local, &x, &ws, &ws_bytes); /* warm-up of the shard-only path */
    for (int r = 0; r < reps; r++) {
        MPI_Barrier(MPI_COMM_WORLD);
        t_loc[r] = slowest(time_forward(local, &x, &ws, &ws_bytes));
        MPI_Barrier(MPI_COMM_WORLD);
        t_tp[r] = slowest(time_forward(tp, &x, &ws, &ws_bytes));
    }
    stats sl = summarize(t_loc, reps), st = summarize(t_tp, reps);
    stats sa = time_allgather(comm, N, reps, t);
    if (g_rank == 0) {
        size_t bytes = (size_t)N * SPH_PARTIAL_FIELDS * sizeof(double);
        double flops = 2.0 * (double)N * (double)H * (double)V_loc;
        printf("\n## forward per rank: N=%lld H=%lld V=%lld V_loc=%lld (%s)\n"
               "| T | combine bytes sent/rank | forward, shard only: median ms (p10-p90) | "
               "forward with TP combine: median ms (p10-p90) | difference | allgather alone: "
               "median ms | allgather / forward | shard GFLOP/s |\n"
               "|---|---|---|---|---|---|---|---|\n",
               (long long)N, (long long)H, (long long)V, (long long)V_loc, sph_ctx_describe(tp));
        double diff = (st.med - sl.med) / st.med * 100;
        printf("| %lld | %zu | %.3f (%.3f-%.3f) | %.3f (%.3f-%.3f) | %+.1f%% | %.4f | %.4f%% | "
               "%.2f |\n",
               (long long)T, bytes, sl.med * 1e3, sl.p10 * 1e3, sl.p90 * 1e3, st.med * 1e3,
               st.p10 * 1e3, st.p90 * 1e3, diff, sa.med * 1e3, sa.med / st.med * 100,
               flops / sl.med / 1e9);
    }
    free(ws);
    free(x.h);
    free(w_all);
    free(x.t);
    free(x.lp);
    free(x.en);
    free(x.st);
    free(lp_full);
    free(en_full);
    free(t);
    free(t_tp);
    free(t_loc);
    sph_ctx_destroy(tp);
    sph_ctx_destroy(local);
    sph_comm_destroy(comm);
    MPI_Finalize();
    return 0;
}
#endif
