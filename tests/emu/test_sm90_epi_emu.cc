/*
 * test_sm90_epi_emu.cc - the sm_90a statistics epilogue (src/cuda/head_sm90.cu: the tile
 * records, sum_p2's q, the one-pass kernel's E, the fused top-k's count, stage, reservation,
 * emission, slots and threshold raises) run on the CPU under tests/emu/cuda_emu.h, one
 * warpgroup of 128 threads per 64 x 256 tile, on accumulators computed here the way wgmma
 * leaves them (thread t's acc[4 j + 2 hf + e] = row 16 (t / 32) + t % 32 / 4 + 8 hf, column
 * 8 j + 2 (t % 4) + e; zero past the rows and the split, as TMA fills). The split's tiles run
 * in a shuffled order (the kernel's blocks meet the rows' thresholds and counts in any order),
 * then head_extras.cu's merge makes each row's list, checked against a sort of the same
 * logits; the records against float64 sums. And the backward's dlogits epilogue (both store
 * forms, v29's folded whole tiles) against float64. What the main loop (wgmma, TMA,
 * mbarriers) does is not here: tests/gpu covers it on a device.
 */
#include <algorithm>
#include <atomic>
#include <string>
#include <vector>

extern "C" {
#include "testutil.h"
}

#include "cuda_emu.h"

/* the kernels in a namespace of their own (the library linked beside them holds their names
 * as host stubs) */
#include "comm/comm.h"
#include "cuda/head.cuh"
#include "cuda/head_math.cuh"
#include "cuda/head_sm90.cuh"
#include "core/trace.h"
#define SPH_SM90_DEVICE_ONLY
namespace k {
#include "cuda/head_sm90.cu"
#include "cuda/head_extras.cu"
}
using namespace k;

static sph_rng g_rng;
static double uni() { return rng_uniform(&g_rng); }
static int irange(int lo, int hi) { return (int)rng_range(&g_rng, lo, hi); }

static bool fbits_eq(float a, float b) { return __float_as_uint(a) == __float_as_uint(b); }
static bool better(const sph_cuda_xtk &a, const sph_cuda_xtk &b) {
    return x_better(a.z, a.id, b.z, b.id);
}

struct epi_case {
    int R, Vs, H, K, variant, every_log2, onepass, store16, sum_p2, seed;
    float cap_s, temp;
    bool trows;
};

struct epi_run {
    epi_case c;
    int n_n, ks, cap, col_g0;
    std::vector<__nv_bfloat16> h, W;
    std::vector<float> u, z, trows, recs, q;
    std::vector<int64_t> tgt;
    std::vector<__half> E;
    std::vector<sph_cuda_xtk> cand, tk;
    std::vector<int> n, tau, slots;
};

/* row r's logits, largest first */
static std::vector<float> row_sorted(const epi_run &s, int r) {
    std::vector<float> zs(s.z.begin() + (size_t)r * s.c.Vs, s.z.begin() + (size_t)(r + 1) * s.c.Vs);
    std::sort(zs.rbegin(), zs.rend());
    return zs;
}

static float dot_row(const epi_run &s, int r, int c) {
    const uint4 *hr = (const uint4 *)(s.h.data() + (size_t)r * s.c.H);
    const uint4 *wr = (const uint4 *)(s.W.data() + (size_t)c * s.c.H);
    float acc = 0.f;
    for (int k = 0; k < s.c.H / 8; k++) acc += dot8<__nv_bfloat162>(hr[k], wr[k]);
    return acc;
}

static void epi_build(epi_run &s) {
    const epi_case &c = s.c;
    s.n_n = (c.Vs + SM90_BN - 1) / SM90_BN;
    s.ks = 8;
    while (s.ks < c.K) s.ks *= 2;
    s.cap = 900, s.col_g0 = 3000;
    s.h.resize((size_t)c.R * c.H), s.W.resize((size_t)c.Vs * c.H);
    for (auto &x : s.h) x = __float2bfloat16_rn((float)rng_normal(&g_rng));
    for (int v = 0; v < c.Vs; v++) {
        /* a quarter of the columns repeat an earlier one: ties, some at the K-th */
        const int src = v > 40 && v % 4 == 1 ? irange(0, 40) : v;
        for (int k = 0; k < c.H; k++)
            s.W[(size_t)v * c.H + k] =
                src == v ? __float2bfloat16_rn((float)(0.4 * rng_normal(&g_rng)))
                         : s.W[(size_t)src * c.H + k];
    }
    /* row 2 increases along the vocabulary: every tile beats the threshold (the stage's
     * overflow, the register emission) */
    for (int k = 0; k < c.H; k++)
        s.h[(size_t)2 * c.H + k] = __float2bfloat16_rn(k == 0 ? 1.f : 0.f);
    for (int v = 0; v < c.Vs; v++)
        s.W[(size_t)v * c.H] = __float2bfloat16_rn(-4.f + 8.f * v / c.Vs);
    s.trows.resize(c.R);
    for (auto &t : s.trows) t = (float)(0.5 + uni());
    s.u.resize((size_t)c.R * c.Vs), s.z.resize((size_t)c.R * c.Vs);
    for (int r = 0; r < c.R; r++) {
        const float it = c.trows ? 1.f / s.trows[r] : 1.f / c.temp;
        for (int v = 0; v < c.Vs; v++) {
            const float u = dot_row(s, r, v);
            s.u[(size_t)r * c.Vs + v] = u;
            s.z[(size_t)r * c.Vs + v] =
                transform(u, it, c.cap_s, c.cap_s > 0 ? 1.f / c.cap_s : 0.f);
        }
    }
    s.tgt.resize(c.R);
    for (int r = 0; r < c.R; r++)
        s.tgt[r] = r % 5 == 0   ? -1                   /* ignored */
                   : r % 5 == 1 ? s.col_g0 + c.Vs + 7 /* another shard's */
                                : s.col_g0 + irange(0, c.Vs - 1);
    s.recs.assign((size_t)c.R * s.n_n * SPH_PARTIAL_FIELDS, NAN);
    s.q.assign((size_t)c.R * s.n_n, NAN);
    s.E.assign((size_t)c.R * (s.n_n * SM90_BN), __float2half(NAN));
    s.cand.assign((size_t)c.R * s.cap, sph_cuda_xtk{NAN, -5});
    s.tk.assign((size_t)c.R * c.K, sph_cuda_xtk{NAN, -5});
    s.n.assign(c.R, 0), s.slots.assign((size_t)c.R * s.ks, sph_tk_enc(-INFINITY));
    s.tau.assign(c.R, sph_tk_enc(-INFINITY));
    if (c.seed)
        for (int r = 0; r < c.R; r++) {
            /* a seed at the row's ~4K-th largest logit, or above its K-th (every seventh row:
             * too few candidates, the merge's recompute) */
            std::vector<float> zs = row_sorted(s, r);
            const int j = r % 7 == 3 ? c.K / 2 : std::min(c.Vs - 1, 4 * c.K + irange(0, 50));
            s.tau[r] = sph_tk_enc(zs[(size_t)j]);
        }
}

static sph_sm90_epi epi_args(epi_run &s) {
    const epi_case &c = s.c;
    sph_sm90_epi ep;
    memset(&ep, 0, sizeof ep);
    ep.mode = SPH_SM90_EPI_STATS | (c.onepass ? SPH_SM90_EPI_E : 0);
    ep.tile_recs = s.recs.data(), ep.tile_q = c.sum_p2 ? s.q.data() : NULL;
    ep.tk_cand = s.cand.data(), ep.tk_n = s.n.data(), ep.tk_tau = s.tau.data();
    ep.tk_slots = s.slots.data(), ep.tk_cap = s.cap, ep.tk_ks = s.ks, ep.tk_k = c.K;
    ep.tk_every_log2 = c.every_log2, ep.tk_variant = c.variant;
    ep.E = c.onepass ? s.E.data() : NULL, ep.ldE = s.n_n * SM90_BN, ep.store16 = c.store16;
    ep.r0 = 0, ep.col_g0 = s.col_g0, ep.tgt = s.tgt.data(), ep.tgt_i64 = 1;
    ep.inv_t = 1.f / c.temp, ep.cap = c.cap_s, ep.inv_cap = c.cap_s > 0 ? 1.f / c.cap_s : 0.f;
    ep.trows = c.trows ? s.trows.data() : NULL;
    return ep;
}

/* Tile (tile_m, tile_n) of an R x Vs matrix u by one warpgroup of 128 fibers: body(acc, r, cb)
 * per thread, acc laid out as wgmma leaves it (acc[4 j + 2 hf + e] = u at row r + 8 hf, column
 * cb + 8 j + e; zero past the rows and the split, as TMA fills), r and cb the thread's first
 * row and column as the kernel forms them. Returns launch's error, or "". */
template <typename Body>
static std::string run_tile(const std::vector<float> &u, int64_t R, int64_t Vs, int tile_m,
                            int tile_n, Body body) {
    return emu::launch(1, 128, [&] {
        const int t = (int)threadIdx.x, lane = t % 32;
        const int64_t r = (int64_t)tile_m * 64 + (t / 32) * 16 + lane / 4;
        const int64_t cb = (int64_t)tile_n * SM90_BN + 2 * (lane % 4);
        float acc[128];
        for (int j = 0; j < 32; j++)
            for (int hf = 0; hf < 2; hf++)
                for (int e = 0; e < 2; e++) {
                    const int64_t rr = r + 8 * hf, col = cb + 8 * j + e;
                    acc[4 * j + 2 * hf + e] = rr < R && col < Vs ? u[(size_t)(rr * Vs + col)] : 0.f;
                }
        body(acc, r, cb);
    });
}

/* every tile of the split through the epilogue, one warpgroup each, in a shuffled order */
static void epi_sweep(epi_run &s, const sph_sm90_epi &ep) {
    const epi_case &c = s.c;
    const int n_m = (c.R + 63) / 64;
    std::vector<int> order(n_m * s.n_n);
    for (size_t i = 0; i < order.size(); i++) order[i] = (int)i;
    for (size_t i = order.size(); i > 1; i--)
        std::swap(order[i - 1], order[(size_t)irange(0, (int)i - 1)]);
    for (int k : order) {
        const int tile_m = k / s.n_n, tile_n = k % s.n_n;
        auto body = [&](float(&acc)[128], int64_t r, int64_t cb) {
            epi_row_args ra[2];
            epi_row_load<SPH_SM90_EPI_STATS>(ep, r, c.R, ra[0]);
            epi_row_load<SPH_SM90_EPI_STATS>(ep, r + 8, c.R, ra[1]);
            ra[0].tau = epi_row_tau(ep, r, c.R);
            ra[1].tau = epi_row_tau(ep, r + 8, c.R);
            const uint32_t tks = 4u * threadIdx.x;
            if (c.onepass) epi_stats_e(acc, ep, ra, r, cb, tile_n, s.n_n, c.R, c.Vs, tks);
            else epi_stats(acc, ep, ra, r, cb, tile_n, s.n_n, c.R, c.Vs, tks);
        };
        const std::string e = run_tile(s.u, c.R, c.Vs, tile_m, tile_n, body);
        if (!e.empty()) fail_msg("epilogue, tile (%d, %d): %s", tile_m, tile_n, e.c_str());
    }
}

static void check_records(const epi_run &s) {
    const epi_case &c = s.c;
    for (int r = 0; r < c.R; r++)
        for (int t = 0; t < s.n_n; t++) {
            const float *rec = s.recs.data() + ((size_t)r * s.n_n + t) * SPH_PARTIAL_FIELDS;
            const int c0 = t * SM90_BN, c1 = std::min(c.Vs, c0 + SM90_BN);
            float m = -INFINITY;
            for (int v = c0; v < c1; v++) m = fmaxf(m, s.z[(size_t)r * c.Vs + v]);
            double S = 0, B = 0, Bb = 0, Z = 0, Za = 0, Q = 0, zt = 0;
            for (int v = c0; v < c1; v++) {
                const double z = s.z[(size_t)r * c.Vs + v], p = exp(z - m);
                S += p, B += p * z, Bb += fabs(p * z), Z += z, Za += fabs(z), Q += p * p;
                if (s.col_g0 + v == s.tgt[r]) zt = z;
                if (c.onepass) {
                    const double E = __half2float(s.E[(size_t)r * (s.n_n * SM90_BN) + v]);
                    if (!(fabs(E - p) <= 1e-3 * p + 1e-7))
                        fail_msg("E row %d column %d: %g, want %g", r, v, E, p);
                }
            }
            char what[96];
            snprintf(what, sizeof what, "record row %d tile %d (variant %d, one-pass %d)", r, t,
                     c.variant, c.onepass);
            if (rec[0] != m) fail_msg("%s: m %g, want %g", what, (double)rec[0], (double)m);
            if (!(fabs(rec[1] - S) <= 2e-6 * S))
                fail_msg("%s: s %g, want %g", what, (double)rec[1], S);
            if (!(fabs(rec[2] - B) <= 2e-6 * Bb + 1e-6))
                fail_msg("%s: b %g, want %g", what, (double)rec[2], B);
            if (rec[3] != (float)zt) fail_msg("%s: z_t %g, want %g", what, (double)rec[3], zt);
            if (!(fabs(rec[4] - Z) <= 2e-6 * Za + 1e-6))
                fail_msg("%s: sum z %g, want %g", what, (double)rec[4], Z);
            if (c.sum_p2 && !(fabs(s.q[(size_t)r * s.n_n + t] - Q) <= 2e-6 * Q))
                fail_msg("%s: q %g, want %g", what, (double)s.q[(size_t)r * s.n_n + t], Q);
        }
}

/* The epilogue's contract for the merge: every logit at or above the row's final threshold
 * is in the buffer (its count <= cap), once, with its value; the threshold and the slots'
 * minimum never pass the K-th largest (unless a seed did: then fewer than K candidates). */
static void check_candidates(const epi_run &s) {
    const epi_case &c = s.c;
    for (int r = 0; r < c.R; r++) {
        const std::vector<float> zs = row_sorted(s, r);
        const float kth = zs[(size_t)c.K - 1], tau = sph_tk_dec(s.tau[r]);
        const int n = s.n[r];
        if (n > s.cap) continue; /* overflowed: the merge recomputes */
        std::vector<int> seen(c.Vs, 0);
        for (int e = 0; e < n; e++) {
            const sph_cuda_xtk x = s.cand[(size_t)r * s.cap + e];
            const int v = x.id - s.col_g0;
            if (v < 0 || v >= c.Vs || seen[v]++ || !fbits_eq(x.z, s.z[(size_t)r * c.Vs + v]))
                fail_msg("row %d candidate %d: (%g, %d) is no logit of the row, or twice", r, e,
                         (double)x.z, x.id);
        }
        for (int v = 0; v < c.Vs; v++)
            if (s.z[(size_t)r * c.Vs + v] >= tau && !seen[v])
                fail_msg("row %d: column %d (%g) reaches the threshold %g but is not a candidate",
                         r, v, (double)s.z[(size_t)r * c.Vs + v], (double)tau);
        int mn = INT32_MAX;
        for (int t = 0; t < s.ks; t++) mn = std::min(mn, s.slots[(size_t)r * s.ks + t]);
        if (n >= c.K && (tau > kth || sph_tk_dec(mn) > kth))
            fail_msg("row %d: threshold %g or slots' minimum %g above the K-th largest %g", r,
                     (double)tau, (double)sph_tk_dec(mn), (double)kth);
    }
}

static void check_lists(epi_run &s) {
    const epi_case &c = s.c;
    tkm_args a;
    memset(&a, 0, sizeof a);
    a.cand = s.cand.data(), a.n = s.n.data(), a.tau = s.tau.data(), a.slots = s.slots.data();
    a.ks = s.ks, a.tk = s.tk.data(), a.K = c.K, a.cap = s.cap, a.merge = 0, a.seeded = c.seed;
    a.variant = c.variant, a.rows = c.R;
    a.tile_recs = s.recs.data(), a.n_tiles = s.n_n, a.w = c.Vs, a.H = c.H, a.ld_h = c.H;
    a.ld_w = c.H, a.r0 = 0, a.hp = s.h.data(), a.wp = s.W.data(), a.col_g0 = s.col_g0;
    a.trows = c.trows ? s.trows.data() : NULL, a.inv_t = 1.f / c.temp, a.cap_s = c.cap_s;
    a.inv_cap = c.cap_s > 0 ? 1.f / c.cap_s : 0.f;
    int diag[4] = {0, 0, 0, 0};
    a.diag = diag;
    const bool warp = c.K <= XW_K;
    const unsigned nb = warp ? (unsigned)((c.R + XW_WARPS - 1) / XW_WARPS) : (unsigned)c.R;
    std::string e = emu::launch(nb, XT, [&] {
        if (warp) head_topk_merge_kernel<__nv_bfloat162, XW_WARPS>(a);
        else head_topk_merge_kernel<__nv_bfloat162, 1>(a);
    });
    if (!e.empty()) fail_msg("merge: %s", e.c_str());
    /* the rows whose seed was above their K-th largest (every seventh) are recomputed */
    if (warp && c.seed) assert_true(diag[2] >= c.R / 7);
    for (int r = 0; r < c.R; r++) {
        std::vector<sph_cuda_xtk> all;
        for (int v = 0; v < c.Vs; v++) all.push_back({s.z[(size_t)r * c.Vs + v], s.col_g0 + v});
        std::sort(all.begin(), all.end(), better);
        for (int e2 = 0; e2 < c.K; e2++) {
            const sph_cuda_xtk g = s.tk[(size_t)r * c.K + e2], w = all[(size_t)e2];
            if (g.id != w.id || !fbits_eq(g.z, w.z))
                fail_msg("list (K %d, variant %d, one-pass %d) row %d entry %d: (%g, %d), want "
                         "(%g, %d); seed %llu", c.K, c.variant, c.onepass, r, e2, (double)g.z,
                         g.id, (double)w.z, w.id, (unsigned long long)test_seed());
        }
    }
}

static void test_epilogue(void **state) {
    (void)state;
    /* R past a tile's 64 rows and short of the next; Vs not a multiple of 256 (a partial last
     * tile, the column tests), the FULL copies on the others */
    const epi_case cases[] = {
        /* R, Vs, H, K, variant, every, onepass, store16, sum_p2, seed, cap, temp, trows */
        {70, 1700, 16, 64, 0, 4, 0, 0, 1, 1, 0.f, 1.f, false},   /* the default count, seeded */
        {70, 1700, 16, 64, 0, 3, 0, 0, 1, 0, 0.f, 1.f, false},   /* no seed: the stage overflows */
        {70, 1500, 8, 20, 1, 4, 0, 0, 0, 1, 25.f, 0.8f, true},   /* v25's count, softcap, T_i */
        {70, 1500, 8, 40, 8, 2, 0, 0, 1, 1, 0.f, 1.3f, false},   /* a stage of 6: its overflows */
        {70, 1300, 16, 64, 0, 4, 1, 1, 1, 1, 0.f, 1.f, false},   /* one-pass, 16-byte E */
        {70, 1300, 16, 33, 1, 5, 1, 0, 0, 0, 30.f, 1.f, true},   /* one-pass, pairs of E */
        {70, 1400, 8, 100, 0, 4, 0, 0, 1, 1, 0.f, 1.f, false},   /* K > 64: the block merge */
    };
    for (const epi_case &c : cases) {
        epi_run s;
        s.c = c;
        epi_build(s);
        const sph_sm90_epi ep = epi_args(s);
        epi_sweep(s, ep);
        check_records(s);
        check_candidates(s);
        check_lists(s);
    }
}

/* The backward's dlogits epilogue (epi_dlogits: du of head.cu's dlogits kernel from the logits
 * in registers): du = dz / T_i (1 - tanh^2(u / cap)), dz = g (delta_t - p) + e p (mu - z) +
 * gl p + gm / V, p = exp(z - lse), 0 on inactive rows; against float64 at the stored dtype's
 * rounding, every column of the split written, the 16-byte form's tail of the row's 8-aligned
 * stride 0, nothing else touched. */
template <typename T>
static void dlogits_case(int R, int Vs, int store16, int vec2, float cap_s, bool trows) {
    const int n_n = (Vs + SM90_BN - 1) / SM90_BN, ldD = n_n * SM90_BN + 8;
    std::vector<float> u((size_t)R * Vs), st((size_t)R * 3), g(R), e(R), gl(R), gm(R), tr(R);
    std::vector<int64_t> tgt(R);
    std::vector<uint8_t> mask(R);
    for (auto &x : u) x = (float)(3.0 * rng_normal(&g_rng));
    for (int r = 0; r < R; r++) {
        tr[r] = (float)(0.5 + uni()), mask[r] = r % 6 != 4;
        g[r] = (float)rng_normal(&g_rng), e[r] = (float)rng_normal(&g_rng);
        gl[r] = (float)rng_normal(&g_rng), gm[r] = (float)rng_normal(&g_rng);
        tgt[r] = r % 5 == 0 ? -1 : r % 5 == 1 ? 5000 + Vs : 5000 + irange(0, Vs - 1);
        /* the row's lse and mu from its own logits (float64), as the forward left them */
        const float it = trows ? 1.f / tr[r] : 1.f / 0.9f, ic = cap_s > 0 ? 1.f / cap_s : 0.f;
        double m = -INFINITY, S = 0, B = 0;
        for (int v = 0; v < Vs; v++)
            m = std::max(m, (double)transform(u[(size_t)r * Vs + v], it, cap_s, ic));
        for (int v = 0; v < Vs; v++) {
            const double z = transform(u[(size_t)r * Vs + v], it, cap_s, ic);
            S += exp(z - m), B += exp(z - m) * z;
        }
        st[(size_t)r * 3 + 1] = (float)(m + log(S)), st[(size_t)r * 3 + 2] = (float)(B / S);
    }
    std::vector<T> D((size_t)(R + 1) * ldD);
    const T poison = from_f32<T>(-12345.f);
    std::fill(D.begin(), D.end(), poison);
    sph_sm90_epi ep;
    memset(&ep, 0, sizeof ep);
    ep.mode = SPH_SM90_EPI_DLOGITS, ep.D = D.data(), ep.ldD = ldD, ep.store16 = store16;
    ep.col_g0 = 5000, ep.tgt = tgt.data(), ep.tgt_i64 = 1, ep.inv_t = 1.f / 0.9f;
    ep.cap = cap_s, ep.inv_cap = cap_s > 0 ? 1.f / cap_s : 0.f, ep.inv_V = 1.f / 50000.f;
    ep.trows = trows ? tr.data() : NULL, ep.stats = st.data(), ep.g = g.data(), ep.e = e.data();
    ep.gl = gl.data(), ep.gm = gm.data(), ep.mask = mask.data();
    for (int tile = 0; tile < ((R + 63) / 64) * n_n; tile++) {
        const int tile_m = tile / n_n, tile_n = tile % n_n;
        auto body = [&](float(&acc)[128], int64_t r, int64_t cb) {
            epi_row_args ra[2];
            epi_row_load<SPH_SM90_EPI_DLOGITS>(ep, r, R, ra[0]);
            epi_row_load<SPH_SM90_EPI_DLOGITS>(ep, r + 8, R, ra[1]);
            epi_dlogits<T>(acc, ep, ra, r, cb, R, Vs, vec2);
        };
        const std::string err = run_tile(u, R, Vs, tile_m, tile_n, body);
        if (!err.empty()) fail_msg("dlogits, tile %d: %s", tile, err.c_str());
    }
    for (int r = 0; r <= R; r++)
        for (int v = 0; v < ldD; v++) {
            const float got = to_f32(D[(size_t)r * ldD + v]);
            const bool written = r < R && (v < Vs || (store16 && v < (Vs + 7) / 8 * 8));
            if (!written) {
                if (got != to_f32(poison))
                    fail_msg("dlogits: row %d column %d written (%g)", r, v, (double)got);
                continue;
            }
            if (v >= Vs) {
                if (got != 0.f)
                    fail_msg("dlogits: row %d column %d past the split: %g", r, v, (double)got);
                continue;
            }
            const float it = trows ? 1.f / tr[r] : 1.f / 0.9f;
            const double uu = u[(size_t)r * Vs + v];
            const double th = cap_s > 0 ? tanh(uu / cap_s) : 0;
            const double z = (cap_s > 0 ? cap_s * th : uu) * it;
            const double p = exp(z - st[(size_t)r * 3 + 1]);
            const bool at_t = tgt[r] == 5000 + v;
            double dz = (tgt[r] >= 0 ? g[r] : 0.0) * ((at_t ? 1.0 : 0.0) - p) +
                        e[r] * p * (st[(size_t)r * 3 + 2] - z) + gl[r] * p + gm[r] / 50000.0;
            double du = dz * it * (cap_s > 0 ? 1 - th * th : 1);
            if (!mask[r]) du = 0;
            const double mu = st[(size_t)r * 3 + 2];
            const double scale =
                fabs(g[r]) + fabs(e[r]) * (1 + fabs(z) + fabs(mu)) + fabs(gl[r]) + 1e-4;
            if (!(fabs(got - du) <= 1e-2 * fabs(du) + 2e-6 * scale * it))
                fail_msg("dlogits (store16 %d, vec2 %d, cap %g, T_i %d) row %d column %d: %g, want "
                         "%g; seed %llu", store16, vec2, (double)cap_s, (int)trows, r, v,
                         (double)got, du, (unsigned long long)test_seed());
        }
}

static void test_dlogits(void **state) {
    (void)state;
    dlogits_case<__nv_bfloat16>(70, 1300, 1, 1, 0.f, false); /* v29's folded whole tiles */
    dlogits_case<__nv_bfloat16>(70, 1300, 1, 1, 30.f, true); /* softcap, T_i */
    dlogits_case<__half>(70, 1030, 0, 1, 0.f, true);         /* 4-byte pairs */
    dlogits_case<__half>(70, 1031, 0, 0, 20.f, false);       /* an odd split, no pairs */
}

int main(void) {
    rng_seed(&g_rng, test_seed());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_epilogue),
        cmocka_unit_test(test_dlogits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
