/*
 * policy.cu - the CUDA backend of the fused policy loss (issue 14), on top of head.cu.
 *
 *   1. Pre-pass (device, no host sync): the active rows act_i = (mask_i, else inside a span,
 *      else 1) and target_i >= 0 (the head's mask for the pass); the group rows (this rank's,
 *      or gathered over seq_comm by one allgather of (seq_id, active, delta) records); with
 *      sequences, a CUB radix sort of the group rows by seq_id (stable, values = group row:
 *      rows of a sequence stay in row order), each position's sequence head by a max-scan,
 *      T_j, T and S by integer atomics (exact in any order: deterministic). The weights c_i
 *      are computed where they are used, from T, S and T_j. Token-mean without a group: one
 *      kernel (the active rows and T).
 *   2. ppo / cispo: head.cu's one-pass forward with this plan's row hook bound (plan.h). Its
 *      finalize_rows calls the hook (pol_rows_hook) after each finalize launch (staged-chunk
 *      path: per chunk, before the chunk's dlogits; recomputing path: per span, before the
 *      gradient sweep),
 *      which writes g_i = dL/dlogp_i and e_i = dL/dH_i into the workspace arrays the dlogits
 *      read as dlogprob / dentropy. Cost: the one-pass weighted loss's sweep plus O(N).
 *      gspo: the head's forward, delta gathered, rho_j per sequence (each head sums its
 *      sequence's deltas in row order),
 *      g and e of every row, then the head's backward sweep (8 N H V).
 *   3. Metrics: one block walks the rows in a fixed stride order with float64 accumulators
 *      and a fixed tree: the same bits for the same inputs, on every TP rank.
 *
 * Per-row math in float64 (policy_math.h, shared with the CPU backends): a row costs a few
 * dozen flops against its 6 H V of the sweep.
 *
 * Non-finite advantages / old / reference log-probs / weights of active rows in device memory
 * are counted in the context's non-finite counter (sph_ctx_nonfinite, the library's policy
 * for device data: no host sync in the pass); they propagate into the loss and metrics as NaN.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include "comm/comm.h"
#include "cuda/device_ptr.h"
#include "cuda/head.cuh"
#include "policy/policy.h"

// ---- device view -----------------------------------------------------------------------

/* A group row's record (exchanged over seq_comm). */
struct grec {
    int64_t seq;
    int64_t act;
    double delta;
};

/* Scratch of one call, bound by sph_policy_cuda_run (pp->dev points at it). */
struct pol_scratch {
    grec *mine, *all;             /* (N), (G) group records (all == mine without a group) */
    int64_t *keys, *keys2, *vals, *vals2; /* (G) sort buffers; after the sort keys holds the
                                             head flags and vals the heads (headpos) */
    int64_t *headpos;             /* (G) == vals: each sorted position's sequence head */
    unsigned long long *segact, *seglen; /* (G) per head: active rows, positions */
    void *cub_temp;
    size_t cub_bytes;
    int64_t *cnt;                 /* (G) active rows of the group row's sequence */
    double *sum;                  /* (G) gspo: delta sum of the group row's sequence */
    unsigned long long *counters; /* [0] T (active group rows), [1] S (sequences) */
    unsigned long long *nf;       /* the context's non-finite counter (count, lowest row) */
};

struct pdev {
    sph_policy_coef coef;
    int agg;
    int64_t num_tokens, num_seqs;
    double norm_length;
    int64_t N, G, rank;
    const float *adv, *old, *ref, *isw;
    const int64_t *seq;
    uint8_t *act;
    double *rho;
    float *g, *e;
    const float *logp, *ent;
    float *metrics;
    pol_scratch s;
};

static pdev dev_of(const sph_policy_plan *pp) {
    pdev d;
    memset(&d, 0, sizeof d);
    d.coef = pp->coef;
    d.agg = pp->agg;
    d.num_tokens = pp->num_tokens, d.num_seqs = pp->num_seqs, d.norm_length = pp->norm_length;
    d.N = pp->N, d.G = pp->group * pp->N, d.rank = pp->rank;
    d.adv = pp->adv, d.old = pp->old, d.ref = pp->ref, d.isw = pp->isw, d.seq = pp->seq;
    d.act = pp->act, d.rho = pp->rho, d.g = pp->g, d.e = pp->e;
    d.logp = pp->logp, d.ent = pp->ent, d.metrics = pp->metrics;
    if (pp->dev) d.s = *(const pol_scratch *)pp->dev;
    return d;
}

static unsigned blocks_for(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    return (unsigned)(b > 65535 ? 65535 : (b < 1 ? 1 : b));
}

// ---- kernels ---------------------------------------------------------------------------

#define POL_SPANS 128
struct pol_spans {
    int64_t a[POL_SPANS], b[POL_SPANS];
    int n;
};

/* act = 1 on the rows of up to 128 spans (one block per span). */
__global__ void pol_span_kernel(pol_spans sp, uint8_t *act) {
    const int64_t a = sp.a[blockIdx.x], b = sp.b[blockIdx.x];
    for (int64_t i = a + threadIdx.x; i < b; i += blockDim.x) act[i] = 1;
}

/* The active rows, this rank's group records, and zeroed per-row arrays; with count set (no
 * sequences, no group) also T: block sums of the active rows, one integer atomic per block. */
__global__ void __launch_bounds__(256) pol_act_kernel(pdev d, const uint8_t *mask, int from_act,
                                                      const void *tgt, int tgt_i64, int count) {
    __shared__ unsigned long long sh[256];
    unsigned long long n = 0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < d.N;
         i += (int64_t)gridDim.x * blockDim.x) {
        int a = mask ? mask[i] != 0 : (from_act ? d.act[i] != 0 : 1);
        int64_t t = tgt_i64 ? ((const int64_t *)tgt)[i] : (int64_t)((const int32_t *)tgt)[i];
        a = a && t >= 0;
        /* the non-finite policy: a NaN / inf per-row input of an active row is counted on the
         * device (sph_ctx_nonfinite reports it; the loss and metrics come out NaN) */
        if (a && d.s.nf &&
            !(isfinite(d.adv[i]) && isfinite(d.old[i]) && (!d.ref || isfinite(d.ref[i])) &&
              (!d.isw || isfinite(d.isw[i])))) {
            atomicAdd(&d.s.nf[0], 1ull);
            atomicMin(&d.s.nf[1], (unsigned long long)i);
        }
        d.act[i] = (uint8_t)a;
        n += a;
        d.s.mine[i].seq = d.seq ? d.seq[i] : 0;
        d.s.mine[i].act = a;
        d.s.mine[i].delta = 0.0;
        d.g[i] = d.e[i] = 0.f;
        if (d.rho) d.rho[i] = 0.0;
    }
    if (!count) return; /* uniform in the grid: no thread skips a barrier below */
    sh[threadIdx.x] = n;
    __syncthreads(); /* every thread's count visible */
    for (int o = blockDim.x / 2; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o) sh[threadIdx.x] += sh[threadIdx.x + o];
        __syncthreads(); /* this level done before the next reads it */
    }
    if (threadIdx.x == 0 && sh[0]) atomicAdd(&d.s.counters[0], sh[0]);
}

/* The aggregation weight of active row i, from the counters of the pre-pass (T, S) and the
 * row's T_j: computed where it is used (a division), not stored. */
__device__ __forceinline__ double pol_coef(const pdev &d, int64_t i) {
    const double T = d.num_tokens > 0 ? (double)d.num_tokens : (double)d.s.counters[0];
    const double S = d.num_seqs > 0 ? (double)d.num_seqs : (double)d.s.counters[1];
    switch (d.agg) {
    case SPH_AGG_TOKEN_MEAN: return 1.0 / T;
    case SPH_AGG_SEQ_MEAN_TOKEN_SUM: return 1.0 / S;
    case SPH_AGG_SEQ_MEAN_TOKEN_MEAN: return 1.0 / (S * (double)d.s.cnt[d.rank * d.N + i]);
    default: return 1.0 / (S * d.norm_length);
    }
}

/* Sort input: key = the group row's sequence id, value = the group row. */
__global__ void pol_keys_kernel(pdev d) {
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < d.G;
         k += (int64_t)gridDim.x * blockDim.x) {
        d.s.keys[k] = d.s.all[k].seq;
        d.s.vals[k] = k;
    }
}

/* T without sequences: active group rows (block sums, one integer atomic per block). */
__global__ void pol_count_kernel(pdev d) {
    __shared__ unsigned long long sh[256];
    unsigned long long n = 0;
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < d.G;
         k += (int64_t)gridDim.x * blockDim.x)
        n += d.s.all[k].act != 0;
    sh[threadIdx.x] = n;
    __syncthreads(); /* every thread's count visible */
    for (int o = blockDim.x / 2; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o) sh[threadIdx.x] += sh[threadIdx.x + o];
        __syncthreads(); /* this level done before the next reads it */
    }
    if (threadIdx.x == 0 && sh[0]) atomicAdd(&d.s.counters[0], sh[0]);
}

/* Sequences over the sorted group rows, in parallel and deterministically:
 *   heads:  hp[k] = k where a sequence starts in the sorted order (else 0), then an inclusive
 *           max-scan (CUB; integer max is exact, so any evaluation order gives the same
 *           result) gives every position its sequence's first position h = headpos[k];
 *   counts: integer atomics per head (segact: active rows T_j, seglen: positions): exact in
 *           any order; then each group row reads its T_j, each head adds to T and S;
 *   gspo:   each head sums delta over its positions in sorted (= group-row) order, 8 loads
 *           in flight per step (latency, not bandwidth, bounds one thread per sequence). */
__global__ void pol_heads_kernel(pdev d) {
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < d.G;
         k += (int64_t)gridDim.x * blockDim.x)
        d.s.keys[k] = (k == 0 || d.s.keys2[k - 1] != d.s.keys2[k]) ? k : 0;
}

__global__ void pol_segcount_kernel(pdev d) {
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < d.G;
         k += (int64_t)gridDim.x * blockDim.x) {
        const int64_t h = d.s.headpos[k];
        if (d.s.all[d.s.vals2[k]].act) atomicAdd(&d.s.segact[h], 1ull);
        atomicAdd(&d.s.seglen[h], 1ull);
    }
}

__global__ void pol_segfinish_kernel(pdev d) {
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < d.G;
         k += (int64_t)gridDim.x * blockDim.x) {
        const int64_t h = d.s.headpos[k];
        const unsigned long long n = d.s.segact[h];
        d.s.cnt[d.s.vals2[k]] = (int64_t)n;
        if (k == h && n > 0) {
            atomicAdd(&d.s.counters[0], n);
            atomicAdd(&d.s.counters[1], 1ull);
        }
    }
}

__global__ void pol_segsum_kernel(pdev d) {
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < d.G;
         k += (int64_t)gridDim.x * blockDim.x) {
        if (d.s.headpos[k] != k) continue;
        const int64_t end = k + (int64_t)d.s.seglen[k];
        double sum = 0.0;
        int64_t m = k;
        for (; m + 8 <= end; m += 8) {
            double v[8];
#pragma unroll
            for (int q = 0; q < 8; q++) {
                const grec r = d.s.all[d.s.vals2[m + q]];
                v[q] = r.act ? r.delta : 0.0;
            }
#pragma unroll
            for (int q = 0; q < 8; q++) sum += v[q]; /* in order */
        }
        for (; m < end; m++) {
            const grec r = d.s.all[d.s.vals2[m]];
            if (r.act) sum += r.delta;
        }
        for (m = k; m < end; m++) d.s.sum[d.s.vals2[m]] = sum;
    }
}

/* gspo, after the forward: this rank's deltas into its records. */
__global__ void pol_delta_kernel(pdev d) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < d.N;
         i += (int64_t)gridDim.x * blockDim.x)
        d.s.mine[i].delta = d.act[i] ? (double)d.logp[i] - (double)d.old[i] : 0.0;
}

__global__ void pol_rho_kernel(pdev d) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < d.N;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t k = d.rank * d.N + i;
        d.rho[i] = d.act[i] ? d.s.sum[k] / (double)d.s.cnt[k] : 0.0;
    }
}

/* g and e of rows r0 + k (or rowmap[k]), k < rows. */
__global__ void pol_rows_kernel(pdev d, int64_t r0, const int64_t *rowmap, int64_t rows) {
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < rows;
         k += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = rowmap ? rowmap[k] : r0 + k;
        double g = 0.0, e = 0.0;
        if (d.act[i])
            sph_policy_row_full(&d.coef, pol_coef(d, i), d.isw ? (double)d.isw[i] : 1.0,
                                (double)d.logp[i], (double)d.ent[i], (double)d.adv[i],
                                (double)d.old[i], d.ref ? (double)d.ref[i] : 0.0,
                                d.rho ? d.rho[i] : 0.0, &g, &e, NULL);
        d.g[i] = (float)g;
        d.e[i] = (float)e;
    }
}

#define MET_THREADS 256

/* One block: float64 sums of the metric terms over the active rows, fixed order. */
__global__ void __launch_bounds__(MET_THREADS) pol_metrics_kernel(pdev d) {
    __shared__ double sh[SPH_PM_N_ACC][MET_THREADS];
    double acc[SPH_PM_N_ACC] = {0}, row[SPH_PM_N_ACC], g, e;
    for (int64_t i = threadIdx.x; i < d.N; i += MET_THREADS) {
        if (!d.act[i]) continue;
        sph_policy_row_full(&d.coef, pol_coef(d, i), d.isw ? (double)d.isw[i] : 1.0,
                            (double)d.logp[i],
                            (double)d.ent[i], (double)d.adv[i], (double)d.old[i],
                            d.ref ? (double)d.ref[i] : 0.0, d.rho ? d.rho[i] : 0.0, &g, &e, row);
        for (int f = 0; f < SPH_PM_N_ACC; f++) acc[f] += row[f];
    }
    for (int f = 0; f < SPH_PM_N_ACC; f++) sh[f][threadIdx.x] = acc[f];
    __syncthreads(); /* all partials visible */
    for (int o = MET_THREADS / 2; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o)
            for (int f = 0; f < SPH_PM_N_ACC; f++) sh[f][threadIdx.x] += sh[f][threadIdx.x + o];
        __syncthreads(); /* level done */
    }
    if (threadIdx.x != 0) return;
    const double Tc = (double)d.s.counters[0];
    const double Tm = d.num_tokens > 0 ? (double)d.num_tokens : Tc;
    float *m = d.metrics;
    m[SPH_METRIC_LOSS] = (float)sh[SPH_PM_ACC_LOSS][0];
    m[SPH_METRIC_PG_LOSS] = (float)sh[SPH_PM_ACC_PG][0];
    m[SPH_METRIC_KL_LOSS] = (float)sh[SPH_PM_ACC_KL][0];
    m[SPH_METRIC_ENTROPY_LOSS] = (float)sh[SPH_PM_ACC_ENT][0];
    m[SPH_METRIC_PG_CLIPFRAC] = Tm > 0 ? (float)(sh[SPH_PM_ACC_CLIP][0] / Tm) : 0.f;
    m[SPH_METRIC_PG_CLIPFRAC_LOWER] = Tm > 0 ? (float)(sh[SPH_PM_ACC_LOWER][0] / Tm) : 0.f;
    m[SPH_METRIC_PPO_KL] = Tm > 0 ? (float)(sh[SPH_PM_ACC_NKL][0] / Tm) : 0.f;
    m[SPH_METRIC_TOKENS] = (float)Tc;
    m[SPH_METRIC_SEQS] = (float)d.s.counters[1];
}

// ---- the hook ----------------------------------------------------------------------------

/* The plan's row hook (plan.h; arg: the bound policy plan): enqueues g and e of the rows that
 * head_kernels.cu's finalize just wrote, on the same stream, before their dlogits. */
static sph_status pol_rows_hook(void *arg, int64_t r0, const int64_t *rowmap, int64_t rows,
                                void *stream_) {
    cudaStream_t stream = (cudaStream_t)stream_;
    if (rows <= 0) return SPH_OK;
    pol_rows_kernel<<<blocks_for(rows, 256), 256, 0, stream>>>(
        dev_of((const sph_policy_plan *)arg), r0, rowmap, rows);
    SPH_LAUNCH_CHECK("pol_rows_kernel", stream);
    return SPH_OK;
}

// ---- layout ------------------------------------------------------------------------------

typedef struct pol_layout {
    size_t head, base; /* the head's bytes; where the policy area starts */
    size_t o_act, o_rho, o_g, o_e, o_lp, o_ent, o_st, o_cnt_ctr, o_mine, o_all, o_keys,
        o_keys2, o_vals, o_vals2, o_cub, o_cnt, o_sum, o_segact, o_seglen, cub_bytes, total;
} pol_layout;

static size_t take(size_t *off, size_t bytes) {
    size_t o = *off;
    *off += sph_ws_round(bytes);
    return o;
}

struct pol_max {
    __host__ __device__ int64_t operator()(int64_t a, int64_t b) const { return a > b ? a : b; }
};

/* CUB's temporary bytes: the larger of the sort's and the heads' max-scan's (the same buffer,
 * used one after the other). */
static sph_status cub_bytes_of(sph_ctx_t ctx, int64_t G, size_t *bytes) {
    *bytes = 0;
    int old = 0;
    SPH_CUDA_RET(cudaGetDevice(&old));
    SPH_CUDA_RET(cudaSetDevice(ctx->device.id));
    size_t a = 0, b = 0;
    cudaError_t e = cub::DeviceRadixSort::SortPairs(
        NULL, a, (const int64_t *)NULL, (int64_t *)NULL, (const int64_t *)NULL,
        (int64_t *)NULL, G, 0, 64, (cudaStream_t)ctx->stream);
    if (e == cudaSuccess)
        e = cub::DeviceScan::InclusiveScan(NULL, b, (const int64_t *)NULL, (int64_t *)NULL,
                                           pol_max(), G, (cudaStream_t)ctx->stream);
    cudaSetDevice(old);
    SPH_CHECK(e == cudaSuccess, SPH_ERR_CUDA, "CUB size query (sort / scan): %s",
              cudaGetErrorString(e));
    *bytes = a > b ? a : b;
    return SPH_OK;
}

static sph_status layout_of(sph_ctx_t ctx, const sph_policy_plan *pp, pol_layout *L) {
    const sph_head_plan *hp = &pp->head;
    memset(L, 0, sizeof *L);
    SPH_TRY(sph_policy_head_workspace(ctx, pp, &L->head));
    const size_t N = (size_t)pp->N, G = (size_t)(pp->group * pp->N);
    const int gspo = pp->coef.loss == SPH_PM_GSPO;
    SPH_CHECK(G <= ((size_t)1 << 40), SPH_ERR_UNSUPPORTED,
              "policy (cuda): %zu group rows exceed the sequence sort's range", G);
    if (pp->need_seq && G > 0) SPH_TRY(cub_bytes_of(ctx, (int64_t)G, &L->cub_bytes));
    size_t off = 0;
    L->o_act = take(&off, N);
    L->o_rho = take(&off, gspo ? N * 8 : 0);
    L->o_g = take(&off, N * 4);
    L->o_e = take(&off, N * 4);
    L->o_lp = take(&off, hp->logprob ? 0 : N * 4);
    L->o_ent = take(&off, hp->entropy ? 0 : N * 4);
    L->o_st = take(&off, hp->stats ? 0 : N * 12);
    L->o_cnt_ctr = take(&off, 4 * sizeof(unsigned long long));
    L->o_mine = take(&off, N * sizeof(grec));
    L->o_all = take(&off, pp->group > 1 ? G * sizeof(grec) : 0);
    const size_t sq = pp->need_seq ? G * 8 : 0;
    L->o_keys = take(&off, sq);
    L->o_keys2 = take(&off, sq);
    L->o_vals = take(&off, sq);
    L->o_vals2 = take(&off, sq);
    L->o_cub = take(&off, pp->need_seq ? L->cub_bytes : 0);
    L->o_cnt = take(&off, sq);
    L->o_sum = take(&off, gspo ? G * 8 : 0);
    L->o_segact = take(&off, sq);
    L->o_seglen = take(&off, sq);
    L->base = sph_ws_round(L->head);
    L->total = L->base + off;
    return SPH_OK;
}

static sph_status cuda_workspace(sph_ctx_t ctx, const sph_policy_plan *pp, size_t *bytes) {
    SPH_CHECK(ctx && pp && bytes, SPH_ERR_INVALID_ARG, "policy (cuda): NULL argument");
    SPH_CHECK(ctx->cuda != NULL, SPH_ERR_DEVICE, "ctx: not a CUDA context");
    pol_layout L;
    SPH_TRY(layout_of(ctx, pp, &L));
    *bytes = L.total;
    return SPH_OK;
}

// ---- the pass ---------------------------------------------------------------------------


/* Active rows, group records, sequence statistics and weights (steps 1 of the file comment). */
static sph_status prepass(sph_ctx_t ctx, const sph_head_plan *hp, const sph_policy_plan *pp,
                          cudaStream_t stream) {
    const pdev d = dev_of(pp);
    const int64_t N = pp->N, G = d.G;
    SPH_CUDA_RET(cudaMemsetAsync(d.s.counters, 0, 4 * sizeof(unsigned long long), stream));
    /* without sequences and without a group, the active-row kernel counts T itself */
    const int local_count = !pp->need_seq && pp->group == 1;
    if (N > 0) {
        int from_act = 0;
        if (!hp->mask && hp->spans) {
            /* activity from the host spans, 128 per launch (no host-to-device copy) */
            SPH_CUDA_RET(cudaMemsetAsync(pp->act, 0, (size_t)N, stream));
            for (int64_t k0 = 0; k0 < hp->n_spans; k0 += POL_SPANS) {
                pol_spans sp;
                memset(&sp, 0, sizeof sp);
                for (int64_t k = k0; k < hp->n_spans && sp.n < POL_SPANS; k++) {
                    if (hp->spans[2 * k + 1] <= hp->spans[2 * k]) continue;
                    sp.a[sp.n] = hp->spans[2 * k], sp.b[sp.n] = hp->spans[2 * k + 1], sp.n++;
                }
                if (sp.n == 0) continue;
                pol_span_kernel<<<(unsigned)sp.n, 256, 0, stream>>>(sp, pp->act);
                SPH_LAUNCH_CHECK("pol_span_kernel", stream);
            }
            from_act = 1;
        }
        pol_act_kernel<<<blocks_for(N, 256), 256, 0, stream>>>(d, hp->mask, from_act,
                                                                hp->targets, hp->tgt_i64,
                                                                local_count);
        SPH_LAUNCH_CHECK("pol_act_kernel", stream);
    }
    if (local_count) return SPH_OK; /* T counted with the active rows; nothing else needed */
    if (pp->group > 1 && N > 0)
        SPH_TRY(pp->seq_comm->ops->allgather(pp->seq_comm, d.s.mine, d.s.all,
                                             (size_t)N * sizeof(grec), ctx->stream));
    if (G == 0) return SPH_OK;
    if (pp->need_seq) {
        pol_keys_kernel<<<blocks_for(G, 256), 256, 0, stream>>>(d);
        SPH_LAUNCH_CHECK("pol_keys_kernel", stream);
        size_t tb = d.s.cub_bytes;
        cudaError_t e = cub::DeviceRadixSort::SortPairs(d.s.cub_temp, tb, d.s.keys, d.s.keys2,
                                                        d.s.vals, d.s.vals2, G, 0, 64, stream);
        SPH_CHECK(e == cudaSuccess, SPH_ERR_CUDA, "cub::DeviceRadixSort::SortPairs: %s",
                  cudaGetErrorString(e));
        SPH_LAUNCH_CHECK("cub::DeviceRadixSort::SortPairs", stream);
        pol_heads_kernel<<<blocks_for(G, 256), 256, 0, stream>>>(d);
        SPH_LAUNCH_CHECK("pol_heads_kernel", stream);
        tb = d.s.cub_bytes;
        e = cub::DeviceScan::InclusiveScan(d.s.cub_temp, tb, d.s.keys, d.s.headpos, pol_max(), G,
                                           stream);
        SPH_CHECK(e == cudaSuccess, SPH_ERR_CUDA, "cub::DeviceScan::InclusiveScan: %s",
                  cudaGetErrorString(e));
        SPH_LAUNCH_CHECK("cub::DeviceScan::InclusiveScan", stream);
        SPH_CUDA_RET(cudaMemsetAsync(d.s.segact, 0, (size_t)G * 8, stream));
        SPH_CUDA_RET(cudaMemsetAsync(d.s.seglen, 0, (size_t)G * 8, stream));
        pol_segcount_kernel<<<blocks_for(G, 256), 256, 0, stream>>>(d);
        SPH_LAUNCH_CHECK("pol_segcount_kernel", stream);
        pol_segfinish_kernel<<<blocks_for(G, 256), 256, 0, stream>>>(d);
        SPH_LAUNCH_CHECK("pol_segfinish_kernel", stream);
    } else {
        pol_count_kernel<<<blocks_for(G, 256), 256, 0, stream>>>(d);
        SPH_LAUNCH_CHECK("pol_count_kernel", stream);
    }
    return SPH_OK;
}

/* gspo between the forward and the backward: rho and every row's g, e. */
static sph_status gspo_middle(sph_ctx_t ctx, const sph_policy_plan *pp, cudaStream_t stream) {
    const pdev d = dev_of(pp);
    const int64_t N = pp->N;
    if (N > 0) {
        pol_delta_kernel<<<blocks_for(N, 256), 256, 0, stream>>>(d);
        SPH_LAUNCH_CHECK("pol_delta_kernel", stream);
        if (pp->group > 1)
            SPH_TRY(pp->seq_comm->ops->allgather(pp->seq_comm, d.s.mine, d.s.all,
                                                 (size_t)N * sizeof(grec), ctx->stream));
        pol_segsum_kernel<<<blocks_for(d.G, 256), 256, 0, stream>>>(d);
        SPH_LAUNCH_CHECK("pol_segsum_kernel", stream);
        pol_rho_kernel<<<blocks_for(N, 256), 256, 0, stream>>>(d);
        SPH_LAUNCH_CHECK("pol_rho_kernel", stream);
        pol_rows_kernel<<<blocks_for(N, 256), 256, 0, stream>>>(d, 0, NULL, N);
        SPH_LAUNCH_CHECK("pol_rows_kernel", stream);
    }
    return SPH_OK;
}

static sph_status cuda_run(sph_ctx_t ctx, const sph_policy_plan *plan, void *ws, size_t bytes) {
    SPH_CHECK(ctx && plan, SPH_ERR_INVALID_ARG, "policy (cuda): NULL argument");
    SPH_CHECK(ctx->cuda != NULL, SPH_ERR_DEVICE, "ctx: not a CUDA context");
    /* a copy of the plan holds the workspace buffers (and is what the hook sees) */
    sph_policy_plan P = *plan, *pp = &P;
    sph_head_plan *hp = &P.head;
    pol_layout L;
    SPH_TRY(layout_of(ctx, pp, &L));
    SPH_TRY(sph_cuda_need_device(pp->adv, "advantages"));
    SPH_TRY(sph_cuda_need_device(pp->old, "old_logprob"));
    SPH_TRY(sph_cuda_need_device(pp->ref, "ref_logprob"));
    SPH_TRY(sph_cuda_need_device(pp->isw, "is_weight"));
    SPH_TRY(sph_cuda_need_device(pp->seq, "seq_id"));
    SPH_TRY(sph_cuda_need_device(pp->metrics, "metrics"));
    SPH_TRY(sph_cuda_need_device(hp->targets, "targets"));
    SPH_TRY(sph_cuda_need_device(hp->mask, "active_mask"));
    SPH_CHECK(((uintptr_t)pp->metrics % 4) == 0, SPH_ERR_INVALID_ARG,
              "metrics: pointer %p is misaligned, expected 4-byte alignment",
              (void *)pp->metrics);
    SPH_CHECK(bytes >= L.total, SPH_ERR_WORKSPACE,
              "workspace: %zu bytes, expected at least %zu (sph_policy_loss_workspace_size)",
              bytes, L.total);
    SPH_CHECK(ws != NULL || L.total == 0, SPH_ERR_WORKSPACE,
              "workspace: NULL, expected %zu bytes", L.total);
    SPH_CUDA_RET(cudaSetDevice(ctx->device.id));
    cudaStream_t stream = (cudaStream_t)ctx->stream;
    char *base = (char *)ws + L.base;
#define AT(off) ((void *)(base + (off)))
    pol_scratch s;
    memset(&s, 0, sizeof s);
    pp->act = (uint8_t *)AT(L.o_act);
    pp->c = NULL; /* the weights are computed where they are used (pol_coef) */
    pp->rho = pp->coef.loss == SPH_PM_GSPO ? (double *)AT(L.o_rho) : NULL;
    pp->g = (float *)AT(L.o_g);
    pp->e = (float *)AT(L.o_e);
    if (!hp->logprob) hp->logprob = (float *)AT(L.o_lp);
    if (!hp->entropy) hp->entropy = (float *)AT(L.o_ent);
    if (!hp->stats) hp->stats = (float *)AT(L.o_st);
    pp->logp = hp->logprob;
    pp->ent = hp->entropy;
    s.counters = (unsigned long long *)AT(L.o_cnt_ctr);
    s.mine = (grec *)AT(L.o_mine);
    s.all = pp->group > 1 ? (grec *)AT(L.o_all) : s.mine;
    s.keys = (int64_t *)AT(L.o_keys), s.keys2 = (int64_t *)AT(L.o_keys2);
    s.vals = (int64_t *)AT(L.o_vals), s.vals2 = (int64_t *)AT(L.o_vals2);
    s.cub_temp = AT(L.o_cub);
    s.cub_bytes = L.cub_bytes;
    s.cnt = (int64_t *)AT(L.o_cnt);
    s.sum = (double *)AT(L.o_sum);
    s.headpos = s.vals; /* the sort's input values are free once it ran */
    s.segact = (unsigned long long *)AT(L.o_segact);
    s.nf = ((sph_cuda_state *)ctx->cuda)->nf;
    s.seglen = (unsigned long long *)AT(L.o_seglen);
#undef AT
    pp->dev = &s;
    /* the head's own device checks, now that its buffers are bound (before any launch) */
    if (ctx->head.check) SPH_TRY(ctx->head.check(ctx, SPH_HEAD_FORWARD, hp));
    SPH_TRY(prepass(ctx, hp, pp, stream));
    /* the loss's rows are the head's rows: inactive and ignored-target rows cost nothing */
    hp->mask = pp->act;
    hp->dlogprob = pp->g;
    hp->dentropy = pp->coef.eta != 0 ? pp->e : NULL;
    hp->dlse = hp->dlogit_mean = NULL;
    sph_status st;
    if (pp->coef.loss != SPH_PM_GSPO) {
        hp->row_hook.device = pol_rows_hook; /* head_kernels.cu calls it per finalize */
        hp->row_hook.arg = pp;
        st = ctx->head.forward(ctx, hp, ws, L.head);
    } else {
        sph_head_plan f, b;
        sph_policy_gspo_plans(hp, &f, &b);
        st = ctx->head.forward(ctx, &f, ws, L.head);
        if (st == SPH_OK) st = gspo_middle(ctx, pp, stream);
        if (st == SPH_OK && hp->one_pass) st = ctx->head.backward(ctx, &b, ws, L.head);
    }
    if (st == SPH_OK) {
        pol_metrics_kernel<<<1, MET_THREADS, 0, stream>>>(dev_of(pp));
        SPH_LAUNCH_CHECK("pol_metrics_kernel", stream);
    }
    return st;
}

extern "C" const sph_policy_backend sph_policy_cuda_backend = {"cuda", cuda_workspace,
                                                             cuda_run};
