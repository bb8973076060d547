/*
 * head_sm90.cu - the Hopper (sm_90a) logits kernel: the tile L (R, Vs) = h (R, H) . W (Vs, H)^T
 * for bf16/f16 inputs, fp32 accumulation, then one of three epilogues on the tile in registers
 * (head_sm90.cuh): store L in fp32 (the batch-invariant variant, same contract and output
 * layout as sph_cuda_logits_fixed in head_mma.cu), per-row softmax records of each 256-column
 * tile (the general path's forward), or the dlogits du (its backward). Machinery:
 * - operands arrive through TMA (cp.async.bulk.tensor.2d) as 128 (or 64) x 64 (h) and
 *   256 x 64 (W) boxes in the 128-byte swizzled layout, out-of-range rows and k columns
 *   zero-filled by the copy engine; the tensor maps are encoded on the host per launch
 *   (cuTensorMapEncodeTiled, reached through cudaGetDriverEntryPointByVersion: no libcuda
 *   link) and passed by value as __grid_constant__ parameters;
 * - a 4-stage (5 for ping-pong) ring of shared-memory buffers, each with a "full" mbarrier
 *   (TMA transaction bytes) and an "empty" mbarrier (the consumer threads that read the stage
 *   release it);
 * - warpgroup 0 is the producer (one thread issues the copies, registers given back with
 *   setmaxnreg), warpgroups 1 and 2 are the consumers: each owns 64 rows x 256 columns, of a
 *   shared 128 x 256 tile (cooperative) or of its own 64 x 256 tile (ping-pong, sm90_cfg),
 *   and issues wgmma.mma_async m64n256k16 with both operands read from shared memory through
 *   matrix descriptors (K-major, 128-byte swizzle);
 * - persistent: one block per SM walks the grouped tile raster; the producer keeps loading
 *   the next tile's k slices while the consumers run an epilogue.
 *
 * Batch invariance: every output element is acc = 0, then acc += (16-wide k step) for
 * k = 0, 16, 32, ... ascending, the same instruction sequence whatever the block, the row's
 * position in it, R or the chunk; zero-filled k columns past H add exact zeros. The value of
 * an element depends on its two input rows and H only. It may differ in the last bits from
 * the mma.sync kernel (another instruction), so the choice between the two must not depend
 * on the batch: sph_cuda_logits_sm90_usable decides from the device, dtype, H and the user's
 * tensors (base alignment, row strides), never from R, the chunk or the row offset.
 *
 * References: PTX ISA 8.x, sections "Asynchronous warpgroup level matrix multiply" (matrix
 * descriptor format, register fragments of D), "cp.async.bulk.tensor", "mbarrier".
 */
#include <cuda.h> /* CUtensorMap and its enums only: the encoder is fetched at run time */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>

#include "cuda/head.cuh"
#include "cuda/head_sm90.cuh"
#include "cuda/head_math.cuh"
#include "core/trace.h"

#define SM90_BN 256 /* columns per tile: one m64n256k16 per warpgroup and k step */
#define SM90_BK 64  /* k per stage: 64 halves = 128 bytes, the swizzle span */
#define SM90_THREADS 384 /* producer warpgroup + 2 consumer warpgroups */
#define SM90_B_BYTES (SM90_BN * SM90_BK * 2)
/* The fused top-k's staging (v22, epi_topk_count): per consumer thread SM90_TK_STAGE logits of
 * one row half, plus one scratch entry, entry-major over the block's 256 consumer threads (a
 * warp's stores hit 32 banks whatever each lane's count). */
#define SM90_TK_STAGE 24
#define SM90_TK_STAGE_BYTES ((SM90_TK_STAGE + 1) * 256 * 4)

/* The two schedules of the consumer warpgroups (template argument PP):
 * - cooperative (PP false): a 128 x 256 tile per block, each consumer warpgroup 64 rows of
 *   it; both run the main loop together, then both run the epilogue while the tensor cores
 *   wait for the next tile;
 * - ping-pong (PP true): a 64 x 256 tile per consumer warpgroup; the block's tiles alternate
 *   between the two, and an ordering barrier lets one warpgroup start its main loop only when
 *   the other has issued its own, so one warpgroup's epilogue runs under the other's MMA.
 *   The W tile is loaded once per 64 rows instead of 128 (more L2 -> shared traffic). */
template <bool PP> struct sm90_cfg {
    static constexpr int BM = PP ? 64 : 128;    /* rows per tile */
    static constexpr int STAGES = PP ? 5 : 4;   /* ring depth */
    static constexpr int GROUP_M = PP ? 32 : 16; /* row tiles per raster group (~2048 rows) */
    static constexpr int A_BYTES = BM * SM90_BK * 2;
    static constexpr int STAGE_BYTES = A_BYTES + SM90_B_BYTES;
    /* stages, 1024 bytes of slack to align the ring to the swizzle atom, 2 x STAGES barriers */
    static constexpr int SMEM = STAGES * STAGE_BYTES + 1024 + 2 * STAGES * 8;
    static constexpr int CONSUMERS = PP ? 128 : 256; /* threads that release a stage */
    /* the fused top-k's staging area past the barriers (SM90_TK_STAGE_BYTES), only in the
     * statistics kernels' launches that emit candidates */
    static constexpr int SMEM_TK = SMEM + SM90_TK_STAGE_BYTES;
};
static_assert(sm90_cfg<true>::SMEM_TK <= 232448 && sm90_cfg<false>::SMEM_TK <= 232448,
              "the stage and the top-k's staging exceed sm_90's 227 KiB of shared memory");
#define SM90_SMEM_MAX                                                                          \
    (sm90_cfg<true>::SMEM_TK > sm90_cfg<false>::SMEM_TK ? sm90_cfg<true>::SMEM_TK              \
                                                        : sm90_cfg<false>::SMEM_TK)

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SPH_SM90_DEVICE 1
#endif

// ---- device helpers (sm_90a only) -------------------------------------------------------

#ifdef SPH_SM90_DEVICE
/* The 128 fp32 accumulators of one m64n256 wgmma, as asm operand text and operand list. */
#define SM90_D_REGS \
    "{" \
    "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15," \
    "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31," \
    "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47," \
    "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63," \
    "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79," \
    "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95," \
    "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111," \
    "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127" \
    "}"
#define SM90_D_OPS(d) \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), \
    "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), \
    "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), \
    "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), \
    "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), \
    "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), \
    "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
    "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), \
    "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), \
    "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), \
    "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
    "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), \
    "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), \
    "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), \
    "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
    "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), \
    "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), \
    "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), \
    "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
    "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), \
    "+f"(d[126]), "+f"(d[127])

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar),
                 "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
/* Waits until the phase of the given parity has completed. A fresh barrier is in phase 0, so
 * waiting for parity 1 returns at once (the producer's first pass over the ring). */
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred p;\n"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    } while (!done);
}
/* One box of a 2-D tensor map into shared memory; completion counted in bytes on bar. */
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap *map, uint32_t bar,
                                            int32_t c0, int32_t c1) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
                 "l"((uint64_t)(uintptr_t)map), "r"(c0), "r"(c1), "r"(bar)
                 : "memory");
}

/* Matrix descriptor of a K-major operand tile in the 128-byte swizzled layout that TMA wrote:
 * rows of 128 bytes (64 halves), 8-row atoms of 1024 bytes, the atom at a 1024-byte aligned
 * address. Start address >> 4 in bits 0-13, leading byte offset (unused for swizzled K-major,
 * 1 by convention) in 16-29, stride byte offset (1024 >> 4: next 8-row group) in 32-45, base
 * offset 0 (aligned atoms) in 49-51, layout 1 = 128-byte swizzle in 62-63. A k step of 16
 * halves (32 bytes) inside the 128-byte row adds 2 to the start address: the hardware applies
 * the swizzle to the final address, as TMA did. */
__device__ __forceinline__ uint64_t sw128_desc(uint32_t saddr) {
    return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) |
           ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}

__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* Keeps the compiler from moving accumulator reads or writes across the asynchronous wgmma
 * window (it sees the asm as done when issued). */
__device__ __forceinline__ void acc_fence(float (&d)[128]) {
#pragma unroll
    for (int i = 0; i < 128; i++) asm volatile("" : "+f"(d[i])::"memory");
}

/* D (64 x 256, fp32, registers) += A (64 x 16, smem) . B (256 x 16, smem)^T; scale-d = 1. */
template <typename T> struct wgmma_op;
template <> struct wgmma_op<__nv_bfloat16> {
    static __device__ __forceinline__ void run(float (&d)[128], uint64_t da, uint64_t db) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " SM90_D_REGS
                     ", %128, %129, p, 1, 1, 0, 0;\n}\n"
                     : SM90_D_OPS(d)
                     : "l"(da), "l"(db));
    }
};
template <> struct wgmma_op<__half> {
    static __device__ __forceinline__ void run(float (&d)[128], uint64_t da, uint64_t db) {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 " SM90_D_REGS
                     ", %128, %129, p, 1, 1, 0, 0;\n}\n"
                     : SM90_D_OPS(d)
                     : "l"(da), "l"(db));
    }
};
#endif /* SPH_SM90_DEVICE */

// ---- epilogues (the D fragment in registers) --------------------------------------------
/* D fragment of m64nN: thread t of the warpgroup holds, for each 8-column group j,
 * (row 16 (t/32) + (t%32)/4, cols 8j + 2 (t%4) + {0,1}) in acc[4j], acc[4j+1] and the
 * same columns 8 rows lower in acc[4j+2], acc[4j+3]. r and cb: this thread's first row and
 * column in the chunk / split. */

__device__ __forceinline__ void epi_store_logits(const float (&acc)[128], const sph_sm90_epi &ep,
                                                 int64_t r, int64_t cb, int64_t R, int64_t Vs,
                                                 int vec2) {
#pragma unroll
    for (int j = 0; j < SM90_BN / 8; j++) {
        const int64_t col = cb + 8 * j;
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int64_t rr = r + 8 * hf;
            if (rr >= R || col >= Vs) continue;
            float *dst = ep.L + rr * ep.ldL + col;
            const float v0 = acc[4 * j + 2 * hf], v1 = acc[4 * j + 2 * hf + 1];
            if (col + 1 < Vs && vec2) {
                *(float2 *)dst = make_float2(v0, v1);
            } else {
                dst[0] = v0;
                if (col + 1 < Vs) dst[1] = v1;
            }
        }
    }
}

/* The global row of chunk row rr (clamped into the chunk: rows past R only feed shuffles). */
__device__ __forceinline__ int64_t epi_row(const sph_sm90_epi &ep, int64_t rr, int64_t R) {
    const int64_t rc = rr < R ? rr : R - 1;
    return ep.rowmap ? ep.rowmap[rc] : ep.r0 + rc;
}

/* The 16-byte store path of the half-precision epilogues. In the D fragment the 4 threads of a
 * quad hold one row's 8-column group j as one 32-bit word each (columns 8j + 2q, 8j + 2q + 1
 * in lane q). For 4 consecutive groups 4m .. 4m + 3, lane q holds w[0..3] = its word of each;
 * a 4 x 4 transpose of words across the quad (two xor rounds of 2 shuffles) leaves lane q
 * with the 4 words of group 4m + q in column order: one 16-byte store per lane and group
 * instead of four 4-byte ones, and a warp's store covers whole 32-byte sectors (8 rows x 64
 * bytes) instead of halves of them. Every lane of the warp must take part (full-mask
 * shuffles); the caller predicates the store. Selects, not indexing, keep w in registers. */
__device__ __forceinline__ void quad_transpose(uint32_t (&w)[4]) {
    const int lane = threadIdx.x & 31;
    const bool x = lane & 1, a = (lane & 2) != 0;
    /* round 1: 2 x 2 transposes between lanes q and q ^ 1 */
    uint32_t s0 = x ? w[0] : w[1], s1 = x ? w[2] : w[3];
    s0 = __shfl_xor_sync(0xffffffffu, s0, 1);
    s1 = __shfl_xor_sync(0xffffffffu, s1, 1);
    if (x) w[0] = s0, w[2] = s1;
    else w[1] = s0, w[3] = s1;
    /* round 2: the off-diagonal 2 x 2 blocks between lanes q and q ^ 2 */
    s0 = a ? w[0] : w[2], s1 = a ? w[1] : w[3];
    s0 = __shfl_xor_sync(0xffffffffu, s0, 2);
    s1 = __shfl_xor_sync(0xffffffffu, s1, 2);
    if (a) w[0] = s0, w[1] = s1;
    else w[2] = s0, w[3] = s1;
}

/* Stores 4 groups (4m .. 4m + 3) of one row after quad_transpose: lane q writes group
 * 4m + q at row + 8 (4m + q), row pointing at the tile's first column. lim: valid columns from
 * there; groups from lim on are not stored, the group holding column lim - 1 is stored whole
 * (its tail columns hold zeros and lie inside the row's 8-aligned stride). */
__device__ __forceinline__ void quad_store16(void *row, int m, uint32_t (&w)[4], int lim,
                                             bool row_ok) {
    quad_transpose(w);
    const int grp = 4 * m + (threadIdx.x & 3);
    if (row_ok && 8 * grp < lim)
        *(uint4 *)((uint16_t *)row + 8 * grp) = make_uint4(w[0], w[1], w[2], w[3]);
}

/* What an epilogue needs of one of the thread's two rows, loaded before the tile's main loop
 * so that the global loads' latency hides behind the wgmma work. */
struct epi_row_args {
    int64_t t;                    /* target (global vocabulary index; < 0 ignored) */
    float lse, mu, g, eg, gl, gmV; /* dlogits: statistics and upstream gradients */
    float it;                      /* the row's 1 / T (row_inv_t) */
    float tau;                     /* top-k: the row's candidate threshold (ep.tk_tau) */
    bool active;
};

/* The top-k's threshold of a row, read after the tile's main loop was issued (the tiles that
 * finished meanwhile raised it): INFINITY for rows past R or without top-k. */
__device__ __forceinline__ float epi_row_tau(const sph_sm90_epi &ep, int64_t rr, int64_t R) {
    return ep.tk_cand && rr < R ? sph_tk_dec(__ldcg(ep.tk_tau + rr)) : INFINITY;
}

template <int EPI>
__device__ __forceinline__ void epi_row_load(const sph_sm90_epi &ep, int64_t rr, int64_t R,
                                             epi_row_args &a) {
    const int64_t i = epi_row(ep, rr, R);
    a.t = load_target(ep.tgt, ep.tgt_i64, i);
    a.it = row_inv_t(ep.trows, i, ep.inv_t);
    if (!(EPI & SPH_SM90_EPI_DLOGITS)) return; /* the top-k's tau: epi_row_tau */
    a.active = !ep.mask || ep.mask[i];
    a.lse = ep.stats[i * 3 + 1], a.mu = ep.stats[i * 3 + 2];
    a.g = ep.g && a.t >= 0 ? ep.g[i] : 0.f; /* ignored target: no gradient through it */
    a.eg = ep.e ? ep.e[i] : 0.f, a.gl = ep.gl ? ep.gl[i] : 0.f;
    a.gmV = ep.gm ? ep.gm[i] * ep.inv_V : 0.f;
}

/* Whether one of the warp's 16 rows (its threads' two) has its target among the tile's 256
 * columns (warp-uniform): the epilogues' whole-tile copies without the target's compare run
 * where none has (v29). cb: the thread's first column in the split (the tile's + 2 (lane %
 * 4)). Exact for every column a thread holds; a row past R only ever picks the copy with it. */
__device__ __forceinline__ bool epi_warp_has_target(const sph_sm90_epi &ep,
                                                    const epi_row_args (&ra)[2], int64_t cb) {
    const int64_t tb = cb - 2 * (threadIdx.x & 3) + ep.col_g0;
    const bool tg = (ra[0].t >= tb && ra[0].t < tb + SM90_BN) ||
                    (ra[1].t >= tb && ra[1].t < tb + SM90_BN);
    return __any_sync(0xffffffffu, tg);
}

/* The fused top-k's part of one row of the tile (ep.tk_cand, head_sm90.cuh), in two halves
 * around the row's statistics so that no global round trip waits on the epilogue's critical
 * path (run 31: a warpgroup's epilogue is as slow as its slowest row): epi_topk_count finds the
 * row's logits z >= tau (finite or -inf; NaN never) among the thread's 64, as a 64-bit mask
 * of their positions, and stages their values in shared memory (tk_stage: up to SM90_TK_STAGE
 * per thread, in position order), offsets the counts by a quad scan and issues one atomicAdd
 * per quad for their place in the row's buffer; epi_topk_emit, after the statistics loop hid
 * the atomic's latency, walks the mask's set bits (each candidate's column) and the staged
 * values, stores them, raises one slot to their maximum (fire-and-forget atomicMax) and,
 * where the row's count crossed a multiple of 2^tk_every_log2, reads the slots back and
 * raises the threshold to their minimum (tk_ks >= K slots fed by disjoint columns: at least K
 * logits are >= it). Its cost is per candidate (run 31 call 6: the v21 loop over all 64
 * positions, its body run wherever any lane of the warp had one, was +72 % instructions). A
 * thread with more candidates than the stage holds emits from its registers instead, before
 * the statistics loops (epi_topk_emit_regs, the same entries in the same order, each raising
 * its column's slot): a row's first tiles before any threshold. Rows past R emit nothing. */
struct tk_part {
    int n, incl, total, base;
    int s0, ds;      /* the row half's first stage entry and its step (+1 or -1: v25's second
                        half fills the stage from the top down) */
    uint32_t m0, m1; /* the candidates' positions p = 2 j + e: bits 0..31, 32..63 */
    bool ov;         /* more than the stage holds: emit from the registers */
    __device__ __forceinline__ bool over() const { return ov; }
};
#ifdef SPH_CUDA_EMU /* tests/emu (host C++): a shared-memory address is an offset into the
                       emulator's block-shared bytes */
__device__ __forceinline__ void st_shared_f32(uint32_t a, float v) { emu::shared_f32(a) = v; }
__device__ __forceinline__ float ld_shared_f32(uint32_t a) { return emu::shared_f32(a); }
#else
__device__ __forceinline__ void st_shared_f32(uint32_t a, float v) {
    asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(a), "f"(v) : "memory");
}
__device__ __forceinline__ float ld_shared_f32(uint32_t a) {
    float v;
    asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(a) : "memory");
    return v;
}
#endif
/* FULL: the tile's 256 columns all lie in the split (no column test). The loop runs over
 * groups of 4 j (8 positions), as v30 left it for its group skip (SPH_TEST_TOPK_VARIANT bit
 * 5, removed after run 37): so the SASS stays v30's default's; one loop over j has the same
 * instruction count, but ptxas allocates otherwise (scripts/sass_epi.sh, sass_epi_topk). */
template <bool FULL>
__device__ __forceinline__ void tk_stage(const float (&acc)[128], int hf, float tau, int lim,
                                         uint32_t tks, tk_part &k) {
    const uint32_t last = tks + SM90_TK_STAGE * 1024u; /* the scratch entry */
    uint32_t sa = tks + (uint32_t)k.s0 * 1024u;
    uint32_t m0 = 0, m1 = 0;
#pragma unroll
    for (int g = 0; g < SM90_BN / 32; g++) {
#pragma unroll
        for (int jj = 0; jj < 4; jj++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int j = 4 * g + jj;
                const float z = acc[4 * j + 2 * hf + e];
                if ((FULL || 8 * j + e < lim) && z >= tau) {
                    if (j < 16) m0 |= 1u << (2 * j + e);
                    else m1 |= 1u << (2 * j + e - 32);
                    st_shared_f32(sa, z);
                    sa = min(sa + 1024u, last);
                }
            }
    }
    k.m0 = m0, k.m1 = m1;
}
/* The quad's place in the row's buffer for the candidates k holds (k.m0, k.m1, k.s0 set):
 * the counts offset by a quad scan, one atomicAdd per quad, its result used in emit. */
__device__ __forceinline__ void tk_reserve(const sph_sm90_epi &ep, int64_t rr, tk_part &k) {
    const int q4 = threadIdx.x & 3;
    const int n = k.n;
    int incl = n;
    int x = __shfl_up_sync(0xffffffffu, incl, 1, 4);
    if (q4 >= 1) incl += x;
    x = __shfl_up_sync(0xffffffffu, incl, 2, 4);
    if (q4 >= 2) incl += x;
    k.incl = incl, k.total = __shfl_sync(0xffffffffu, incl, 3, 4);
    k.base = 0;
    /* used in emit; tk_probe & 2 (timing only, SPH_TEST_TOPK_PROBE): no atomic, every quad's
     * candidates at the buffer's start */
    if (q4 == 0 && k.total > 0 && !(ep.tk_probe & 2)) k.base = atomicAdd(ep.tk_n + rr, k.total);
}
/* The row half's candidates (the loop after the row's maximum: folded into the maximum's
 * loop, run 33 call 1, its column test compiled to a branch per position, +76 M instructions) */
__device__ __forceinline__ void epi_topk_count(const float (&acc)[128], int hf, float tau,
                                               const sph_sm90_epi &ep, int64_t rr, int64_t R,
                                               int lim, uint32_t tks, int s0, tk_part &k) {
    k.m0 = 0, k.m1 = 0, k.s0 = s0, k.ds = 1;
    if (rr < R) {
        if (lim == SM90_BN) tk_stage<true>(acc, hf, tau, lim, tks, k);
        else tk_stage<false>(acc, hf, tau, lim, tks, k);
    }
    k.n = __popc(k.m0) + __popc(k.m1);
    k.ov = s0 + k.n > SM90_TK_STAGE;
    tk_reserve(ep, rr, k);
}

/* v25: both row halves' candidates in one loop, the two halves' tests of a column side by
 * side, so that the stage pointers' dependent chains (one step per candidate, v22's latency in
 * run 33 call 2's PC samples) run two at a time: the first half fills the stage from entry 0
 * up, the second from entry SM90_TK_STAGE - 1 down, and where together they hold more than the
 * stage, both emit from their registers (only the halves with candidates: rows past R have a
 * NaN threshold, which no logit reaches). */
template <bool FULL>
__device__ __forceinline__ void tk_stage2(const float (&acc)[128], const float (&tau)[2],
                                          int lim, uint32_t tks, int cap, tk_part (&k)[2]) {
    const uint32_t last = tks + (uint32_t)cap * 1024u; /* the first half's scratch entry */
    uint32_t sa0 = tks, sa1 = last - 1024u;             /* the second half's ends at entry 0 */
    uint32_t m[2][2] = {{0u, 0u}, {0u, 0u}};
#pragma unroll
    for (int j = 0; j < SM90_BN / 8; j++)
#pragma unroll
        for (int e = 0; e < 2; e++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const float z = acc[4 * j + 2 * hf + e];
                if ((FULL || 8 * j + e < lim) && z >= tau[hf]) {
                    m[hf][j >= 16] |= 1u << ((2 * j + e) & 31);
                    if (hf == 0) {
                        st_shared_f32(sa0, z);
                        sa0 = min(sa0 + 1024u, last);
                    } else {
                        st_shared_f32(sa1, z);
                        sa1 = max(sa1, tks + 1024u) - 1024u;
                    }
                }
            }
#pragma unroll
    for (int hf = 0; hf < 2; hf++) k[hf].m0 = m[hf][0], k[hf].m1 = m[hf][1];
}
__device__ __forceinline__ void epi_topk_count2(const float (&acc)[128], const float (&tau)[2],
                                                const sph_sm90_epi &ep, int64_t r, int lim,
                                                uint32_t tks, tk_part (&k)[2]) {
    /* the stage's entries: 6 under SPH_TEST_TOPK_VARIANT bit 3 (tests: the overflows of
     * one half, of both, of their sum, at every tile size) */
    const int cap = ep.tk_variant & 8 ? 6 : SM90_TK_STAGE;
    if (lim == SM90_BN) tk_stage2<true>(acc, tau, lim, tks, cap, k);
    else tk_stage2<false>(acc, tau, lim, tks, cap, k);
#pragma unroll
    for (int hf = 0; hf < 2; hf++) k[hf].n = __popc(k[hf].m0) + __popc(k[hf].m1);
    const bool ov = k[0].n + k[1].n > cap;
    k[0].s0 = 0, k[0].ds = 1, k[1].s0 = cap - 1, k[1].ds = -1;
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        k[hf].ov = ov && k[hf].n > 0;
        tk_reserve(ep, r + 8 * hf, k[hf]);
    }
}
/* One candidate (z, split column c) at the row's place pos. */
__device__ __forceinline__ void tk_put(const sph_sm90_epi &ep, sph_cuda_xtk *cand, int *slots,
                                       int ks1, int pos, float z, int64_t c) {
    if (pos < ep.tk_cap) {
        sph_cuda_xtk v;
        v.z = z;
        v.id = (int)(ep.col_g0 + c);
        cand[pos] = v;
    }
    atomicMax(slots + ((int)c & ks1), sph_tk_enc(z));
}
/* The thread's candidates from its registers (z still in acc), from place pos on. */
__device__ __forceinline__ void epi_topk_emit_regs(const float (&acc)[128], int hf, float tau,
                                                   const sph_sm90_epi &ep, int64_t rr,
                                                   int64_t cb, int lim, int pos) {
    sph_cuda_xtk *cand = (sph_cuda_xtk *)ep.tk_cand + rr * ep.tk_cap;
    int *slots = ep.tk_slots + rr * ep.tk_ks;
    const int ks1 = ep.tk_ks - 1;
#pragma unroll
    for (int j = 0; j < SM90_BN / 8; j++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const float z = acc[4 * j + 2 * hf + e];
            if (8 * j + e < lim && z >= tau) tk_put(ep, cand, slots, ks1, pos++, z, cb + 8 * j + e);
        }
}
/* ESTORE's first half, before the statistics loop overwrites z: the threads whose candidates
 * overflowed the stage emit from their registers (waits on the atomicAdd: rare). */
__device__ __forceinline__ void epi_topk_emit_over(const float (&acc)[128], int hf, float tau,
                                                   const sph_sm90_epi &ep, int64_t rr,
                                                   int64_t cb, int lim, const tk_part &k) {
    if (!__any_sync(0xffffffffu, k.over())) return;
    const int base = __shfl_sync(0xffffffffu, k.base, 0, 4);
    if (k.over()) epi_topk_emit_regs(acc, hf, tau, ep, rr, cb, lim, base + k.incl - k.n);
}
/* The slots back (this thread's quarter) only when the row's count crossed a multiple of
 * 2^tk_every_log2: reading them at every tile with candidates cost more than the candidates
 * it saved (run 30), and any read-back delays its whole warpgroup (run 31). */
__device__ __forceinline__ void tk_readback(const sph_sm90_epi &ep, int64_t rr, const int *slots,
                                            int base, float tau, const tk_part &k) {
    const int q4 = threadIdx.x & 3;
    const int sh = ep.tk_every_log2;
    const bool look = k.total > 0 && base >> sh != (base + k.total) >> sh && !(ep.tk_probe & 1);
    if (!__any_sync(0xffffffffu, look)) return;
    const int per = ep.tk_ks / 4;
    int mn = 0x7fffffff;
    if (look) {
        if (per >= 4) {
            const int4 *s4 = (const int4 *)(slots + q4 * per);
#pragma unroll 4
            for (int i = 0; i < per / 4; i++) {
                const int4 v = __ldcg(s4 + i);
                mn = min(mn, min(min(v.x, v.y), min(v.z, v.w)));
            }
        } else {
            const int2 v = __ldcg((const int2 *)(slots + q4 * per));
            mn = min(v.x, v.y);
        }
    }
    mn = min(mn, __shfl_xor_sync(0xffffffffu, mn, 1));
    mn = min(mn, __shfl_xor_sync(0xffffffffu, mn, 2));
    if (q4 == 0 && look && sph_tk_dec(mn) > tau) atomicMax(ep.tk_tau + rr, mn);
}

/* After the statistics loops (their exp latency hid the atomicAdd's), the staged candidates
 * to the row's buffer: the mask's set bits give each one's column, the stage its value, in
 * the order they were staged. v26 (2026-12-04; its SASS by scripts/sass_epi.sh): 16-17
 * instructions per candidate where v24's emission took 40-47 (the buffer's and the slots'
 * 64-bit addresses formed again in every iteration, the 64-bit mask's find-first-set and
 * clear, one atomicMax per candidate: the accumulators were live through it, for the register
 * path of the overflowing threads, so at 168 registers the compiler rematerialized). Now the
 * overflowing threads have emitted from their registers before the statistics loops
 * (epi_topk_emit_over, in both kernels), the accumulators are dead here (the statistics
 * kernels' stack: general 0, one-pass 8 bytes, against 0 and 40 before), the mask's two words
 * walk as two 32-bit loops, and the thread raises one slot per row half and tile, slot (4 tile
 * + quad lane) mod ks, to the largest of its candidates (taken in the loop: a maximum kept
 * across the statistics loops spilled the kernel's loop state). The slots' rule holds as
 * before: every column feeds at most one slot (a candidate emitted from the registers its
 * column's, a staged thread its chunk's maximum), so at least ks >= K distinct logits reach
 * the slots' minimum; a slot covers ~V / ks columns either way (where the split has >= 64 ks
 * columns; a narrower one leaves some slots at -inf longer: fewer raises, never a wrong list). */
__device__ __forceinline__ void st_global_v2(int2 *a, int x, int y) {
#ifdef SPH_CUDA_EMU
    a->x = x, a->y = y;
#else
    asm volatile("st.global.v2.b32 [%0], {%1, %2};\n" ::"l"(a), "r"(x), "r"(y) : "memory");
#endif
}
__device__ __forceinline__ void tk_emit_word(int2 *row, int last, int &at, uint32_t m, int p0,
                                             int id0, uint32_t &sa, uint32_t step, float &mx) {
    /* at: the candidate's place in the row's buffer, clamped to its last entry: a row whose
     * count passes the buffer is recomputed by the merge, which never reads its buffer (the
     * clamp keeps the loop free of a branch around the store) */
    for (; m; m &= m - 1, sa += step, at++) {
        const int p = p0 + __ffs(m) - 1; /* position p = 2 j + e: column 8 j + e */
        const float z = ld_shared_f32(sa);
        mx = fmaxf(mx, z);
        st_global_v2(row + min(at, last), __float_as_int(z), id0 + 8 * (p >> 1) + (p & 1));
    }
}
__device__ __forceinline__ void epi_topk_emit(const sph_sm90_epi &ep, int64_t rr, int64_t cb,
                                              int64_t tile_n, float tau, uint32_t tks,
                                              const tk_part &k) {
    const int q4 = threadIdx.x & 3;
    if (__all_sync(0xffffffffu, k.total == 0)) return;
    const int base = __shfl_sync(0xffffffffu, k.base, 0, 4);
    int *slots = ep.tk_slots + rr * ep.tk_ks;
    if (!k.over() && k.n > 0) {
        int2 *row = (int2 *)((sph_cuda_xtk *)ep.tk_cand + rr * ep.tk_cap);
        /* formed once: without this the compiler folds the row's offset into every
         * iteration's address (5 instructions instead of 1) */
#ifndef SPH_CUDA_EMU
        asm("" : "+l"(row));
#endif
        const int id0 = (int)(ep.col_g0 + cb);
        int at = base + k.incl - k.n;
        const uint32_t step = (uint32_t)k.ds * 1024u;
        uint32_t sa = tks + (uint32_t)k.s0 * 1024u;
        float mx = -INFINITY;
        tk_emit_word(row, ep.tk_cap - 1, at, k.m0, 0, id0, sa, step, mx);
        tk_emit_word(row, ep.tk_cap - 1, at, k.m1, 32, id0, sa, step, mx);
        atomicMax(slots + ((4 * (int)tile_n + q4) & (ep.tk_ks - 1)), sph_tk_enc(mx));
    }
    tk_readback(ep, rr, slots, base, tau, k);
}

/* The rows' statistics loops (the transform and the maxima done), records and staged E; with
 * top-k, a thread whose candidates the stage could not hold emits them from its registers
 * first (the one-pass kernel's loop overwrites z with p; the general kernel's emission after
 * the loops then runs without the accumulators live). */
template <int ESTORE, bool Q2, bool TK, bool TGT = true>
__device__ __forceinline__ void epi_stats_rows(float (&acc)[128], const sph_sm90_epi &ep,
                                               const epi_row_args (&ra)[2], int64_t r,
                                               int64_t cb, int64_t tile_n, int64_t n_n,
                                               int64_t R, int lim, const float (&mxs)[2],
                                               const tk_part (&tk)[2]) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int64_t rr = r + 8 * hf;
        const int64_t tg = ra[hf].t - ep.col_g0 - cb;
        const int tl = ra[hf].t >= 0 && tg >= 0 && tg < SM90_BN ? (int)tg : -1;
        const float mx = mxs[hf];
        if (TK) epi_topk_emit_over(acc, hf, ra[hf].tau, ep, rr, cb, lim, tk[hf]);
        /* p = 2^(z log2e - mx log2e): one FFMA before the exponential (v29) */
        const float mxl = mx * SPH_LOG2E;
        float s = 0.f, b = 0.f, sz = 0.f, zt = 0.f, q = 0.f;
#pragma unroll
        for (int j = 0; j < SM90_BN / 8; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                float &v = acc[4 * j + 2 * hf + e];
                const float z = v;
                float p = 0.f;
                if (8 * j + e < lim) {
                    p = fex2(fmaf(z, SPH_LOG2E, -mxl));
                    s += p;
                    b = fmaf(p, z, b);
                    sz += z;
                    if (Q2) q = fmaf(p, p, q);
                }
                if (TGT && 8 * j + e == tl) zt = z;
                if (ESTORE) v = p; /* z is not needed past this point */
            }
#pragma unroll
        for (int o = 1; o <= 2; o <<= 1) {
            s += __shfl_xor_sync(0xffffffffu, s, o);
            b += __shfl_xor_sync(0xffffffffu, b, o);
            sz += __shfl_xor_sync(0xffffffffu, sz, o);
            zt += __shfl_xor_sync(0xffffffffu, zt, o);
            if (Q2) q += __shfl_xor_sync(0xffffffffu, q, o);
        }
        if ((lane & 3) == 0 && rr < R) {
            float *rec = ep.tile_recs + (rr * n_n + tile_n) * SPH_PARTIAL_FIELDS;
            rec[0] = mx, rec[1] = s, rec[2] = b, rec[3] = zt, rec[4] = sz;
            if (Q2) ep.tile_q[rr * n_n + tile_n] = q;
        }
        if (ESTORE == 2) {
            __half *row = (__half *)ep.E + rr * ep.ldE + (cb - 2 * (lane & 3));
#pragma unroll
            for (int m = 0; m < SM90_BN / 32; m++) {
                uint32_t w[4];
#pragma unroll
                for (int q = 0; q < 4; q++)
                    w[q] = pack2<__half>(acc[4 * (4 * m + q) + 2 * hf],
                                         acc[4 * (4 * m + q) + 2 * hf + 1]);
                quad_store16(row, m, w, lim + 2 * (lane & 3), rr < R);
            }
        } else if (ESTORE == 1 && rr < R) {
            __half *row = (__half *)ep.E + rr * ep.ldE + cb;
#pragma unroll
            for (int j = 0; j < SM90_BN / 8; j++) {
                if (8 * j >= lim) continue;
                /* a pair's second column past the split holds 0 and lies inside the row's
                 * 8-aligned stride */
                *(__half2 *)(row + 8 * j) =
                    __floats2half2_rn(acc[4 * j + 2 * hf], acc[4 * j + 2 * hf + 1]);
            }
        }
    }
}

/* Row statistics of the tile: each row's 256 columns live in the 4 threads of a quad, 64
 * each. Max first (quad shuffles), then sum exp(z - m), sum exp(z - m) z and sum z over the
 * columns in a fixed order, quad-summed in a fixed order: one record per row and tile. The
 * accumulators are overwritten with z. Column tests are 32-bit against lim = Vs - cb; a
 * second copy for whole tiles has none (FULL, v27: 1616 SASS instructions per tile and thread
 * against 1960 plain, 6608 against 7984 with top-k; the one-pass kernel's, v28, only without
 * softcap: with softcap's too its stack went 8 -> 32 bytes).
 * ESTORE (one-pass forward, SPH_SM90_EPI_E): E = exp(z - m) goes to ep.E as f16 as well,
 * 0 in the columns past the split; 1 = 4-byte pairs, 2 = 16-byte stores (quad_store16).
 * Q2 (sum_p2 asked for): q = sum exp(2 (z - m)) = sum p^2 of the same p, to ep.tile_q. */
template <bool CAP, int ESTORE, bool Q2, bool TK, bool FULL, bool TGT = true>
__device__ __forceinline__ void epi_stats_t(float (&acc)[128], const sph_sm90_epi &ep,
                                            const epi_row_args (&ra)[2], int64_t r, int64_t cb,
                                            int64_t tile_n, int64_t n_n, int64_t R, int64_t Vs,
                                            uint32_t tks) {
    /* FULL: the tile's 256 columns all lie in the split, so no column test is compiled */
    const int lim = FULL || Vs - cb >= SM90_BN ? SM90_BN : (int)(Vs - cb);
    /* the transform and each row's maximum, then (top-k) both rows' candidates counted and
     * staged and their atomicAdds issued, so that both statistics loops hide the atomics'
     * latency before the candidates are stored (v22b) */
    float mxs[2]; /* each row's maximum over the tile */
    tk_part tk[2];
    /* v22's count, a half at a time with the second half's stage after the first's, or
     * (SPH_TEST_TOPK_VARIANT bit 0) v25's, both halves in one loop (built 2026-12-02, not yet
     * run); run 34 call 1: v24's pairs, spill-free, were no faster than v22's (7.65 against
     * 7.67 ms at A 16K; removed) */
    const bool seq = TK && !(ep.tk_variant & 1);
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        /* two partial maxima (even and odd columns): two dependent chains of 32 instead of
         * one of 64 (exact: max is order-free); over groups of 4 j as in tk_stage (the same
         * SASS as v30's default) */
        float mx0 = -INFINITY, mx1 = -INFINITY;
        const float it = ra[hf].it;
#pragma unroll
        for (int g = 0; g < SM90_BN / 32; g++) {
#pragma unroll
            for (int jj = 0; jj < 4; jj++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int j = 4 * g + jj;
                    float &v = acc[4 * j + 2 * hf + e];
                    v = (CAP ? ep.cap * tanhf(v * ep.inv_cap) : v) * it;
                    if (8 * j + e < lim) {
                        float &m = e ? mx1 : mx0;
                        m = fmaxf(m, v);
                    }
                }
        }
        float mx = fmaxf(mx0, mx1);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mxs[hf] = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        if (seq)
            epi_topk_count(acc, hf, ra[hf].tau, ep, r + 8 * hf, R, lim, tks,
                           hf ? min(tk[0].n, SM90_TK_STAGE) : 0, tk[hf]);
    }
    if (TK && !seq) {
        /* rows past R: a NaN threshold, which no logit reaches */
        const float tau[2] = {r < R ? ra[0].tau : NAN, r + 8 < R ? ra[1].tau : NAN};
        epi_topk_count2(acc, tau, ep, r, lim, tks, tk);
    }
    epi_stats_rows<ESTORE, Q2, TK, TGT>(acc, ep, ra, r, cb, tile_n, n_n, R, lim, mxs, tk);
    if (TK) {
#pragma unroll
        for (int hf = 0; hf < 2; hf++)
            epi_topk_emit(ep, r + 8 * hf, cb, tile_n, ra[hf].tau, tks, tk[hf]);
    }
}

template <int ESTORE, bool Q2, bool TK>
__device__ __forceinline__ void epi_stats_c(float (&acc)[128], const sph_sm90_epi &ep,
                                            const epi_row_args (&ra)[2], int64_t r, int64_t cb,
                                            int64_t tile_n, int64_t n_n, int64_t R, int64_t Vs,
                                            uint32_t tks) {
    /* a whole tile (the split's last one excepted): warp-uniform, as its shuffles need. The
     * one-pass kernel (ESTORE) has the whole-tile copy without softcap only: with it too, its
     * stack went 8 -> 32 bytes (v28; without, 8 as before) */
    constexpr bool full_cap = !ESTORE;
    const bool full = Vs - (cb - 2 * (threadIdx.x & 3)) >= SM90_BN;
#define SPH_EPI_STATS_T(CAP, FULL)                                                            \
    epi_stats_t<CAP, ESTORE, Q2, TK, FULL>(acc, ep, ra, r, cb, tile_n, n_n, R, Vs, tks)
    if (ep.cap > 0.f) {
        if (full_cap && full) SPH_EPI_STATS_T(true, full_cap);
        else SPH_EPI_STATS_T(true, false);
    } else if (full) {
        /* v29: a copy without the target's compare for the warps none of whose 16 rows has
         * its target in the tile (~14 of 15 warp-tiles at V 62080) */
        if (epi_warp_has_target(ep, ra, cb)) SPH_EPI_STATS_T(false, true);
        else epi_stats_t<false, ESTORE, Q2, TK, true, false>(acc, ep, ra, r, cb, tile_n, n_n, R,
                                                             Vs, tks);
    } else {
        SPH_EPI_STATS_T(false, false);
    }
#undef SPH_EPI_STATS_T
}
template <int ESTORE, bool TK>
__device__ __forceinline__ void epi_stats_q(float (&acc)[128], const sph_sm90_epi &ep,
                                            const epi_row_args (&ra)[2], int64_t r, int64_t cb,
                                            int64_t tile_n, int64_t n_n, int64_t R, int64_t Vs,
                                            uint32_t tks) {
    if (ep.tile_q) epi_stats_c<ESTORE, true, TK>(acc, ep, ra, r, cb, tile_n, n_n, R, Vs, tks);
    else epi_stats_c<ESTORE, false, TK>(acc, ep, ra, r, cb, tile_n, n_n, R, Vs, tks);
}
template <int ESTORE>
__device__ __forceinline__ void epi_stats_k(float (&acc)[128], const sph_sm90_epi &ep,
                                            const epi_row_args (&ra)[2], int64_t r, int64_t cb,
                                            int64_t tile_n, int64_t n_n, int64_t R, int64_t Vs,
                                            uint32_t tks) {
    if (ep.tk_cand) epi_stats_q<ESTORE, true>(acc, ep, ra, r, cb, tile_n, n_n, R, Vs, tks);
    else epi_stats_q<ESTORE, false>(acc, ep, ra, r, cb, tile_n, n_n, R, Vs, tks);
}

/* The general forward's epilogue (statistics) and the one-pass forward's (statistics and E),
 * each with or without sum_p2's q and the top-k's candidates. */
__device__ __forceinline__ void epi_stats(float (&acc)[128], const sph_sm90_epi &ep,
                                          const epi_row_args (&ra)[2], int64_t r, int64_t cb,
                                          int64_t tile_n, int64_t n_n, int64_t R, int64_t Vs,
                                          uint32_t tks) {
    epi_stats_k<0>(acc, ep, ra, r, cb, tile_n, n_n, R, Vs, tks);
}
__device__ __forceinline__ void epi_stats_e(float (&acc)[128], const sph_sm90_epi &ep,
                                            const epi_row_args (&ra)[2], int64_t r, int64_t cb,
                                            int64_t tile_n, int64_t n_n, int64_t R, int64_t Vs,
                                            uint32_t tks) {
    if (ep.store16) epi_stats_k<2>(acc, ep, ra, r, cb, tile_n, n_n, R, Vs, tks);
    else epi_stats_k<1>(acc, ep, ra, r, cb, tile_n, n_n, R, Vs, tks);
}

template <typename T> __device__ __forceinline__ void store_pair(T *dst, float a, float b);
template <> __device__ __forceinline__ void store_pair(__nv_bfloat16 *dst, float a, float b) {
    *(__nv_bfloat162 *)dst = __floats2bfloat162_rn(a, b);
}
template <> __device__ __forceinline__ void store_pair(__half *dst, float a, float b) {
    *(__half2 *)dst = __floats2half2_rn(a, b);
}

/* du of head.cu's head_dlogits_kernel, from the logits in registers:
 * dz = g (delta - p) + e p (mu - z) + gl p + gm / V, du = dz / T (1 - tanh^2(u / cap)).
 * S16: 16-byte stores through quad_transpose (every lane runs the shuffles; rows past R only
 * skip the store). */
template <typename T, bool CAP>
__device__ __forceinline__ float epi_du(float u, const sph_sm90_epi &ep, float it, float lse,
                                        float cp, float eg, float g, float gmV, bool at_t,
                                        bool active) {
    const float th = CAP ? tanhf(u * ep.inv_cap) : 0.f;
    const float z = (CAP ? ep.cap * th : u) * it;
    const float p = fexp(z - lse);
    float dz = fmaf(p, fmaf(-eg, z, cp), gmV);
    if (at_t) dz += g;
    float du = dz * it;
    if (CAP) du *= 1.f - th * th;
    return active ? du : 0.f; /* inactive rows: exactly 0 */
}

template <typename T, bool CAP, bool S16, bool FULL = false, bool TGT = true>
__device__ __forceinline__ void epi_dlogits_t(const float (&acc)[128], const sph_sm90_epi &ep,
                                              const epi_row_args (&ra)[2], int64_t r, int64_t cb,
                                              int64_t R, int64_t Vs, int vec2) {
    /* FULL: the tile's 256 columns all lie in the split, so no column test is compiled */
    const int lim = FULL || Vs - cb >= SM90_BN ? SM90_BN : (int)(Vs - cb);
    const int q4 = threadIdx.x & 3;
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int64_t rr = r + 8 * hf;
        if (!S16 && rr >= R) continue;
        const bool active = ra[hf].active;
        const float lse = ra[hf].lse, mu = ra[hf].mu, g = ra[hf].g, eg = ra[hf].eg;
        const float gl = ra[hf].gl, gmV = ra[hf].gmV, it = ra[hf].it;
        const int64_t t = ra[hf].t;
        const int64_t tg = t - ep.col_g0 - cb;
        const int tl = t >= 0 && tg >= 0 && tg < SM90_BN ? (int)tg : -1;
        /* dz = p (gl - g + e (mu - z)) + gmV (+ g at the target) */
        const float cp = gl - g + eg * mu;
        if (S16) {
            /* v29, whole tiles without softcap (FOLD): du = dz / T_i with z = u / T_i folded
             * into per-row coefficients, so that a logit costs two FFMA, the exponential and a
             * third FFMA: p = 2^(u it log2e - lse log2e), du = p (it cp - eg it^2 u) + it gmV
             * (+ it g at the target); inactive rows zeroed on the packed words (the quad
             * shares the row) */
            constexpr bool FOLD = FULL && !CAP;
            const float itl = it * SPH_LOG2E, lsl = lse * SPH_LOG2E;
            const float ca = it * cp, cu = -eg * it * it, c0 = it * gmV, ct = it * g;
            T *row = (T *)ep.D + rr * ep.ldD + (cb - 2 * q4);
#pragma unroll
            for (int m = 0; m < SM90_BN / 32; m++) {
                uint32_t w[4];
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    const int j = 4 * m + q;
                    float o[2];
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const float u = acc[4 * j + 2 * hf + e];
                        if (FOLD) {
                            o[e] = fmaf(fex2(fmaf(u, itl, -lsl)), fmaf(cu, u, ca), c0);
                            if (TGT && 8 * j + e == tl) o[e] += ct;
                        } else {
                            o[e] = 8 * j + e < lim ? epi_du<T, CAP>(u, ep, it, lse, cp, eg, g,
                                                                    gmV, 8 * j + e == tl, active)
                                                   : 0.f;
                        }
                    }
                    w[q] = !FOLD || active ? pack2<T>(o[0], o[1]) : 0u;
                }
                quad_store16(row, m, w, lim + 2 * q4, rr < R);
            }
            continue;
        }
        T *row = (T *)ep.D + rr * ep.ldD + cb;
#pragma unroll
        for (int j = 0; j < SM90_BN / 8; j++) {
            float o[2];
#pragma unroll
            for (int e = 0; e < 2; e++)
                o[e] = epi_du<T, CAP>(acc[4 * j + 2 * hf + e], ep, it, lse, cp, eg, g, gmV,
                                      8 * j + e == tl, active);
            const int cj = 8 * j;
            if (cj >= lim) continue;
            if (cj + 1 < lim && vec2) {
                store_pair<T>(row + cj, o[0], o[1]);
            } else {
                row[cj] = from_f32<T>(o[0]);
                if (cj + 1 < lim) row[cj + 1] = from_f32<T>(o[1]);
            }
        }
    }
}

template <typename T>
__device__ __forceinline__ void epi_dlogits(const float (&acc)[128], const sph_sm90_epi &ep,
                                            const epi_row_args (&ra)[2], int64_t r, int64_t cb,
                                            int64_t R, int64_t Vs, int vec2) {
    if (ep.store16) {
        /* v29: a whole tile (the split's last one excepted; warp-uniform) without column
         * tests, as the statistics epilogue's (v27), with the per-logit math folded into
         * per-row coefficients, and a copy without the target's compare for the warps none of
         * whose 16 rows has its target in the tile (all but ~1 in 15 at V 62080): SASS per
         * tile and thread (scripts/sass_epi.sh) 3032 -> 1664 (target) / 1368 (none); without
         * softcap only (v29's first form, with softcap's copy too, had 24 bytes of stack) */
        const bool full = Vs - (cb - 2 * (threadIdx.x & 3)) >= SM90_BN;
        if (ep.cap > 0.f) {
            epi_dlogits_t<T, true, true>(acc, ep, ra, r, cb, R, Vs, vec2);
        } else {
            if (full) {
                if (epi_warp_has_target(ep, ra, cb))
                    epi_dlogits_t<T, false, true, true>(acc, ep, ra, r, cb, R, Vs, vec2);
                else epi_dlogits_t<T, false, true, true, false>(acc, ep, ra, r, cb, R, Vs, vec2);
            }
            else epi_dlogits_t<T, false, true>(acc, ep, ra, r, cb, R, Vs, vec2);
        }
    } else {
        if (ep.cap > 0.f) epi_dlogits_t<T, true, false>(acc, ep, ra, r, cb, R, Vs, vec2);
        else epi_dlogits_t<T, false, false>(acc, ep, ra, r, cb, R, Vs, vec2);
    }
}

/* recs[r] = fixed-order merge of the row's tile records: lane l takes tiles l, l + 32, ...
 * in order, then a butterfly over the warp; one warp per row. With tq (sum_p2), the tiles'
 * (m, q) the same way into mq[r], after mq[r]'s own when merge. */
__global__ void sm90_reduce_tiles_kernel(const float *__restrict__ tr,
                                         const float *__restrict__ tq, int64_t n_tiles,
                                         int64_t R, float *__restrict__ recs,
                                         float2 *__restrict__ mq, int merge) {
    const int64_t r = (int64_t)blockIdx.x * 8 + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (r >= R) return; /* the whole warp: r is warp-uniform */
    float m = -INFINITY, s = 0.f, b = 0.f, zt = 0.f, sz = 0.f, qm = -INFINITY, qq = 0.f;
    for (int64_t k = lane; k < n_tiles; k += 32) {
        const float *q = tr + (r * n_tiles + k) * SPH_PARTIAL_FIELDS;
        merge3(m, s, b, q[0], q[1], q[2]);
        zt += q[3];
        sz += q[4];
        if (tq) mq_merge(qm, qq, q[0], tq[r * n_tiles + k]);
    }
    for (int o = 1; o < 32; o <<= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
        const float s2 = __shfl_xor_sync(0xffffffffu, s, o);
        const float b2 = __shfl_xor_sync(0xffffffffu, b, o);
        zt += __shfl_xor_sync(0xffffffffu, zt, o);
        sz += __shfl_xor_sync(0xffffffffu, sz, o);
        merge3(m, s, b, m2, s2, b2);
        if (tq) {
            const float qm2 = __shfl_xor_sync(0xffffffffu, qm, o);
            const float qq2 = __shfl_xor_sync(0xffffffffu, qq, o);
            mq_merge(qm, qq, qm2, qq2);
        }
    }
    if (lane != 0) return;
    record_store(recs + r * SPH_PARTIAL_FIELDS, m, s, b, zt, sz, merge);
    if (!tq) return;
    if (merge) {
        float pm = mq[r].x, pq = mq[r].y;
        mq_merge(pm, pq, qm, qq);
        qm = pm, qq = pq;
    }
    mq[r] = make_float2(qm, qq);
}

// ---- the kernel -------------------------------------------------------------------------

/* Tile k of the grouped raster: consecutive tiles walk GROUP_M row tiles down one column of W
 * tiles, then the next column, so the tiles in flight at once (one or two per SM) touch ~2048
 * rows of h and ~8 W tiles (~33 MB at H = 4096, inside the 50 MB L2) instead of one h tile
 * and every W tile. Which block computes a tile changes nothing in how the tile is computed. */
template <int GROUP_M>
__device__ __forceinline__ void sm90_tile(int64_t k, int64_t n_m, int64_t n_n, int64_t &tile_m,
                                          int64_t &tile_n) {
    const int64_t in_group = GROUP_M * n_n;
    const int64_t first_m = k / in_group * GROUP_M;
    const int64_t size_m = n_m - first_m < GROUP_M ? n_m - first_m : GROUP_M;
    tile_m = first_m + (k % in_group) % size_m;
    tile_n = (k % in_group) / size_m;
}

#ifdef SPH_SM90_DEVICE
/* Named barriers 1 and 2 (0 is __syncthreads) order the ping-pong main loops: the warpgroup
 * that finished issuing tile j's main loop arrives, the one that runs tile j + 1 waits. */
__device__ __forceinline__ void order_arrive(int id) {
    asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory");
}
__device__ __forceinline__ void order_wait(int id) {
    asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory");
}
/* SPH_SM90_EPI_NONE: keeps the accumulators live (ptxas drops a wgmma whose result is never
 * read: the first probe timed the main loop above the tensor cores' peak) at the cost of a
 * sum; the store never happens on finite data. */
__device__ __forceinline__ void epi_none(const float (&acc)[128], const sph_sm90_epi &ep) {
    float x = 0.f;
#pragma unroll
    for (int i = 0; i < 128; i++) x += acc[i];
    if (x == 1e38f && ep.L) ep.L[0] = x;
}
#endif

/* Persistent: grid min(#tiles, #SMs) blocks of 384 threads, sm90_cfg<PP>::SMEM bytes of
 * dynamic shared memory; block b computes tiles b, b + gridDim.x, ... The producer streams the
 * k tiles of its tiles back to back through the ring (stage and phase from one running k
 * counter), so while the consumers run a tile's epilogue the next tile's first stages are
 * already loading. Cooperative (PP false): both consumer warpgroups take every tile, 64 rows
 * each. Ping-pong (PP true): the block's j-th tile belongs to consumer warpgroup j % 2, whose
 * k tiles are ring slots j nk .. j nk + nk - 1; before its main loop it waits until the other
 * warpgroup has issued tile j - 1's. That order also keeps the mbarrier parities exact: when
 * a warpgroup waits for a slot's fill, every earlier fill of that slot has been waited for.
 * map_h: (R rows, H) of the chunk's hidden rows, boxes BM x 64; map_w: (Vs rows, H) of the
 * split's weight rows, boxes 256 x 64; zero fill outside. vec2: paired stores allowed (L:
 * 8-byte float2, D: 4-byte half2). */
template <typename T, int EPI, bool PP>
__global__ void __launch_bounds__(SM90_THREADS, 1)
    head_logits_sm90_kernel(const __grid_constant__ CUtensorMap map_h,
                            const __grid_constant__ CUtensorMap map_w, const sph_sm90_epi ep,
                            int64_t R, int64_t Vs, int64_t H, int vec2) {
#ifdef SPH_SM90_DEVICE
    typedef sm90_cfg<PP> C;
    extern __shared__ uint8_t smem_raw[];
    const uint32_t base = ((uint32_t)__cvta_generic_to_shared(smem_raw) + 1023u) & ~1023u;
    const uint32_t bars = base + C::STAGES * C::STAGE_BYTES;
#define SM90_FULL(s) (bars + 8u * (uint32_t)(s))
#define SM90_EMPTY(s) (bars + 8u * (uint32_t)(C::STAGES + (s)))
    const int nk = (int)((H + SM90_BK - 1) / SM90_BK);
    const int wg = threadIdx.x / 128;
    const int64_t n_m = (R + C::BM - 1) / C::BM, n_n = (Vs + SM90_BN - 1) / SM90_BN;
    const int64_t n_tiles = n_m * n_n;
    if (threadIdx.x == 0) {
        for (int s = 0; s < C::STAGES; s++) {
            mbar_init(SM90_FULL(s), 1); /* the producer's expect_tx arrival + the bytes */
            mbar_init(SM90_EMPTY(s), C::CONSUMERS); /* each consumer thread, after its wgmma */
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads(); /* barriers initialised before anyone waits on or arrives at them */

    if (wg == 0) {
        /* producer: one thread streams the k tiles, the warpgroup's registers go to the
         * consumers (setmaxnreg is warpgroup-wide, so all 128 threads execute it) */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if (threadIdx.x == 0) {
            uint32_t it = 0; /* k tiles issued by this block so far */
            for (int64_t k = blockIdx.x; k < n_tiles; k += gridDim.x) {
                int64_t tile_m, tile_n;
                sm90_tile<C::GROUP_M>(k, n_m, n_n, tile_m, tile_n);
                const int32_t row0 = (int32_t)(tile_m * C::BM);
                const int32_t col0 = (int32_t)(tile_n * SM90_BN);
                for (int kt = 0; kt < nk; kt++, it++) {
                    const uint32_t s = it % C::STAGES, ph = (it / C::STAGES) & 1u;
                    mbar_wait(SM90_EMPTY(s), ph ^ 1u); /* the consumers released this stage */
                    mbar_expect_tx(SM90_FULL(s), C::STAGE_BYTES); /* zero-filled bytes count */
                    const uint32_t a = base + s * C::STAGE_BYTES;
                    tma_load_2d(a, &map_h, SM90_FULL(s), kt * SM90_BK, row0);
                    tma_load_2d(a + C::A_BYTES, &map_w, SM90_FULL(s), kt * SM90_BK, col0);
                }
            }
        }
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
    const int c = wg - 1; /* cooperative: rows [64 c, 64 c + 64) of the tile; ping-pong: the
                             block's tiles j with j % 2 == c */
    const int t = threadIdx.x % 128, lane = t % 32;
    /* this thread's column of the top-k's stage (launched with SMEM_TK where it is used) */
    const uint32_t tks = bars + 16u * C::STAGES + 4u * (uint32_t)(threadIdx.x - 128);
    const int64_t step = PP ? 2 * (int64_t)gridDim.x : gridDim.x;
    int64_t j = PP ? c : 0; /* the block's tile index */
    for (int64_t k = blockIdx.x + j * gridDim.x; k < n_tiles; k += step, j += PP ? 2 : 1) {
        int64_t tile_m, tile_n;
        sm90_tile<C::GROUP_M>(k, n_m, n_n, tile_m, tile_n);
        const int64_t r = tile_m * C::BM + (PP ? 0 : c * 64) + (t / 32) * 16 + lane / 4;
        const int64_t cb = tile_n * SM90_BN + 2 * (lane % 4);
        epi_row_args ra[2];
        if (EPI & (SPH_SM90_EPI_STATS | SPH_SM90_EPI_DLOGITS)) {
            epi_row_load<EPI>(ep, r, R, ra[0]);
            epi_row_load<EPI>(ep, r + 8, R, ra[1]);
        }
        float acc[128];
#pragma unroll
        for (int i = 0; i < 128; i++) acc[i] = 0.f;
        acc_fence(acc);
        uint32_t it = (uint32_t)(j * nk); /* the producer's count at this tile's first k tile */
        if (PP && j > 0) order_wait(1 + (1 - c)); /* tile j - 1's main loop issued */
        for (int kt = 0; kt < nk; kt++, it++) {
            const uint32_t s = it % C::STAGES;
            mbar_wait(SM90_FULL(s), (it / C::STAGES) & 1u); /* TMA bytes landed */
            const uint32_t a = base + s * C::STAGE_BYTES + (PP ? 0u : (uint32_t)c * (64 * 128));
            const uint64_t da = sw128_desc(a),
                           db = sw128_desc(base + s * C::STAGE_BYTES + C::A_BYTES);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < SM90_BK / 16; kk++) /* k ascending: the fixed order */
                wgmma_op<T>::run(acc, da + 2 * kk, db + 2 * kk);
            wgmma_commit();
            /* at most this k tile's group in flight: k tile it - 1's reads are done */
            wgmma_wait<1>();
            acc_fence(acc);
            if (kt > 0) mbar_arrive(SM90_EMPTY((it - 1) % C::STAGES));
        }
        /* the other warpgroup's next tile may start (when there is one) */
        if (PP && k + gridDim.x < n_tiles) order_arrive(1 + c);
        if (EPI & SPH_SM90_EPI_STATS) { /* under the last k tile's wgmma */
            ra[0].tau = epi_row_tau(ep, r, R);
            ra[1].tau = epi_row_tau(ep, r + 8, R);
        }
        wgmma_wait<0>();
        acc_fence(acc);
        mbar_arrive(SM90_EMPTY((it - 1) % C::STAGES)); /* the tile's last stage */

        if (EPI == SPH_SM90_EPI_NONE) epi_none(acc, ep);
        if (EPI & SPH_SM90_EPI_L) epi_store_logits(acc, ep, r, cb, R, Vs, vec2);
        if (EPI == SPH_SM90_EPI_STATS) epi_stats(acc, ep, ra, r, cb, tile_n, n_n, R, Vs, tks);
        if (EPI == (SPH_SM90_EPI_STATS | SPH_SM90_EPI_E))
            epi_stats_e(acc, ep, ra, r, cb, tile_n, n_n, R, Vs, tks);
        if (EPI & SPH_SM90_EPI_DLOGITS) epi_dlogits<T>(acc, ep, ra, r, cb, R, Vs, vec2);
    }
#undef SM90_FULL
#undef SM90_EMPTY
#elif defined(__CUDA_ARCH__)
    /* sm_80 pass: never launched (the launcher checks the loaded binary is sm_90a) */
    (void)map_h, (void)map_w, (void)ep, (void)R, (void)Vs, (void)H, (void)vec2;
    __trap();
#endif
}

// ---- host side --------------------------------------------------------------------------
/* SPH_SM90_DEVICE_ONLY: the device code alone (bench/cuda/sass_epi.cu counts the epilogues'
 * SASS without compiling every kernel the host side instantiates) */
#ifndef SPH_SM90_DEVICE_ONLY

typedef CUresult (*encode_tiled_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
                                    const cuuint64_t *, const cuuint64_t *, const cuuint32_t *,
                                    const cuuint32_t *, CUtensorMapInterleave,
                                    CUtensorMapSwizzle, CUtensorMapL2promotion,
                                    CUtensorMapFloatOOBfill);

/* The driver's tensor-map encoder, looked up once per process (NULL: driver too old). */
static encode_tiled_fn encoder(void) {
    static const encode_tiled_fn fn = []() -> encode_tiled_fn {
        void *f = NULL;
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000,
                                             cudaEnableDefault, &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess) {
            (void)cudaGetLastError();
            return NULL;
        }
        return (encode_tiled_fn)f;
    }();
    return fn;
}

#define SM90_MAX_DEVICES 64
/* Per device: 0 unknown, 1 the sm_90a kernels load and get their shared memory, 2 no. */
static std::atomic<int> g_dev_ok[SM90_MAX_DEVICES];

template <typename T, int EPI, bool PP> static int kernel_ready1(void) {
    cudaFuncAttributes fa;
    if (cudaFuncGetAttributes(&fa, head_logits_sm90_kernel<T, EPI, PP>) != cudaSuccess) return 0;
    /* the sm_90a cubin loads only on an sm_90 device; anything else means the sm_80 stub */
    if (fa.binaryVersion != 90) return 0;
    return cudaFuncSetAttribute(head_logits_sm90_kernel<T, EPI, PP>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (EPI & SPH_SM90_EPI_STATS) ? sm90_cfg<PP>::SMEM_TK
                                                           : sm90_cfg<PP>::SMEM) == cudaSuccess;
}

/* Every epilogue and schedule variant the launcher may pick. */
template <typename T, bool PP> static int kernel_ready_pp(void) {
    return kernel_ready1<T, SPH_SM90_EPI_L, PP>() && kernel_ready1<T, SPH_SM90_EPI_STATS, PP>() &&
           kernel_ready1<T, SPH_SM90_EPI_STATS | SPH_SM90_EPI_E, PP>() &&
           kernel_ready1<T, SPH_SM90_EPI_DLOGITS, PP>() &&
           kernel_ready1<T, SPH_SM90_EPI_NONE, PP>();
}
template <typename T> static int kernel_ready(void) {
    return kernel_ready_pp<T, false>() && kernel_ready_pp<T, true>();
}

extern "C" int sph_cuda_sm90_available(void) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= SM90_MAX_DEVICES) {
        (void)cudaGetLastError();
        return 0;
    }
    int state = g_dev_ok[dev].load();
    if (state == 0) {
        int major = 0, minor = 0, optin = 0;
        int ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) ==
                     cudaSuccess &&
                 cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) ==
                     cudaSuccess &&
                 cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) ==
                     cudaSuccess;
        ok = ok && major == 9 && minor == 0 && optin >= SM90_SMEM_MAX && encoder() != NULL &&
             kernel_ready<__nv_bfloat16>() && kernel_ready<__half>();
        (void)cudaGetLastError(); /* a failed probe is an answer, not a pending error */
        state = ok ? 1 : 2;
        g_dev_ok[dev].store(state);
    }
    return state == 1;
}

extern "C" int sph_cuda_sm90_operands_ok(sph_dtype dt, const void *h, int64_t ld_h,
                                         const void *w, int64_t ld_w, int64_t H) {
    if (dt.bits != 16 || (dt.code != SPH_DTYPE_BFLOAT && dt.code != SPH_DTYPE_FLOAT)) return 0;
    /* TMA: 16-byte aligned global base, row strides a multiple of 16 bytes; H % 8 so that a
     * gathered chunk (row stride H) qualifies exactly when the user's rows do */
    if (H <= 0 || H % 8 || H > INT32_MAX || ld_h % 8 || ld_w % 8) return 0;
    return (uintptr_t)h % 16 == 0 && (uintptr_t)w % 16 == 0;
}

extern "C" int sph_cuda_logits_sm90_usable(sph_dtype dt, const void *h, int64_t ld_h,
                                           const void *w, int64_t ld_w, int64_t H) {
    return sph_cuda_sm90_operands_ok(dt, h, ld_h, w, ld_w, H) && sph_cuda_sm90_available();
}

/* A 2-D map over rows x H (row stride ld elements) with boxes of box_rows x 64. */
static sph_status make_map(CUtensorMap *map, sph_dtype dt, const void *base, int64_t rows,
                           int64_t ld, int64_t H, uint32_t box_rows) {
    encode_tiled_fn enc = encoder();
    if (!enc) return sph_err(SPH_ERR_INTERNAL, "logits_sm90: no cuTensorMapEncodeTiled");
    const cuuint64_t dims[2] = {(cuuint64_t)H, (cuuint64_t)rows};
    const cuuint64_t strides[1] = {(cuuint64_t)ld * 2}; /* bytes, dimension 1 */
    const cuuint32_t box[2] = {SM90_BK, box_rows};
    const cuuint32_t estr[2] = {1, 1};
    CUresult r = enc(map,
                     dt.code == SPH_DTYPE_BFLOAT ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                     2, (void *)base, dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                     CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                     CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE /* out of bounds reads as zero */);
    if (r != CUDA_SUCCESS)
        return sph_err(SPH_ERR_INTERNAL,
                       "logits_sm90: cuTensorMapEncodeTiled(rows=%lld, H=%lld, ld=%lld) failed: "
                       "CUresult %d",
                       (long long)rows, (long long)H, (long long)ld, (int)r);
    return SPH_OK;
}

/* The schedule for hidden size H: ping-pong up to SM90_PINGPONG_MAX_H, cooperative above (a
 * short main loop at small H gains from hiding its epilogue; at large H the W tile loaded per
 * 64 rows instead of 128 doubles the L2 -> shared traffic; the measurement is in
 * notes/cuda-notes.md, "The layout's rules").
 * A context's SPH_CUDA_FLAG_PINGPONG / _COOPERATIVE forces one (epi.schedule). H alone
 * decides, never the batch: the two give bitwise equal logits anyway (test_pingpong). */
#define SM90_PINGPONG_MAX_H 3072
static int pingpong_on(int64_t H, int schedule) {
    if (schedule == SPH_SM90_SCHED_COOPERATIVE) return 0;
    if (schedule == SPH_SM90_SCHED_PINGPONG) return 1;
    return H <= SM90_PINGPONG_MAX_H;
}

template <typename T, bool PP>
static void launch_pp(int mode, dim3 grid, cudaStream_t stream, const CUtensorMap &mh,
                      const CUtensorMap &mw, const sph_sm90_epi &ep, int64_t R, int64_t Vs,
                      int64_t H, int vec2) {
    const int smem = ep.tk_cand ? sm90_cfg<PP>::SMEM_TK : sm90_cfg<PP>::SMEM;
    switch (mode) {
    case SPH_SM90_EPI_L:
        head_logits_sm90_kernel<T, SPH_SM90_EPI_L, PP>
            <<<grid, SM90_THREADS, smem, stream>>>(mh, mw, ep, R, Vs, H, vec2);
        break;
    case SPH_SM90_EPI_STATS:
        head_logits_sm90_kernel<T, SPH_SM90_EPI_STATS, PP>
            <<<grid, SM90_THREADS, smem, stream>>>(mh, mw, ep, R, Vs, H, vec2);
        break;
    case SPH_SM90_EPI_STATS | SPH_SM90_EPI_E:
        head_logits_sm90_kernel<T, SPH_SM90_EPI_STATS | SPH_SM90_EPI_E, PP>
            <<<grid, SM90_THREADS, smem, stream>>>(mh, mw, ep, R, Vs, H, vec2);
        break;
    case SPH_SM90_EPI_NONE:
        head_logits_sm90_kernel<T, SPH_SM90_EPI_NONE, PP>
            <<<grid, SM90_THREADS, smem, stream>>>(mh, mw, ep, R, Vs, H, vec2);
        break;
    default:
        head_logits_sm90_kernel<T, SPH_SM90_EPI_DLOGITS, PP>
            <<<grid, SM90_THREADS, smem, stream>>>(mh, mw, ep, R, Vs, H, vec2);
        break;
    }
}

template <typename T>
static void launch_epi(int mode, int pp, dim3 grid, cudaStream_t stream, const CUtensorMap &mh,
                       const CUtensorMap &mw, const sph_sm90_epi &ep, int64_t R, int64_t Vs,
                       int64_t H, int vec2) {
    if (pp) launch_pp<T, true>(mode, grid, stream, mh, mw, ep, R, Vs, H, vec2);
    else launch_pp<T, false>(mode, grid, stream, mh, mw, ep, R, Vs, H, vec2);
}

extern "C" sph_status sph_cuda_head_sm90(sph_dtype dt, const void *h, int64_t ld_h,
                                         const void *w, int64_t ld_w, int64_t R, int64_t Vs,
                                         int64_t H, const sph_sm90_epi *epi,
                                         cudaStream_t stream) {
    if (R <= 0 || Vs <= 0) return SPH_OK;
    /* the caller asked sph_cuda_logits_sm90_usable on the user's tensors; the chunk's own
     * pointers must then qualify too (row offsets keep 16-byte alignment when ld % 8 == 0) */
    SPH_CHECK(dt.bits == 16 && (dt.code == SPH_DTYPE_BFLOAT || dt.code == SPH_DTYPE_FLOAT),
              SPH_ERR_INTERNAL, "logits_sm90: dtype %s is not bf16/f16", sph_dtype_name(dt));
    SPH_CHECK((uintptr_t)h % 16 == 0 && (uintptr_t)w % 16 == 0 && ld_h % 8 == 0 &&
                  ld_w % 8 == 0 && H > 0 && H % 8 == 0 && H <= INT32_MAX,
              SPH_ERR_INTERNAL, "logits_sm90: operands not TMA-aligned (ld_h=%lld, ld_w=%lld)",
              (long long)ld_h, (long long)ld_w);
    const int mode = epi->mode;
    SPH_CHECK(mode == SPH_SM90_EPI_NONE || mode == SPH_SM90_EPI_L || mode == SPH_SM90_EPI_STATS ||
                  mode == (SPH_SM90_EPI_STATS | SPH_SM90_EPI_E) || mode == SPH_SM90_EPI_DLOGITS,
              SPH_ERR_INTERNAL, "logits_sm90: epilogue mode %d", mode);
    SPH_CHECK(!(mode & SPH_SM90_EPI_E) ||
                  (epi->E && (uintptr_t)epi->E % 16 == 0 && epi->ldE % 8 == 0 && epi->ldE >= Vs),
              SPH_ERR_INTERNAL, "logits_sm90: E %p / ldE %lld not 16-byte aligned rows", epi->E,
              (long long)epi->ldE);
    SPH_CHECK(!epi->store16 || !(mode & SPH_SM90_EPI_DLOGITS) ||
                  ((uintptr_t)epi->D % 16 == 0 && epi->ldD % 8 == 0 && epi->ldD >= Vs),
              SPH_ERR_INTERNAL, "logits_sm90: store16 needs 16-byte aligned D rows (ldD %lld)",
              (long long)epi->ldD);
    SPH_CHECK(!(mode & SPH_SM90_EPI_L) || epi->L, SPH_ERR_INTERNAL, "logits_sm90: L is NULL");
    SPH_CHECK(!(mode & SPH_SM90_EPI_STATS) || epi->tile_recs, SPH_ERR_INTERNAL,
              "logits_sm90: tile_recs is NULL");
    SPH_CHECK(!(mode & SPH_SM90_EPI_DLOGITS) || (epi->D && epi->stats), SPH_ERR_INTERNAL,
              "logits_sm90: D or stats is NULL");
    SPH_CHECK(!epi->tk_cand ||
                  ((mode & SPH_SM90_EPI_STATS) && epi->tk_n && epi->tk_tau && epi->tk_slots &&
                   epi->tk_cap > 0 && epi->tk_ks >= 8 && epi->tk_ks <= 256 &&
                   (epi->tk_ks & (epi->tk_ks - 1)) == 0 && epi->tk_k >= 1 &&
                   epi->tk_k <= epi->tk_ks && epi->tk_every_log2 >= 4 &&
                   epi->tk_every_log2 <= 10),
              SPH_ERR_INTERNAL, "logits_sm90: top-k candidates without their buffers (ks %d)",
              epi->tk_ks);
    const int pp = pingpong_on(H, epi->schedule);
    const int64_t bm = pp ? sm90_cfg<true>::BM : sm90_cfg<false>::BM;
    const int64_t n_tiles = ((R + bm - 1) / bm) * ((Vs + SM90_BN - 1) / SM90_BN);
    SPH_CHECK(R <= INT32_MAX && Vs <= INT32_MAX && n_tiles <= INT32_MAX, SPH_ERR_INTERNAL,
              "logits_sm90: %lld x %lld exceeds the grid", (long long)R, (long long)Vs);
    CUtensorMap mh, mw;
    sph_status s = make_map(&mh, dt, h, R, ld_h, H, (uint32_t)bm);
    if (s != SPH_OK) return s;
    s = make_map(&mw, dt, w, Vs, ld_w, H, SM90_BN);
    if (s != SPH_OK) return s;
    sph_trace_mark("sm90: tensor maps");
    /* paired stores: 8-byte float2 into L, 4-byte half2 into D */
    const int vec2 = mode == SPH_SM90_EPI_DLOGITS
                         ? (uintptr_t)epi->D % 4 == 0 && epi->ldD % 2 == 0
                         : !(mode & SPH_SM90_EPI_L) || ((uintptr_t)epi->L % 8 == 0 &&
                                                        epi->ldL % 2 == 0);
    int dev = 0, sms = 0;
    SPH_CUDA_RET(cudaGetDevice(&dev));
    SPH_CUDA_RET(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    sph_trace_mark("sm90: device query");
    const dim3 grid((unsigned)(n_tiles < sms ? n_tiles : sms)); /* persistent: one per SM */
    if (dt.code == SPH_DTYPE_BFLOAT)
        launch_epi<__nv_bfloat16>(mode, pp, grid, stream, mh, mw, *epi, R, Vs, H, vec2);
    else
        launch_epi<__half>(mode, pp, grid, stream, mh, mw, *epi, R, Vs, H, vec2);
    SPH_LAUNCH_CHECK("head_logits_sm90_kernel", stream);
    sph_trace_mark("sm90: launch");
    return SPH_OK;
}

extern "C" sph_status sph_cuda_logits_sm90(sph_dtype dt, const void *h, int64_t ld_h,
                                           const void *w, int64_t ld_w, float *L, int64_t ldL,
                                           int64_t R, int64_t Vs, int64_t H,
                                           cudaStream_t stream) {
    sph_sm90_epi ep;
    memset(&ep, 0, sizeof ep);
    ep.mode = SPH_SM90_EPI_L;
    ep.L = L;
    ep.ldL = ldL;
    return sph_cuda_head_sm90(dt, h, ld_h, w, ld_w, R, Vs, H, &ep, stream);
}

extern "C" sph_status sph_cuda_sm90_reduce_tiles(const float *tile_recs, const float *tile_q,
                                                 int64_t n_tiles, int64_t R, float *recs,
                                                 float2 *mq, int merge, cudaStream_t stream) {
    if (R <= 0) return SPH_OK;
    SPH_CHECK((R + 7) / 8 <= INT32_MAX, SPH_ERR_INTERNAL, "reduce_tiles: R %lld", (long long)R);
    SPH_CHECK(!tile_q == !mq, SPH_ERR_INTERNAL, "reduce_tiles: tile_q and mq come together");
    sm90_reduce_tiles_kernel<<<(unsigned)((R + 7) / 8), 256, 0, stream>>>(tile_recs, tile_q,
                                                                         n_tiles, R, recs, mq,
                                                                         merge);
    SPH_LAUNCH_CHECK("sm90_reduce_tiles_kernel", stream);
    return SPH_OK;
}

extern "C" sph_status sph_cuda_logits_variant(int variant, sph_dtype dt, const void *h,
                                              int64_t ld_h, const void *w, int64_t ld_w,
                                              float *L, int64_t ldL, int64_t R, int64_t Vs,
                                              int64_t H, cudaStream_t stream) {
    if (variant == 1) {
        SPH_CHECK(sph_cuda_logits_sm90_usable(dt, h, ld_h, w, ld_w, H), SPH_ERR_UNSUPPORTED,
                  "variant: 1 (sm_90a) is not available for dtype %s, H=%lld on this device",
                  sph_dtype_name(dt), (long long)H);
        return sph_cuda_logits_sm90(dt, h, ld_h, w, ld_w, L, ldL, R, Vs, H, stream);
    }
    SPH_CHECK(variant == 0, SPH_ERR_INVALID_ARG, "variant: %d, expected 0 (mma.sync) or 1 (sm_90a)",
              variant);
    return sph_cuda_logits_fixed(dt, h, ld_h, w, ld_w, L, ldL, R, Vs, H, stream);
}
#endif /* SPH_SM90_DEVICE_ONLY */
