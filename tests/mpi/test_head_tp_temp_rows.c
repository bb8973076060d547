/*
 * test_head_tp_temp_rows.c - per-row temperature (issue 25 item 1) under mpirun, tensor
 * parallel over every rank (CI: 2 and 4): vocabulary shard [V r / T, V (r + 1) / T) of
 * V = 1601 (several 256-column CPU tiles per rank), several row chunks, f32 and bf16, masks,
 * sample support, softcap, one-pass and forward then backward, T_i in [0.25, 4] mixed; every
 * rank checks its outputs against the unsharded float64 reference. Then the agreement: a rank
 * whose temperature_rows differ in one value (or that passes none) makes every rank fail with
 * SPH_ERR_MISMATCH naming temperature_rows, nothing written.
 */
#include "../parity/test_head_case.h"
#include "mpitest.h"

static void die_on(sph_status s, const char *what, const char *cs) {
    if (s == SPH_OK) return;
    fprintf(stderr, "[rank %d] %s failed in %s: %s\n", mt_rank, what, cs, sph_last_error());
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

static sph_ctx_t tp_ctx(const char *kernel, int64_t a0, int64_t VL, int64_t V, sph_dtype dt,
                        sph_comm_t *comm, const char *cs) {
    sph_comm_config cfg = SPH_COMM_CONFIG_INIT;
    cfg.tp = mt_size, cfg.vocab_total = V, cfg.vocab_start = a0, cfg.vocab_local = VL;
    cfg.dtype = dt, cfg.temperature = 1.0;
    MPI_Comm world = MPI_COMM_WORLD;
    die_on(sph_comm_create_mpi(comm, &world, &cfg), "sph_comm_create_mpi", cs);
    sph_ctx_opts o = SPH_CTX_OPTS_INIT;
    o.force_kernel = kernel, o.num_threads = 1, o.chunk_rows = 9, o.tp_comm = *comm;
    sph_ctx_t ctx = NULL;
    die_on(sph_ctx_create(&ctx, &o), "sph_ctx_create", cs);
    return ctx;
}

static int run_cfg(sph_rng *r, const char *kernel, int64_t K, int bf, int masked, int one_pass,
                   double cap) {
    const int64_t T = mt_size, N = 41, H = 17, V = 1601;
    const int64_t a0 = V * mt_rank / T, a1 = V * (mt_rank + 1) / T, VL = a1 - a0;
    const sph_dtype dt = bf ? SPH_BF16 : SPH_F32;
    hcase f;
    hc_init(&f, r, N, H, V, V, 0, K, dt);
    if (masked) hc_mask_ragged(&f, r, 0.6);
    float *Tr = hc_alloc((size_t)N * 4);
    for (int64_t i = 0; i < N; i++) Tr[i] = (float)(0.25 * pow(16.0, rng_uniform(r)));
    int64_t sht[1];
    sph_tensor tt = tensor1(Tr, SPH_F32, sht, N);
    char cs[160];
    snprintf(cs, sizeof cs, "tp_temp_rows(kernel=%s,ranks=%d,K=%lld,%s,mask=%d,one_pass=%d,cap=%g)",
             kernel ? kernel : "best", mt_size, (long long)K, bf ? "bf16" : "f32", masked,
             one_pass, cap);
    const unsigned m = masked ? HC_MASK | HC_SPANS : 0;
    hc_wire(&f, HC_OUTS | HC_UPS | HC_DH | HC_DW | m);
    f.a.temperature_rows = &tt, f.a.softcap = cap;
    sph_ctx_t rc = hc_ctx("ref", 1, NULL);
    hexp x;
    hc_expect(rc, &f.a, &x);
    sph_ctx_destroy(rc);

    hcase c = f;
    c.V_loc = VL, c.v0 = a0;
    c.w = (char *)f.w + (size_t)(a0 * H) * hc_esize(f.dt);
    c.lp = hc_alloc((size_t)N * 4), c.ent = hc_alloc((size_t)N * 4);
    c.lse = hc_alloc((size_t)N * 4), c.lm = hc_alloc((size_t)N * 4);
    c.stats = hc_alloc((size_t)N * 12);
    c.dh = hc_alloc((size_t)(N * H) * 4), c.dw = hc_alloc((size_t)(VL * H) * 4);
    hc_poison(&c);
    sph_comm_t comm = NULL;
    sph_ctx_t ctx = tp_ctx(kernel, a0, VL, V, dt, &comm, cs);
    hc_wire(&c, HC_OUTS | m | (one_pass ? HC_UPS | HC_DH | HC_DW : 0));
    c.a.temperature_rows = &tt, c.a.softcap = cap;
    c.a.allreduce_dhidden = one_pass;
    die_on(hc_run(ctx, SPH_HEAD_FORWARD, &c.a), "forward", cs);
    if (!one_pass) {
        hc_wire(&c, HC_UPS | HC_DH | HC_DW | m);
        c.a.temperature_rows = &tt, c.a.softcap = cap, c.a.allreduce_dhidden = 1;
        die_on(hc_run(ctx, SPH_HEAD_BACKWARD, &c.a), "backward", cs);
    }
    sph_ctx_destroy(ctx);
    sph_comm_destroy(comm);
    int ok = !x.active_mismatch;
    ok &= hc_close_col("logprob", cs, c.lp, 1, x.rows, 7, 0, N, TOL_CPU_F32);
    ok &= hc_close_col("entropy", cs, c.ent, 1, x.rows, 7, 1, N, TOL_CPU_F32);
    ok &= hc_close_col("lse", cs, c.lse, 1, x.rows, 7, 2, N, TOL_CPU_F32);
    for (int s = 0; s < 3; s++)
        ok &= hc_close_col("stats", cs, c.stats + s, 3, x.rows, 7, 4 + s, N, TOL_CPU_F32);
    ok &= hc_check_grad("dhidden", cs, c.dh, SPH_F32, x.dh, x.dh, NULL, NULL, N * H, TOL_CPU_F32,
                        0, 0, 0, 1);
    ok &= hc_check_grad("dweight shard", cs, c.dw, SPH_F32, x.dw + a0 * H, x.dw + a0 * H, NULL,
                        NULL, VL * H, TOL_CPU_F32, 0, 0, 0, 1);
    free(c.lp), free(c.ent), free(c.lse), free(c.lm), free(c.stats), free(c.dh), free(c.dw);
    free(Tr);
    hc_expect_free(&x);
    hc_free(&f);
    return ok;
}

/* The last rank changes one temperature (or drops the vector): every rank is refused. */
static void mismatch(sph_rng *r, int drop) {
    const int64_t T = mt_size, N = 12, H = 8, V = 300;
    const int64_t a0 = V * mt_rank / T, a1 = V * (mt_rank + 1) / T, VL = a1 - a0;
    hcase f;
    hc_init(&f, r, N, H, V, V, 0, 0, SPH_F32);
    float Tr[12];
    for (int i = 0; i < 12; i++) Tr[i] = 0.5f + 0.1f * (float)i;
    if (mt_rank == mt_size - 1) Tr[7] = nextafterf(Tr[7], 2.0f); /* one ulp */
    int64_t sht[1];
    sph_tensor tt = tensor1(Tr, SPH_F32, sht, N);
    hcase c = f;
    c.V_loc = VL, c.v0 = a0;
    c.w = (char *)f.w + (size_t)(a0 * H) * 4;
    sph_comm_t comm = NULL;
    sph_ctx_t ctx = tp_ctx(NULL, a0, VL, V, SPH_F32, &comm, "mismatch");
    hc_wire(&c, HC_OUTS);
    c.a.temperature_rows = drop && mt_rank == mt_size - 1 ? NULL : &tt;
    if (drop) Tr[7] = 1.2f; /* only the presence differs */
    hc_poison(&c);
    float *lp0 = hc_dup(c.lp, (size_t)N * 4);
    MT_EXPECT(hc_run(ctx, SPH_HEAD_FORWARD, &c.a), SPH_ERR_MISMATCH,
              drop ? "requested outputs" : "temperature_rows");
    MT_CHECK(!memcmp(lp0, c.lp, (size_t)N * 4), "logprob written by a refused call");
    free(lp0);
    sph_ctx_destroy(ctx);
    sph_comm_destroy(comm);
    hc_free(&f);
}

int main(int argc, char **argv) {
    mt_init(&argc, &argv);
    unsigned long long seed = mt_rank == 0 ? (unsigned long long)test_seed() : 0;
    MPI_Bcast(&seed, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
    if (mt_rank != 0) {
        char b[32];
        snprintf(b, sizeof b, "%llu", seed);
        setenv("SPH_TEST_SEED", b, 1);
    }
    sph_rng r;
    rng_seed(&r, seed + 25201); /* the same stream on every rank: the same inputs */
    const char *kernels[2] = {"ref", NULL};
    for (int kk = 0; kk < 2; kk++)
        for (int v = 0; v < 8; v++)
            MT_CHECK(run_cfg(&r, kernels[kk], v & 1 ? 6 : 0, v >> 1 & 1, 1, v >> 2 & 1,
                             v == 3 ? 2.5 : 0.0),
                     "case %d kernel %s", v, kernels[kk] ? kernels[kk] : "best");
    if (mt_size > 1) {
        mismatch(&r, 0);
        mismatch(&r, 1);
    }
    return mt_finish("test_head_tp_temp_rows");
}
