/*
 * test_extras_emu.cc - the top-k kernels of src/cuda/head_extras.cu run on the CPU
 * (tests/emu/cuda_emu.h: each thread a fiber, the warp's collectives exact), against a host
 * reference, on machines without a GPU: the sampled seed's select (the warp kernel and the
 * block kernel, the same threshold bit for bit), the merge (the warp per row with its
 * compaction and its register sort, the v31 variant, the block per row with its recompute of
 * an overflowed or wrongly seeded row, from real bf16 dot products), the finalize across
 * ranks (the lists' merge by rank, sum_p2), and the emulator's own collectives.
 *
 * The GPU programs (tests/gpu/test_head_cuda_contract.c) check the same kernels behind the
 * fused statistics kernel on a device; this test checks their logic in CI, where there is
 * none: every path of the merge (tkm_args.diag counts which ran) on fresh random inputs.
 */
#include <algorithm>
#include <string>
#include <vector>

extern "C" {
#include "testutil.h"
}

#include "cuda_emu.h"

/* the kernels in a namespace of their own: the library linked beside them (for testutil) holds
 * the same names as host stubs of the device build */
#include "comm/comm.h"
#include "cuda/head.cuh"
#include "cuda/head_math.cuh"
#include "cuda/head_sm90.cuh"
namespace k {
#include "cuda/head_extras.cu"
}
using namespace k;

static sph_rng g_rng;

static double uni() { return rng_uniform(&g_rng); }
static int irange(int lo, int hi) { return (int)rng_range(&g_rng, lo, hi); }

static bool better(const sph_cuda_xtk &a, const sph_cuda_xtk &b) {
    return x_better(a.z, a.id, b.z, b.id);
}
/* the K best of a set (NaN and empty entries never enter), padded with empty ones */
static std::vector<sph_cuda_xtk> ref_topk(std::vector<sph_cuda_xtk> v, int K) {
    v.erase(std::remove_if(v.begin(), v.end(),
                           [](const sph_cuda_xtk &x) { return x.id < 0 || x.z != x.z; }),
            v.end());
    std::sort(v.begin(), v.end(), better);
    v.resize((size_t)K, sph_cuda_xtk{-INFINITY, -1});
    return v;
}
static unsigned fbits(float f) { return __float_as_uint(f); }

// ---- the emulator ------------------------------------------------------------------------------

static void test_emu_collectives(void **state) {
    (void)state;
    std::vector<int> out(64 * 8, -7);
    std::string e = emu::launch(2, 64, [&] {
        const int t = (int)threadIdx.x, l = t & 31, b = (int)blockIdx.x;
        int *o = out.data() + (b * 64 + t) * 4;
        o[0] = __shfl_sync(0xffffffffu, 100 * b + l, (l + 3) & 31);
        o[1] = (int)__ballot_sync(0xffffffffu, (l % 3) == 0);
        o[2] = __reduce_add_sync(0xffffffffu, l);
        o[3] = __shfl_xor_sync(0xffffffffu, l, 5, 8);
        __shared__ int sh[64];
        sh[t] = t + b;
        __syncthreads();
        o[0] += 1000 * sh[63 - t];
    });
    assert_true(e.empty());
    unsigned every3 = 0;
    for (int l = 0; l < 32; l += 3) every3 |= 1u << l;
    for (int b = 0; b < 2; b++)
        for (int t = 0; t < 64; t++) {
            const int l = t & 31, *o = out.data() + (b * 64 + t) * 4;
            assert_int_equal(o[0], 100 * b + ((l + 3) & 31) + 1000 * (63 - t + b));
            assert_int_equal((unsigned)o[1], every3);
            assert_int_equal(o[2], 31 * 32 / 2);
            assert_int_equal(o[3], (l & ~7) | ((l & 7) ^ 5));
        }
    /* lanes of one warp in different collectives; half a warp in a warp collective while
     * the other half waits at the block's barrier: both reported, no hang */
    e = emu::launch(1, 32, [&] {
        if (threadIdx.x < 16) (void)__shfl_sync(0xffffffffu, 1, 0);
        else (void)__ballot_sync(0xffffffffu, 1);
    });
    assert_true(e.find("collective") != std::string::npos);
    e = emu::launch(1, 32, [&] {
        if (threadIdx.x < 16) __syncwarp();
        else __syncthreads();
    });
    assert_true(e.find("deadlock") != std::string::npos);
    /* lanes that exited drop out of a full-mask collective (CUDA's rule: the named lanes that
     * have not exited), and out of the block's barrier */
    std::vector<int> got(32, -1);
    e = emu::launch(1, 32, [&] {
        if (threadIdx.x >= 20) return;
        got[threadIdx.x] = (int)__ballot_sync(0xffffffffu, 1);
    });
    assert_true(e.empty());
    for (int l = 0; l < 20; l++) assert_int_equal(got[l], (1 << 20) - 1);
    /* threads that exit leave the barrier to the others (CUDA's rule for exited threads) */
    int after = 0;
    e = emu::launch(1, 64, [&] {
        if (threadIdx.x >= 32) return;
        __syncthreads();
        after++;
    });
    assert_true(e.empty());
    assert_int_equal(after, 32);
}

// ---- the staged kernel (no sm_90a, fp32, batch-invariant: from the staged logits) ------------

/* rows of two vocabulary splits of staged logits (ldL > w), in shapes: normal, ties (a few
 * levels), increasing along the vocabulary (every logit beats the list: the list's merges of
 * 2048 entries), a NaN row; the list and (m, q) carried from the first split to the second */
static void test_staged(void **state) {
    (void)state;
    for (int pass = 0; pass < 6; pass++) {
        static const int Ks[6] = {0, 1, 17, 64, 100, 256}; /* 0: sum_p2 alone */
        const int K = Ks[pass];
        const bool q2 = pass != 3;
        const int rows = 9, w0 = 2500 + 37 * pass, w1 = 1700, ld = 2600 + 37 * pass;
        const float cap = pass == 2 ? 20.f : 0.f;
        std::vector<float> L0((size_t)rows * ld), L1((size_t)rows * ld), trows(rows);
        for (auto &t : trows) t = (float)(0.6 + uni());
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < ld; c++) {
                const int shape = r % 4;
                double z0 = 4.0 * rng_normal(&g_rng), z1 = 4.0 * rng_normal(&g_rng);
                if (shape == 1) z0 = irange(0, 3), z1 = irange(0, 3);
                if (shape == 2) z0 = 1e-3 * c, z1 = 3.0 + 1e-3 * c;
                L0[(size_t)r * ld + c] = (float)z0, L1[(size_t)r * ld + c] = (float)z1;
            }
        L1[(size_t)3 * ld + 5] = NAN; /* row 3: non-finite in the second split */
        std::vector<float2> mq(rows, make_float2(NAN, NAN));
        std::vector<sph_cuda_xtk> tk((size_t)rows * (K ? K : 1), sph_cuda_xtk{NAN, -5});
        x_args a;
        memset(&a, 0, sizeof a);
        a.ldL = ld, a.r0 = 0, a.trows = pass & 1 ? trows.data() : NULL, a.inv_t = 1.f / 0.9f;
        a.cap = cap, a.inv_cap = cap > 0 ? 1.f / cap : 0.f, a.K = K;
        a.mq = q2 ? mq.data() : NULL, a.tk = K ? tk.data() : NULL;
        for (int sp = 0; sp < 2; sp++) {
            a.L = sp ? L1.data() : L0.data(), a.w = sp ? w1 : w0, a.col_g0 = sp ? w0 : 0;
            a.merge = sp;
            std::string e = emu::launch(rows, XT, [&] { head_extras_kernel(a); });
            if (!e.empty()) fail_msg("staged (K %d): %s", K, e.c_str());
        }
        for (int r = 0; r < rows; r++) {
            const float it = a.trows ? 1.f / trows[r] : a.inv_t;
            std::vector<sph_cuda_xtk> all;
            double m = -INFINITY;
            bool nan = false;
            for (int sp = 0; sp < 2; sp++)
                for (int c = 0; c < (sp ? w1 : w0); c++) {
                    const float u = (sp ? L1 : L0)[(size_t)r * ld + c];
                    const float z = transform(u, it, cap, a.inv_cap);
                    all.push_back({z, (sp ? w0 : 0) + c});
                    if (z != z) nan = true;
                    else m = std::max(m, (double)z);
                }
            if (q2) {
                double q = 0;
                for (const sph_cuda_xtk &x : all)
                    if (x.z == x.z) q += exp(2.0 * (x.z - m));
                if (nan) assert_true(mq[r].y != mq[r].y);
                else {
                    assert_true(mq[r].x == (float)m);
                    if (!(fabs(mq[r].y - q) <= 1e-5 * q))
                        fail_msg("staged (K %d) row %d: q %.9g, want %.9g; seed %llu", K, r,
                                 (double)mq[r].y, q, (unsigned long long)test_seed());
                }
            }
            if (!K) continue;
            const std::vector<sph_cuda_xtk> want = ref_topk(all, K);
            for (int e2 = 0; e2 < K; e2++) {
                const sph_cuda_xtk g = tk[(size_t)r * K + e2], w = want[(size_t)e2];
                if (g.id != w.id || fbits(g.z) != fbits(w.z))
                    fail_msg("staged (K %d) row %d entry %d: (%g, %d), want (%g, %d); seed %llu",
                             K, r, e2, (double)g.z, g.id, (double)w.z, w.id,
                             (unsigned long long)test_seed());
            }
        }
    }
}

// ---- the seed's select --------------------------------------------------------------------

/* rows of m = 1024 sample logits in several shapes: normal, heavy ties, NaN-laced (some with
 * fewer than s ordered samples: no seed), -inf and +inf among them */
static void seed_samples(std::vector<float> &S, int rows, int m) {
    S.resize((size_t)rows * m);
    for (int r = 0; r < rows; r++) {
        float *x = S.data() + (size_t)r * m;
        const int shape = r % 6;
        for (int j = 0; j < m; j++) {
            double z = 3.0 * rng_normal(&g_rng);
            if (shape == 1) z = floor(z * 2.0) / 2.0;   /* ~25 levels: ties at every rank */
            if (shape == 2) z = (double)irange(0, 2);     /* 3 levels */
            x[j] = (float)z;
            if (shape == 3 && uni() < 0.3) x[j] = NAN;
            if (shape == 4 && uni() < 0.995) x[j] = NAN; /* ~5 ordered samples */
            if (shape == 5 && uni() < 0.05) x[j] = uni() < 0.5 ? -INFINITY : INFINITY;
        }
    }
}

static void test_seed_select(void **state) {
    (void)state;
    const int m = 1024, rows = 39; /* not a multiple of the warp kernel's 4 rows per block */
    for (int pass = 0; pass < 4; pass++) {
        const int K = pass == 0 ? 1 : pass == 1 ? 13 : pass == 2 ? 40 : 64;
        const int H = pass < 2 ? 0 : pass == 2 ? 24 : 20; /* 0: no margin; 20: 2-byte loads */
        std::vector<float> S;
        seed_samples(S, rows, m);
        std::vector<__nv_bfloat16> h((size_t)rows * (H ? H : 1) + 8);
        for (auto &x : h) x = __float2bfloat16_rn((float)rng_normal(&g_rng));
        std::vector<float> trows(rows);
        for (auto &t : trows) t = (float)(0.5 + uni());
        const unsigned wmax = fbits(1.25f);
        tks_args a;
        memset(&a, 0, sizeof a);
        a.S = S.data(), a.m = m, a.K = K, a.kind = 1;
        a.s = topk_seed_rank(K, m, 62080, 0);
        a.wmax = &wmax, a.hp = h.data(), a.ld_h = H, a.H = H, a.r0 = 0;
        a.trows = pass & 1 ? trows.data() : NULL;
        a.inv_t = 1.f / 0.7f, a.cap = pass == 3 ? 30.f : 0.f, a.inv_cap = a.cap ? 1.f / a.cap : 0.f;
        const int ninf = sph_tk_enc(-INFINITY);
        std::vector<int> tb(rows, ninf), tw(rows, ninf), tr(rows, ninf);
        a.tau = tb.data();
        std::string e = emu::launch(rows, SEED_T, [&] { head_topk_seed_kernel<8>(a); });
        assert_true(e.empty());
        a.tau = tw.data();
        e = emu::launch((rows + SEED_WARPS - 1) / SEED_WARPS, 32 * SEED_WARPS,
                        [&] { head_topk_seed_warp_kernel(a, rows); });
        assert_true(e.empty());
        int seeded = 0;
        for (int r = 0; r < rows; r++) {
            /* the reference: the s-th largest ordered key, its top 24 bits */
            std::vector<unsigned> keys;
            for (int j = 0; j < m; j++) {
                const float z = S[(size_t)r * m + j];
                if (z == z) keys.push_back(tk_key(z));
            }
            std::sort(keys.rbegin(), keys.rend());
            const unsigned T = (int)keys.size() >= a.s ? keys[(size_t)a.s - 1] & ~0xffu : 0u;
            double hh = 0;
            for (int k = 0; k < H; k++) {
                const double x = __bfloat162float(h[(size_t)r * H + k]);
                hh += x * x;
            }
            a.tau = tr.data();
            seed_store(a, r, r, T, (float)hh);
            if (tr[r] != ninf) seeded++;
            if (H == 0) {
                /* no margin: the threshold is T's, exactly, in both kernels */
                assert_int_equal(tb[r], tr[r]);
                assert_int_equal(tw[r], tr[r]);
            } else {
                /* |h_i|'s sums differ in order: the seed within rounding */
                assert_int_equal(tb[r] == ninf, tr[r] == ninf);
                assert_int_equal(tw[r] == ninf, tr[r] == ninf);
                const double ref = sph_tk_dec(tr[r]), gb = sph_tk_dec(tb[r]);
                const double gw = sph_tk_dec(tw[r]);
                if (tr[r] != ninf && (!(fabs(gb - ref) <= 1e-5 * (1.0 + fabs(ref))) ||
                    !(fabs(gw - ref) <= 1e-5 * (1.0 + fabs(ref)))))
                    fail_msg("seed (K %d, s %d, H %d) row %d: block %.9g, warp %.9g, want %.9g; "
                             "seed %llu",
                             K, a.s, H, r, gb, gw, ref, (unsigned long long)test_seed());
            }
        }
        assert_true(seeded > 0 && seeded < rows); /* the NaN rows have none */
    }
}

// ---- the merge ---------------------------------------------------------------------------

/* One launch's rows: logits from bf16 dot products (so the block merge's recompute sees the
 * same values), a threshold, slots and a candidate buffer per row in one of the regimes the
 * epilogue leaves: few candidates, a few hundred, more than the warp's buffer, an overflowed
 * buffer, a seed above the K-th largest (too few). */
struct merge_setup {
    int rows, K, w, H, ks, cap, merge, seeded;
    int distinct; /* > 0: that many distinct weight columns, repeated: ties at the K-th */
    float cap_s, temp;
    std::vector<__nv_bfloat16> h, W;
    std::vector<float> z;       /* rows x w logits */
    std::vector<float> recs;    /* rows x n_tiles x FIELDS, [0] the tile's maximum */
    std::vector<sph_cuda_xtk> cand, tk, prev;
    std::vector<int> n, tau, slots;
    std::vector<std::vector<sph_cuda_xtk>> want;
    std::vector<int> want_tau;
    int64_t n_tiles;
};

static float dot_row(const merge_setup &s, int r, int c) {
    const uint4 *hr = (const uint4 *)(s.h.data() + (size_t)r * s.H);
    const uint4 *wr = (const uint4 *)(s.W.data() + (size_t)c * s.H);
    float acc = 0.f;
    for (int k = 0; k < s.H / 8; k++) acc += dot8<__nv_bfloat162>(hr[k], wr[k]);
    return acc;
}

static void merge_build(merge_setup &s) {
    const int rows = s.rows, w = s.w, H = s.H, K = s.K;
    s.h.resize((size_t)rows * H);
    s.W.resize((size_t)w * H);
    for (auto &x : s.h) x = __float2bfloat16_rn((float)rng_normal(&g_rng));
    for (int c = 0; c < w; c++)
        for (int k = 0; k < H; k++) {
            const int src = s.distinct ? c % s.distinct : c;
            s.W[(size_t)c * H + k] =
                src == c ? __float2bfloat16_rn((float)(0.5 * rng_normal(&g_rng)))
                         : s.W[(size_t)src * H + k];
        }
    /* two NaN columns (never candidates) where there are no ties to keep */
    if (!s.distinct)
        for (int k = 0; k < H; k++)
            s.W[(size_t)7 * H + k] = s.W[(size_t)(w - 2) * H + k] = __float2bfloat16_rn(NAN);
    s.n_tiles = (w + SPH_SM90_TILE_N - 1) / SPH_SM90_TILE_N;
    s.z.resize((size_t)rows * w);
    s.recs.assign((size_t)rows * s.n_tiles * SPH_PARTIAL_FIELDS, 0.f);
    const float it = 1.f / s.temp, inv_cap = s.cap_s > 0 ? 1.f / s.cap_s : 0.f;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < w; c++) {
            const float z = transform(dot_row(s, r, c), it, s.cap_s, inv_cap);
            s.z[(size_t)r * w + c] = z;
            float &mx = s.recs[((size_t)r * s.n_tiles + c / SPH_SM90_TILE_N) * SPH_PARTIAL_FIELDS];
            if (c % SPH_SM90_TILE_N == 0) mx = -INFINITY;
            mx = fmaxf(mx, z);
        }
    s.cand.assign((size_t)rows * s.cap, sph_cuda_xtk{NAN, -5});
    s.tk.assign((size_t)rows * K, sph_cuda_xtk{NAN, -5});
    s.n.assign(rows, 0), s.tau.assign(rows, 0), s.slots.assign((size_t)rows * s.ks, 0);
    s.want.assign(rows, {}), s.want_tau.assign(rows, 0);
    for (int r = 0; r < rows; r++) {
        std::vector<sph_cuda_xtk> split, all;
        for (int c = 0; c < w; c++) split.push_back({s.z[(size_t)r * w + c], c});
        all = split;
        if (s.merge) {
            /* the earlier splits' list: K entries of other columns (ids past the split), half
             * of them ties of the split's own logits (the split's lower id goes first) */
            std::vector<sph_cuda_xtk> p;
            for (int e = 0; e < 4 * K; e++) {
                const float z = e % 2 ? s.z[(size_t)r * w + irange(0, w - 1)]
                                      : (float)(3.0 * rng_normal(&g_rng));
                p.push_back({z, w + 3 * e + irange(0, 2)});
            }
            p = ref_topk(p, K);
            std::copy(p.begin(), p.end(), s.tk.begin() + (size_t)r * K);
            all.insert(all.end(), p.begin(), p.end());
        }
        std::vector<sph_cuda_xtk> U = ref_topk(all, (int)all.size());
        int nv = 0;
        while (nv < (int)U.size() && U[nv].id >= 0) nv++;
        /* the regime: the threshold's rank in the union (tau), the buffer's (lo <= tau) */
        const int regime = s.seeded ? r % 6 : r % 5;
        int jt, jl;
        switch (regime) {
        case 0: jt = irange(K - 1, K + 20), jl = jt + irange(0, 20); break;     /* few */
        case 1: jt = irange(K + 60, 330), jl = jt + irange(0, 30); break;       /* hundreds */
        case 2: jt = irange(400, 500), jl = jt + irange(0, 60); break;          /* compaction */
        case 3: jt = irange(K - 1, 300), jl = irange(520, s.cap - 1); break;    /* over 512 */
        case 4: jt = irange(K - 1, 2 * K), jl = irange(s.cap + 1, nv - 1); break; /* overflow */
        default: jt = uni() < 0.5 ? K - 2 : irange(0, K - 2), jl = jt; break; /* seed too high */
        }
        jl = std::min(jl, nv - 1), jt = std::min(jt, jl);
        const float tau = U[(size_t)jt].z, lo = U[(size_t)jl].z;
        int n = 0;
        std::vector<int> order;
        for (int c = 0; c < w; c++) {
            const float z = s.z[(size_t)r * w + c];
            /* every logit >= lo, and some stale ones below it (emitted before tau rose; none
             * below a seed, which the threshold starts at) */
            if (z >= lo || (z == z && regime != 5 && uni() < 0.01)) order.push_back(c);
        }
        for (size_t i = order.size(); i > 1; i--)
            std::swap(order[i - 1], order[(size_t)irange(0, (int)i - 1)]);
        sph_cuda_xtk *cr = s.cand.data() + (size_t)r * s.cap;
        for (int c : order) {
            if (n < s.cap) cr[n] = {s.z[(size_t)r * w + c], c};
            n++;
        }
        s.n[r] = n;
        s.tau[r] = sph_tk_enc(tau);
        /* the slots: each the largest candidate of one class of columns (c mod ks), so at
         * least ks >= K logits reach their minimum; one row in three left at -inf (its
         * threshold tau alone: more entries, the compaction) */
        for (int t = 0; t < s.ks; t++) s.slots[(size_t)r * s.ks + t] = sph_tk_enc(-INFINITY);
        if (r % 3 == 1 && regime != 5)
            for (int c : order) {
                const float z = s.z[(size_t)r * w + c];
                int &sl = s.slots[(size_t)r * s.ks + c % s.ks];
                if (z == z) sl = std::max(sl, sph_tk_enc(z));
            }
        /* or as tight as the rule allows: the split's ks largest, one per slot (their minimum
         * the K-th largest itself where ks = K) */
        if (r % 3 == 2 && regime != 5 && !s.merge) {
            const std::vector<sph_cuda_xtk> top = ref_topk(split, s.ks);
            for (int t = 0; t < s.ks; t++)
                if (top[(size_t)t].id >= 0)
                    s.slots[(size_t)r * s.ks + t] = sph_tk_enc(top[(size_t)t].z);
        }
        const std::vector<sph_cuda_xtk> want = ref_topk(all, K);
        s.want[r] = want;
        const bool low = s.seeded && n < K;
        int wt = low ? sph_tk_enc(-INFINITY) : s.tau[r];
        if (want[(size_t)K - 1].id >= 0) wt = std::max(wt, sph_tk_enc(want[(size_t)K - 1].z));
        s.want_tau[r] = wt;
    }
}

static tkm_args merge_args(merge_setup &s, std::vector<sph_cuda_xtk> &tk, std::vector<int> &n,
                           std::vector<int> &tau, int variant, int *diag) {
    tkm_args a;
    memset(&a, 0, sizeof a);
    a.cand = s.cand.data(), a.n = n.data(), a.tau = tau.data(), a.slots = s.slots.data();
    a.ks = s.ks, a.tk = tk.data(), a.K = s.K, a.cap = s.cap, a.merge = s.merge;
    a.seeded = s.seeded, a.variant = variant, a.diag = diag, a.rows = s.rows;
    a.tile_recs = s.recs.data(), a.n_tiles = s.n_tiles, a.w = s.w, a.H = s.H;
    a.ld_h = s.H, a.ld_w = s.H, a.r0 = 0, a.hp = s.h.data(), a.wp = s.W.data();
    a.col_g0 = 0, a.inv_t = 1.f / s.temp, a.cap_s = s.cap_s;
    a.inv_cap = s.cap_s > 0 ? 1.f / s.cap_s : 0.f;
    return a;
}

static void merge_check(const merge_setup &s, const std::vector<sph_cuda_xtk> &tk,
                        const std::vector<int> &n, const std::vector<int> &tau, const char *how) {
    for (int r = 0; r < s.rows; r++) {
        for (int e = 0; e < s.K; e++) {
            const sph_cuda_xtk g = tk[(size_t)r * s.K + e], w = s.want[r][(size_t)e];
            if (g.id != w.id || (w.id >= 0 && fbits(g.z) != fbits(w.z))) {
                fail_msg("merge (%s, K %d, w %d, merge %d, seeded %d, ties %d) row %d entry %d: "
                         "(%g, %d), want (%g, %d); seed %llu", how, s.K, s.w, s.merge, s.seeded,
                         s.distinct, r, e, (double)g.z, g.id, (double)w.z, w.id,
                         (unsigned long long)test_seed());
            }
        }
        assert_int_equal(n[r], 0);
        assert_int_equal(tau[r], s.want_tau[r]);
    }
}

static void test_merge(void **state) {
    (void)state;
    int seen[4] = {0, 0, 0, 0}; /* diag: warp, warp + compaction, block (recompute), block */
    struct cfg { int K, w, H, merge, seeded, distinct; float cap_s, temp; } cases[] = {
        {64, 2300, 24, 0, 1, 0, 0.f, 1.f},   /* A's K; every regime, the seed's rows too */
        {40, 1900, 16, 1, 0, 0, 0.f, 0.8f},  /* a later split: the earlier list merged */
        {20, 1500, 8, 0, 1, 0, 30.f, 1.3f},  /* softcap, 32 entries in the register sort */
        {1, 1100, 16, 1, 0, 0, 0.f, 1.f},    /* K = 1 */
        {33, 1200, 16, 0, 0, 48, 0.f, 1.f},  /* ties at the K-th: 64 entries and more */
        {64, 1000, 8, 1, 0, 40, 0.f, 1.f},   /* ties: the warp's shared-memory sort */
        {64, 1200, 8, 0, 0, 2, 0.f, 1.f},    /* ties past the warp's buffer: the block */
        {100, 1300, 16, 0, 1, 0, 0.f, 1.f},  /* K > 64: the block per row only */
        {256, 1600, 8, 1, 0, 0, 0.f, 1.f},   /* the largest K */
    };
    for (const cfg &c : cases) {
        merge_setup s;
        s.rows = 37, s.K = c.K, s.w = c.w, s.H = c.H, s.merge = c.merge, s.seeded = c.seeded;
        s.distinct = c.distinct, s.cap_s = c.cap_s, s.temp = c.temp;
        s.ks = 8;
        while (s.ks < c.K) s.ks *= 2;
        s.cap = c.w * 3 / 5; /* below the split: some rows overflow it */
        merge_build(s);
        /* the warp kernel (K <= 64), its v31 variant, and the block kernel on every row */
        const int v0 = c.K <= XW_K ? 0 : 2;
        for (int v = v0; v < 3; v++) {
            std::vector<sph_cuda_xtk> tk = s.tk;
            std::vector<int> n = s.n, tau = s.tau;
            int diag[4] = {0, 0, 0, 0};
            tkm_args a = merge_args(s, tk, n, tau, v == 1 ? 16 : 0, diag);
            const bool warp = v < 2;
            const char *how = !warp ? "block" : v == 1 ? "warp, variant 16" : "warp";
            const unsigned nb = (unsigned)(warp ? (s.rows + XW_WARPS - 1) / XW_WARPS : s.rows);
            std::string e = emu::launch(nb, XT, [&] {
                if (warp) head_topk_merge_kernel<__nv_bfloat162, XW_WARPS>(a);
                else head_topk_merge_kernel<__nv_bfloat162, 1>(a);
            });
            if (!e.empty()) fail_msg("merge (%s, K %d): %s", how, c.K, e.c_str());
            merge_check(s, tk, n, tau, how);
            if (v == 0)
                for (int i = 0; i < 4; i++) seen[i] += diag[i];
            if (warp) assert_int_equal(diag[0] + diag[1] + diag[2] + diag[3], s.rows);
        }
    }
    /* every path of the warp kernel ran: plain, compacted, recomputed, handed to the block */
    print_message("merge paths: warp %d, warp with compaction %d, recompute %d, block %d\n",
                  seen[0], seen[1], seen[2], seen[3]);
    for (int i = 0; i < 4; i++) assert_true(seen[i] > 0);
}

// ---- the finalize across ranks -----------------------------------------------------------

static void test_finalize(void **state) {
    (void)state;
    for (int pass = 0; pass < 6; pass++) {
        const int P = 1 + pass % 3, K = pass < 2 ? 1 : pass < 4 ? 5 : 64;
        const int rows = 21, N = 30, stride = rows + 3;
        std::vector<int64_t> rowmap(rows);
        for (int k = 0; k < rows; k++) rowmap[k] = 1 + k + k / 3; /* a gap every third row */
        std::vector<uint8_t> mask(N);
        for (auto &m : mask) m = uni() < 0.8;
        std::vector<float> recs((size_t)P * stride * SPH_PARTIAL_FIELDS), stats((size_t)N * 3);
        std::vector<float2> mq((size_t)P * stride);
        std::vector<sph_cuda_xtk> tk((size_t)P * stride * K, sph_cuda_xtk{NAN, -9});
        for (int r = 0; r < P; r++)
            for (int k = 0; k < rows; k++) {
                float *rec = recs.data() + ((size_t)r * stride + k) * SPH_PARTIAL_FIELDS;
                rec[0] = (float)rng_normal(&g_rng), rec[1] = (float)(1 + 10 * uni());
                rec[2] = (float)rng_normal(&g_rng);
                mq[(size_t)r * stride + k] =
                    make_float2(rec[0] + (float)uni(), (float)(uni() * rec[1]));
                /* a sorted list, shorter than K on some rows; ties across ranks (2 levels) */
                std::vector<sph_cuda_xtk> l;
                const int len = k % 4 == 0 ? irange(0, K) : K;
                for (int e = 0; e < len; e++)
                    l.push_back({(float)(irange(0, 3) * 0.5), 1000 * r + 7 * e + irange(0, 6)});
                l = ref_topk(l, K);
                std::copy(l.begin(), l.end(), tk.begin() + ((size_t)r * stride + k) * K);
            }
        for (int i = 0; i < N; i++) stats[(size_t)i * 3 + 1] = (float)rng_normal(&g_rng);
        std::vector<float> sp2(N), lp((size_t)N * K);
        std::vector<int64_t> ids((size_t)N * K);
        poison_f32(sp2.data(), sp2.size()), poison_f32(lp.data(), lp.size());
        std::fill(ids.begin(), ids.end(), (int64_t)-77);
        /* the zero kernel first, as the forward runs it, then the finalize */
        std::string e = emu::launch((unsigned)((N * K + 255) / 256), 256, [&] {
            head_extras_zero_kernel(N, K, sp2.data(), ids.data(), K, lp.data(), K);
        });
        assert_true(e.empty());
        xf_args a;
        memset(&a, 0, sizeof a);
        a.recs = recs.data(), a.mq = mq.data(), a.tk = tk.data(), a.rank_stride = stride;
        a.rows = rows, a.rowmap = rowmap.data(), a.comm_size = P, a.K = K;
        a.mask = mask.data(), a.stats = stats.data(), a.sum_p2 = sp2.data();
        a.ids = ids.data(), a.ld_ti = K, a.lp = lp.data(), a.ld_tl = K;
        e = emu::launch((unsigned)((rows + XF_ROWS - 1) / XF_ROWS), XT,
                        [&] { head_extras_finalize_kernel(a); });
        assert_true(e.empty());
        std::vector<bool> mapped(N, false);
        for (int k = 0; k < rows; k++) {
            const int64_t i = rowmap[k];
            mapped[i] = true;
            std::vector<sph_cuda_xtk> all;
            double M = -INFINITY;
            for (int r = 0; r < P; r++) {
                const sph_cuda_xtk *l = tk.data() + ((size_t)r * stride + k) * K;
                all.insert(all.end(), l, l + K);
                M = std::max(M, (double)recs[((size_t)r * stride + k) * SPH_PARTIAL_FIELDS]);
            }
            double S = 0, Q = 0;
            for (int r = 0; r < P; r++) {
                const float *rec = recs.data() + ((size_t)r * stride + k) * SPH_PARTIAL_FIELDS;
                const float2 x = mq[(size_t)r * stride + k];
                S += rec[1] * exp(rec[0] - M);
                Q += x.y * exp(2.0 * (x.x - M));
            }
            const std::vector<sph_cuda_xtk> want = ref_topk(all, K);
            if (!mask[i]) {
                assert_true(sp2[i] == 0.f);
                for (int e2 = 0; e2 < K; e2++) {
                    assert_int_equal(ids[(size_t)i * K + e2], -1);
                    assert_true(lp[(size_t)i * K + e2] == 0.f);
                }
                continue;
            }
            assert_true(fabs(sp2[i] - Q / (S * S)) <= 1e-5 * Q / (S * S));
            for (int e2 = 0; e2 < K; e2++) {
                const sph_cuda_xtk w = want[(size_t)e2];
                assert_int_equal(ids[(size_t)i * K + e2], w.id);
                const float wl = w.id >= 0 ? w.z - stats[(size_t)i * 3 + 1] : 0.f;
                assert_int_equal(fbits(lp[(size_t)i * K + e2]), fbits(wl));
            }
        }
        /* rows outside the map: the zero kernel's values, nothing else written */
        for (int i = 0; i < N; i++)
            if (!mapped[i]) {
                assert_true(sp2[i] == 0.f);
                for (int e2 = 0; e2 < K; e2++) assert_int_equal(ids[(size_t)i * K + e2], -1);
            }
    }
}

int main(void) {
    rng_seed(&g_rng, test_seed());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_emu_collectives),
        cmocka_unit_test(test_staged),
        cmocka_unit_test(test_seed_select),
        cmocka_unit_test(test_merge),
        cmocka_unit_test(test_finalize),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
