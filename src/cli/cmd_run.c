/*
 * cmd_run.c - `spanhead run`: forward + backward of the LM head on synthetic inputs (seeded;
 * by default a packed RL batch of prompts and responses) or on .npy inputs, on the CPU or a
 * CUDA device. Prints a table (or with --json one JSON object): rows, active rows, forward
 * and backward latency, achieved GFLOP/s, the ratio to the active floor (8 N_active H V_loc
 * flops, 6 in one-pass mode, 2 for a forward alone, at the sgemm rate measured in this run),
 * and the workspace (the only extra memory the library uses). --check recomputes everything
 * that was computed with the float64 reference and exits 1 when a relative error exceeds the
 * tolerance. --outputs writes .npy files, all of them or none.
 *
 * Every value is validated here before any work, each failure naming the option and its
 * value: sizes whose products overflow or exceed the machine, thread counts beyond its CPUs,
 * temperatures and softcaps that do not survive the conversion to float, a support larger
 * than the vocabulary, a shard outside the vocabulary, non-finite inputs (run_problem.c).
 * With --tp/--cp/--dp, or under an MPI launcher with more than one rank, the distributed
 * runner takes over (run_dist.c).
 */
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "run.h"
#include "run_dist.h"
#include "run_policy.h"
#include "synth.h"

static const char *const k_devices[] = {"cpu", "cuda", NULL};
static const char *const k_dtypes[] = {"f32", "bf16", "f16", NULL};

#define O(f) offsetof(run_opts, f)
const sph_cli_opt run_opt_table[] = {
    {"--device", "cpu|cuda", SPH_OPT_CHOICE, O(device), 0, 0, 0, 0, k_devices, 0,
     "where to compute (default cpu)"},
    {"--N", "ROWS", SPH_OPT_COUNT, O(N), 1, INT64_MAX, 0, 0, NULL, 0, "tokens (rows of hidden)"},
    {"--H", "SIZE", SPH_OPT_COUNT, O(H), 1, INT64_MAX, 0, 0, NULL, 0, "hidden size"},
    {"--V", "ROWS", SPH_OPT_COUNT, O(V), 1, INT64_MAX, 0, 0, NULL, 0,
     "local vocabulary rows (V_loc); --N, --H and --V go together"},
    {"--vocab-total", "V", SPH_OPT_COUNT, O(V_total), 1, INT64_MAX, 0, 0, NULL, 0,
     "full vocabulary (default V_loc)"},
    {"--vocab-start", "v0", SPH_OPT_I64, O(v0), 0, INT64_MAX, 0, 0, NULL, 0,
     "first id of this shard (default 0)"},
    {"--dtype", "f32|bf16|f16", SPH_OPT_CHOICE, O(dtype), 0, 0, 0, 0, k_dtypes, 0,
     "input dtype (default f32); gradients are written in f32"},
    {"--mask", "PATTERN", SPH_OPT_CHOICE, O(mask), 0, 0, 0, 0, synth_mask_names, 0,
     "response|random|fragmented|all|none: active rows (default\n"
     "response without shape options, else all)"},
    {"--active", "FRAC", SPH_OPT_F64, O(active), 0, 0, 0, 1, NULL, 0,
     "active fraction of random/fragmented masks (default 0.5)"},
    {"--gap", "G", SPH_OPT_I64, O(gap), 0, INT64_MAX, 0, 0, NULL, 0,
     "coalesce active runs across <= G inactive rows into one span\n"
     "(default 0: exact spans)"},
    {"--entropy", NULL, SPH_OPT_FLAG, O(entropy), 0, 0, 0, 0, NULL, 0,
     "also compute entropy and backpropagate an entropy bonus"},
    {"--softcap", "C", SPH_OPT_F64, O(softcap), 0, 0, 0, 1e308, NULL, 0,
     "tanh logit cap (default 0: off)"},
    {"--temperature", "T", SPH_OPT_F64, O(temperature), 0, 0, -1e308, 1e308, NULL, 0,
     "softmax temperature, > 0 (default 1)"},
    {"--one-pass", NULL, SPH_OPT_FLAG, O(one_pass), 0, 0, 0, 0, NULL, 0,
     "gradients from the forward sweep (no recompute)"},
    {"--support", "K", SPH_OPT_I64, O(K), 1, INT64_MAX, 0, 0, NULL, 0,
     "sample-support mode with K candidates per row (K <= vocabulary)"},
    {"--seed", "S", SPH_OPT_I64, O(seed), 0, INT64_MAX, 0, 0, NULL, 0,
     "synthetic data seed (default 1)"},
    {"--threads", "N", SPH_OPT_I64, O(threads), 0, INT64_MAX, 0, 0, NULL, 0,
     "CPU threads, at most this machine's CPUs (default 0: all)"},
    {"--repeats", "R", SPH_OPT_I64, O(repeats), 1, 1000, 0, 0, NULL, 0,
     "timed runs after a warm-up, median reported (default 3)"},
    {"--kernel", "NAME", SPH_OPT_STR, O(kernel), 0, 0, 0, 0, NULL, 0,
     "force a CPU kernel set: ref, generic, avx2, avx512"},
    {"--check", NULL, SPH_OPT_FLAG, O(check), 0, 0, 0, 0, NULL, 0,
     "compare what was computed with the float64 reference; exit 1 if\n"
     "off. Without an upstream gradient there is no backward: the\n"
     "check covers the forward outputs and says so"},
    {"--inputs", "DIR", SPH_OPT_STR, O(inputs), 0, 0, 0, 0, NULL, 0,
     "read hidden.npy weight.npy targets.npy and optional mask.npy\n"
     "dlogprob.npy dentropy.npy dlse.npy dlogit_mean.npy\n"
     "candidates.npy (bf16 data: uint16 .npy plus --dtype bf16);\n"
     "the backward runs when an upstream gradient is given"},
    {"--outputs", "DIR", SPH_OPT_STR, O(outputs), 0, 0, 0, 0, NULL, 0,
     "write logprob entropy lse logit_mean dhidden dweight .npy (what\n"
     "was computed): all at once after the run (and --check) succeeded,\n"
     "or none"},
    {"--json", NULL, SPH_OPT_FLAG, O(json), 0, 0, 0, 0, NULL, 0,
     "print the results and the check as one JSON object"},
    {NULL}};
#undef O

static const char k_synopsis[] = "usage: spanhead run [options]\n"
                                 "       mpirun -np T*C*D spanhead run --tp T --cp C --dp D "
                                 "[options]   (spanhead run --tp 1 --help)";
static const char k_about[] =
    "Forward + backward of the LM head (logprob, entropy, lse, logit_mean; dhidden,\n"
    "dweight). Default: a packed RL batch of prompts and responses with an entropy\n"
    "bonus (N=1024 H=256 V=4096), small enough to --check in seconds. With --policy-loss:\n"
    "the fused RL policy loss (spanhead run --policy-loss ppo --help).";

/* OpenMP workers that spin while the master runs serial code take half of an SMT core from
 * it (and from OpenBLAS); on this project's 2-vCPU machines that cost 2-4x on small shapes.
 * Unless the user chose a policy, re-run ourselves once with OMP_WAIT_POLICY=passive (libgomp
 * reads it at load time, so setting it now would be too late). */
static void prefer_passive_wait(int argc, char **argv) {
    if (getenv("OMP_WAIT_POLICY") || getenv("SPH_NO_REEXEC")) return;
    if (setenv("OMP_WAIT_POLICY", "passive", 0) || setenv("SPH_NO_REEXEC", "1", 1)) return;
    char **nargv = calloc((size_t)argc + 2, sizeof *nargv);
    if (!nargv) return;
    nargv[0] = "/proc/self/exe";
    nargv[1] = "run";
    for (int i = 1; i < argc; i++) nargv[i + 1] = argv[i];
    fflush(stdout);
    execv("/proc/self/exe", nargv); /* returns only on failure: carry on as we are */
    free(nargv);
}

/* Values the parser cannot judge alone; 0 or an exit code (message printed). */
static int validate(run_opts *o, const sph_cli_parsed *pp) {
    o->dtype_given = sph_cli_given(run_opt_table, pp, "--dtype");
    o->shape_given = sph_cli_given(run_opt_table, pp, "--N") ||
                     sph_cli_given(run_opt_table, pp, "--H") || sph_cli_given(run_opt_table, pp, "--V");
    if (o->inputs && o->shape_given)
        return sph_cli_fail(RUN_CMD, 2, "--inputs takes its shapes from the files: drop --N/--H/--V");
    if (o->inputs && o->K)
        return sph_cli_fail(RUN_CMD, 2, "--support %lld: with --inputs the candidates come from "
                                        "candidates.npy", (long long)o->K);
    if (o->inputs && o->mask >= 0)
        return sph_cli_fail(RUN_CMD, 2, "--mask %s: with --inputs the mask comes from mask.npy",
                            synth_mask_names[o->mask]);
    o->default_batch = !o->inputs && !o->shape_given;
    if (o->default_batch) o->N = 1024, o->H = 256, o->V = 4096, o->entropy = 1; /* RL bonus */
    if (!o->inputs && (!o->N || !o->H || !o->V))
        return sph_cli_fail(RUN_CMD, 2, "--N, --H and --V go together (or none: the default batch)");
    if (o->mask < 0) o->mask = o->default_batch ? SYNTH_RESPONSE : SYNTH_ALL;
    /* thread counts: bounded by the machine (libgomp crashes on absurd counts) */
    const int64_t cpus = sph_cli_cpu_count();
    if (o->threads > cpus)
        return sph_cli_fail(RUN_CMD, 1, "--threads %lld: more than the %lld CPUs of this machine",
                            (long long)o->threads, (long long)cpus);
    /* the kernels compute in float: a value that does not survive the conversion is refused */
    if (!(o->temperature > 0))
        return sph_cli_fail(RUN_CMD, 1, "--temperature %g: expected a number > 0", o->temperature);
    if (!((float)o->temperature >= FLT_MIN) || !isfinite((float)o->temperature))
        return sph_cli_fail(RUN_CMD, 1, "--temperature %g: outside float's normal range [%g, %g] "
                                        "(the kernels divide by it in float)",
                            o->temperature, (double)FLT_MIN, (double)FLT_MAX);
    if (o->softcap > 0 && (!((float)o->softcap >= FLT_MIN) || !isfinite((float)o->softcap)))
        return sph_cli_fail(RUN_CMD, 1, "--softcap %g: outside float's normal range [%g, %g] "
                                        "(0 turns it off)",
                            o->softcap, (double)FLT_MIN, (double)FLT_MAX);
    if (!o->inputs && o->V_total && o->V_total < o->V)
        return sph_cli_fail(RUN_CMD, 1, "--vocab-total %lld: smaller than --V %lld",
                            (long long)o->V_total, (long long)o->V);
    return 0;
}

int sph_cli_run(int argc, char **argv) {
    /* the fused RL policy loss has its own options and runner (run_policy.c) */
    if (sph_cli_run_wants_policy(argc, argv)) {
        if (!sph_cli_run_wants_dist(argc, argv)) prefer_passive_wait(argc, argv);
        return sph_cli_run_policy(argc, argv);
    }
    if (sph_cli_run_wants_dist(argc, argv)) return sph_cli_run_dist(argc, argv);
    run_opts o;
    memset(&o, 0, sizeof o);
    o.mask = -1, o.repeats = 3, o.active = 0.5, o.temperature = 1.0, o.seed = 1;
    sph_cli_parsed pp = {0};
    int done, rc = sph_cli_parse_or_exit(RUN_CMD, k_synopsis, k_about, run_opt_table, argc, argv,
                                         &o, &pp, &done);
    if (done) return rc;
    if ((rc = validate(&o, &pp))) return rc;
    prefer_passive_wait(argc, argv);
    const int on_cuda = o.device == RUN_CUDA;
    run_problem p;
    run_result r;
    run_device d;
    memset(&r, 0, sizeof r);
    memset(&d, 0, sizeof d);
    if ((rc = run_problem_make(&o, &p))) goto out;
    rc = 1;
    if (o.one_pass && !p.grads) {
        sph_cli_fail(RUN_CMD, 1, "--one-pass computes the gradients in the forward, but no "
                                 "upstream gradient was given (dlogprob.npy, dentropy.npy, "
                                 "dlse.npy or dlogit_mean.npy in --inputs)");
        goto out;
    }
    sph_status s = run_device_setup(&d, &p, &o, on_cuda, o.kernel, o.threads);
    if (s) {
        sph_cli_fail(RUN_CMD, 1, "%s: %s", sph_status_str(s), sph_last_error());
        goto out;
    }
    r.describe = sph_ctx_describe(d.ctx);
    r.reps = (int)o.repeats;
    double *tf = malloc(sizeof(double) * (size_t)r.reps), *tb = malloc(sizeof(double) * (size_t)r.reps);
    if (!tf || !tb) {
        free(tf), free(tb);
        sph_cli_fail(RUN_CMD, 1, "out of memory");
        goto out;
    }
    sph_cli_progress pr;
    sph_cli_progress_start(&pr, "spanhead run: passes", r.reps + 1 + (o.check ? 1 : 0));
    for (int k = -1; k < r.reps && s == SPH_OK; k++) { /* k = -1: warm-up */
        double a_, b_;
        s = run_device_pass(&d, &a_, &b_);
        if (k >= 0) tf[k] = a_, tb[k] = b_;
        sph_cli_progress_step(&pr, k + 2);
    }
    if (s) {
        sph_cli_progress_end(&pr);
        free(tf), free(tb);
        sph_cli_fail(RUN_CMD, 1, "%s: %s", sph_status_str(s), sph_last_error());
        goto out;
    }
    r.fwd_s = sph_cli_median(tf, r.reps), r.bwd_s = sph_cli_median(tb, r.reps);
    free(tf), free(tb);
    const double Hd = (double)p.H, Na = (double)p.n_act, Vd = p.K ? (double)p.K : (double)p.V;
    r.work = (!p.grads ? 2.0 : o.one_pass ? 6.0 : 8.0) * Na * Hd * Vd;
    r.rate = on_cuda ? 0
                     : sph_cli_sgemm_rate(p.N < 64 ? 64 : (p.N > 1024 ? 1024 : p.N),
                                          p.V < 64 ? 64 : (p.V > 4096 ? 4096 : p.V), p.H, 1, 3);
    r.floor_s = r.rate > 0 ? r.work / r.rate : 0;
    r.ws_bytes = d.ws_bytes[0] > d.ws_bytes[1] ? d.ws_bytes[0] : d.ws_bytes[1];
    const int have[RUN_N_OUT] = {1, d.a.entropy != NULL, 1, d.a.logit_mean != NULL, d.backward,
                                 d.backward};
    const int64_t cnt[RUN_N_OUT] = {p.N, p.N, p.N, p.N, p.N * p.H, p.V * p.H};
    for (int k = 0; k < RUN_N_OUT; k++) {
        r.have[k] = have[k], r.count[k] = cnt[k];
        if (have[k] && !(r.out[k] = run_device_get(&d, run_out_buf[k]))) {
            sph_cli_progress_end(&pr);
            sph_cli_fail(RUN_CMD, 1, "copying %s back: %s", run_out_names[k], sph_last_error());
            goto out;
        }
    }
    if (o.check && (rc = run_check(&p, &o, on_cuda, &r))) {
        sph_cli_progress_end(&pr);
        goto out;
    }
    sph_cli_progress_end(&pr);
    rc = 0;
    if (o.outputs && (!o.check || r.passed)) rc = run_write_outputs(&p, &o, &r);
    if (o.json) run_report_json(&p, &o, &r);
    else run_report_text(&p, &o, &r);
    if (!rc && o.check && !r.passed)
        rc = sph_cli_fail(RUN_CMD, 1, "check failed: results differ from the reference%s",
                          o.outputs ? " (no outputs written)" : "");
out:
    for (int k = 0; k < RUN_N_OUT; k++) free(r.out[k]);
    run_device_free(&d);
    run_problem_free(&p);
    return rc;
}
