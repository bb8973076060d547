/*
 * tolerances.h - every numerical budget of the C tests, written once, each with the arithmetic
 * it comes from. The oracle is the float64 reference (src/head/head_ref.c) run on exactly the
 * rounded inputs the kernel sees, so input rounding never enters a budget: only the kernel's
 * own arithmetic does.
 *
 * Two shapes of check use these numbers (tests/parity/test_head_case.h):
 *   normwise   |got - ref| <= tol * (max|ref| + TOL_NORM_FLOOR) + tol * |ref|   (per-row outputs)
 *   gradient   |got - ref| <= tol * (max|g| + TOL_NORM_FLOOR) + (tol + u_out) |ref|
 *                             + (u_D + TOL_ACC_F32) A + eta_D Z                     (dhidden, dweight)
 * where g is the gradient itself (without an accumulated start value), u_out the unit roundoff
 * of the gradient output's dtype (0 for f32), u_D that of the dlogits the backend feeds to its
 * products (0 on the CPU, which keeps dlogits in f32), A the sum of |dlogit| |operand| over the
 * product (A_ik = sum_j |du_ij| |w_jk| for dhidden), eta_D the absolute error of a dlogit that
 * rounds into the subnormals of its dtype, and Z the sum of |operand| (Z_ik = sum_j |w_jk|).
 * Each run prints the largest error / budget ratio it saw per output, so the margin is visible.
 *
 * Unit roundoffs (round to nearest even, p significand bits including the implicit one):
 *   f32 p = 24: u = 2^-24 = 6.0e-8;  bf16 p = 8: u = 2^-8 = 3.9e-3;  f16 p = 11: u = 2^-11 = 4.9e-4.
 */
#ifndef SPH_TOLERANCES_H
#define SPH_TOLERANCES_H

#define TOL_U_F32 0x1p-24
#define TOL_U_BF16 0x1p-8
#define TOL_U_F16 0x1p-11
/* Half the smallest f16 subnormal (2^-24): the absolute error of an f16 value that underflows.
 * bf16 has float32's exponent range: its underflow error (2^-134) never matters here. */
#define TOL_ETA_F16 0x1p-25

/* Results that are 0 in exact arithmetic carry noise of the size of the operands, not of the
 * result: V = 1 gives entropy = 0 and an entropy gradient e p (mu - z) = 0 computed from f32
 * statistics, eps32 |z| |e| |w| ~ 1.5e-6 with |z| ~ 10 (seed 1883208803163134). The normwise
 * scale is max|ref| + 0.5 so such rows compare against the size of a typical logit, not 0. */
#define TOL_NORM_FLOOR 0.5

/* CPU kernels (generic, avx2, avx512) and the reference's own float32 stores, f32 results.
 * Half inputs are widened exactly once, everything after is f32, so bf16/f16 inputs have the
 * f32 budget. Error sources: the f32 dot products u = h.w (H <= 128 terms, sum|h||w| ~ 2 sqrt(H),
 * sqrt(H) eps32 sum|h||w| ~ 1e-6 absolute in z), the f32 exponentials (SIMD polynomial within
 * 2 ulp), f32 tile sums over <= 256 columns (merged in float64 across tiles), and the f32
 * statistics the backward reads back (lse rounded to f32: 6e-8 |lse| relative in p). All are
 * ~1e-6 normwise; 2e-5 leaves a margin of ~10 over the largest ratio the grids print. */
#define TOL_CPU_F32 2e-5
/* The CPU keeps dlogits in f32 (u_D = 0); its products accumulate <= V_loc or N terms in f32
 * through OpenBLAS (sqrt(V) eps32 ~ 2e-6 of A for V ~ 1000): covered by this share of A. */
#define TOL_ACC_F32 1e-5

/* CUDA, f32 inputs: cuBLAS with CUBLAS_COMPUTE_32F (exact FP32; TF32 only with allow_tf32,
 * which no parity test sets), fp32 records merged across vocabulary splits, fp32 dlogits: the
 * arithmetic of the CPU path with longer sums (V_loc up to 20000: sqrt(V) eps32 ~ 1e-5). Was
 * 1e-3 for the gradients, fifty times what FP32 arithmetic can produce. */
#define TOL_CUDA_F32 5e-5
/* CUDA, bf16/f16 inputs, per-row outputs: tensor-core products of the exact half inputs with
 * fp32 accumulation (sqrt(H) eps32 sum|h||w|, H <= 520), the sm_90a epilogue's ex2.approx.ftz
 * (2^-22 relative), fp32 records merged across splits of up to 16384 columns (sqrt(V) eps32).
 * Kept at the budget the device runs have passed (run 14: every seed); the grids print the
 * largest ratio so a device run shows the margin. */
#define TOL_CUDA_HALF_ROWS 2e-4
/* CUDA, bf16/f16 inputs, gradients: the dlogits are rounded to the input dtype before the
 * tensor-core products (u_D = u_bf16 or u_f16 on every element; f16 also underflows below
 * 2^-14, eta_D = TOL_ETA_F16), then accumulate in fp32 (tensor-core adds, TOL_ACC_CUDA of A
 * for sums of up to 20000 terms: sqrt(V) 2^-22 ~ 3e-5, times 3). TOL_CUDA_MARGIN multiplies
 * the u_D and eta_D terms: the sm_90a one-pass path stages E = e^(z - m) in f16 before forming
 * the dlogits (a second rounding of <= u_f16 <= u_D in p, and of z through log E in the
 * entropy term), and the dlogits' own f32 error feeds the rounding: 3 covers u_D + u_E with
 * u_D to spare. Was a flat 2.5e-2 normwise for both half dtypes (eight times f16's
 * arithmetic); run 21 saw a max abs error 4.9e-3 for bf16 inputs with f32 dhidden, which an
 * elementwise 2e-4 + 2e-2 |ref| did not cover and this budget (per element, with A) does. */
#define TOL_ACC_CUDA 1e-4
#define TOL_CUDA_MARGIN 3.0
/* The same, normwise, for tests that do not compute A (the policy loss on the GPU): the
 * rounding of D contributes <= u_D A_ik to dhidden_ik, and A_ik stays within a few max|dh|
 * for these softmax gradients (sum_j |du_ij| <= 2 |g_i| (1 - p_t) + ...): 6 u_D, which is the
 * old flat 2.5e-2 for bf16 and eight times tighter for f16. */
#define TOL_CUDA_HALF_GRAD_NORM(dt) (6.0 * ((dt).code == SPH_DTYPE_BFLOAT ? TOL_U_BF16 : TOL_U_F16))

/* Float64 end to end (the reference's float64 cores against an independent float64
 * computation written in the test): rounding of float64 sums of a few hundred terms: ~1e-14 observed. */
#define TOL_F64 1e-12
/* The reference against central finite differences of its own float64 forward on O(1) float
 * inputs, Richardson-extrapolated over steps 2^-10 and 2^-11 (hc_central_diff): truncation
 * O(h^4 |f^(5)|) ~ 1e-11 relative, cancellation eps64 / h ~ 1e-12; what is left is the
 * reference's own float32 steps (the policy's upstream gradients and per-row temperatures are
 * float: up to 2.3e-7 relative seen). 0 failures in 1000 seeds of each test at 1e-6; the old
 * single step of 1e-3 needed 1e-5 and still failed 1 seed in 400 (h^2 |f'''| / 6 of 3e-5 on a
 * GSPO loss, exp(rho) times cubed row derivatives). */
#define TOL_FD 1e-6

#endif
