/*
 * plan.h - the validated, normalized form of sph_head_args that every head backend (CPU
 * reference, CPU optimized, CUDA) receives through the context's table (core/backend.h).
 * Validation (src/head/head.c, sph_head_plan_make) fills it once at the API boundary; kernels
 * get plain pointers, int64 sizes and row strides, nothing else.
 *
 * TP combine record: every backend reduces its shard to one partial per row,
 *   m  = max_j z_ij over the shard (-inf if the shard holds no candidate of the row)
 *   s  = sum_j exp(z_ij - m)
 *   b  = sum_j exp(z_ij - m) z_ij
 *   zt = z_{i,t_i} if the target lives in this shard, else 0 (exactly one shard owns it)
 *   sz = sum_j z_ij (for logit_mean)
 * and partials of the TP group combine exactly, in rank order (deterministic):
 *   M = max m_r, S = sum s_r e^(m_r - M), B = sum b_r e^(m_r - M), ZT = sum zt_r, SZ = sum sz_r
 *   lse = M + log S, mu = B / S.
 */
#ifndef SPH_HEAD_PLAN_H
#define SPH_HEAD_PLAN_H

#include "core/backend.h"
#include "core/internal.h"
#include "core/validate.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Fields of one partial record (m, s, b, zt, sz): values per row per shard, in this order. */
#define SPH_PARTIAL_FIELDS 5

/* The per-row epilogue of a one-pass forward (issue 27): a loss above the head binds it to
 * turn rows' final statistics into their upstream gradients (core/backend.h). The
 * sweeps call it at one point, right after a block of rows is finalized (logprob, entropy,
 * lse, logit_mean, stats written) and before those rows' dlogits read dlogprob / dentropy; the
 * head knows nothing else of it. All zero: no epilogue.
 *   host    host sweeps (head_cpu.c): rows[0 .. n) of the pass, host memory.
 *   device  CUDA sweeps (src/cuda/head_kernels.cu, after each finalize launch): enqueues the
 *           epilogue of rows r0 .. r0 + n, or rowmap[0 .. n) (device memory) when gathered, on
 *           stream (a cudaStream_t); a launch error is its status.
 *   arg     the loss's, passed back as is. */
typedef struct sph_row_hook {
    void (*host)(void *arg, const int64_t *rows, int64_t n);
    sph_status (*device)(void *arg, int64_t r0, const int64_t *rowmap, int64_t n, void *stream);
    void *arg;
} sph_row_hook;

struct sph_head_plan {
    int64_t N, H, V_loc, V, v0; /* rows, hidden, shard width, vocab_total, vocab_start */
    int64_t K;                  /* candidates per row (support mode), 0 = full vocabulary */
    sph_dtype dtype;            /* hidden/weight dtype: f32, bf16 or f16 */
    sph_device device;
    const void *hidden;  int64_t ld_h;   /* (N, H) row stride ld_h elements */
    const void *weight;  int64_t ld_w;   /* (V_loc, H) */
    const void *targets; int tgt_i64;    /* (N) or NULL */
    const void *cand;    int cand_i64; int64_t ld_c; /* (N, K) or NULL */
    double temperature, softcap;
    const float *temp_rows;              /* (N) or NULL: row i's temperature T_i instead of
                                            temperature (each T_i passes the scalar's rule,
                                            sph_check_float_scalar: checked for every row on
                                            host plans; device kernels turn a bad one into a
                                            non-finite row, docs/head.md); temperature is 1 */
    const uint8_t *mask;                 /* (N) or NULL = every row active */
    const int64_t *spans; int64_t n_spans; /* host, validated: ordered, in range, cover mask;
                                              NULL = derive from mask or dense */
    float *logprob, *entropy, *lse, *logit_mean; /* (N) each or NULL */
    float *sum_p2;                       /* (N) or NULL: sum_j p_ij^2 (forward only) */
    int64_t topk;                        /* K of topk_ids / topk_lp (forward only), 0 = none */
    int64_t *topk_ids; int64_t ld_ti;    /* (N, topk) i64, row stride ld_ti */
    float *topk_lp; int64_t ld_tl;       /* (N, topk) f32, row stride ld_tl */
    float *stats;                        /* (N, 3): m, lse, mu; row stride 3 */
    const float *dlogprob, *dentropy, *dlse, *dlogit_mean; /* (N) each or NULL */
    void *dhidden; int64_t ld_dh; sph_dtype dh_dtype;
    void *dweight; int64_t ld_dw; sph_dtype dw_dtype;
    int acc_dh, acc_dw, allreduce_dh;
    int one_pass;                        /* forward also produces the gradients */
    sph_comm_t comm;                     /* TP group or NULL */
    sph_row_hook row_hook;               /* the one-pass sweeps' per-row epilogue, or zero */
}; /* typedef sph_head_plan: core/backend.h */

/* The head table's fill functions (the device tables carry them, core/backend.h): the
 * reference in every slot, plain (host memory) or staged (device memory: inputs copied to the
 * host, float64 reference, outputs copied back; synchronous), head_ref.c; the optimized CPU
 * backend's slots, head_cpu.c. */
void sph_head_ref_fill(sph_ctx_t ctx, sph_head_backend *be, int staged);
void sph_head_cpu_fill(sph_ctx_t ctx, sph_head_backend *be);

/* Validates args for the pass on ctx and fills plan (src/head/head.c). Checks everything that
 * can be checked without touching device data, then the backend's own conditions (the table's
 * check slot); host-resident targets/candidates/masks are also checked for range, duplicates
 * and support membership (sph_head_plan_check_data). */
sph_status sph_head_plan_make(sph_ctx_t ctx, sph_head_pass pass, const sph_head_args *args,
                              sph_head_plan *plan);
/* The generic part of sph_head_plan_make, without the backend's check: for callers that
 * complete the plan first (a loss binds workspace buffers and its row hook into it, then runs
 * the check). */
sph_status sph_head_plan_fill(sph_ctx_t ctx, sph_head_pass pass, const sph_head_args *args,
                              sph_head_plan *plan);
/* The generic validation feeding the caller's validator (core/validate.h): every tensor of
 * args registered there, the caller adds its own (the loss's tensors, the workspace) and runs
 * sph_val_finish, then (host contexts) sph_head_plan_check_data. flags:
 * SPH_PLAN_STATS_OPTIONAL accepts stats NULL (plan->stats NULL: a loss keeps them in its
 * workspace). */
#define SPH_PLAN_STATS_OPTIONAL 1u
sph_status sph_head_plan_validate(sph_ctx_t ctx, sph_head_pass pass, const sph_head_args *args,
                                  sph_head_plan *plan, sph_validator *val, unsigned flags);
/* The data checks of a plan whose mask, targets and candidates are in host memory: mask
 * values 0/1, spans covering every active row, targets < V, candidates < V without
 * duplicates and holding the row's target. sph_head_plan_make runs it on host plans; the
 * staged reference (head_ref_stage.c) on its host copies of device data. */
sph_status sph_head_plan_check_data(const sph_head_plan *p);

/* The id at k of a plan's targets or candidates (host memory), int64 or int32 (tgt_i64,
 * cand_i64). */
static inline int64_t sph_head_id_at(const void *base, int is64, int64_t k) {
    return is64 ? ((const int64_t *)base)[k] : (int64_t)((const int32_t *)base)[k];
}

/* Row i's temperature and the float 1/T the kernels multiply by (z = u * float(1 / T_i)):
 * the per-row value when temp_rows is given, else the scalar. Host code on plans whose
 * temp_rows is host memory (the reference, the CPU backend, the distillation loss). */
static inline double sph_plan_row_temperature(const sph_head_plan *p, int64_t i) {
    return p->temp_rows ? (double)p->temp_rows[i] : p->temperature;
}
static inline float sph_plan_row_inv_t(const sph_head_plan *p, int64_t i) {
    return (float)(1.0 / sph_plan_row_temperature(p, i));
}

/* Host helpers on a plan whose mask is host memory (plan.c): active[i] = 1 if row i is
 * active (mask, else spans, else all); the count of active rows. */
void sph_head_active_rows(const sph_head_plan *p, uint8_t *active);
int64_t sph_head_count_active(const sph_head_plan *p);

/* Non-finite policy (spanhead.h, "Policies"), host plans. scan_backward_inputs: the active rows
 * whose stats (lse, mu) or upstream gradients are not finite (*first: the first, -1: none).
 * nonfinite_error: records count and first on ctx (sph_ctx_nonfinite) and returns
 * SPH_ERR_NONFINITE with the message of the pass; partial: what was written already (NULL:
 * nothing). */
int64_t sph_head_scan_backward_inputs(const sph_head_plan *p, int64_t *first);
/* 1 when one of a row's cols elements (f32, bf16 or f16 bits) is NaN or inf. */
int sph_row_has_nonfinite(const void *row, sph_dtype dt, int64_t cols);
/* The active rows of a host plan whose hidden row holds NaN or inf (*first: the first, -1). */
int64_t sph_head_nonfinite_hidden(const sph_head_plan *p, int64_t *first);
/* Host contexts, a pass with gradients (one-pass forward, backward), before anything is
 * written: NaN / inf in an active hidden row makes the row's statistics non-finite, which a
 * one-pass sweep finds only at the row's chunk, after the gradient rows of the earlier chunks
 * were written (and a backward would write NaN gradients from it). Such rows are refused
 * here, counted for sph_ctx_nonfinite: N_active H reads beside 6 N_active H V flops. A
 * non-finite weight needs no scan: every active row's statistics show it in the first chunk.
 * What is left to the sweep: finite inputs whose logits overflow float. who names the call. */
sph_status sph_head_refuse_nonfinite_hidden(sph_ctx_t ctx, const sph_head_plan *p,
                                            const char *who);
sph_status sph_head_nonfinite_error(sph_ctx_t ctx, sph_head_pass pass, int64_t count,
                                    int64_t first, const char *partial);

/* The tensor-parallel consistency check of a pass (head_tp.c; spanhead.h, "Policies"): with a
 * TP group, every rank allgathers a record of its call and all compare them; local is this
 * rank's validation status (p unused unless SPH_OK). Returns local when it failed (its message
 * kept), SPH_ERR_MISMATCH naming the field and ranks when the calls differ,
 * SPH_ERR_INVALID_ARG when another rank's validation failed, SPH_OK otherwise. Without a
 * group, or with a device communicator in a release build, returns local at once. */
sph_status sph_head_tp_agree(sph_ctx_t ctx, sph_head_pass pass, const sph_head_plan *p,
                             sph_status local);
/* Its two halves, for a loss that gathers the head's record beside its own in one exchange
 * (comm/check.h, sph_comm_agree): the head's record of the call into w[SPH_HEAD_TP_WORDS] (p
 * NULL: this rank's validation failed), and the head's verdict over gathered records whose
 * first SPH_HEAD_TP_WORDS words are the head's (records of `words` words). */
#define SPH_HEAD_TP_WORDS 17
void sph_head_tp_record(sph_ctx_t ctx, sph_head_pass pass, const sph_head_plan *p, int64_t *w);
sph_status sph_head_tp_verdict(const int64_t *all, int64_t n, size_t words);

#ifdef __cplusplus
}
#endif
#endif
