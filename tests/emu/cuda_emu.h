/*
 * cuda_emu.h - run CUDA kernels' device code on the CPU, for tests on machines without a GPU.
 *
 * A source of CUDA kernels (head_extras.cu) compiles as host C++ after this header: every
 * thread of a block is a fiber (ucontext), the block's fibers run one at a time on one OS
 * thread, and a fiber runs until it reaches a barrier (__syncthreads) or a warp collective
 * (__syncwarp, shuffles, votes, reductions), where it waits for the other participants. So
 * the kernels' logic runs as written, with the warp's collectives exact, blocks one after the
 * other, and any collective reached by part of a warp, or a barrier by part of a block, is a
 * reported deadlock instead of a hang. It checks logic, not the GPU's memory model: a lane
 * reads another's shared-memory store only across a collective, as CUDA requires, and a
 * missing __syncwarp between a store and another lane's load may pass here and fail there.
 *
 * Not emulated: wgmma, TMA, inline PTX (a kernel file's SPH_CUDA_EMU branches replace it; a
 * 32-bit shared-window address, as st.shared takes, is an offset into emu::shared_bytes()).
 * Atomics are plain read-modify-writes: one OS thread runs every fiber.
 */
#ifndef SPH_CUDA_EMU_H
#define SPH_CUDA_EMU_H

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include <functional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#define SPH_CUDA_EMU 1

namespace emu {

struct dim { unsigned x, y, z; };

struct fiber {
    ucontext_t ctx;
    std::vector<char> stack;
    int state; /* 0 runnable, 1 waiting, 2 done */
};

struct warp_x {
    unsigned arrived = 0; /* the lanes waiting in the collective under way */
    unsigned mask = 0;
    int kind = 0;
    unsigned long long gen = 0;
    uint64_t val[32], snap[32];
};

struct machine {
    dim grid{1, 1, 1}, block{1, 1, 1}, bidx{0, 0, 0};
    int nthreads = 0, cur = 0, live = 0;
    std::vector<fiber> f;
    ucontext_t sched;
    std::function<void()> body;
    int bar_arrived = 0;
    unsigned long long bar_gen = 0;
    warp_x warps[32];
    std::string error;
};
inline machine &M() {
    static machine m;
    return m;
}

inline void yield_waiting() {
    machine &m = M();
    m.f[m.cur].state = 1;
    swapcontext(&m.f[m.cur].ctx, &m.sched);
}
inline void wake_if(bool (*pred)(int tid, void *), void *arg) {
    machine &m = M();
    for (int t = 0; t < m.nthreads; t++)
        if (m.f[t].state == 1 && pred(t, arg)) m.f[t].state = 0;
}

inline int tid() { return M().cur; }
inline int lane() { return tid() & 31; }
/* the lanes a warp has (a partial last warp has fewer) that have not exited */
inline unsigned warp_members(int w) {
    machine &m = M();
    unsigned b = 0;
    for (int l = 0; l < 32; l++) {
        const int t = 32 * w + l;
        if (t < m.nthreads && m.f[t].state != 2) b |= 1u << l;
    }
    return b;
}

/* The collective under way in warp w completes once every live lane its mask names has
 * arrived (CUDA: the named lanes that have not exited); lanes that exited read as 0. */
inline void warp_try_complete(int w) {
    machine &m = M();
    warp_x &x = m.warps[w];
    const unsigned need = x.mask & warp_members(w);
    if (!x.arrived || (x.arrived & need) != need) return;
    for (int l = 0; l < 32; l++) x.snap[l] = x.arrived >> l & 1 ? x.val[l] : 0;
    x.arrived = 0;
    x.gen++;
    for (int l = 0; l < 32; l++) {
        const int t = 32 * w + l;
        if (t < m.nthreads && m.f[t].state == 1) m.f[t].state = 0;
    }
}

/* Lane deposits v in a collective of this kind and mask; returns once the collective is
 * complete, with the lanes' values in the returned array. Lanes of one warp meeting in
 * collectives of different kinds or masks are an error (divergent collectives). */
inline const uint64_t *exchange(unsigned mask, uint64_t v, int kind) {
    machine &m = M();
    const int w = tid() / 32, l = lane();
    warp_x &x = m.warps[w];
    char b[200];
    if (!(mask >> l & 1)) {
        snprintf(b, sizeof b,
                 "lane %d of warp %d (block %u) calls a collective whose mask 0x%08x omits it",
                 l, w, m.bidx.x, mask);
        throw std::runtime_error(b);
    }
    if (!x.arrived) x.mask = mask, x.kind = kind;
    else if (x.mask != mask || x.kind != kind) {
        snprintf(b, sizeof b,
                 "warp %d (block %u): lane %d meets collective %d mask 0x%08x where others "
                 "wait in %d mask 0x%08x",
                 w, m.bidx.x, l, kind, mask, x.kind, x.mask);
        throw std::runtime_error(b);
    }
    x.val[l] = v;
    x.arrived |= 1u << l;
    const unsigned long long g = x.gen;
    warp_try_complete(w);
    while (x.gen == g) yield_waiting();
    return x.snap;
}

inline void syncthreads() {
    machine &m = M();
    if (++m.bar_arrived == m.live) {
        m.bar_arrived = 0;
        m.bar_gen++;
        wake_if([](int, void *) { return true; }, nullptr);
    } else {
        const unsigned long long g = m.bar_gen;
        while (m.bar_gen == g) yield_waiting();
    }
}

inline void trampoline() {
    machine &m = M();
    try {
        m.body();
    } catch (const std::exception &e) {
        if (m.error.empty()) m.error = e.what();
    }
    m.f[m.cur].state = 2;
    m.live--;
    /* a barrier waiting on the exited thread: the others may complete it now */
    if (m.bar_arrived > 0 && m.bar_arrived == m.live) {
        m.bar_arrived = 0;
        m.bar_gen++;
        wake_if([](int, void *) { return true; }, nullptr);
    }
    warp_try_complete(m.cur / 32);
    /* returns to m.sched (uc_link) */
}

/* Runs body once per thread of every block of grid x block (x only), blocks in order.
 * Returns "" or the first error (a deadlock, a collective with missing lanes). */
inline std::string launch(unsigned grid, unsigned block, std::function<void()> body,
                          size_t stack_bytes = 256 << 10) {
    machine &m = M();
    if (block > 1024) return "block over 1024 threads";
    m.grid = {grid, 1, 1}, m.block = {block, 1, 1};
    m.nthreads = (int)block;
    m.body = std::move(body);
    m.error.clear();
    if (m.f.size() < block) m.f.resize(block);
    for (unsigned b = 0; b < grid && m.error.empty(); b++) {
        m.bidx = {b, 0, 0};
        m.live = (int)block, m.bar_arrived = 0;
        for (auto &w : m.warps) w.arrived = 0;
        for (unsigned t = 0; t < block; t++) {
            fiber &f = m.f[t];
            if (f.stack.size() < stack_bytes) f.stack.resize(stack_bytes);
            getcontext(&f.ctx);
            f.ctx.uc_stack.ss_sp = f.stack.data();
            f.ctx.uc_stack.ss_size = f.stack.size();
            f.ctx.uc_link = &m.sched;
            makecontext(&f.ctx, trampoline, 0);
            f.state = 0;
        }
        for (;;) {
            int ran = 0, done = 0;
            for (unsigned t = 0; t < block; t++) {
                if (m.f[t].state == 2) {
                    done++;
                    continue;
                }
                if (m.f[t].state != 0) continue;
                m.cur = (int)t;
                swapcontext(&m.sched, &m.f[t].ctx);
                ran++;
            }
            if (done == (int)block || !m.error.empty()) break;
            if (!ran) {
                char s[128];
                snprintf(s, sizeof s, "deadlock in block %u: %d of %u threads wait, none can run",
                         b, (int)block - done, block);
                m.error = s;
                break;
            }
        }
    }
    return m.error;
}

/* The block's shared memory as the kernels address it through 32-bit shared-window
 * addresses (st.shared / ld.shared in the source): byte offsets into this array. */
inline unsigned char *shared_bytes() {
    alignas(16) static unsigned char b[256 << 10];
    return b;
}
inline float &shared_f32(uint32_t a) {
    if (a % 4 || a >= (256u << 10)) throw std::runtime_error("shared-memory address out of range");
    return *(float *)(shared_bytes() + a);
}

template <typename T> inline uint64_t bits(T v) {
    static_assert(sizeof(T) <= 8, "a collective's value is at most 8 bytes");
    uint64_t u = 0;
    memcpy(&u, &v, sizeof v);
    return u;
}
template <typename T> inline T unbits(uint64_t u) {
    T v;
    memcpy(&v, &u, sizeof v);
    return v;
}

} // namespace emu

/* CUDA's execution-space keywords: host code here */
#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __shared__
#undef __launch_bounds__
#undef __noinline__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __shared__ static
#define __launch_bounds__(...)

#undef threadIdx
#undef blockIdx
#undef blockDim
#undef gridDim
#undef warpSize
#define threadIdx (emu::dim{(unsigned)emu::tid(), 0u, 0u})
#define blockIdx (emu::M().bidx)
#define blockDim (emu::M().block)
#define gridDim (emu::M().grid)
#define warpSize 32

inline void __syncthreads() { emu::syncthreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { emu::exchange(mask, 0, 1); }

template <typename T> inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    const uint64_t *s = emu::exchange(mask, emu::bits(v), 10);
    const int l = emu::lane(), base = l & ~(width - 1);
    return emu::unbits<T>(s[base + (src & (width - 1))]);
}
template <typename T> inline T __shfl_xor_sync(unsigned mask, T v, int x, int width = 32) {
    const uint64_t *s = emu::exchange(mask, emu::bits(v), 11);
    const int l = emu::lane(), base = l & ~(width - 1);
    return emu::unbits<T>(s[base + (((l & (width - 1)) ^ x) & (width - 1))]);
}
template <typename T> inline T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32) {
    const uint64_t *s = emu::exchange(mask, emu::bits(v), 12);
    const int l = emu::lane(), i = l & (width - 1);
    return i >= (int)d ? emu::unbits<T>(s[l - (int)d]) : v;
}
template <typename T> inline T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32) {
    const uint64_t *s = emu::exchange(mask, emu::bits(v), 13);
    const int l = emu::lane(), i = l & (width - 1);
    return i + (int)d < width ? emu::unbits<T>(s[l + (int)d]) : v;
}
inline unsigned __ballot_sync(unsigned mask, int p) {
    const uint64_t *s = emu::exchange(mask, p ? 1u : 0u, 3);
    unsigned b = 0;
    for (int l = 0; l < 32; l++)
        if (mask >> l & 1 && s[l]) b |= 1u << l;
    return b;
}
inline int __any_sync(unsigned mask, int p) { return __ballot_sync(mask, p) != 0; }
inline int __all_sync(unsigned mask, int p) { return __ballot_sync(mask, p) == mask; }
template <typename T> inline unsigned __match_any_sync(unsigned mask, T v) {
    const uint64_t *s = emu::exchange(mask, emu::bits(v), 14);
    const uint64_t me = s[emu::lane()];
    unsigned b = 0;
    for (int l = 0; l < 32; l++)
        if (mask >> l & 1 && s[l] == me) b |= 1u << l;
    return b;
}
#define SPH_EMU_REDUCE(name, T, init, op)                                                         \
    inline T name(unsigned mask, T v) {                                                         \
        const uint64_t *s = emu::exchange(mask, emu::bits(v), 15);                                 \
        T r = init;                                                                             \
        for (int l = 0; l < 32; l++)                                                            \
            if (mask >> l & 1) {                                                                \
                const T x = emu::unbits<T>(s[l]);                                               \
                r = op;                                                                         \
            }                                                                                   \
        return r;                                                                               \
    }
SPH_EMU_REDUCE(__reduce_add_sync, int, 0, r + x)
SPH_EMU_REDUCE(__reduce_add_sync, unsigned, 0u, r + x)
SPH_EMU_REDUCE(__reduce_min_sync, int, INT32_MAX, x < r ? x : r)
SPH_EMU_REDUCE(__reduce_min_sync, unsigned, UINT32_MAX, x < r ? x : r)
SPH_EMU_REDUCE(__reduce_max_sync, int, INT32_MIN, x > r ? x : r)
SPH_EMU_REDUCE(__reduce_max_sync, unsigned, 0u, x > r ? x : r)
#undef SPH_EMU_REDUCE

inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned __brev(unsigned x) {
    unsigned r = 0;
    for (int i = 0; i < 32; i++) r |= (x >> i & 1u) << (31 - i);
    return r;
}
inline unsigned __float_as_uint(float f) { return emu::unbits<unsigned>(emu::bits(f)); }
inline int __float_as_int(float f) { return emu::unbits<int>(emu::bits(f)); }
inline float __uint_as_float(unsigned u) { return emu::unbits<float>(emu::bits(u)); }
inline float __int_as_float(int u) { return emu::unbits<float>(emu::bits(u)); }
template <typename T> inline T __ldg(const T *p) { return *p; }
template <typename T> inline T __ldcg(const T *p) { return *p; }
template <typename T> inline T __ldcs(const T *p) { return *p; }
template <typename T> inline T __ldca(const T *p) { return *p; }
template <typename T> inline T __ldlu(const T *p) { return *p; }
template <typename T> inline void __stcs(T *p, T v) { *p = v; }
template <typename T> inline void __stcg(T *p, T v) { *p = v; }
template <typename T> inline T atomicAdd(T *p, T v) { const T o = *p; *p = o + v; return o; }
template <typename T> inline T atomicMax(T *p, T v) { const T o = *p; if (v > o) *p = v; return o; }
template <typename T> inline T atomicMin(T *p, T v) { const T o = *p; if (v < o) *p = v; return o; }
template <typename T> inline T atomicExch(T *p, T v) { const T o = *p; *p = v; return o; }
template <typename T> inline T atomicCAS(T *p, T c, T v) {
    const T o = *p;
    if (o == c) *p = v;
    return o;
}
inline float __frcp_rn(float x) { return 1.f / x; }
inline void __threadfence() {}
inline void __threadfence_block() {}
template <typename A, typename B>
inline auto min(A a, B b) -> typename std::common_type<A, B>::type {
    return b < a ? b : a;
}
template <typename A, typename B>
inline auto max(A a, B b) -> typename std::common_type<A, B>::type {
    return a < b ? b : a;
}

#endif
