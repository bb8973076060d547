#!/usr/bin/env python3
"""spanhead against its peers, side by side, in one run on one GPU.

Per point (model shape, N tokens, active fraction, mask pattern) it builds random bf16 hidden
[N, H] and weight [V, H] (std chosen so logits have std --logit-std), random targets and a
loss mask, then times one training step (forward + backward, gradients w.r.t. hidden and
weight) of every implementation on the same tensors.

--mode logprob (default): the loss is the sum of the masked log-probs (upstream gradient 1 on
active rows, 0 elsewhere):

  spanhead     spanhead.torch.logprobs(hidden, weight, targets, loss_mask=<device mask>,
               spans=<host spans>): the general path (statistics in the forward, logits
               recomputed in the backward: 8 N_active H V flops), active rows only
  spanhead-onepass  spanhead.torch.weighted_logprob_loss(hidden, weight, targets, -1, ...,
               return_logprobs=True): the same loss in spanhead's one-pass mode (dhidden and
               dweight in the forward's sweep, 6 N_active H V flops)
  torch-eager  logits = h @ W.T (bf16) -> float -> log_softmax -> gather, times the mask
  liger-sum    liger-kernel (Triton) LigerFusedLinearCrossEntropyFunction, reduction "sum",
               ignore_index -100 on inactive rows (gradients computed inside the forward)
  liger-none   the same with reduction "none" (per-token losses; gradients in the backward)
  cce          cut-cross-entropy linear_cross_entropy, impl "cce", reduction "none"
  cce-exact    the same, impl "cce_exact" (filter_eps=None where that impl name is absent)
  verl         verl's Triton fused log-prob kernel (verl/utils/kernel), every row computed
  quack        quack-kernels chunked_linear_cross_entropy (CuTe DSL), reduction "sum",
               ignore_index -100 on inactive rows, tuned=False (see --quack-tuned)
  quack-compact  the same on hidden.index_select(0, active_rows): the gather, and through
               autograd the scatter-add of its gradient, inside the timed step
  liger-cute   liger-kernel's Hopper CuTe DSL kernel, liger_kernel.ops.cutedsl.ops.
               fused_linear_cross_entropy_sm90 (LigerFusedLinearCrossEntropySM90Function),
               reduction "sum", ignore_index -100; needs M % 128 == 0 and V % 256 == 0
  liger-cute-compact  the same on the gathered active rows (padded to 128 rows)

--mode policy (issue 14): the loss is a PPO/GRPO clipped policy loss, token-mean over the
active rows, with per-sequence advantages and old log-probs near the current ones:

  spanhead+torch    spanhead.torch.logprobs (general path) + the loss written in torch
  spanhead-policy   spanhead.torch.policy_loss (fused: the gradient in the forward's sweep)
  spanhead-onepass  weighted_logprob_loss with REINFORCE weights A_i / T: the same sweep's
                    cost with a gradient known in advance (a timing reference, no check)
  torch-eager-policy  eager logits + log_softmax + the same torch loss
  liger-grpo        liger-kernel's LigerFusedLinearGRPOLoss (chunked torch), loss_type
                    "dapo" (= token-mean), beta 0

and measures the dense cuBLAS bf16 GEMM rate at the shape (h[N,H] @ W.T[H,V], median), from
which floor_ms = 8 N_active H V / rate (the general path's flops) and floor_onepass_ms =
6 N_active H V / rate (the one-pass mode's); every row carries ratio = ms / floor_ms,
ratio_onepass = ms / floor_onepass_ms, and vs_best_peer = ms / (fastest peer's ms at that
point, compacted peers included).

Every peer's per-row log-probs (or their sum, or the policy loss) are compared with
spanhead's on the active rows and its gradients with spanhead's (relative Frobenius error);
above 5e-2 is flagged, so a broken peer call shows. Peak extra memory = max_memory_allocated
during the timed reps minus what was allocated before them minus the two gradient outputs.
first_call_s is the wall time of the first call (JIT compilation, autotuning, torch.compile),
kept out of ms.

A peer that is not importable, cannot run a shape, fails or runs out of memory is skipped with
a message; the run never stops for one. A CUDA fault that leaves the context unusable ends the
run after the results so far are written. --budget-s bounds the run. --dry-run checks the
arguments, the peers' imports and call signatures, then runs the harness on the CPU at a tiny
shape (GPU-only peers skipped with the reason). See bench/cuda/README-peers.md.
"""

import argparse
import datetime
import json
import math
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

# the parts live in peerlib/ beside this file (importable however this file is run or loaded);
# pad_rows, quack_plan, packed_rl_batch, packed_rl_mask and spans_of are imported for
# python/tests/test_bench_peers.py, which reaches the parts through this module
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from peerlib.common import GIB, MODE_IMPLS, PeerSkip, REF_ORDER, REPO, SEQ, _LOG, log  # noqa: E402
from peerlib.cli import build_parser, make_points  # noqa: E402
from peerlib.loaders import check_apis, load_all, version_of  # noqa: E402
from peerlib.steps import make_step, pad_rows, quack_plan  # noqa: E402,F401
from peerlib.inputs import (Timer, cuda_alive, gemm_rate, is_oom, make_inputs,  # noqa: E402
                            measure, packed_rl_batch, packed_rl_mask, spans_of)  # noqa: F401
from peerlib.report import (annotate_point, commit_hash, final_table, fmt,  # noqa: E402
                            write_md, write_plot)


# ----------------------------------------------------------------------------------------


def estimate_cost(point_cost, shape, N):
    """Seconds a point is expected to take: measured at this (shape, N), else scaled by N
    from the same shape, else half the longest point so far."""
    if (shape, N) in point_cost:
        return point_cost[(shape, N)]
    same = [c * N / n for (s, n), c in point_cost.items() if s == shape]
    if same:
        return max(same)
    return 0.5 * max(point_cost.values(), default=0.0)


def run_grid(args, t_start, loaded, unavailable, out):
    """Measures every point; returns the exit code."""
    import torch
    points = make_points(args)
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    if cuda and not torch.cuda.is_available():
        log("# no CUDA device: use --device cpu for a harness test")
        return 2
    if cuda:
        if dev.index is None:        # set_device and the memory stats want an index
            dev = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(dev)
        props = torch.cuda.get_device_properties(dev)
        gpu = f"cuda {props.name} sm_{props.major}{props.minor} SMs={props.multi_processor_count}"
    else:
        gpu = "cpu"
    out.mkdir(parents=True, exist_ok=True)
    meta = {"gpu": gpu, "date": datetime.datetime.now(datetime.timezone.utc)
            .strftime("%Y-%m-%dT%H:%M:%SZ"), "commit": commit_hash(),
            "torch": torch.__version__, "triton": version_of("triton"),
            "python": sys.version.split()[0], "mode": args.mode,
            "clip": f"{args.clip_low}/{args.clip_high}",
            "versions": {k: v[1] for k, v in loaded.items()},
            "unavailable": dict(unavailable), "gemm": {},
            "dtype": "bf16" if cuda else "f32"}
    if _LOG:
        _LOG.pop().close()
    _LOG.append(open(out / "peers.log", "w"))
    log(f"# {gpu}, torch {meta['torch']}, triton {meta['triton']}, commit {meta['commit']}, "
        f"mode {args.mode}")
    jsonl = open(out / "peers.jsonl", "w")
    records, notes = [], []
    timer = Timer(cuda)
    try:
        fatal = measure_points(args, points, t_start, loaded, unavailable, meta, out, jsonl,
                               records, notes, timer, cuda, dev, gpu)
    except KeyboardInterrupt:    # `timeout -s INT`: keep what was measured, write it all
        notes.append(f"interrupted after {time.monotonic() - t_start:.0f} s (SIGINT)")
        log(f"# {notes[-1]}")
        fatal = "interrupted"
    jsonl.close()
    meta["unavailable"] = dict(unavailable)
    notes.append(f"run took {time.monotonic() - t_start:.0f} s")
    write_md(out / "peers.md", meta, records, notes)
    try:
        write_plot(out / "peers.png", records)
    except Exception as e:  # noqa: BLE001
        log(f"# plot failed: {type(e).__name__}: {e}")
    log(f"# wrote {out / 'peers.md'}, {out / 'peers.jsonl'}, {out / 'peers.png'}")
    log(final_table(records, args.mode))
    return 3 if fatal else 0


def measure_points(args, points, t_start, loaded, unavailable, meta, out, jsonl, records,
                   notes, timer, cuda, dev, gpu):
    """The grid's loop: records and files grow after every point. Returns the fatal message
    that stopped it, or None."""
    import torch
    dead = set(unavailable)       # impls not run any more
    failures = {}                 # impl: count of non-OOM failures (2 make it dead)
    point_cost = {}
    rates = {}
    fatal = None
    task = "logprob-sum" if args.mode == "logprob" else "policy-ppo-token-mean"

    def emit(rec):
        keys = ("gpu", "date", "commit", "shape", "H", "V_local", "N", "active", "mask",
                "mode", "impl", "dtype", "ms", "floor_ms", "ratio", "peak_extra_bytes")
        obj = {k: rec.get(k) for k in keys}
        obj.update({k: v for k, v in rec.items() if k not in obj})
        for k, v in obj.items():     # strict JSON: no NaN / Infinity
            if isinstance(v, float) and not math.isfinite(v):
                obj[k] = None
                obj["nonfinite"] = obj.get("nonfinite", []) + [k]
        jsonl.write(json.dumps(obj) + "\n")
        jsonl.flush()

    for pi, (shape, H, V, N, frac, mask) in enumerate(points):
        spent = time.monotonic() - t_start
        est = estimate_cost(point_cost, shape, N)
        if spent + est > args.budget_s:
            left = [f"{p[0]}/N{p[3]}/{p[4] if p[4] is not None else ''}/{p[5]}"
                    for p in points[pi:]]
            notes.append(f"budget {args.budget_s:.0f} s spent after {spent:.0f} s: "
                         f"{len(left)} points not run ({', '.join(left)})")
            log(f"# {notes[-1]}")
            break
        t_pt = time.monotonic()
        log(f"# point {pi + 1}/{len(points)}: {shape} H {H} V {V} N {N} active "
            f"{frac if frac is not None else 'batch'} {mask} (t = {spent:.0f} s)")
        try:
            P = make_inputs(H, V, N, frac, mask, args, dev)
        except Exception as e:  # noqa: BLE001
            notes.append(f"{shape} N {N} {mask}: inputs could not be built "
                         f"({type(e).__name__}: {e})")
            log(f"# {notes[-1]}")
            if cuda:
                torch.cuda.empty_cache()
            continue
        n_act = P["n_act"]
        if P.get("mask_how"):
            log(f"#   packed-rl: {n_act} of {N} rows active, {len(P['spans'])} spans "
                f"({P['mask_how']})")
        rkey = (shape, N)
        if rkey not in rates:
            try:
                rates[rkey] = gemm_rate(P["h"].detach(), P["w"].detach(), timer)
                meta["gemm"][f"{shape} N {N} ({N}x{H} @ {H}x{V})"] = rates[rkey]
                log(f"#   dense GEMM {rates[rkey] / 1e12:.1f} TFLOP/s")
            except Exception as e:  # noqa: BLE001
                rates[rkey] = None
                notes.append(f"{shape} N {N}: GEMM rate failed ({type(e).__name__}: {e})")
            if cuda:
                torch.cuda.empty_cache()
        rate = rates[rkey]
        floor_ms = 8.0 * n_act * H * V / rate * 1e3 if rate else None
        base = {"gpu": gpu, "date": meta["date"], "commit": meta["commit"], "shape": shape,
                "H": H, "V_local": V, "N": N, "active": n_act / N,
                "active_target": frac if frac is not None else round(n_act / N, 4),
                "n_active": n_act, "mask": mask, "mode": "general", "task": task,
                "dtype": "bf16" if cuda else "f32", "floor_ms": floor_ms,
                "floor_onepass_ms": 0.75 * floor_ms if floor_ms else None}
        ref = None
        sp_ms = None
        first = REF_ORDER[args.mode]
        order = [i for i in first if i in args.impls] + \
                [i for i in args.impls if i not in first]
        point_recs = []
        for impl in order:
            rec = dict(base, impl=impl)
            if impl in ("spanhead-onepass", "spanhead-policy"):
                rec["mode"] = "one-pass"
            if impl in dead:   # listed once in the header with the reason, no rows
                continue
            step = None
            try:
                step, extra = make_step(impl, loaded, P, args, cuda)
                rec.update({k: v for k, v in extra.items() if k != "check"})
                r, lp, loss = measure(impl, step, P,
                                      None if extra.get("check") else ref, timer, args, cuda)
                rec.update(r)
                if extra.get("check"):
                    rec["check"] = extra["check"]
                rec["ratio"] = rec["ms"] / floor_ms if floor_ms else None
                rec["ratio_onepass"] = rec["ms"] / (0.75 * floor_ms) if floor_ms else None
                # the checks' reference: the first of REF_ORDER that ran
                if ref is None and impl in first and not extra.get("check"):
                    ref = {"lp": None if lp is None or lp.dim() == 0 else lp.float(),
                           "loss": loss, "dh": P["h"].grad, "dw": P["w"].grad, "impl": impl}
                    if impl == first[0]:
                        sp_ms = rec["ms"]
                rec["speedup"] = rec["ms"] / sp_ms if sp_ms else None
                if ref is not None and impl != ref["impl"]:
                    rec["check_ref"] = ref["impl"]
                del lp, loss
            except PeerSkip as e:
                rec.update(ms=None, ratio=None, peak_extra_bytes=None, status=f"skipped: {e}")
                log(f"#   {impl}: skipped: {e}")
                P["h"].grad = P["w"].grad = None
            except Exception as e:  # noqa: BLE001 - a failing peer is skipped, never fatal
                oom = cuda and is_oom(e)
                text = str(e).strip().splitlines()[0] if str(e).strip() else ""
                if not text:     # a bare assert: say where
                    fr = traceback.extract_tb(e.__traceback__)[-1]
                    text = f"at {Path(fr.filename).name}:{fr.lineno}: {fr.line}"
                msg = ("OOM" if oom else f"failed: {type(e).__name__}: {text}")[:300]
                rec.update(ms=None, ratio=None, peak_extra_bytes=None, status=msg)
                log(f"#   {impl}: {msg}")
                if not oom:
                    tb = traceback.format_exc().strip().splitlines()
                    log("#     " + "\n#     ".join(tb[-6:]))
                    failures[impl] = failures.get(impl, 0) + 1
                    if failures[impl] >= 2:   # a bug in the call: don't repeat it everywhere
                        dead.add(impl)
                        unavailable[impl] = f"failed twice, last: {msg}"
                P["h"].grad = P["w"].grad = None
                if cuda and not cuda_alive():
                    fatal = f"CUDA context unusable after {impl} at {shape} N {N}: {msg}"
            finally:
                step = None
            point_recs.append(rec)
            if rec.get("ms") is not None:
                diff = rec.get("loss_diff") if rec.get("loss_diff") is not None \
                    else rec.get("logp_diff")
                log(f"#   {impl:18s} {rec['ms']:9.3f} ms  r8 {fmt(rec.get('ratio'), '.3f')}"
                    f" r6 {fmt(rec.get('ratio_onepass'), '.3f')}  first "
                    f"{rec['first_call_s']:.1f} s  peak extra "
                    f"{fmt(None if rec.get('peak_extra_bytes') is None else rec['peak_extra_bytes'] / GIB, '.3f')} GiB"
                    f"  diff {fmt(diff, '.1e')} grad {fmt(rec.get('grad_relerr'), '.1e')}"
                    f" {rec.get('flag', '')}{' ' + rec['notes'] if rec.get('notes') else ''}")
            if cuda and fatal is None:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
            if fatal:
                break
        annotate_point(point_recs)
        for rec in point_recs:
            records.append(rec)
            emit(rec)
        ref = P = None
        if cuda and fatal is None:
            torch.cuda.empty_cache()
        point_cost[(shape, N)] = max(point_cost.get((shape, N), 0.0), time.monotonic() - t_pt)
        meta["unavailable"] = dict(unavailable)
        write_md(out / "peers.md", meta, records, notes)
        if fatal:
            notes.append(fatal)
            log(f"# {fatal}: stopping")
            break
    return fatal


def main(argv=None):
    t_start = time.monotonic()
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.budget_s <= 0 or args.target_s <= 0 or args.logit_std <= 0 or args.gap < 0:
        parser.error("--budget-s, --target-s, --logit-std must be > 0, --gap >= 0")
    if not (0.0 <= args.clip_low <= 1.0) or args.clip_high < 0 or args.old_noise < 0:
        parser.error(f"--clip-low {args.clip_low} must be in [0, 1], --clip-high "
                     f"{args.clip_high} and --old-noise {args.old_noise} >= 0")
    if args.impls is None:
        args.impls = list(MODE_IMPLS[args.mode])
    wrong = [i for i in args.impls if i not in MODE_IMPLS[args.mode]]
    if wrong:
        parser.error(f"--impls {','.join(wrong)}: not in --mode {args.mode} (its impls: "
                     f"{','.join(MODE_IMPLS[args.mode])})")
    points = make_points(args)
    out = Path(args.out or os.environ.get("OUT") or
               REPO / "bench" / "results" / f"peers-{datetime.date.today().isoformat()}")
    log(f"# peers.py: mode {args.mode}, {len(points)} points x {len(args.impls)} impls, "
        f"budget {args.budget_s:.0f} s, out {out if not args.dry_run else '(dry run)'}")

    try:
        import torch  # noqa: F401
    except ImportError as e:
        log(f"# torch not importable ({e}): nothing can be measured")
        if args.dry_run:
            for p in points:
                log(f"  point {p}")
            return 0
        return 2
    loaded, unavailable = load_all(args.impls)
    if not args.dry_run:
        return run_grid(args, t_start, loaded, unavailable, out)

    for p in points:
        log(f"  point shape {p[0]} H {p[1]} V {p[2]} N {p[3]} active "
            f"{p[4] if p[4] is not None else 'batch'} mask {p[5]}")
    log(f"# dry run: importable {sorted(loaded)}, unavailable {unavailable}")
    bad = 0
    for name, status in check_apis(loaded):
        log(f"# api {name}: {status}")
        bad += status.startswith("missing")
    # the harness on the CPU at a tiny shape: inputs, masks, every step's call, the checks
    tiny = argparse.Namespace(**vars(args))
    tiny.device, tiny.shapes, tiny.N = "cpu", [("tiny", 64, 512)], [2 * SEQ]
    tiny.fractions = [0.5]
    tiny.reps, tiny.warmup, tiny.target_s, tiny.budget_s = 3, 1, 0.01, 600.0
    tmp = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="peers-dry-"))
    log(f"# dry run: the harness on the CPU at H 64, V 512, N {2 * SEQ}, active 0.5 "
        f"({','.join(args.masks)}) into {tmp}")
    rc = run_grid(tiny, time.monotonic(), loaded, dict(unavailable), tmp)
    return rc or (4 if bad else 0)


if __name__ == "__main__":
    sys.exit(main())
