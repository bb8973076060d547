/*
 * nccl_single.c - the NCCL communicator on one GPU (labels gpu, mpi; exits 77 without NCCL in
 * the build or without a CUDA device).
 *
 * 1. sph_comm_create_nccl over an ncclComm_t made by ncclCommInitAll on device 0: the
 *    agreement over NCCL itself accepts a good config and rejects tp = 2 on a 1-rank group
 *    and a short shard (SPH_ERR_MISMATCH), leaves the caller's ncclComm_t alive on destroy.
 * 2. sph_comm_create_nccl_mpi over MPI_COMM_WORLD (singleton MPI_Init; only in an MPI build):
 *    owns its ncclComm_t.
 * For each: info (backend NCCL, rank 0, size 1, device buffers), an allgather of device
 * buffers (out of place and in place) and an f32 all-reduce on a caller stream, checked on
 * the host after a sync.
 * NCCL_NVLS_ENABLE=0 is set here too (multicast stays off on the lent machines).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"

#ifdef SPH_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#ifdef SPH_HAVE_MPI
#include <mpi.h>
#endif

static int fails;

#define CHECK(cond, ...)                                                                      \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);          \
            fprintf(stderr, __VA_ARGS__);                                                     \
            fputc('\n', stderr);                                                              \
            fails++;                                                                          \
        }                                                                                     \
    } while (0)

#define CUDA_OK(expr)                                                                         \
    do {                                                                                      \
        cudaError_t e_ = (expr);                                                              \
        if (e_ != cudaSuccess) {                                                              \
            fprintf(stderr, "%s failed: %s\n", #expr, cudaGetErrorString(e_));                \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

static void exercise(sph_comm_t c, cudaStream_t s, const char *what) {
    sph_comm_backend b;
    int64_t rank = -1, size = -1;
    CHECK(sph_comm_info(c, &b, &rank, &size) == SPH_OK, "%s", sph_last_error());
    CHECK(b == SPH_COMM_NCCL && rank == 0 && size == 1 && c->device_buffers == 1,
          "%s: backend %d rank %lld size %lld device_buffers %d", what, (int)b, (long long)rank,
          (long long)size, c->device_buffers);
    enum { BYTES = 5 * 4 * 1031 };
    unsigned char host[BYTES], back[BYTES];
    for (int i = 0; i < BYTES; i++) host[i] = (unsigned char)(i * 7 + 3);
    unsigned char *d_send, *d_recv;
    CUDA_OK(cudaMalloc((void **)&d_send, BYTES));
    CUDA_OK(cudaMalloc((void **)&d_recv, BYTES));
    CUDA_OK(cudaMemcpy(d_send, host, BYTES, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(d_recv, 0xA5, BYTES));
    sph_status st = c->ops->allgather(c, d_send, d_recv, BYTES, s);
    CHECK(st == SPH_OK, "%s: allgather: %s", what, sph_last_error());
    CUDA_OK(cudaStreamSynchronize(s));
    CUDA_OK(cudaMemcpy(back, d_recv, BYTES, cudaMemcpyDeviceToHost));
    CHECK(!memcmp(back, host, BYTES), "%s: allgather result differs", what);
    st = c->ops->allgather(c, d_recv, d_recv, BYTES, s); /* in place: rank 0's block */
    CHECK(st == SPH_OK, "%s: in-place allgather: %s", what, sph_last_error());
    CUDA_OK(cudaStreamSynchronize(s));
    CUDA_OK(cudaMemcpy(back, d_recv, BYTES, cudaMemcpyDeviceToHost));
    CHECK(!memcmp(back, host, BYTES), "%s: in-place allgather result differs", what);

    enum { COUNT = 3001 };
    float hf[COUNT], bf[COUNT];
    for (int i = 0; i < COUNT; i++) hf[i] = (float)(i % 13) - 6.5f;
    float *d_f;
    CUDA_OK(cudaMalloc((void **)&d_f, sizeof hf));
    CUDA_OK(cudaMemcpy(d_f, hf, sizeof hf, cudaMemcpyHostToDevice));
    st = c->ops->allreduce_sum_f32(c, d_f, COUNT, s);
    CHECK(st == SPH_OK, "%s: allreduce: %s", what, sph_last_error());
    CUDA_OK(cudaStreamSynchronize(s));
    CUDA_OK(cudaMemcpy(bf, d_f, sizeof bf, cudaMemcpyDeviceToHost));
    CHECK(!memcmp(bf, hf, sizeof hf), "%s: allreduce over one rank changed the data", what);
    st = c->ops->allgather(c, NULL, d_recv, 4, s);
    CHECK(st == SPH_ERR_INVALID_ARG, "%s: NULL send gave %d", what, (int)st);
    cudaFree(d_send);
    cudaFree(d_recv);
    cudaFree(d_f);
}

int main(int argc, char **argv) {
    (void)argc;
    (void)argv;
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
        printf("skipped: no CUDA device\n");
        return 77;
    }
    CUDA_OK(cudaSetDevice(0));
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    sph_comm_config cfg = SPH_COMM_CONFIG_INIT;
    cfg.vocab_total = cfg.vocab_local = 151936;
    cfg.dtype = SPH_BF16;

    /* 1. the caller's ncclComm_t */
    ncclComm_t nc;
    int devs[1] = {0};
    ncclResult_t r = ncclCommInitAll(&nc, 1, devs);
    CHECK(r == ncclSuccess, "ncclCommInitAll: %s", ncclGetErrorString(r));
    if (r == ncclSuccess) {
        sph_comm_t c = NULL;
        sph_status st = sph_comm_create_nccl(&c, nc, &cfg);
        CHECK(st == SPH_OK, "create_nccl: %s", sph_last_error());
        if (c) exercise(c, s, "create_nccl");
        sph_comm_destroy(c);
        sph_comm_config bad = cfg;
        bad.tp = 2;
        st = sph_comm_create_nccl(&c, nc, &bad);
        CHECK(st == SPH_ERR_MISMATCH && strstr(sph_last_error(), "cfg.tp is 2") && c == NULL,
              "tp 2 on one rank: %d %s", (int)st, sph_last_error());
        bad = cfg;
        bad.vocab_local -= 5;
        st = sph_comm_create_nccl(&c, nc, &bad);
        CHECK(st == SPH_ERR_MISMATCH && strstr(sph_last_error(), "leaving a gap"),
              "short shard: %d %s", (int)st, sph_last_error());
        /* The caller's comm survived our destroy: one more collective on it works. */
        float *d;
        CUDA_OK(cudaMalloc((void **)&d, 16));
        r = ncclAllReduce(d, d, 4, ncclFloat32, ncclSum, nc, s);
        CHECK(r == ncclSuccess, "caller's comm after destroy: %s", ncclGetErrorString(r));
        CUDA_OK(cudaStreamSynchronize(s));
        cudaFree(d);
        ncclCommDestroy(nc);
    }

#ifdef SPH_HAVE_MPI
    /* 2. created over MPI */
    if (MPI_Init(&argc, &argv) == MPI_SUCCESS) {
        sph_comm_t c = NULL;
        MPI_Comm w = MPI_COMM_WORLD;
        sph_status st = sph_comm_create_nccl_mpi(&c, &w, &cfg);
        CHECK(st == SPH_OK, "create_nccl_mpi: %s", sph_last_error());
        if (c) exercise(c, s, "create_nccl_mpi");
        sph_comm_destroy(c);
        MPI_Finalize();
    } else {
        printf("note: singleton MPI_Init failed; create_nccl_mpi not exercised\n");
    }
#else
    printf("note: built without MPI; create_nccl_mpi not exercised\n");
#endif
    cudaStreamDestroy(s);
    printf("nccl_single: %s\n", fails ? "FAIL" : "PASS");
    return fails ? 1 : 0;
}

#else /* !SPH_HAVE_NCCL */

int main(void) {
    printf("skipped: spanhead built without NCCL\n");
    return 77;
}

#endif
