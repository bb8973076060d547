/*
 * distill.h - the validated form of one sph_distill_loss call (distill.c fills it) and the
 * backends that run it: the float64 reference (distill_ref.c), the CPU backend
 * (distill_cpu.c) and CUDA (src/cuda/distill.cu). distill.c dispatches on the context's device
 * type through its own small table (never core/backend.h). docs/distill.md has the math.
 */
#ifndef SPH_DISTILL_DISTILL_H
#define SPH_DISTILL_DISTILL_H

#include "core/ctx.h"
#include "head/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The kind a row's math runs: jsd with beta 0 / 1 becomes the forward / reverse KL. */
enum { SPH_DK_FWD = 0, SPH_DK_REV = 1, SPH_DK_JSD = 2 };

typedef struct sph_distill_plan {
    /* the head's plan: hidden, weight, shard, temperature, softcap, mask / spans, dhidden /
     * dweight with accumulate / allreduce, comm; no targets or per-row outputs */
    sph_head_plan head;
    int kind;          /* SPH_DK_*, after the beta special cases */
    double beta;       /* jsd: in (0, 1) */
    double t_teacher;  /* dense: the teacher's temperature, or 0 = the student's (row by row
                        * with the head's temperature_rows) */
    const float *tt_rows; /* dense: (N) row i's teacher temperature (teacher_temperature_rows,
                           * t_teacher 0 then), or NULL */
    int reduction;     /* sph_reduction */
    int dense;         /* 1: teacher_hidden / teacher_weight, 0: top-k */
    /* dense teacher */
    const void *th; int64_t ld_th; int64_t HT; sph_dtype tdtype;
    const void *tw; int64_t ld_tw;
    /* sparse teacher */
    const void *ids; int ids_i64; int64_t ld_ids; int64_t K;
    const float *tlp; int64_t ld_tlp;
    const float *dloss; /* (N) or NULL */
    float *loss;        /* (1) or (N) */
    int64_t N;
    /* reduction mean's divisor: num_tokens (0 = counted), the group whose active rows are
     * counted (NULL: this call's), and on host contexts the divisor itself (distill.c sets it
     * before the backend runs: num_tokens, or the rows counted over the group; CUDA counts on
     * the device) */
    int64_t num_tokens;
    sph_comm_t seq_comm;
    int64_t n_mean;
} sph_distill_plan;

/* The scale of row i's gradient: 1 / n_mean (mean; 0 when it is 0), 1 (sum), dloss_i or 1
 * (none). */
static inline double sph_distill_row_scale(const sph_distill_plan *dp, int64_t i) {
    if (dp->reduction == 0) return dp->n_mean > 0 ? 1.0 / (double)dp->n_mean : 0.0;
    if (dp->reduction == 1) return 1.0;
    return dp->dloss ? (double)dp->dloss[i] : 1.0;
}

/* The reduced loss of the call's row losses' sum (mean / sum). */
static inline double sph_distill_reduce(const sph_distill_plan *dp, double tot) {
    if (dp->reduction == 0) return dp->n_mean > 0 ? tot / (double)dp->n_mean : 0.0;
    return tot;
}

/* Backends. workspace: exact bytes; run: the whole call on a validated plan (host plans for
 * the reference and the CPU; device pointers for CUDA). */
sph_status sph_distill_ref_run(sph_ctx_t ctx, const sph_distill_plan *dp);
sph_status sph_distill_cpu_workspace(sph_ctx_t ctx, const sph_distill_plan *dp, size_t *bytes);
sph_status sph_distill_cpu_run(sph_ctx_t ctx, const sph_distill_plan *dp, void *ws, size_t bytes);

/* A backend's table: the CPU's and the reference's live in distill.c; a device's is handed
 * out by its device table (core/backend.h loss_backend("distill"); CUDA's is
 * src/cuda/distill.cu's sph_distill_cuda_backend). */
typedef struct sph_distill_backend {
    const char *name;
    sph_status (*workspace)(sph_ctx_t ctx, const sph_distill_plan *dp, size_t *bytes);
    sph_status (*run)(sph_ctx_t ctx, const sph_distill_plan *dp, void *ws, size_t bytes);
} sph_distill_backend;

/* The float64 oracle (distill_ref.c) on float64 inputs, for the tests' finite differences
 * and the reference backend: every row of h (N, H) against w (V, H) (the whole vocabulary,
 * v0 = 0) with temperature T, softcap cap (0 = off); the teacher dense (th (N, HT), tw
 * (V, HT), T_T_rows[i], else T_T, else the row's T when 0) or sparse (ids (N, K) int64, -1 padding; lp (N, K)). act (N) or NULL = all.
 * Writes loss_rows (N, 0 on inactive rows) and, each optional, the gradients of
 * sum_i scale_i loss_i: dh (N, H), dw (V, H) (scale NULL = 1). */
typedef struct sph_distill_f64 {
    int64_t N, H, V, HT, K;
    int kind;  /* SPH_DK_* */
    double beta, T, cap, T_T; /* T_T 0: the row's student temperature */
    const double *T_rows;     /* (N) or NULL: row i's student temperature instead of T */
    const double *T_T_rows;   /* (N) or NULL: row i's teacher temperature instead of T_T */
    const double *h, *w, *th, *tw, *lp;
    const int64_t *ids;
    const uint8_t *act;
    const double *scale;
} sph_distill_f64;
sph_status sph_distill_ref_f64(const sph_distill_f64 *in, double *loss_rows, double *dh,
                               double *dw);
/* The kind after jsd's special cases (beta 0: forward KL, 1: reverse KL). */
int sph_distill_kind_of(int kind, double beta);

#ifdef __cplusplus
}
#endif
#endif
