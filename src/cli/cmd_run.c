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
 * runner takes over (run_dist_main.c).
 */
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "dist/run_dist.h"
#include "msg.h"
#include "progress.h"
#include "run.h"
#include "run_distill.h"
#include "run_policy.h"
#include "synth.h"


/* options: sph_cli_run_opts (opts.c) */

static const char k_synopsis[] = "usage: spanhead run [options]\n"
                                 "       mpirun -np T*C*D spanhead run --tp T --cp C --dp D "
                                 "[options]   (spanhead run --tp 1 --help)";
static const char k_about[] =
    "Forward + backward of the LM head (logprob, entropy, lse, logit_mean; dhidden,\n"
    "dweight). Default: a packed RL batch of prompts and responses with an entropy\n"
    "bonus (N=1024 H=256 V=4096), small enough to --check in seconds. With --policy-loss:\n"
    "the fused RL policy loss (spanhead run --policy-loss ppo --help); with --distill: the\n"
    "fused distillation loss (spanhead run --distill jsd --help); with --tp/--cp/--dp or\n"
    "under mpirun: their MPI forms.";

/* OpenMP workers that spin while the master runs serial code take half of an SMT core from
 * it (and from OpenBLAS); on this project's 2-vCPU machines that cost 2-4x on small shapes.
 * Unless the user chose a policy, re-run ourselves once with OMP_WAIT_POLICY=passive (libgomp
 * reads it at load time, so setting it now would be too late). */
/* SPH_CLI_TEST_CORRUPT=NAME (tests only, tests/cli/test_errors.sh): adds 1 % of max|x| to
 * the first element of output NAME after the run, so that a test can show `--check` failing a
 * wrong result however generous the budget of the inputs' conditioning is. */
static void test_corrupt(run_result *r) {
    const char *v = getenv("SPH_CLI_TEST_CORRUPT");
    for (int k = 0; v && k < RUN_N_OUT; k++) {
        if (!r->have[k] || !r->out[k] || strcmp(v, run_out_names[k]) != 0 || r->count[k] < 1)
            continue;
        float mx = 0;
        for (int64_t i = 0; i < r->count[k]; i++)
            if (fabsf(r->out[k][i]) > mx) mx = fabsf(r->out[k][i]);
        r->out[k][0] += 0.01f * (mx > 0 ? mx : 1.0f);
    }
}

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
    o->dtype_given = sph_cli_given(sph_cli_run_opts, pp, "--dtype");
    o->shape_given = sph_cli_given(sph_cli_run_opts, pp, "--N") ||
                     sph_cli_given(sph_cli_run_opts, pp, "--H") || sph_cli_given(sph_cli_run_opts, pp, "--V");
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
    /* threads, kernel, temperature, softcap: the library's domains, judged by the library
     * before any work (opt_probe.c); a refusal is a usage error with its message */
    int prc = sph_cli_probe_head(RUN_CMD, o->temperature, o->softcap, o->threads, o->kernel,
                                 NULL, 0);
    if (prc) return prc;
    if (!o->inputs && o->V_total && o->V_total < o->V)
        return sph_cli_fail(RUN_CMD, 1, "--vocab-total %lld: smaller than --V %lld",
                            (long long)o->V_total, (long long)o->V);
    return 0;
}

/* ---- the runners, and the one choice among them --------------------------------------- */

static int run_head(int argc, char **argv);

/* A runner per loss, each with its one-process form and its MPI form (src/cli/dist/); the
 * option that names the loss picks it, none the head alone. */
typedef struct run_mode {
    const char *selector;                /* "--policy-loss", "--distill"; NULL: the head */
    int (*one)(int argc, char **argv);   /* one process */
    int (*dist)(int argc, char **argv);  /* --tp/--cp/--dp, or an MPI launch of several ranks */
    int passive_wait;                    /* re-exec with OMP_WAIT_POLICY=passive first */
} run_mode;

static const run_mode k_modes[] = {
    {NULL, run_head, sph_cli_run_dist, 1},
    {"--policy-loss", sph_cli_run_policy, sph_cli_run_policy_main_dist, 1},
    {"--distill", sph_cli_run_distill, sph_cli_run_distill_main_dist, 0},
};

/* Ranks of the MPI launch that started this process (1 when none did). Ranks given different
 * arguments must still meet in one agreement, so a launch of several ranks is distributed
 * whatever its arguments say. */
static int launcher_ranks(void) {
    static const char *const env[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", NULL};
    for (int k = 0; env[k]; k++) {
        const char *v = getenv(env[k]);
        if (v && atoi(v) > 1) return atoi(v);
    }
    return 1;
}

int sph_cli_run(int argc, char **argv) {
    /* which runner: one walk of argv with the parser's own rules and every runner's table (a
     * value is never taken for an option; "--" ends the options for all of them), then the
     * runner parses its options once, with its table */
    const sph_cli_opt *const tables[] = {sph_cli_run_opts, sph_cli_dist_opts,
                                         sph_cli_policy_opts, sph_cli_distill_opts};
    static const char *const names[] = {"--policy-loss", "--distill", "--tp", "--cp", "--dp",
                                        NULL};
    int given[5];
    sph_cli_scan(tables, 4, argc, argv, names, given);
    if (given[0] && given[1])
        return sph_cli_fail(RUN_CMD, 2, "--policy-loss and --distill: one loss per run "
                                        "(see --help of each)");
    const run_mode *m = &k_modes[given[0] ? 1 : given[1] ? 2 : 0];
    if (given[2] || given[3] || given[4] || launcher_ranks() > 1) return m->dist(argc, argv);
    if (m->passive_wait) prefer_passive_wait(argc, argv);
    return m->one(argc, argv);
}

/* The head alone in one process: synthetic or .npy inputs, timing, --check, --outputs. */
static int run_head(int argc, char **argv) {
    run_opts o;
    memset(&o, 0, sizeof o);
    o.mask = -1, o.repeats = 3, o.active = 0.5, o.temperature = 1.0, o.seed = 1;
    sph_cli_parsed pp = {0};
    int done, rc = sph_cli_parse_or_exit(RUN_CMD, k_synopsis, k_about, sph_cli_run_opts, argc, argv,
                                         &o, &pp, &done);
    if (done) return rc;
    if ((rc = validate(&o, &pp))) return rc;
    const int on_cuda = o.device == RUN_CUDA;
    run_problem p;
    run_result r;
    run_device d;
    sph_cli_outset os;
    memset(&r, 0, sizeof r);
    memset(&d, 0, sizeof d);
    memset(&os, 0, sizeof os);
    if ((rc = run_problem_make(&o, &p))) goto out;
    rc = 1;
    /* the outputs' directory locked, its names checked, the staging made: before any work */
    if (o.outputs && sph_cli_outset_begin(&os, o.outputs, run_out_files)) {
        sph_cli_fail(RUN_CMD, 1, "%s", os.err);
        goto out;
    }
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
                                 d.backward, d.a.sum_p2 != NULL, o.topk > 0, o.topk > 0};
    const int64_t cnt[RUN_N_OUT] = {p.N, p.N, p.N, p.N, p.N * p.H, p.V * p.H, p.N,
                                    p.N * o.topk, p.N * o.topk};
    for (int k = 0; k < RUN_N_OUT; k++) {
        r.have[k] = have[k], r.count[k] = cnt[k];
        if (have[k] && !(r.out[k] = run_device_get(&d, run_out_buf[k]))) {
            sph_cli_progress_end(&pr);
            sph_cli_fail(RUN_CMD, 1, "copying %s back: %s", run_out_names[k], sph_last_error());
            goto out;
        }
    }
    test_corrupt(&r);
    if (o.check && (rc = run_check(&p, &o, on_cuda, &r))) {
        sph_cli_progress_end(&pr);
        goto out;
    }
    sph_cli_progress_end(&pr);
    rc = 0;
    if (o.outputs && (!o.check || r.passed)) rc = run_write_outputs(&p, &o, &r, &os);
    if (o.json) run_report_json(&p, &o, &r);
    else run_report_text(&p, &o, &r);
    if (!rc && o.check && !r.passed)
        rc = sph_cli_fail(RUN_CMD, 1, "check failed: results differ from the reference%s",
                          o.outputs ? " (no outputs written)" : "");
out:
    sph_cli_outset_abort(&os); /* a no-op once committed */
    for (int k = 0; k < RUN_N_OUT; k++) free(r.out[k]);
    run_device_free(&d);
    run_problem_free(&p);
    return rc;
}
