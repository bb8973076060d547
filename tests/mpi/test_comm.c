/*
 * test_comm.c - the MPI communicator under mpirun (any rank count >= 1; CI runs 2 and 4).
 *
 * Covers: creation over a caller's MPI_Comm and over MPI_COMM_WORLD split by every (tp, cp,
 * dp) factorization of the world size (coordinates, group membership, rank order);
 * allgather order (random sizes, in place, and the large-message path forced by a small
 * count limit); the f32 all-reduce (also chunked); configuration disagreement on one rank
 * (vocab_total, temperature, dtype, tp, a shard gap, an overlap, a short last shard, shards
 * that differ across DP replicas) returning the same error on every rank; invalid values and a
 * NULL cfg on one rank; argument errors; the caller's communicator left untouched; and the
 * SPH_ERR_MPI message format.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "comm/comm.h"
#include "comm/mpi_util.h"
#include "mpitest.h"
#include "testutil.h"

static uint64_t g_seed;

/* An even-ish split of V over tp ranks (the last rank takes the remainder). */
static void shard_of(int64_t V, int64_t tp, int64_t t, int64_t *start, int64_t *local) {
    int64_t base = V / tp;
    *start = t * base;
    *local = t == tp - 1 ? V - t * base : base;
}

static sph_comm_config group_cfg(int64_t V) {
    sph_comm_config c = SPH_COMM_CONFIG_INIT;
    c.tp = mt_size;
    c.vocab_total = V;
    shard_of(V, mt_size, mt_rank, &c.vocab_start, &c.vocab_local);
    c.dtype = SPH_BF16;
    c.temperature = 0.7;
    return c;
}

/* ---- good paths ------------------------------------------------------------------------- */

static void check_allgather(sph_comm_t c, sph_rng *rng, size_t bytes, int in_place) {
    int64_t rank = 0, size = 0;
    sph_comm_info(c, NULL, &rank, &size);
    unsigned char *recv = malloc(bytes * (size_t)size + 1), *send = malloc(bytes + 1);
    /* Every rank derives every rank's payload from the shared seed, so each can check all. */
    for (int64_t r = 0; r < size; r++) {
        sph_rng g;
        rng_seed(&g, g_seed ^ (uint64_t)(r + 1) * 0x9E3779B97F4A7C15ull ^ bytes);
        for (size_t i = 0; i < bytes; i++) {
            unsigned char v = (unsigned char)rng_u64(&g);
            if (r == rank) send[i] = v;
        }
    }
    memset(recv, 0xA5, bytes * (size_t)size);
    const void *src = send;
    if (in_place) {
        memcpy(recv + (size_t)rank * bytes, send, bytes);
        src = recv + (size_t)rank * bytes;
    }
    MT_OK(c->ops->allgather(c, src, recv, bytes, NULL));
    for (int64_t r = 0; r < size; r++) {
        sph_rng g;
        rng_seed(&g, g_seed ^ (uint64_t)(r + 1) * 0x9E3779B97F4A7C15ull ^ bytes);
        size_t bad = 0;
        for (size_t i = 0; i < bytes; i++)
            bad += recv[(size_t)r * bytes + i] != (unsigned char)rng_u64(&g);
        MT_CHECK(bad == 0, "allgather(bytes=%zu, in_place=%d): %zu wrong bytes in rank %lld's "
                 "block", bytes, in_place, bad, (long long)r);
    }
    (void)rng;
    free(recv);
    free(send);
}

static void check_allreduce(sph_comm_t c, size_t count) {
    int64_t rank = 0, size = 0;
    sph_comm_info(c, NULL, &rank, &size);
    float *buf = malloc(count * sizeof *buf + 4);
    /* Small integers: the float sum is exact whatever the reduction order. */
    for (size_t i = 0; i < count; i++) buf[i] = (float)((int64_t)(i % 97) * (rank + 1) - 40);
    MT_OK(c->ops->allreduce_sum_f32(c, buf, count, NULL));
    size_t bad = 0;
    double tri = (double)size * (double)(size + 1) / 2;
    for (size_t i = 0; i < count; i++) {
        double want = (double)(i % 97) * tri - 40.0 * (double)size;
        bad += buf[i] != (float)want;
    }
    MT_CHECK(bad == 0, "allreduce(count=%zu): %zu wrong sums", count, bad);
    free(buf);
}

static void test_group(void) {
    sph_rng rng;
    rng_seed(&rng, g_seed + (uint64_t)mt_rank);
    MPI_Comm user;
    MPI_Comm_split(MPI_COMM_WORLD, 0, mt_rank, &user);
    MPI_Errhandler before, after;
    MPI_Comm_get_errhandler(user, &before);
    sph_comm_config cfg = group_cfg(1000 + (int64_t)(g_seed % 97));
    sph_comm_t c = NULL;
    MT_OK(sph_comm_create_mpi(&c, &user, &cfg));
    if (!c) return;
    MPI_Comm_get_errhandler(user, &after);
    MT_CHECK(before == after, "the caller's error handler changed");
    MPI_Errhandler_free(&before);
    MPI_Errhandler_free(&after);

    sph_comm_backend b;
    int64_t rank = -1, size = -1;
    MT_OK(sph_comm_info(c, &b, &rank, &size));
    MT_CHECK(b == SPH_COMM_MPI && rank == mt_rank && size == mt_size,
             "info: backend %d rank %lld size %lld", (int)b, (long long)rank, (long long)size);
    MT_CHECK(c->device_buffers == 0, "MPI takes host buffers");

    size_t sizes[] = {1, 3, 40, 8 * 5 * 37, 4096 + 13};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        check_allgather(c, &rng, sizes[i], 0);
        check_allgather(c, &rng, sizes[i], 1);
    }
    MT_OK(c->ops->allgather(c, NULL, NULL, 0, NULL)); /* nothing to exchange */
    check_allreduce(c, 1);
    check_allreduce(c, 1000);

    /* The large-message paths with a tiny count limit: a derived datatype of 7-byte blocks
     * plus a remainder, and chunked all-reduces. */
    sph_comm_mpi_set_max_count(7);
    check_allgather(c, &rng, 7, 0);
    check_allgather(c, &rng, 100, 0);
    check_allgather(c, &rng, 7 * 5, 1);
    check_allreduce(c, 50);
    sph_comm_mpi_set_max_count(0);

    /* Argument errors of the ops are local and need no collective. */
    unsigned char buf[64];
    MT_EXPECT(c->ops->allgather(c, NULL, buf, 4, NULL), SPH_ERR_INVALID_ARG, "NULL");
    MT_EXPECT(c->ops->allreduce_sum_f32(c, NULL, 4, NULL), SPH_ERR_INVALID_ARG, "NULL");
    if (mt_size > 1)
        MT_EXPECT(c->ops->allgather(c, buf + 1, buf, 8, NULL), SPH_ERR_INVALID_ARG, "overlaps");

    /* The caller's communicator still works and is not ours: a message on it arrives. */
    int token = mt_rank, sum = 0;
    MPI_Allreduce(&token, &sum, 1, MPI_INT, MPI_SUM, user);
    MT_CHECK(sum == mt_size * (mt_size - 1) / 2, "user comm allreduce gave %d", sum);
    sph_comm_destroy(c);
    MPI_Comm_free(&user);
}

static void test_world(void) {
    for (int64_t tp = 1; tp <= mt_size; tp++) {
        if (mt_size % tp) continue;
        for (int64_t cp = 1; cp <= mt_size / tp; cp++) {
            if ((mt_size / tp) % cp) continue;
            int64_t dp = mt_size / tp / cp;
            sph_comm_config cfg = SPH_COMM_CONFIG_INIT;
            cfg.tp = tp;
            cfg.cp = cp;
            cfg.dp = dp;
            cfg.vocab_total = 517;
            int64_t t_expect = mt_rank % tp;
            shard_of(517, tp, t_expect, &cfg.vocab_start, &cfg.vocab_local);
            sph_comm_t c = NULL;
            int64_t t = -1, cr = -1, d = -1;
            MT_OK(sph_comm_create_mpi_world(&c, &cfg, &t, &cr, &d));
            if (!c) continue;
            MT_CHECK(t == t_expect && cr == (mt_rank / tp) % cp && d == mt_rank / (tp * cp),
                     "(%lld,%lld,%lld): coordinates (%lld,%lld,%lld) for world rank %d",
                     (long long)tp, (long long)cp, (long long)dp, (long long)t, (long long)cr,
                     (long long)d, mt_rank);
            MT_CHECK(((dp == 1 ? 0 : d) * cp + cr) * tp + t == mt_rank, "rank formula");
            int64_t rank, size;
            sph_comm_info(c, NULL, &rank, &size);
            MT_CHECK(rank == t && size == tp, "TP comm rank %lld size %lld", (long long)rank,
                     (long long)size);
            /* The group holds exactly the tp consecutive world ranks, in tp_rank order. */
            int32_t me = mt_rank, got[64];
            MT_OK(c->ops->allgather(c, &me, got, sizeof me, NULL));
            for (int64_t r = 0; r < size && r < 64; r++)
                MT_CHECK(got[r] == mt_rank - t + r, "(%lld,%lld,%lld): group slot %lld holds "
                         "world rank %d", (long long)tp, (long long)cp, (long long)dp,
                         (long long)r, got[r]);
            sph_comm_destroy(c);
        }
    }
}

/* ---- disagreement: the same error on every rank ------------------------------------------ */

typedef void (*mutate_fn)(sph_comm_config *c);
static void m_vocab(sph_comm_config *c) { c->vocab_total += 1; }
static void m_temp(sph_comm_config *c) { c->temperature = nextafter(c->temperature, 2.0); }
static void m_dtype(sph_comm_config *c) { c->dtype = SPH_F32; }
static void m_tp(sph_comm_config *c) { c->tp += 1; }
static void m_gap(sph_comm_config *c) { c->vocab_start += 1; c->vocab_local -= 1; }
static void m_overlap(sph_comm_config *c) { c->vocab_start -= 1; c->vocab_local += 1; }
static void m_short(sph_comm_config *c) { c->vocab_local -= 1; }
static void m_bad_temp(sph_comm_config *c) { c->temperature = -1; }
static void m_zero_local(sph_comm_config *c) { c->vocab_local = 0; }
static void m_bad_dtype(sph_comm_config *c) { c->dtype = SPH_I32; }

static void expect_everywhere(sph_status got, sph_status want, const char *needle,
                              const char *what) {
    const char *msg = sph_last_error();
    MT_CHECK(got == want, "%s: status %d (%s), expected %d; message: %s", what, (int)got,
             sph_status_str(got), (int)want, msg);
    MT_CHECK(strstr(msg, needle) != NULL, "%s: message '%s' lacks '%s'", what, msg, needle);
    /* Same text on every rank: compare a hash against rank 0's. */
    uint64_t h = 1469598103934665603ull, h0;
    for (const char *p = msg; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    h0 = h;
    MPI_Bcast(&h0, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    MT_CHECK(h == h0, "%s: message differs from rank 0's: %s", what, msg);
}

static void test_mismatch(void) {
    const int64_t V = 777;
    int last = mt_size - 1;
    char needle[128];
    struct { mutate_fn f; int rank; sph_status s; const char *field; int needs_peer; } cases[] = {
        {m_vocab, last, SPH_ERR_MISMATCH, "cfg.vocab_total is 778, rank 0 has 777", 1},
        {m_temp, last, SPH_ERR_MISMATCH, "cfg.temperature", 1},
        {m_dtype, last, SPH_ERR_MISMATCH, "cfg.dtype is f32, rank 0 has bf16", 1},
        {m_tp, 0, SPH_ERR_MISMATCH, "cfg.tp", 0},
        {m_gap, last, SPH_ERR_MISMATCH, "leaves a gap", 0},
        {m_overlap, last, SPH_ERR_MISMATCH, "overlaps", 1},
        {m_short, last, SPH_ERR_MISMATCH, "leaving a gap", 0},
        {m_bad_temp, last, SPH_ERR_INVALID_ARG, "cfg.temperature is -1, expected finite", 0},
        {m_zero_local, last, SPH_ERR_INVALID_ARG, "cfg.vocab_local is 0, expected >= 1", 0},
        {m_bad_dtype, last, SPH_ERR_INVALID_ARG, "cfg.dtype is i32", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (cases[i].needs_peer && mt_size < 2) continue;
        sph_comm_config cfg = group_cfg(V);
        if (mt_rank == cases[i].rank) cases[i].f(&cfg);
        sph_comm_t c = (sph_comm_t)&cfg; /* must be reset to NULL on failure */
        MPI_Comm w = MPI_COMM_WORLD;
        sph_status st = sph_comm_create_mpi(&c, &w, &cfg);
        int who = cases[i].rank;
        const char *field = cases[i].field;
        char tpmsg[96];
        if (cases[i].f == m_tp) { /* rank 0 claims tp = size + 1 */
            if (mt_size > 1) {
                who = 1;
                snprintf(tpmsg, sizeof tpmsg, "cfg.tp is %d, rank 0 has %d", mt_size, mt_size + 1);
                field = tpmsg;
            } else {
                snprintf(tpmsg, sizeof tpmsg, "the communicator has 1 ranks, but cfg.tp is 2");
                field = tpmsg;
                who = -1;
            }
        }
        if (who >= 0) {
            snprintf(needle, sizeof needle, "rank %d: ", who);
            if (strstr(sph_last_error(), needle) == NULL)
                MT_CHECK(0, "mismatch case %zu: message '%s' does not name %s", i,
                         sph_last_error(), needle);
        }
        snprintf(needle, sizeof needle, "%s", field);
        char what[64];
        snprintf(what, sizeof what, "mismatch case %zu", i);
        expect_everywhere(st, cases[i].s, needle, what);
        MT_CHECK(c == NULL, "%s: handle not reset on failure", what);
        if (st == SPH_OK) sph_comm_destroy(c);
    }

    /* A NULL cfg on one rank: every rank learns, nobody hangs. */
    {
        sph_comm_config cfg = group_cfg(V);
        sph_comm_t c = NULL;
        MPI_Comm w = MPI_COMM_WORLD;
        sph_status st = sph_comm_create_mpi(&c, &w, mt_rank == last ? NULL : &cfg);
        snprintf(needle, sizeof needle, "rank %d: cfg is NULL", last);
        expect_everywhere(st, SPH_ERR_INVALID_ARG, needle, "NULL cfg");
    }
    /* A NULL output handle on one rank. */
    {
        sph_comm_config cfg = group_cfg(V);
        sph_comm_t c = NULL;
        MPI_Comm w = MPI_COMM_WORLD;
        sph_status st = sph_comm_create_mpi(mt_rank == 0 ? NULL : &c, &w, &cfg);
        expect_everywhere(st, SPH_ERR_INVALID_ARG, "rank 0: comm: output pointer is NULL",
                          "NULL out");
    }
    /* World: the sizes do not multiply to the world size. */
    {
        sph_comm_config cfg = SPH_COMM_CONFIG_INIT;
        cfg.tp = 1;
        cfg.dp = mt_size + 1;
        cfg.vocab_total = cfg.vocab_local = 50;
        sph_comm_t c = NULL;
        sph_status st = sph_comm_create_mpi_world(&c, &cfg, NULL, NULL, NULL);
        snprintf(needle, sizeof needle, "world has %d ranks, but cfg.tp * cp * dp", mt_size);
        expect_everywhere(st, SPH_ERR_MISMATCH, needle, "world size");
    }
    /* World: two DP replicas whose shards tile V differently. */
    if (mt_size % 2 == 0 && mt_size >= 4) {
        sph_comm_config cfg = SPH_COMM_CONFIG_INIT;
        cfg.tp = 2;
        cfg.dp = mt_size / 2;
        cfg.vocab_total = 100;
        int64_t cut = mt_rank < 2 ? 50 : 60, t = mt_rank % 2;
        cfg.vocab_start = t ? cut : 0;
        cfg.vocab_local = t ? 100 - cut : cut;
        sph_comm_t c = NULL;
        sph_status st = sph_comm_create_mpi_world(&c, &cfg, NULL, NULL, NULL);
        expect_everywhere(st, SPH_ERR_MISMATCH, "rank 2: shard [0, 60) differs from rank 0's",
                          "replica shards");
    }
}

/* Ranks that pass different sizes to a collective (different shapes on the TP ranks): the
 * same SPH_ERR_MISMATCH everywhere, never a truncation or a hang. */
static void test_size_mismatch(void) {
    if (mt_size < 2) return;
    sph_comm_config cfg = group_cfg(300);
    sph_comm_t c = NULL;
    MPI_Comm w = MPI_COMM_WORLD;
    MT_OK(sph_comm_create_mpi(&c, &w, &cfg));
    if (!c) return;
    int last = mt_size - 1;
    char send[64] = {0}, *recv = calloc((size_t)mt_size, 64);
    char needle[160];
    size_t bytes = mt_rank == last ? 24 : 16;
    sph_status st = c->ops->allgather(c, send, recv, bytes, NULL);
    snprintf(needle, sizeof needle, "ranks disagree on the size: rank %d passes 24 bytes, rank 0 "
             "passes 16", last);
    expect_everywhere(st, SPH_ERR_MISMATCH, needle, "allgather size mismatch");
    float f[8] = {0};
    st = c->ops->allreduce_sum_f32(c, f, mt_rank == 0 ? 3 : 8, NULL);
    expect_everywhere(st, SPH_ERR_MISMATCH, "rank 1 passes 8 floats, rank 0 passes 3",
                      "allreduce count mismatch");
    /* bad arguments on one rank: that rank says why, the others learn which rank it was */
    st = c->ops->allgather(c, mt_rank == last ? NULL : send, recv, 16, NULL);
    if (mt_rank == last)
        MT_CHECK(st == SPH_ERR_INVALID_ARG && strstr(sph_last_error(), "is NULL"),
                 "bad rank: %d %s", (int)st, sph_last_error());
    else {
        snprintf(needle, sizeof needle, "rank %d passed invalid arguments", last);
        MT_CHECK(st == SPH_ERR_INVALID_ARG && strstr(sph_last_error(), needle),
                 "good rank: %d %s", (int)st, sph_last_error());
    }
    /* and the communicator still works afterwards */
    check_allreduce(c, 17);
    free(recv);

    /* Through the head: TP ranks with different N fail the forward's combine everywhere. */
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    o.tp_comm = c;
    o.num_threads = 1;
    sph_ctx_t ctx = NULL;
    MT_OK(sph_ctx_create(&ctx, &o));
    if (ctx) {
        int64_t N = mt_rank == last ? 6 : 5, H = 4, V_loc = cfg.vocab_local;
        float *h = calloc((size_t)(N * H), sizeof(float)), *wt = calloc((size_t)(V_loc * H), 4);
        float *lp = calloc((size_t)N, 4), *stt = calloc((size_t)(N * 3), 4);
        uint16_t *hb = calloc((size_t)(N * H), 2), *wb = calloc((size_t)(V_loc * H), 2);
        int64_t tg[6] = {0, 1, 2, 3, 4, 5};
        int64_t sh[2] = {N, H}, sw[2] = {V_loc, H}, sn[1] = {N}, ss[2] = {N, 3};
        sph_tensor th = {hb, {SPH_DEVICE_CPU, 0}, 2, SPH_BF16, sh, NULL, 0};
        sph_tensor tw = {wb, {SPH_DEVICE_CPU, 0}, 2, SPH_BF16, sw, NULL, 0};
        sph_tensor tt = {tg, {SPH_DEVICE_CPU, 0}, 1, SPH_I64, sn, NULL, 0};
        sph_tensor tl = {lp, {SPH_DEVICE_CPU, 0}, 1, SPH_F32, sn, NULL, 0};
        sph_tensor ts = {stt, {SPH_DEVICE_CPU, 0}, 2, SPH_F32, ss, NULL, 0};
        sph_head_args a = SPH_HEAD_ARGS_INIT;
        a.hidden = &th;
        a.weight = &tw;
        a.targets = &tt;
        a.vocab_start = cfg.vocab_start;
        a.vocab_total = cfg.vocab_total;
        a.logprob = &tl;
        a.stats = &ts;
        size_t need = 0;
        MT_OK(sph_head_workspace_size(ctx, SPH_HEAD_FORWARD, &a, &need));
        void *ws = malloc(need + 1);
        /* the consistency check comes before any output is written (issue 18 item 7) */
        for (int64_t i = 0; i < N; i++) lp[i] = 123.f, stt[3 * i] = 123.f;
        st = sph_head_forward(ctx, &a, ws, need);
        MT_CHECK(st == SPH_ERR_MISMATCH && strstr(sph_last_error(), "calls with N (rows of "
                                                                    "hidden)"),
                 "head forward with N differing across TP ranks: %d (%s) %s", (int)st,
                 sph_status_str(st), sph_last_error());
        for (int64_t i = 0; i < N; i++)
            MT_CHECK(lp[i] == 123.f && stt[3 * i] == 123.f, "row %lld written after a mismatch",
                     (long long)i);
        /* the same N, another temperature on one rank: the same message on every rank */
        N = 5;
        sh[0] = sn[0] = ss[0] = N;
        a.temperature = mt_rank == last ? 0.75 : 1.0;
        MT_OK(sph_head_workspace_size(ctx, SPH_HEAD_FORWARD, &a, &need));
        free(ws);
        ws = malloc(need + 1);
        st = sph_head_forward(ctx, &a, ws, need);
        snprintf(needle, sizeof needle, "rank %d calls with temperature 0.75, rank 0 with 1",
                 last);
        MT_CHECK(st == SPH_ERR_MISMATCH && strstr(sph_last_error(), needle),
                 "temperature differing across TP ranks: %d %s", (int)st, sph_last_error());
        /* other targets on one rank */
        a.temperature = 1.0;
        int64_t t0 = tg[2];
        if (mt_rank == last) tg[2] = 4;
        st = sph_head_forward(ctx, &a, ws, need);
        MT_CHECK(st == SPH_ERR_MISMATCH && strstr(sph_last_error(), "targets differ"),
                 "targets differing across TP ranks: %d %s", (int)st, sph_last_error());
        tg[2] = t0;
        /* one rank's call is invalid: it says why, the others fail with it (no hang) */
        a.stats = mt_rank == last ? NULL : &ts;
        st = sph_head_forward(ctx, &a, ws, need);
        if (mt_rank == last)
            MT_CHECK(st == SPH_ERR_INVALID_ARG && strstr(sph_last_error(), "stats: NULL"),
                     "invalid rank: %d %s", (int)st, sph_last_error());
        else {
            snprintf(needle, sizeof needle, "rank %d of the group refused its call", last);
            MT_CHECK(st == SPH_ERR_INVALID_ARG && strstr(sph_last_error(), needle),
                     "valid ranks: %d %s", (int)st, sph_last_error());
        }
        a.stats = &ts;
        /* and the same call everywhere passes */
        MT_OK(sph_head_forward(ctx, &a, ws, need));
        free(ws);
        free(h), free(wt), free(lp), free(stt), free(hb), free(wb);
        sph_ctx_destroy(ctx);
    }
    sph_comm_destroy(c);
}

static void test_args(void) {
    sph_comm_config cfg = group_cfg(64);
    sph_comm_t c = NULL;
    MT_EXPECT(sph_comm_create_mpi(&c, NULL, &cfg), SPH_ERR_INVALID_ARG, "mpi_comm is NULL");
    MPI_Comm null = MPI_COMM_NULL;
    MT_EXPECT(sph_comm_create_mpi(&c, &null, &cfg), SPH_ERR_INVALID_ARG, "MPI_COMM_NULL");
    MT_EXPECT(sph_comm_info(NULL, NULL, NULL, NULL), SPH_ERR_INVALID_ARG, "NULL");
    if (mt_size >= 2) { /* an intercommunicator (even ranks <-> odd ranks) is refused */
        MPI_Comm half, inter;
        MPI_Comm_split(MPI_COMM_WORLD, mt_rank % 2, mt_rank, &half);
        MPI_Intercomm_create(half, 0, MPI_COMM_WORLD, mt_rank % 2 ? 0 : 1, 99, &inter);
        MT_EXPECT(sph_comm_create_mpi(&c, &inter, &cfg), SPH_ERR_INVALID_ARG,
                  "intercommunicator");
        MPI_Comm_free(&inter);
        MPI_Comm_free(&half);
    }
    sph_comm_destroy(NULL);
    /* The SPH_ERR_MPI message: rank, size, the expression and MPI's own error string. */
    char mpimsg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(MPI_ERR_COMM, mpimsg, &len);
    sph_status s = sph_mpi_error(MPI_ERR_COMM, "MPI_Fake(x)", MPI_COMM_WORLD, "f.c", 7);
    char rank_of[64];
    snprintf(rank_of, sizeof rank_of, "rank %d of %d: MPI_Fake(x) failed", mt_rank, mt_size);
    MT_CHECK(s == SPH_ERR_MPI, "sph_mpi_error status %d", (int)s);
    MT_CHECK(strstr(sph_last_error(), rank_of) && strstr(sph_last_error(), mpimsg),
             "message '%s' lacks '%s' or '%s'", sph_last_error(), rank_of, mpimsg);
#ifndef SPH_HAVE_NCCL
    MT_EXPECT(sph_comm_create_nccl(&c, (void *)&cfg, &cfg), SPH_ERR_UNSUPPORTED, "without NCCL");
    MPI_Comm w = MPI_COMM_WORLD;
    MT_EXPECT(sph_comm_create_nccl_mpi(&c, &w, &cfg), SPH_ERR_UNSUPPORTED, "without NCCL");
#endif
#ifdef SPH_HAVE_NCCL
    MT_EXPECT(sph_comm_create_nccl(&c, NULL, &cfg), SPH_ERR_INVALID_ARG, "nccl_comm is NULL");
#endif
}

int main(int argc, char **argv) {
    mt_init(&argc, &argv);
    g_seed = mt_rank == 0 ? test_seed() : 0;
    MPI_Bcast(&g_seed, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    test_group();
    test_world();
    test_mismatch();
    test_size_mismatch();
    test_args();
    return mt_finish("test_comm");
}
