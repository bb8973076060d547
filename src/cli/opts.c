/*
 * opts.c - the option tables of the subcommands (see opts.h and args.h): one row per option,
 * its help text beside it. The policy loss's `run` options are run_policy.c's
 * (sph_cli_policy_opts), beside its runner.
 */
#include "opts.h"

#include <stddef.h>

#include "synth.h"

const char *const sph_cli_fp8_names[] = {"none", "blockwise", "mxfp8", NULL};
const char *const sph_cli_device_names[] = {"cpu", "cuda", NULL};
const char *const sph_cli_run_dtype_names[] = {"f32", "bf16", "f16", NULL};

const bench_shape bench_shapes[5] = {
    {"A", 2048, 62080}, {"B", 4096, 37984}, {"C", 5120, 37984}, {"D", 2048, 151936},
    {"E", 4096, 128256}};
const char *const bench_shape_names[] = {"A", "B", "C", "D", "E", NULL};
const char *const bench_mask_names[] = {"response", "fragmented", "packed-rl", NULL};

// ---- layout ------------------------------------------------------------------------------------

const sph_cli_opt sph_cli_layout_opts[] = {
    {"--tp", "T", SPH_OPT_I64, offsetof(layout_opts, tp), 1, INT64_MAX, 0, 0, NULL, 0,
     "tensor-parallel size (default 1)"},
    {"--cp", "C", SPH_OPT_I64, offsetof(layout_opts, cp), 1, INT64_MAX, 0, 0, NULL, 0,
     "context-parallel size (default 1)"},
    {"--fp8", "R", SPH_OPT_CHOICE, offsetof(layout_opts, fp8), 0, 0, 0, 0, sph_cli_fp8_names, 0,
     "FP8 recipe: none (default), blockwise, mxfp8"},
    SPH_CLI_OPT_END};

// ---- pack --------------------------------------------------------------------------------------

static const char *const k_pack_algos[] = {"ffd", "mffd", "balanced", NULL}; /* sph_pack_algo order */
const sph_cli_opt sph_cli_pack_opts[] = {
    {"--capacity", "N", SPH_OPT_COUNT, offsetof(pack_opts, capacity), 1, INT64_MAX, 0, 0, NULL, 0,
     "tokens per bin (required)"},
    {"--algorithm", "A", SPH_OPT_CHOICE, offsetof(pack_opts, algorithm), 0, 0, 0, 0, k_pack_algos, 0,
     "ffd (default): first-fit decreasing; mffd: Johnson & Garey's\n"
     "modified FFD; balanced: least-loaded, a sequence longer than N\n"
     "gets a bin of its own"},
    {"--tp", "T", SPH_OPT_I64, offsetof(pack_opts, tp), 1, INT64_MAX, 0, 0, NULL, 0,
     "tensor-parallel size (default 1)"},
    {"--cp", "C", SPH_OPT_I64, offsetof(pack_opts, cp), 1, INT64_MAX, 0, 0, NULL, 0,
     "context-parallel size (default 1)"},
    {"--fp8", "R", SPH_OPT_CHOICE, offsetof(pack_opts, fp8), 0, 0, 0, 0, sph_cli_fp8_names, 0,
     "FP8 recipe: none (default), blockwise, mxfp8"},
    {"--min-bins", "K", SPH_OPT_I64, offsetof(pack_opts, min_bins), 0, INT64_MAX, 0, 0, NULL, 0,
     "at least K bins"},
    {"--bin-multiple", "D", SPH_OPT_I64, offsetof(pack_opts, bin_multiple), 1, INT64_MAX, 0, 0,
     NULL, 0, "a multiple of D bins (the data-parallel size)"},
    SPH_CLI_OPT_END};

// ---- spans -------------------------------------------------------------------------------------

const sph_cli_opt sph_cli_spans_opts[] = {
    {"--tp", "T", SPH_OPT_I64, offsetof(spans_opts, tp), 1, INT64_MAX, 0, 0, NULL, 0,
     "tensor-parallel size (default 1)"},
    {"--cp", "C", SPH_OPT_I64, offsetof(spans_opts, cp), 1, INT64_MAX, 0, 0, NULL, 0,
     "context-parallel size (default 1)"},
    {"--cp-rank", "R", SPH_OPT_I64, offsetof(spans_opts, cp_rank), 0, INT64_MAX, 0, 0, NULL, 0,
     "this context-parallel rank, 0 <= R < C (default 0)"},
    {"--fp8", "R", SPH_OPT_CHOICE, offsetof(spans_opts, fp8), 0, 0, 0, 0, sph_cli_fp8_names, 0,
     "FP8 recipe: none (default), blockwise, mxfp8"},
    {"--gap", "G", SPH_OPT_I64, offsetof(spans_opts, gap), 0, INT64_MAX, 0, 0, NULL, 0,
     "merge active runs across at most G inactive rows (default 0:\n"
     "exact spans, which alone say which rows are active; a gap > 0 makes\n"
     "fewer spans that need the mask beside them)"},
    SPH_CLI_OPT_END};

// ---- tune --------------------------------------------------------------------------------------

static const char *const k_tune_dtypes[] = {"bf16", "f16", "f32", NULL};
#define O(f) offsetof(tune_opts, f)
const sph_cli_opt sph_cli_tune_opts[] = {
    {"--dtype", "bf16|f16|f32", SPH_OPT_CHOICE, O(dtype), 0, 0, 0, 0, k_tune_dtypes, 0, "(default bf16)"},
    {"--H", "N", SPH_OPT_COUNT, O(H), 1, INT32_MAX, 0, 0, NULL, 0, "hidden size (required)"},
    {"--V", "N", SPH_OPT_COUNT, O(V), 1, INT32_MAX, 0, 0, NULL, 0,
     "local vocabulary V_loc (required)"},
    {"--N", "16K,64K", SPH_OPT_COUNTS, O(N), 1, (int64_t)1 << 40, 0, 0, NULL, 0,
     "token counts, one tuned entry per power-of-two bucket\n(default 16K)"},
    {"--repeats", "N", SPH_OPT_I64, O(repeats), 1, 1000, 0, 0, NULL, 0,
     "timed repetitions per candidate (default 5)"},
    {"--cache", "PATH", SPH_OPT_STR, O(cache), 0, 0, 0, 0, NULL, 0,
     "tune cache (default $SPH_TUNE_CACHE, else\n"
     "$XDG_CACHE_HOME/spanhead/tune.json or ~/.cache/...)"},
    {"--device-id", "N", SPH_OPT_I64, O(device_id), 0, 1 << 16, 0, 0, NULL, 0,
     "CUDA device (default 0)"},
    {"--quiet", NULL, SPH_OPT_FLAG, O(quiet), 0, 0, 0, 0, NULL, 0,
     "no per-candidate timings on stderr"},
    SPH_CLI_OPT_END};
#undef O

// ---- bench -------------------------------------------------------------------------------------

static const char *const k_bench_devices[] = {"cpu", "cuda", NULL};
const char *const bench_dtype_names[] = {"bf16", "f16", "f32", NULL};
static const char *const k_bench_matrix[] = {"seed", NULL};
static const char *const k_bench_modes[] = {"general", "one-pass", "both", "policy", NULL};
#define O(f) offsetof(bopts, f)
const sph_cli_opt sph_cli_bench_opts[] = {
    {"--device", "cpu|cuda", SPH_OPT_CHOICE, O(device), 0, 0, 0, 0, k_bench_devices, 0,
     "(default cuda when a GPU is present, else cpu)"},
    {"--dtype", "bf16|f16|f32", SPH_OPT_CHOICE, O(dtype_opt), 0, 0, 0, 0, bench_dtype_names, 0,
     "(default bf16 on cuda, f32 on cpu)"},
    {"--shape", "A,B,C,D,E", SPH_OPT_CHOICES, O(shape_list), 0, 0, 0, 0, bench_shape_names, 0,
     "model shapes per rank at TP4 (A 2048x62080, B 4096x37984,\n"
     "C 5120x37984, D 2048x151936; E 4096x128256, a whole 128K\n"
     "vocabulary); default on cuda A,B (matrix: A-D)"},
    {"--H", "N", SPH_OPT_COUNT, O(H), 1, INT32_MAX, 0, 0, NULL, 0,
     "a custom shape instead, with --V (default on cpu: 256 x 4096)"},
    {"--V", "N", SPH_OPT_COUNT, O(V), 1, INT32_MAX, 0, 0, NULL, 0, "local vocabulary of the custom shape"},
    {"--N", "4K,16K,64K", SPH_OPT_COUNTS, O(N_list), 1, (int64_t)1 << 40, 0, 0, NULL, 0,
     "tokens per rank (default 4K,16K,64K on cuda, 1K on cpu)"},
    {"--matrix", "seed", SPH_OPT_CHOICE, O(matrix), 0, 0, 0, 0, k_bench_matrix, 0,
     "instead of the --shape x --N grid, the seed's matrix as\n"
     "per-rank work: each shape at TP4/CP2 with 16K..256K total\n"
     "tokens T (5 sizes), and at every (TP, CP), powers of two\n"
     "with TP*CP <= 8 (10 layouts), with T = 16K; N = T / CP,\n"
     "V_loc = 4 V / TP. 56 unique points (the seed says 58 but\n"
     "does not list them); JSON gains tp, cp, tokens (null on\n"
     "grid points)"},
    {"--list", NULL, SPH_OPT_FLAG, O(list), 0, 0, 0, 0, NULL, 0,
     "print the runs (point, mask, active, mode), run nothing"},
    {"--temperature-rows", NULL, SPH_OPT_FLAG, O(temp_rows), 0, 0, 0, 0, NULL, 0,
     "give every row its own temperature (seeded, uniform in\n"
     "[0.5, 1.5]) instead of the scalar 1: the cost of per-row\n"
     "temperature against the same run without it (JSON\n"
     "\"temperature_rows\": true); general and one-pass modes"},
    {"--active", "1,0.5,0.25", SPH_OPT_F64S, O(act_list), 0, 0, 0, 1, NULL, SPH_OPTF_GT,
     "active fractions in (0, 1] (default 1,0.5,0.25)"},
    {"--mask", "PATTERNS", SPH_OPT_CHOICES, O(mask_list), 0, 0, 0, 0, bench_mask_names, 0,
     "response,fragmented,packed-rl (default response):\n"
     "response: the last active*2048 rows of each 2048-row\n"
     "sequence; fragmented: runs of 16 active rows, evenly\n"
     "spaced; packed-rl: a packed RL batch from the library's\n"
     "metadata: prompts log-normal (median 512, sigma 1,\n"
     "clipped to [32, 4096] tokens), responses log-normal\n"
     "(median 768, sigma 1, [16, 8192]), concatenated until\n"
     "the T tokens are full (the last one cut), padded to the\n"
     "TP/CP sequence alignment, loss on response tokens, CP\n"
     "rank 0's rows; --active does not apply: it runs once\n"
     "and reports its own fraction (n_active / N)"},
    {"--seed", "N", SPH_OPT_I64, O(seed), 0, INT64_MAX, 0, 0, NULL, 0,
     "packed-rl length draws (default 1; same seed, same batch)"},
    {"--mode", "general|one-pass|both|policy", SPH_OPT_CHOICE, O(mode), 0, 0, 0, 0, k_bench_modes, 0,
     "(default both); policy: the fused RL policy loss next to the\n"
     "one-pass weighted loss and the general path + the loss on the\n"
     "host, same run (bench_policy.c)"},
    {"--repeats", "N", SPH_OPT_I64, O(repeats), 1, 1000, 0, 0, NULL, 0,
     "timed runs per point (default 5 on cuda, 3 on cpu)"},
    {"--warmup", "N", SPH_OPT_I64, O(warmup), 0, 1000, 0, 0, NULL, 0,
     "untimed runs first (default 2 on cuda, 1 on cpu)"},
    {"--chunk-bytes", "N", SPH_OPT_COUNT, O(chunk_bytes), 0, INT64_MAX, 0, 0, NULL, 0,
     "workspace budget (default the context's: on CUDA 1 GiB,\n"
     "4 GiB for the one-pass path)"},
    {"--topk", "K", SPH_OPT_I64, O(topk), 1, 256, 0, 0, NULL, 0,
     "time every point twice: as it is, then with the forward also\n"
     "writing the top-K ids and log-probs (the row's mode reads\n"
     "'+extras' with the extra time in %: issue 25's cost)"},
    {"--sum-p2", NULL, SPH_OPT_FLAG, O(sum_p2), 0, 0, 0, 0, NULL, 0,
     "the same with sum_p2 (with --topk: both in the second run)"},
    {"--gap", "N", SPH_OPT_I64, O(gap), 0, INT64_MAX, 0, 0, NULL, 0,
     "coalesce active runs across gaps of <= N rows into one\n"
     "span (default 0: exact spans; the CUDA backend gathers\n"
     "rows across spans, so coalescing only adds work)"},
    {"--json", "FILE", SPH_OPT_STR, O(json), 0, 0, 0, 0, NULL, 0,
     "JSON lines, one object per run (appended)"},
    {"--commit", "SHA", SPH_OPT_STR, O(commit), 0, 0, 0, 0, NULL, 0,
     "recorded in the JSON (default $SPH_COMMIT or unknown)"},
    {"--plot", "FILE.png", SPH_OPT_STR, O(plot), 0, 0, 0, 0, NULL, 0,
     "draw time against active fraction per shape, with the floors\n"
     "(bench/plot_bench.py; needs python3 and matplotlib, which\n"
     "scripts/setup.sh installs; without them the plot is skipped\n"
     "with a message)"},
    {"--peers", "FILE", SPH_OPT_STR, O(peers), 0, 0, 0, 0, NULL, 0,
     "with --plot: also draw the peers of bench/cuda/peers.py's\n"
     "peers.jsonl (same shapes and N)"},
    SPH_CLI_OPT_END};
#undef O

// ---- run ---------------------------------------------------------------------------------------

#define O(f) offsetof(run_opts, f)
const sph_cli_opt sph_cli_run_opts[] = {
    SPH_CLI_ROW_DEVICE(run_opts, "where to compute (default cpu)"),
    {"--N", "ROWS", SPH_OPT_COUNT, O(N), 1, INT64_MAX, 0, 0, NULL, 0, "tokens (rows of hidden)"},
    {"--H", "SIZE", SPH_OPT_COUNT, O(H), 1, INT64_MAX, 0, 0, NULL, 0, "hidden size"},
    {"--V", "ROWS", SPH_OPT_COUNT, O(V), 1, INT64_MAX, 0, 0, NULL, 0,
     "local vocabulary rows (V_loc); --N, --H and --V go together"},
    {"--vocab-total", "V", SPH_OPT_COUNT, O(V_total), 1, INT64_MAX, 0, 0, NULL, 0,
     "full vocabulary (default V_loc)"},
    {"--vocab-start", "v0", SPH_OPT_I64, O(v0), 0, INT64_MAX, 0, 0, NULL, 0,
     "first id of this shard (default 0)"},
    {"--dtype", "f32|bf16|f16", SPH_OPT_CHOICE, O(dtype), 0, 0, 0, 0, sph_cli_run_dtype_names, 0,
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
    SPH_CLI_ROW_SOFTCAP(run_opts),
    SPH_CLI_ROW_TEMPERATURE(run_opts),
    {"--one-pass", NULL, SPH_OPT_FLAG, O(one_pass), 0, 0, 0, 0, NULL, 0,
     "gradients from the forward sweep (no recompute)"},
    {"--support", "K", SPH_OPT_I64, O(K), 1, INT64_MAX, 0, 0, NULL, 0,
     "sample-support mode with K candidates per row (K <= vocabulary)"},
    {"--sum-p2", NULL, SPH_OPT_FLAG, O(sum_p2), 0, 0, 0, 0, NULL, 0,
     "also compute sum_j p_ij^2 per row (sum_p2.npy; no gradient)"},
    {"--topk", "K", SPH_OPT_I64, O(topk), 1, 256, 0, 0, NULL, 0,
     "also compute the K most probable ids of each row and their\n"
     "log-probs (topk_ids.npy int64, topk_logprobs.npy; K <= 256 and\n"
     "<= the vocabulary; no gradient)"},
    {"--seed", "S", SPH_OPT_I64, O(seed), 0, INT64_MAX, 0, 0, NULL, 0,
     "synthetic data seed (default 1)"},
    SPH_CLI_ROW_THREADS(run_opts),
    {"--repeats", "R", SPH_OPT_I64, O(repeats), 1, 1000, 0, 0, NULL, 0,
     "timed runs after a warm-up, median reported (default 3)"},
    SPH_CLI_ROW_KERNEL(run_opts),
    {"--check", NULL, SPH_OPT_FLAG, O(check), 0, 0, 0, 0, NULL, 0,
     "compare what was computed with the float64 reference; exit 1 if\n"
     "off (normwise 1e-4 for f32; the entropy and the gradients also get\n"
     "the budget of fp32 logits' rounding, which 1/T amplifies). Without\n"
     "an upstream gradient there is no backward: the check covers the\n"
     "forward outputs and says so"},
    {"--inputs", "DIR", SPH_OPT_STR, O(inputs), 0, 0, 0, 0, NULL, 0,
     "read hidden.npy weight.npy targets.npy and optional mask.npy\n"
     "dlogprob.npy dentropy.npy dlse.npy dlogit_mean.npy\n"
     "candidates.npy temperature.npy (bf16 data: uint16 .npy plus\n"
     "--dtype bf16); temperature.npy (<f4 (N)) gives each row its own\n"
     "temperature and excludes --temperature; the backward runs when\n"
     "an upstream gradient is given"},
    {"--outputs", "DIR", SPH_OPT_STR, O(outputs), 0, 0, 0, 0, NULL, 0,
     "write logprob entropy lse logit_mean dhidden dweight sum_p2\n"
     "topk_logprobs topk_ids .npy (what\n"
     "was computed): all at once after the run (and --check) succeeded,\n"
     "or none"},
    SPH_CLI_ROW_JSON(run_opts),
    SPH_CLI_OPT_END};
#undef O

// ---- dist --------------------------------------------------------------------------------------

static const char *const k_dist_dtypes[] = {"f32", "bf16", NULL};
static const char *const k_dist_masks[] = {"rl", "dense", NULL};
static const char *const k_dist_packs[] = {"ffd", "mffd", "balanced", NULL}; /* sph_pack_algo order */
static const char *const k_dist_refs[] = {"ref", "device", NULL};
static const char *const k_dist_dh[] = {"allreduce", "partial", NULL};
#define O(f) offsetof(dopts, f)
const sph_cli_opt sph_cli_dist_opts[] = {
    {"--tp", "T", SPH_OPT_I64, O(tp), 1, 1 << 20, 0, 0, NULL, 0,
     "tensor-parallel size (default 1); T*C*D must equal the world size"},
    {"--cp", "C", SPH_OPT_I64, O(cp), 1, 1 << 20, 0, 0, NULL, 0, "context-parallel size (default 1)"},
    {"--dp", "D", SPH_OPT_I64, O(dp), 1, 1 << 20, 0, 0, NULL, 0, "data-parallel size (default 1)"},
    SPH_CLI_ROW_DEVICE(dopts, "cuda: one GPU per rank, NCCL communicator (default cpu)"),
    {"--inputs", "DIR", SPH_OPT_STR, O(inputs), 0, 0, 0, 0, NULL, 0,
     "rank 0 reads DIR/{hidden,weight,targets}.npy and optionally\n"
     "mask, lengths, dlogprob, dentropy, dlse, dlogit_mean,\n"
     "candidates .npy (absent gradients are 0; bf16 data as\n"
     "uint16 .npy with --dtype bf16)"},
    {"--outputs", "DIR", SPH_OPT_STR, O(outputs), 0, 0, 0, 0, NULL, 0,
     "rank 0 writes logprob, entropy, lse, logit_mean, dhidden,\n"
     "dweight (topk_ids, topk_logprobs) .npy, the files of a\n"
     "single-process run (all or none)"},
    {"--seqs", "N", SPH_OPT_I64, O(seqs), 1, 1 << 24, 0, 0, NULL, 0,
     "synthetic batch: N ragged sequences (default 8)"},
    {"--min-len", "A", SPH_OPT_I64, O(min_len), 1, 1 << 24, 0, 0, NULL, 0,
     "shortest sequence (default 3)"},
    {"--max-len", "B", SPH_OPT_I64, O(max_len), 1, 1 << 24, 0, 0, NULL, 0,
     "longest sequence (default 40)"},
    {"--hidden", "H", SPH_OPT_I64, O(H), 1, 1 << 24, 0, 0, NULL, 0, "hidden size (default 24)"},
    {"--vocab", "V", SPH_OPT_I64, O(V), 1, 1 << 30, 0, 0, NULL, 0, "vocabulary (default 203)"},
    {"--mask", "rl|dense", SPH_OPT_CHOICE, O(mask), 0, 0, 0, 0, k_dist_masks, 0,
     "rl: prompt rows and holes masked out (default); dense: all"},
    {"--support", "K", SPH_OPT_I64, O(K), 0, 1 << 20, 0, 0, NULL, 0,
     "sample-support run with K candidates per row (0 = full vocab)"},
    {"--topk", "K", SPH_OPT_I64, O(topk), 1, 256, 0, 0, NULL, 0,
     "also the K most probable ids of each row and their log-probs,\n"
     "merged over the TP group (topk_ids.npy, topk_logprobs.npy)"},
    {"--sum-p2", NULL, SPH_OPT_FLAG, O(sum_p2), 0, 0, 0, 0, NULL, 0,
     "also sum_j p_ij^2 of each row, combined over the TP group\n"
     "(sum_p2.npy)"},
    {"--seed", "S", SPH_OPT_I64, O(seed), 0, INT64_MAX, 0, 0, NULL, 0, "(default 1)"},
    {"--dtype", "f32|bf16", SPH_OPT_CHOICE, O(dtype), 0, 0, 0, 0, k_dist_dtypes, 0,
     "input dtype (default f32)"},
    SPH_CLI_ROW_TEMPERATURE(dopts),
    {"--capacity", "N", SPH_OPT_COUNT, O(capacity), 1, INT64_MAX, 0, 0, NULL, 0,
     "tokens per bin (default: about two bins per DP rank)"},
    {"--pack", "ffd|mffd|balanced", SPH_OPT_CHOICE, O(pack), 0, 0, 0, 0, k_dist_packs, 0,
     "bin packing algorithm (default ffd)"},
    {"--gap", "G", SPH_OPT_I64, O(gap), 0, INT64_MAX, 0, 0, NULL, 0,
     "span coalescing gap (default 0: exact spans)"},
    SPH_CLI_ROW_KERNEL(dopts),
    {"--atol", "a", SPH_OPT_F64, O(atol), 0, 0, 0, 1e30, NULL, 0,
     "pass if |got - ref| <= a + r |ref| (1e-4; bf16 on cuda 2e-2)"},
    {"--rtol", "r", SPH_OPT_F64, O(rtol), 0, 0, 0, 1e30, NULL, 0, "(see --atol)"},
    {"--dhidden", "allreduce|partial", SPH_OPT_CHOICE, O(dhidden), 0, 0, 0, 0, k_dist_dh, 0,
     "allreduce: the head sums dhidden over the TP group\n"
     "(allreduce_dhidden, default); partial: each rank keeps its\n"
     "shard's partial and rank 0 sums the gathered partials"},
    {"--reference", "ref|device", SPH_OPT_CHOICE, O(reference), 0, 0, 0, 0, k_dist_refs, 0,
     "what rank 0 compares with: the float64 reference kernels on\n"
     "the CPU (default), or one process on the ranks' device and\n"
     "kernels without a communicator (the single-GPU result)"},
    {"--one-pass", NULL, SPH_OPT_FLAG, O(one_pass), 0, 0, 0, 0, NULL, 0,
     "gradients in the forward sweep (one combine per chunk of\n"
     "rows) instead of a separate backward"},
    {"--chunk-rows", "N", SPH_OPT_I64, O(chunk_rows), 1, INT64_MAX, 0, 0, NULL, 0,
     "rows per chunk on the ranks (default: automatic)"},
    {"--no-check", NULL, SPH_OPT_FLAG, O(no_check), 0, 0, 0, 0, NULL, 0,
     "skip the reference (timing or output only)"},
    {"--bench", "R", SPH_OPT_I64, O(bench), 1, 100000, 0, 0, NULL, 0,
     "time forward and backward of each rank's first bin R times,\n"
     "with and without the TP collectives (their share)"},
    SPH_CLI_OPT_END};
#undef O
