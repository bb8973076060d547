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
import importlib
import importlib.util
import inspect
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHAPES = {"A": (2048, 62080), "B": (4096, 37984), "C": (5120, 37984), "D": (2048, 151936),
          "E": (4096, 128256)}
# Peers that compute their gradients inside the forward, so need the upstream gradient before
# it (a scalar here): not usable where the loss needs the log-probs first (PPO/GRPO ratios).
ONE_PASS_PEERS = {"liger-sum", "quack", "quack-compact", "liger-cute", "liger-cute-compact"}
COMPACT = {"quack-compact", "liger-cute-compact"}
CUTE_PEERS = {"quack", "quack-compact", "liger-cute", "liger-cute-compact"}
TRITON_PEERS = {"liger-sum", "liger-none", "cce", "cce-exact", "verl"}

LOGPROB_IMPLS = ["spanhead", "spanhead-onepass", "torch-eager", "liger-sum", "liger-none",
                 "cce", "cce-exact", "verl", "quack", "quack-compact", "liger-cute",
                 "liger-cute-compact"]
POLICY_IMPLS = ["spanhead+torch", "spanhead-policy", "spanhead-onepass", "torch-eager-policy",
                "liger-grpo"]
IMPLS = LOGPROB_IMPLS + [i for i in POLICY_IMPLS if i not in LOGPROB_IMPLS]
MODE_IMPLS = {"logprob": LOGPROB_IMPLS, "policy": POLICY_IMPLS}
# the references of the checks, in order of preference, run first
REF_ORDER = {"logprob": ("spanhead", "torch-eager", "spanhead-onepass"),
             "policy": ("spanhead+torch", "torch-eager-policy", "spanhead-policy")}
MASKS = ["response", "fragmented", "packed-rl"]
CHECK_TOL = 5e-2
POLICY_LOSS_TOL = 1e-2   # |loss - reference loss|, absolute (the loss is a token mean, O(0.1))
SEQ = 2048        # response masks: the last active*SEQ rows of each SEQ-row sequence
FRAG_RUN = 16     # fragmented masks: runs of 16 active rows, evenly spaced (as spanhead bench)
GIB = float(1 << 30)
QUACK_ROW_ALIGN = 8      # quack's base pipeline asserts M % 8 == 0
QUACK_SE_ALIGN = 128     # its scaled-exp pipeline pads each chunk to 128 rows


_LOG = []   # the open log file, once the output folder exists


def log(msg):
    print(msg, flush=True)
    if _LOG:
        _LOG[0].write(msg + "\n")
        _LOG[0].flush()


class PeerSkip(Exception):
    """A peer that cannot run this point by design (a shape it rejects, no GPU): a
    'skipped: ...' row, not a failure."""


# ----------------------------------------------------------------------------------------
# Arguments


def parse_list(text, conv, what):
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        try:
            out.append(conv(item))
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"{what}: {item!r}: {e}") from None
    if not out:
        raise argparse.ArgumentTypeError(f"{what}: empty list")
    return out


def shape_arg(item):
    """A, B, C, D, E or HxV (a custom shape, named by itself)."""
    if item.upper() in SHAPES:
        return (item.upper(),) + SHAPES[item.upper()]
    parts = item.lower().split("x")
    if len(parts) != 2:
        raise ValueError("expected A, B, C, D, E or HxV (e.g. 4096x32000)")
    H, V = int(parts[0]), int(parts[1])
    if H <= 0 or V <= 0:
        raise ValueError("H and V must be positive")
    return (item, H, V)


def positive_int(item):
    v = int(item)
    if v <= 0:
        raise ValueError("must be a positive integer")
    return v


def fraction(item):
    v = float(item)
    if not 0.0 < v <= 1.0:
        raise ValueError("must be in (0, 1]")
    return v


def impl_arg(item):
    if item not in IMPLS:
        raise ValueError(f"expected one of {', '.join(IMPLS)}")
    return item


def mask_arg(item):
    if item not in MASKS:
        raise ValueError(f"expected one of {', '.join(MASKS)}")
    return item


def build_parser():
    p = argparse.ArgumentParser(
        description="spanhead vs peers (PyTorch eager, liger-kernel Triton and CuTe DSL, "
                    "cut-cross-entropy, verl kernel, QuACK): one training step's time, floor "
                    "ratios, memory, value checks.")
    p.add_argument("--mode", choices=["logprob", "policy"], default="logprob",
                   help="logprob: loss = sum of the masked log-probs (default); policy: a "
                        "PPO/GRPO clipped loss, token-mean (issue 14)")
    p.add_argument("--shapes", default="A,B,C,D,E",
                   type=lambda s: parse_list(s, shape_arg, "--shapes"),
                   help="model shapes per rank: A (2048x62080), B (4096x37984), "
                        "C (5120x37984), D (2048x151936), E (4096x128256), or HxV; "
                        "default A,B,C,D,E")
    p.add_argument("--N", default="16384", type=lambda s: parse_list(s, positive_int, "--N"),
                   help="tokens per point, comma list (default 16384)")
    p.add_argument("--fractions", default="1.0,0.5,0.25",
                   type=lambda s: parse_list(s, fraction, "--fractions"),
                   help="active fractions (default 1.0,0.5,0.25)")
    p.add_argument("--masks", default="response,fragmented",
                   type=lambda s: parse_list(s, mask_arg, "--masks"),
                   help="mask patterns: response (the last part of each 2048-row sequence), "
                        "fragmented (runs of 16 rows; not run at 1.0, where it equals "
                        "response), packed-rl (a packed RL batch as spanhead bench builds it; "
                        "its active fraction is what the batch gives, once per shape and N); "
                        "default response,fragmented")
    p.add_argument("--impls", default=None,
                   type=lambda s: parse_list(s, impl_arg, "--impls"),
                   help="implementations (default: every one of the mode: logprob "
                        f"{','.join(LOGPROB_IMPLS)}; policy {','.join(POLICY_IMPLS)})")
    p.add_argument("--budget-s", type=float, default=240.0,
                   help="wall-clock budget in seconds, imports included (default 240); no "
                        "point is started that would likely end past it")
    p.add_argument("--reps", type=positive_int, default=10,
                   help="most timed repetitions per impl and point (default 10; at least 3)")
    p.add_argument("--target-s", type=float, default=0.3,
                   help="timed seconds aimed at per impl and point: reps = clamp(target / "
                        "one call, 3, --reps) (default 0.3)")
    p.add_argument("--warmup", type=positive_int, default=1,
                   help="untimed calls before timing (compilation, autotuning); default 1")
    p.add_argument("--logit-std", type=float, default=2.0,
                   help="standard deviation of the random logits (default 2.0)")
    p.add_argument("--gap", type=int, default=0,
                   help="spanhead span coalescing gap in rows (default 0: exact spans, as "
                        "spanhead bench)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--packed-seed", type=int, default=1,
                   help="packed-rl length draws (default 1: spanhead bench's --seed default, "
                        "so both lay out the same batch at the same N)")
    p.add_argument("--device", default="cuda",
                   help="cuda, cuda:N, or cpu (cpu: a harness test with tiny shapes only)")
    p.add_argument("--order", choices=["priority", "shape"], default="priority",
                   help="point order: priority (response 0.5, 1.0, 0.25 over every shape, "
                        "then packed-rl, then fragmented), or shape (shape by shape); default "
                        "priority")
    p.add_argument("--quack-chunk", type=positive_int, default=4096,
                   help="QuACK's chunk_size (default 4096, its default); where its scaled-exp "
                        "pipeline would run a chunk of exactly H rows (its dx epilogue then "
                        "refuses the row-vector operand as ambiguous, m == n) the chunk is "
                        "doubled, and a compacted batch whose last chunk has H rows gets 128 "
                        "padding rows; both are recorded in the row")
    p.add_argument("--quack-scaled-exp", choices=["auto", "on", "off"], default="auto",
                   help="QuACK's use_scaled_exp: auto (its own choice: scaled-exp where "
                        "eligible: SM90, bf16, V %% 128 == 0), on, off (the base pipeline)")
    p.add_argument("--quack-tuned", action="store_true",
                   help="let QuACK autotune the GEMMs of its base pipeline (tuned=True: "
                        "50-170 s per new shape on the first call, kept out of ms and reported "
                        "as first_call_s); default tuned=False (its default config)")
    p.add_argument("--liger-cute-pad", action="store_true",
                   help="run liger-cute where V %% 256 != 0 by padding the vocabulary to a "
                        "multiple of 256 with rows whose logits are -30000 (one extra hidden "
                        "column of ones; liger pads H to a multiple of 256, so this adds 256 "
                        "columns of work); default: skip those shapes with the reason")
    p.add_argument("--clip-low", type=float, default=0.2, help="policy: clip epsilon low")
    p.add_argument("--clip-high", type=float, default=0.2, help="policy: clip epsilon high")
    p.add_argument("--old-noise", type=float, default=0.1,
                   help="policy: old log-probs = current ones + N(0, old-noise^2) (default "
                        "0.1: some ratios clip)")
    p.add_argument("--out", default=None,
                   help="output folder (default $OUT, else bench/results/peers-<date>)")
    p.add_argument("--dry-run", action="store_true",
                   help="validate arguments, import every peer and check its call signature, "
                        "print the plan, then run the harness on the CPU at a tiny shape "
                        "(GPU-only peers skipped with the reason); no GPU work")
    return p


def make_points(args):
    """(shape, H, V, N, fraction or None for packed-rl, mask) in the order they are run."""
    combos = []
    for mask in args.masks:
        if mask == "packed-rl":
            combos.append((mask, None))
            continue
        for frac in args.fractions:
            if mask == "fragmented" and frac >= 1.0:
                continue
            combos.append((mask, frac))

    def prio(c):
        mask, frac = c
        # response first; within it 0.5 (the issue's headline point), 1.0, then lower; then
        # the packed RL batch, then fragmented
        mrank = {"response": 0, "packed-rl": 1, "fragmented": 2}[mask]
        if frac is None:
            return (mrank, 0, 0.0)
        frank = 0 if abs(frac - 0.5) < 1e-9 else (1 if frac >= 1.0 else 2)
        return (mrank, frank, -frac)

    pts = []
    if args.order == "priority":
        for mask, frac in sorted(combos, key=prio):
            for N in args.N:
                for name, H, V in args.shapes:
                    pts.append((name, H, V, N, frac, mask))
    else:
        for name, H, V in args.shapes:
            for N in args.N:
                for mask, frac in sorted(combos, key=prio):
                    pts.append((name, H, V, N, frac, mask))
    return pts


# ----------------------------------------------------------------------------------------
# Peers: each loader returns (object, version string) or raises


def version_of(dist):
    try:
        from importlib import metadata
        return metadata.version(dist)
    except Exception:  # noqa: BLE001 - metadata missing is not an error here
        return "?"


def load_spanhead():
    if importlib.util.find_spec("spanhead") is None:
        sys.path.insert(0, str(REPO / "python"))
        if not list((REPO / "python" / "spanhead").glob("_spanhead*.so")):
            raise ImportError("python/spanhead/_spanhead.abi3.so is not built (make "
                              "python/spanhead/_spanhead.abi3.so here, then carry it)")
    if "SPANHEAD_LIB" not in os.environ and "SPANHEAD_BUILD_DIR" not in os.environ:
        for c in ("build/libspanhead.so", "build-peers/libspanhead.so",
                  "build-cpu/libspanhead.so"):
            if (REPO / c).exists():
                os.environ["SPANHEAD_LIB"] = str(REPO / c)
                break
    import spanhead
    import spanhead.torch as sht
    missing = getattr(spanhead, "missing_functions", lambda: [])()
    ver = getattr(spanhead, "library_version", lambda: "?")()
    return sht, f"{ver} ({spanhead.LIBRARY_PATH})" + (f", missing {missing}" if missing else "")


def load_liger():
    from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction
    return LigerFusedLinearCrossEntropyFunction, version_of("liger-kernel")


def load_cce():
    import cut_cross_entropy
    from cut_cross_entropy import linear_cross_entropy
    impls = getattr(cut_cross_entropy, "LinearCrossEntropyImpl", None)
    has_exact = impls is not None and any(m.name.lower() == "cce_exact" for m in impls)
    return (linear_cross_entropy, has_exact), version_of("cut-cross-entropy")


def load_verl():
    """verl's fused kernel without verl: its package __init__ pulls ray, hydra, datasets...
    Only verl/utils/kernel/{kernels,linear_cross_entropy}.py are loaded, under stub parent
    packages, with verl.utils.device (all the kernel module imports from verl) stubbed on
    torch.cuda."""
    import torch
    mod = sys.modules.get("verl.utils.kernel.linear_cross_entropy")
    if mod is not None:
        return mod.linear_cross_entropy, version_of("verl")
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("No module named 'verl' (wheel not installed)")
    kdir = Path(list(spec.submodule_search_locations)[0]) / "utils" / "kernel"
    for f in ("kernels.py", "linear_cross_entropy.py"):
        if not (kdir / f).exists():
            raise ImportError(f"verl {version_of('verl')}: {kdir / f} missing")

    def pkg(name, path):
        m = types.ModuleType(name)
        m.__path__ = [str(path)] if path else []
        m.__package__ = name
        sys.modules[name] = m
        return m

    saved = {k: sys.modules.get(k) for k in ("verl", "verl.utils", "verl.utils.device",
                                             "verl.utils.kernel")}
    try:
        root, utils, kern = pkg("verl", None), pkg("verl.utils", None), \
            pkg("verl.utils.kernel", kdir)
        dev = types.ModuleType("verl.utils.device")
        dev.is_cuda_available = torch.cuda.is_available()
        dev.get_device_name = lambda: "cuda"
        dev.get_torch_device = lambda: torch.cuda
        dev.get_device_capability = lambda device_id=0: (
            torch.cuda.get_device_capability(device_id) if torch.cuda.is_available()
            else (None, None))
        sys.modules["verl.utils.device"] = dev
        root.utils, utils.device, utils.kernel = utils, dev, kern
        importlib.import_module("verl.utils.kernel.kernels")
        lce = importlib.import_module("verl.utils.kernel.linear_cross_entropy")
    except BaseException:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
        raise
    return lce.linear_cross_entropy, version_of("verl")


def in_site_dir(path):
    p = str(path)
    return f"{os.sep}site-packages{os.sep}" in p or f"{os.sep}dist-packages{os.sep}" in p


def ensure_cutlass_path():
    """`import cutlass` works once nvidia_cutlass_dsl/dsl_packages is on sys.path. A site
    directory does that through nvidia-cutlass-dsl's .pth file; a pip --target directory on
    PYTHONPATH processes no .pth files, so add the folder here. Returns the cutlass module."""
    if importlib.util.find_spec("cutlass") is None:
        spec = importlib.util.find_spec("nvidia_cutlass_dsl")
        if spec is None or not spec.submodule_search_locations:
            raise ImportError("No module named 'cutlass' (nvidia-cutlass-dsl not installed)")
        dsl = Path(list(spec.submodule_search_locations)[0]) / "dsl_packages"
        if not (dsl / "cutlass").is_dir():
            raise ImportError(f"nvidia-cutlass-dsl: {dsl / 'cutlass'} missing")
        sys.path.insert(0, str(dsl))
    import cutlass
    return cutlass


def patch_quack_semantic_key():
    """QuACK (0.6.x) keys its compile cache on a fingerprint of each epilogue function and the
    globals it reads (quack.gemm_runtime.identity). Functions of installed libraries are keyed
    by name only, and 'installed' means a file under a site-packages or dist-packages folder.
    Installed with pip --target into a folder named otherwise (/tmp/site), cutlass's functions
    are fingerprinted by their globals too, down to a ContextVar, and the first epilogue fails
    with "epilogue fn depends on <ContextVar name='_LOC_TRANSFORMS' ...> ..., which has no
    fail-closed semantic key". The fix is to install under a path holding /site-packages/
    (scripts/device/peers_run.sh does); where that is not so, this treats every file under
    cutlass's and tvm_ffi's folders as installed, which gives the same keys a site-packages
    install gives (checked: same digests). Returns a note, or None when nothing was patched."""
    import cutlass
    import tvm_ffi
    roots = tuple(os.path.realpath(os.path.dirname(m.__file__)) + os.sep
                  for m in (cutlass, tvm_ffi))
    if all(in_site_dir(r) for r in roots):
        return None
    import quack.gemm_runtime.identity as idm
    orig = getattr(idm, "_is_extern_function", None)
    if orig is None:
        return ("cutlass is outside site-packages but quack.gemm_runtime.identity has no "
                "_is_extern_function to patch: expect 'no fail-closed semantic key'")
    if getattr(orig, "_sph_patched", False):
        return "quack.gemm_runtime.identity._is_extern_function patched (earlier)"

    def _is_extern_function(fn):
        if orig(fn):
            return True
        code = getattr(fn, "__code__", None)
        return code is not None and os.path.realpath(code.co_filename).startswith(roots)

    _is_extern_function._sph_patched = True
    idm._is_extern_function = _is_extern_function
    return (f"patched quack.gemm_runtime.identity._is_extern_function: {', '.join(roots)} "
            f"not under site-packages")


def load_quack():
    ensure_cutlass_path()
    import quack
    note = patch_quack_semantic_key()
    import quack.linear_cross_entropy as qlce
    fn = getattr(qlce, "chunked_linear_cross_entropy", None)
    if fn is None:
        raise ImportError(f"quack {quack.__version__}: no chunked_linear_cross_entropy")
    params = inspect.signature(fn).parameters
    info = {"fn": fn, "has_tuned": "tuned" in params, "has_scaled": "use_scaled_exp" in params,
            "supported": getattr(qlce, "scaled_exp_lce_supported", None), "note": note}
    ver = (f"{getattr(quack, '__version__', version_of('quack-kernels'))}, nvidia-cutlass-dsl "
           f"{version_of('nvidia-cutlass-dsl')}, apache-tvm-ffi {version_of('apache-tvm-ffi')}")
    return info, ver + (f" ({note})" if note else "")


def load_liger_cute():
    ensure_cutlass_path()
    mod = importlib.import_module("liger_kernel.ops.cutedsl.ops.fused_linear_cross_entropy_sm90")
    F = mod.LigerFusedLinearCrossEntropySM90Function
    return ((F, int(getattr(mod, "TILE_M", 128)), int(getattr(mod, "TILE_N", 256))),
            f"{version_of('liger-kernel')}, nvidia-cutlass-dsl {version_of('nvidia-cutlass-dsl')}")


def load_liger_grpo():
    from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss
    return LigerFusedLinearGRPOLoss, version_of("liger-kernel")


LOADERS = {"spanhead": load_spanhead, "liger": load_liger, "cce": load_cce, "verl": load_verl,
           "quack": load_quack, "liger-cute": load_liger_cute, "liger-grpo": load_liger_grpo}
IMPL_LOADER = {"spanhead": "spanhead", "spanhead-onepass": "spanhead", "liger-sum": "liger",
               "liger-none": "liger", "cce": "cce", "cce-exact": "cce", "verl": "verl",
               "torch-eager": None, "quack": "quack", "quack-compact": "quack",
               "liger-cute": "liger-cute", "liger-cute-compact": "liger-cute",
               "spanhead+torch": "spanhead", "spanhead-policy": "spanhead",
               "torch-eager-policy": None, "liger-grpo": "liger-grpo"}


def load_all(impls):
    """{loader name: (object, version)} and {impl: reason it is unavailable}."""
    loaded, unavailable = {}, {}
    for impl in impls:
        key = IMPL_LOADER[impl]
        if key is None or key in loaded:
            continue
        if key in unavailable:
            unavailable[impl] = unavailable[key]
            continue
        t0 = time.monotonic()
        try:
            loaded[key] = LOADERS[key]()
            log(f"# {key}: {loaded[key][1]} (import {time.monotonic() - t0:.1f} s)")
        except BaseException as e:  # noqa: BLE001 - any import failure skips the peer
            if isinstance(e, KeyboardInterrupt):
                raise
            msg = f"{type(e).__name__}: {e}".splitlines()[0][:300]
            unavailable[key] = msg
            log(f"# {key}: not importable, skipped ({msg})")
    for impl in impls:
        key = IMPL_LOADER[impl]
        if key is not None and key in unavailable:
            unavailable[impl] = unavailable[key]
    return loaded, unavailable


def check_apis(loaded):
    """The call surface each peer is driven through, against what is installed: a list of
    (peer, 'ok' or the mismatch). Catches an upgrade that renames an argument before any GPU
    time is spent."""
    out = []

    def params_of(fn):
        try:
            return set(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            return set()

    def need(name, fn, want):
        miss = sorted(set(want) - params_of(fn))
        out.append((name, "ok" if not miss else f"missing parameters {miss}"))

    if "quack" in loaded:
        info = loaded["quack"][0]
        need("quack chunked_linear_cross_entropy", info["fn"],
             ["x", "weight", "target", "chunk_size", "ignore_index", "reduction", "tuned",
              "use_scaled_exp"])
        out.append(("quack scaled_exp_lce_supported",
                    "ok" if callable(info["supported"]) else "absent (base pipeline only)"))
        try:
            import quack.gemm_runtime.identity as idm
            out.append(("quack monkeypatch target identity._is_extern_function",
                        "ok" if callable(getattr(idm, "_is_extern_function", None))
                        else "absent"))
        except ImportError as e:
            out.append(("quack monkeypatch target", f"absent ({e})"))
        try:
            import quack.epilogue.frontend as fe
            src = inspect.getsource(fe._infer_kind)
            out.append(("quack m == n operand inference (chunk != H rule)",
                        "present" if "m == n" in src else "not found (rule harmless)"))
        except (ImportError, AttributeError, OSError, TypeError) as e:
            out.append(("quack epilogue frontend", f"not inspected ({type(e).__name__})"))
    if "liger-cute" in loaded:
        F, tm, tn = loaded["liger-cute"][0]
        need("liger-cute LigerFusedLinearCrossEntropySM90Function.forward", F.forward,
             ["_input", "weight", "target", "ignore_index", "reduction"])
        out.append(("liger-cute tiles", "ok" if (tm, tn) == (128, 256)
                    else f"TILE_M {tm}, TILE_N {tn} (expected 128, 256)"))
    if "liger-grpo" in loaded:
        G = loaded["liger-grpo"][0]
        need("liger-grpo LigerFusedLinearGRPOLoss.__init__", G.__init__,
             ["beta", "compiled", "use_ref_model", "chunk_size", "epsilon_low", "epsilon_high",
              "loss_type"])
        need("liger-grpo LigerFusedLinearGRPOLoss.forward", G.forward,
             ["_input", "lin_weight", "selected_token_ids", "attention_mask", "advantages",
              "old_per_token_logps"])
    if "liger" in loaded:
        need("liger-sum/none LigerFusedLinearCrossEntropyFunction.forward",
             loaded["liger"][0].forward, ["_input", "weight", "target"])
    if "spanhead" in loaded:
        sht = loaded["spanhead"][0]
        need("spanhead.torch.logprobs", sht.logprobs, ["loss_mask", "spans"])
        pl = getattr(sht, "policy_loss", None)
        if pl is None:
            out.append(("spanhead.torch.policy_loss", "absent (issue 14 not in this tree: "
                        "spanhead-policy is skipped)"))
        else:
            need("spanhead.torch.policy_loss", pl,
                 ["loss_mask", "loss_type", "clip_low", "clip_high", "agg"])
    return out


# ----------------------------------------------------------------------------------------
# Steps


def policy_loss_torch(lp, maskf, adv, old, n_act, clip_low, clip_high):
    """Issue 14's ppo loss, token-mean: pg_i = max(-A r, -A clip(r, 1-el, 1+eh)), r =
    exp(clamp(logp - old, -20, 20)), L = sum_i m_i pg_i / T."""
    import torch
    r = torch.exp(torch.clamp(lp - old, -20.0, 20.0))
    pg = torch.maximum(-adv * r, -adv * torch.clamp(r, 1.0 - clip_low, 1.0 + clip_high))
    return (pg * maskf).sum() / max(n_act, 1)


def pad_rows(n, align, avoid=None):
    """n rounded up to a multiple of align; plus one more align step while the result
    collides with `avoid` (a callable rows -> bool)."""
    m = -(-max(n, 1) // align) * align
    while avoid is not None and avoid(m):
        m += align
    return m


def quack_plan(impl, P, args, info):
    """(rows M, chunk, scaled-exp?, notes) for a QuACK call at this point."""
    h, w = P["h"], P["w"]
    N, H = h.shape
    n = P["n_act"] if impl == "quack-compact" else N
    chunk = args.quack_chunk
    if args.quack_scaled_exp == "off" or not info["has_scaled"]:
        scaled = False
    elif args.quack_scaled_exp == "on":
        scaled = True
    else:
        sup = info["supported"]
        scaled = bool(sup(h, w, chunk, "sum")) if callable(sup) else False
    notes = []
    if scaled and chunk == H:
        # the dx GEMM of a chunk is (chunk rows) x H: quack's epilogue frontend infers its
        # per-row operand's kind from its length and raises when m == n
        chunk *= 2
        notes.append(f"chunk {chunk} (chunk == H = {H} is refused by quack's scaled-exp dx "
                     f"epilogue: m == n)")

    def last_chunk_is_h(m):
        r = m - (-(-m // chunk) - 1) * chunk
        return -(-r // QUACK_SE_ALIGN) * QUACK_SE_ALIGN == H

    M = pad_rows(n, QUACK_ROW_ALIGN, last_chunk_is_h if scaled else None)
    if scaled and impl == "quack" and M != N:
        notes.append(f"{M - N} padding rows (a last chunk of H rows is refused)")
    return M, chunk, scaled, notes


def gather_plan(P, M, compact):
    """Device row indices for the M rows a gathered peer call takes (active rows, or all N,
    padded with copies of the first one) and the index into an extended target vector whose
    last entry is -100 (padding rows ignored: no loss, zero gradient)."""
    import torch
    dev = P["h"].device
    base = P["act_idx"] if compact else torch.arange(P["h"].shape[0], device=dev)
    n = base.numel()
    if M == n:
        return base, base
    first = base[:1] if n else torch.zeros(1, dtype=torch.int64, device=dev)
    idx = torch.cat([base, first.expand(M - n)])
    tidx = torch.cat([base, torch.full((M - n,), P["h"].shape[0], dtype=torch.int64,
                                       device=dev)])
    return idx, tidx


def make_step(impl, loaded, P, args, cuda):
    """A function that runs one training step and returns what the checks compare: per-row
    log-probs (float32, N; 0 on inactive rows), their scalar sum, or (policy mode) a dict
    {"loss": scalar, "lp": per-row log-probs or None}. Also returns a dict of notes for the
    row (pipeline, padding, ...)."""
    import torch
    h, w, t, t_ign, maskd, maskf = P["h"], P["w"], P["t"], P["t_ign"], P["maskd"], P["maskf"]
    N, H = h.shape
    V = w.shape[0]
    extra = {}
    if not cuda and impl in CUTE_PEERS:
        raise PeerSkip("CuTe DSL kernels need a CUDA sm_90 device")
    if not cuda and impl in TRITON_PEERS and not os.environ.get("TRITON_INTERPRET"):
        raise PeerSkip("Triton kernels need a CUDA device (TRITON_INTERPRET=1 runs liger's "
                       "on the CPU)")

    if impl == "spanhead":
        sht = loaded["spanhead"][0]
        spans = P["spans"]

        def run():
            lp = sht.logprobs(h, w, t, loss_mask=maskd, spans=spans)
            lp.sum().backward()
            return lp
    elif impl == "spanhead-onepass":
        sht = loaded["spanhead"][0]
        loss_fn = getattr(sht, "weighted_logprob_loss", None)
        if loss_fn is None:
            raise PeerSkip("spanhead.torch.weighted_logprob_loss: not in this spanhead "
                           "package (python/spanhead/torch.py older than the one-pass loss)")
        spans = P["spans"]
        if args.mode == "policy":
            # REINFORCE weights: the same sweep as the fused policy loss, a gradient known
            # before the forward (timing reference; a different loss, so no check)
            wts = P["adv"] * maskf / max(P["n_act"], 1)
            extra["check"] = "none (REINFORCE weights: timing reference)"
        else:
            wts = P["neg_ones"]   # L = -sum(-1 * logprob) = the sum of the masked log-probs

        def run():
            out = loss_fn(h, w, t, wts, loss_mask=maskd, spans=spans, return_logprobs=True)
            out.loss.backward()
            return out.logprob if args.mode == "logprob" else {"loss": None, "lp": None}
    elif impl == "torch-eager":
        def run():
            z = (h @ w.T).float()
            lp = torch.log_softmax(z, -1).gather(1, t.unsqueeze(1)).squeeze(1) * maskf
            del z
            lp.sum().backward()
            return lp
    elif impl in ("liger-sum", "liger-none"):
        F = loaded["liger"][0]
        red = "sum" if impl == "liger-sum" else "none"

        def run():
            # positional: (input, weight, target, bias, ce_weight, ignore_index,
            # lse_square_scale, label_smoothing, reduction); the rest keep their defaults
            out = F.apply(h, w, t_ign, None, None, -100, 0.0, 0.0, red)
            loss = out[0] if isinstance(out, (tuple, list)) else out
            lp = -loss          # cross entropy = -log-prob
            lp.sum().backward()
            return lp.detach()
    elif impl in ("cce", "cce-exact"):
        lce, has_exact = loaded["cce"][0]
        if impl == "cce":
            kw = {"impl": "cce"}
        elif has_exact:
            kw = {"impl": "cce_exact"}
        else:
            kw = {"impl": "cce", "filter_eps": None}  # what cce_exact is: no grad filtering

        def run():
            loss = lce(h, w, t_ign, ignore_index=-100, reduction="none", **kw)
            lp = -loss
            lp.sum().backward()
            return lp.detach()
    elif impl == "verl":
        lce = loaded["verl"][0]

        def run():
            lp_all, _ent = lce(h, w, t, 1.0, "none", None)
            lp = lp_all * maskf
            lp.sum().backward()
            return lp.detach()
    elif impl in ("quack", "quack-compact"):
        info = loaded["quack"][0]
        fn = info["fn"]
        compact = impl == "quack-compact"
        if compact and P["n_act"] == 0:
            raise PeerSkip("no active row")
        M, chunk, scaled, notes = quack_plan(impl, P, args, info)
        kw = {"chunk_size": chunk, "ignore_index": -100, "reduction": "sum"}
        if info["has_tuned"]:
            kw["tuned"] = bool(args.quack_tuned)
        if info["has_scaled"]:
            kw["use_scaled_exp"] = scaled
        extra.update(pipeline="scaled-exp" if scaled else "base", chunk=chunk,
                     pad_rows=M - (P["n_act"] if compact else N),
                     tuned=kw.get("tuned", True))
        if notes:
            extra["notes"] = "; ".join(notes)
        if compact or M != N:
            idx, tidx = gather_plan(P, M, compact)
            t_ext = torch.cat([t_ign, torch.full((1,), -100, dtype=t_ign.dtype,
                                                 device=t_ign.device)])

            def run():
                x = h.index_select(0, idx)      # the gather; its backward scatter-adds
                tt = t_ext.index_select(0, tidx)
                lp = -fn(x, w, tt, **kw)
                lp.backward()
                return lp.detach()
        else:
            def run():
                lp = -fn(h, w, t_ign, **kw)
                lp.backward()
                return lp.detach()
    elif impl in ("liger-cute", "liger-cute-compact"):
        F, tile_m, tile_n = loaded["liger-cute"][0]
        compact = impl == "liger-cute-compact"
        if compact and P["n_act"] == 0:
            raise PeerSkip("no active row")
        pad_v = V % tile_n != 0
        if pad_v and not args.liger_cute_pad:
            raise PeerSkip(f"V {V} % {tile_n} != 0: liger's SM90 CuTe FLCE rejects it "
                           f"(--liger-cute-pad pads the vocabulary)")
        n = P["n_act"] if compact else N
        M = pad_rows(n, tile_m)
        extra.update(pad_rows=M - n)
        if pad_v:
            Vp = pad_rows(V, tile_n)
            extra["notes"] = (f"vocabulary padded {V} -> {Vp} (rows of logit -30000 through "
                              f"one extra hidden column of ones)")
            zcol = torch.zeros(V, 1, dtype=w.dtype, device=w.device)
            prow = torch.zeros(Vp - V, H + 1, dtype=w.dtype, device=w.device)
            prow[:, H] = -30000.0

            def widen(x, ww):
                xa = torch.cat([x, torch.ones(x.shape[0], 1, dtype=x.dtype, device=x.device)], 1)
                wa = torch.cat([torch.cat([ww, zcol], 1), prow], 0)
                return xa, wa
        else:
            def widen(x, ww):
                return x, ww
        if compact or M != N:
            idx, tidx = gather_plan(P, M, compact)
            t_ext = torch.cat([t_ign, torch.full((1,), -100, dtype=t_ign.dtype,
                                                 device=t_ign.device)])

            def run():
                x, ww = widen(h.index_select(0, idx), w)
                tt = t_ext.index_select(0, tidx)
                lp = -F.apply(x, ww, tt, -100, "sum")
                lp.backward()
                return lp.detach()
        else:
            def run():
                x, ww = widen(h, w)
                lp = -F.apply(x, ww, t_ign, -100, "sum")
                lp.backward()
                return lp.detach()
    elif impl == "spanhead+torch":
        sht = loaded["spanhead"][0]
        spans = P["spans"]

        def run():
            lp = sht.logprobs(h, w, t, loss_mask=maskd, spans=spans)
            loss = policy_loss_torch(lp, maskf, P["adv"], P["old"], P["n_act"],
                                     args.clip_low, args.clip_high)
            loss.backward()
            return {"loss": loss.detach(), "lp": lp.detach()}
    elif impl == "spanhead-policy":
        sht = loaded["spanhead"][0]
        pl = getattr(sht, "policy_loss", None)
        if pl is None:
            raise PeerSkip("spanhead.torch.policy_loss: not in this spanhead package (issue "
                           "14's fused policy loss has not landed in this tree)")
        kw = {"loss_mask": maskd, "loss_type": "ppo", "clip_low": args.clip_low,
              "clip_high": args.clip_high, "agg": "token-mean"}
        if "spans" in inspect.signature(pl).parameters:   # exact host spans, as logprobs
            kw["spans"] = P["spans"]

        def run():
            out = pl(h, w, t, P["adv"], P["old"], **kw)
            loss, lp = out[0], out[1]
            loss.backward()
            return {"loss": loss.detach(), "lp": None if lp is None else lp.detach()}
    elif impl == "torch-eager-policy":
        def run():
            z = (h @ w.T).float()
            lp = torch.log_softmax(z, -1).gather(1, t.unsqueeze(1)).squeeze(1) * maskf
            del z
            loss = policy_loss_torch(lp, maskf, P["adv"], P["old"], P["n_act"],
                                     args.clip_low, args.clip_high)
            loss.backward()
            return {"loss": loss.detach(), "lp": lp.detach()}
    elif impl == "liger-grpo":
        G = loaded["liger-grpo"][0]
        if N % SEQ:
            raise PeerSkip(f"N {N} is not a multiple of {SEQ}: liger's GRPO loss takes a "
                           f"(batch, {SEQ}) layout")
        if P["adv_seq"] is None:
            raise PeerSkip("advantages are not per 2048-row sequence at this mask")
        B = N // SEQ
        # dapo: sum over active tokens / active tokens = token-mean; no KL, no reference model
        mod = G(beta=0.0, compiled=cuda, use_ref_model=False, chunk_size=1,
                epsilon_low=args.clip_low, epsilon_high=args.clip_high, loss_type="dapo")
        extra["notes"] = f"loss_type dapo, beta 0, chunk_size 1 (one {SEQ}-row sequence), " \
                         f"compiled {cuda}"
        t2, m2, old2 = t.view(B, SEQ), maskf.view(B, SEQ), P["old"].view(B, SEQ)

        def run():
            out = mod(h.view(B, SEQ, H), w, t2, m2, P["adv_seq"], old_per_token_logps=old2)
            loss = out[0] if isinstance(out, (tuple, list)) else out
            loss.backward()
            return {"loss": loss.detach(), "lp": None}
    else:
        raise ValueError(f"impl {impl}")

    def step():
        h.grad = None
        w.grad = None
        return run()

    return step, extra


# ----------------------------------------------------------------------------------------
# Measurement


class Timer:
    def __init__(self, cuda):
        self.cuda = cuda

    def sync(self):
        import torch
        if self.cuda:
            torch.cuda.synchronize()

    def one(self, fn):
        import torch
        if self.cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            r = fn()
            b.record()
            b.synchronize()
            return a.elapsed_time(b), r
        t0 = time.perf_counter()
        r = fn()
        return (time.perf_counter() - t0) * 1e3, r

    def many(self, fn, n):
        import torch
        r = None
        if self.cuda:
            ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(n)]
            for a, b in ev:
                a.record()
                r = fn()
                b.record()
            torch.cuda.synchronize()
            return [a.elapsed_time(b) for a, b in ev], r
        ts = []
        for _ in range(n):
            t0 = time.perf_counter()
            r = fn()
            ts.append((time.perf_counter() - t0) * 1e3)
        return ts, r


def median(xs):
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def gemm_rate(h, w, timer, reps=10):
    """Dense bf16 GEMM rate (FLOP/s) of h[N,H] @ W.T[H,V], median of reps after warm-up."""
    N, H = h.shape
    V = w.shape[0]
    with __import__("torch").no_grad():
        f = lambda: h @ w.T  # noqa: E731
        for _ in range(3):
            f()
        timer.sync()
        ts, out = timer.many(f, reps)
        del out
    return 2.0 * N * H * V / (median(ts) * 1e-3)


def build_mask(N, frac, pattern):
    """Host uint8 mask, as spanhead bench builds it (response, fragmented)."""
    import numpy as np
    m = np.zeros(N, dtype=np.uint8)
    if frac >= 1.0:
        m[:] = 1
    elif pattern == "response":
        for s0 in range(0, N, SEQ):
            ln = min(SEQ, N - s0)
            a = int(math.floor(frac * ln + 0.5))
            m[s0 + ln - a:s0 + ln] = 1
    else:
        period = max(FRAG_RUN, int(math.floor(FRAG_RUN / frac + 0.5)))
        for s0 in range(0, N, period):
            m[s0:s0 + FRAG_RUN] = 1
    return m


_M64 = (1 << 64) - 1


def _splitmix(state):
    """(new state, output) of splitmix64, as src/cli/cmd_bench.c's splitmix."""
    s = (state + 0x9E3779B97F4A7C15) & _M64
    z = s
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return s, z ^ (z >> 31)


def _lognormal_len(state, med, sigma, lo, hi):
    state, a = _splitmix(state)
    state, b = _splitmix(state)
    u1 = ((a >> 11) + 1.0) * 2.0 ** -53
    u2 = (b >> 11) * 2.0 ** -53
    x = med * math.exp(sigma * math.sqrt(-2.0 * math.log(u1)) *
                       math.cos(6.283185307179586 * u2))
    if x < lo:
        return state, lo
    if x > hi:
        return state, hi
    return state, int(math.floor(x + 0.5))      # llround of a positive value


def packed_rl_batch(T, seed):
    """The sequences of spanhead bench's packed-rl batch of T tokens (TP1/CP1: no padding):
    prompt lengths log-normal, median 512, sigma 1, in [32, 4096]; response lengths median 768,
    sigma 1, in [16, 8192]; drawn until T tokens are full, the last truncated. Returns
    (lengths, prompt lengths) exactly as cmd_bench.c's packed_rl_mask draws them."""
    st, z = _splitmix(seed & _M64)
    st = z ^ (T & _M64)
    lens, prompts, filled = [], [], 0
    while filled < T:
        st, p = _lognormal_len(st, 512, 1.0, 32, 4096)
        st, r = _lognormal_len(st, 768, 1.0, 16, 8192)
        ln = p + r
        if ln > T - filled:
            ln = T - filled
        lens.append(ln)
        prompts.append(min(p, ln))
        filled += ln
    return lens, prompts


def packed_rl_mask(N, seed, gap):
    """(host uint8 mask, spans, how) of the packed-rl batch of N tokens: the rows whose next
    token is a response token. Through the library's own metadata (spanhead.meta.spans, as
    spanhead bench) when the binding is importable, else the same rows computed here
    (TP1/CP1 lays the sequences end to end)."""
    import numpy as np
    lens, prompts = packed_rl_batch(N, seed)
    loss = np.zeros(N, dtype=np.uint8)
    c0 = 0
    for ln, p in zip(lens, prompts):
        loss[c0 + p - 1:c0 + ln - 1] = 1      # loss column c - 1 is token column c
        c0 += ln
    try:
        import spanhead.meta as sm
    except Exception:  # noqa: BLE001 - binding absent: the rows computed here
        return loss, spans_of(loss, gap), "python"
    doc = {"layout": "packed", "sequence_length": N, "num_actions": N - 1,
           "loss_mask": [loss[:N - 1].tolist()], "sub_seq_lengths": [lens]}
    r = sm.spans(doc, tp=1, cp=1, cp_rank=0, gap=gap, full=True)
    if r["local_rows"] != N:
        raise ValueError(f"packed-rl: rank 0 holds {r['local_rows']} rows, expected {N}")
    mask = np.asarray(r["local_mask"], dtype=np.uint8)
    return mask, np.asarray(r["spans"], dtype=np.int64).reshape(-1, 2), "spanhead.meta.spans"


def spans_of(mask, gap):
    """(n, 2) int64 runs of active rows, coalesced across gaps of at most `gap` rows."""
    import numpy as np
    idx = np.flatnonzero(np.diff(np.concatenate(([0], mask.astype(np.int8), [0]))))
    runs = idx.reshape(-1, 2)
    out = []
    for s, e in runs:
        if out and s - out[-1][1] <= gap:
            out[-1][1] = int(e)
        else:
            out.append([int(s), int(e)])
    return np.asarray(out, dtype=np.int64).reshape(-1, 2)


def make_inputs(H, V, N, frac, pattern, args, dev):
    import numpy as np
    import torch
    g = torch.Generator(device=dev).manual_seed(args.seed + 7919 * N + 31 * H + V)
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    h = torch.randn(N, H, device=dev, generator=g, dtype=torch.float32).to(dt)
    w = (torch.randn(V, H, device=dev, generator=g, dtype=torch.float32)
         * (args.logit_std / math.sqrt(H))).to(dt)
    t = torch.randint(0, V, (N,), device=dev, generator=g, dtype=torch.int64)
    how = None
    if pattern == "packed-rl":
        mask, spans, how = packed_rl_mask(N, args.packed_seed, args.gap)
    else:
        mask = build_mask(N, frac, pattern)
        try:
            import spanhead
            spans = spanhead.spans_from_mask(mask, args.gap)
        except Exception:  # noqa: BLE001 - spanhead absent: the same coalescing here
            spans = spans_of(mask, args.gap)
    maskd = torch.from_numpy(mask.astype(np.bool_)).to(dev)
    P = {"h": h.requires_grad_(True), "w": w.requires_grad_(True), "t": t,
         "t_ign": torch.where(maskd, t, torch.full_like(t, -100)),
         "maskd": maskd, "maskf": maskd.float(), "spans": spans, "mask_how": how,
         "act_idx": torch.from_numpy(np.flatnonzero(mask).astype(np.int64)).to(dev),
         "neg_ones": torch.full((N,), -1.0, device=dev, dtype=torch.float32),
         "n_act": int(mask.sum())}
    if args.mode == "policy":
        # advantages per 2048-row sequence (GRPO: one per sampled response), old log-probs
        # near the current ones so that some ratios clip
        nseq = -(-N // SEQ)
        adv_seq = torch.randn(nseq, device=dev, generator=g, dtype=torch.float32)
        P["adv"] = adv_seq.repeat_interleave(SEQ)[:N].contiguous()
        P["adv_seq"] = adv_seq if N % SEQ == 0 else None
        with torch.no_grad():
            lp = torch.empty(N, device=dev, dtype=torch.float32)
            for i in range(0, N, 4096):
                z = (h[i:i + 4096] @ w.T).float()
                lp[i:i + 4096] = torch.log_softmax(z, -1).gather(
                    1, t[i:i + 4096].unsqueeze(1)).squeeze(1)
                del z
            noise = torch.randn(N, device=dev, generator=g, dtype=torch.float32)
            P["old"] = ((lp + args.old_noise * noise) * P["maskf"]).contiguous()
    return P


def relerr(a, b, rows=8192):
    """||a - b|| / ||b|| in float32, by row chunks (bounded temporaries)."""
    import torch
    num = torch.zeros((), dtype=torch.float64, device=a.device)
    den = torch.zeros((), dtype=torch.float64, device=a.device)
    for i in range(0, a.shape[0], rows):
        x, y = a[i:i + rows].float(), b[i:i + rows].float()
        num += (x - y).square().sum().double()
        den += y.square().sum().double()
    return math.sqrt(num.item()) / max(math.sqrt(den.item()), 1e-30)


def is_oom(e):
    import torch
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()


def cuda_alive():
    import torch
    try:
        torch.cuda.synchronize()
        torch.empty(1, device="cuda").add_(1)
        torch.cuda.synchronize()
        return True
    except Exception:  # noqa: BLE001
        return False


def split_out(out):
    """(per-row log-probs or their sum or None, policy loss or None) of a step's return."""
    if isinstance(out, dict):
        return out.get("lp"), out.get("loss")
    return out, None


def measure(impl, step, P, ref, timer, args, cuda):
    """One impl at one point: dict with ms, reps, first_call_s, peak_extra_bytes, checks,
    status; and what the step returned (for the checks' reference)."""
    import torch
    h, w = P["h"], P["w"]
    rec = {"impl": impl}
    t0 = time.perf_counter()
    step()
    timer.sync()
    rec["first_call_s"] = time.perf_counter() - t0
    for _ in range(args.warmup - 1):
        step()
    timer.sync()
    one_ms, _ = timer.one(step)
    reps = max(3, min(args.reps, int(args.target_s * 1e3 / max(one_ms, 1e-3))))
    grad_bytes = h.numel() * h.element_size() + w.numel() * w.element_size()
    h.grad = w.grad = None
    timer.sync()
    if cuda:
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    ts, out = timer.many(step, reps)
    if cuda:
        peak = torch.cuda.max_memory_allocated()
        rec["peak_extra_bytes"] = max(0, int(peak - base - grad_bytes))
        rec["peak_bytes_raw"] = int(peak - base)
    else:
        rec["peak_extra_bytes"] = None
    rec["ms"] = median(ts)
    rec["ms_min"] = min(ts)
    rec["reps"] = reps
    lp, loss = split_out(out)
    lp = None if lp is None else lp.detach()
    act = P["maskd"]
    rec["grad_relerr"] = None
    if ref is not None:
        checked = False
        bad = False
        if loss is not None and ref.get("loss") is not None:
            d = abs(float(loss) - float(ref["loss"]))
            rec["loss_diff"] = d
            bad |= not math.isfinite(d) or d > POLICY_LOSS_TOL
            checked = True
        if lp is not None and ref.get("lp") is not None:
            if lp.dim() == 0:
                d = abs(lp.item() - ref["lp"][act].sum().item()) / max(P["n_act"], 1)
                rec["check"] = "sum/row"
            else:
                d = (lp[act] - ref["lp"][act]).abs().max().item() if P["n_act"] else 0.0
                rec["check"] = "max|dlogp|"
            rec["logp_diff"] = d
            bad |= not math.isfinite(d) or d > CHECK_TOL
            checked = True
        if checked and h.grad is not None and w.grad is not None and ref.get("dh") is not None:
            rec["grad_relerr"] = max(relerr(h.grad, ref["dh"]), relerr(w.grad, ref["dw"]))
        bad_grads = rec["grad_relerr"] is not None and not rec["grad_relerr"] <= CHECK_TOL
        if bad or (bad_grads and impl != "cce"):
            rec["flag"] = "MISMATCH"
        elif bad_grads:
            # cce drops gradient entries below its filter_eps by design; on flat random
            # logits that is a visible share of the gradient (cce-exact shows the exact one)
            rec["flag"] = "APPROX(grad filter)"
        else:
            rec["flag"] = ""
    rec["status"] = "ok"
    return rec, lp, loss


# ----------------------------------------------------------------------------------------
# Outputs


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def best_peers(rs):
    """The fastest peer (compacted included) and the fastest one that takes its upstream
    gradient after the forward, among a point's measured rows."""
    peers = [r for r in rs if r.get("ms") is not None and not r["impl"].startswith("spanhead")]
    best = min(peers, key=lambda r: r["ms"]) if peers else None
    two = [r for r in peers if r["impl"] not in ONE_PASS_PEERS]
    best2 = min(two, key=lambda r: r["ms"]) if two else None
    return best, best2


def annotate_point(rs):
    """Adds best_peer, best_peer_ms, vs_best_peer (ms / best peer ms: < 1 is faster than every
    peer) and the same against the peers taking the gradient after the forward."""
    best, best2 = best_peers(rs)
    for r in rs:
        for tag, b in (("", best), ("_general", best2)):
            r[f"best_peer{tag}"] = b["impl"] if b else None
            r[f"best_peer{tag}_ms"] = b["ms"] if b else None
            r[f"vs_best_peer{tag}"] = (r["ms"] / b["ms"]) if b and r.get("ms") else None


def write_md(path, meta, records, notes):
    mode = meta.get("mode", "logprob")
    what = ("loss = sum of masked log-probs (spanhead: the general path; spanhead-onepass: "
            "the one-pass mode, gradients in the forward's sweep)" if mode == "logprob" else
            f"loss = ppo clipped policy loss, token-mean (clip {meta.get('clip')}), "
            f"per-sequence advantages")
    lines = [f"# spanhead vs peers ({mode}): {meta['gpu']}, {meta['date']}, commit "
             f"{meta['commit']}", "",
             f"torch {meta['torch']}, triton {meta['triton']}, python {meta['python']}; "
             f"dtype {meta['dtype']}, forward + backward, grads of hidden and weight, {what}.",
             ""]
    for k, v in meta["versions"].items():
        lines.append(f"- {k}: {v}")
    for k, v in meta["unavailable"].items():
        lines.append(f"- {k}: skipped: {v}")
    for k, v in sorted(meta["gemm"].items()):
        lines.append(f"- dense bf16 GEMM rate {k}: {v / 1e12:.1f} TFLOP/s")
    lines += ["",
              "ratio = ms / (8 N_active H V / GEMM rate), r6 = ms / (6 N_active H V / rate); "
              "vs best = ms / the fastest peer's ms at the point (compacted peers included; "
              "< 1: faster than every peer). first s = the first call's wall time (JIT, "
              "autotuning, torch.compile), not in ms. peak extra = peak allocated during the "
              "timed reps beyond the inputs and the two gradient outputs. check: against "
              "spanhead's log-probs on active rows (max abs; sum/row where the peer returns "
              "only the sum), policy loss (abs), gradients (relative error); MISMATCH above "
              "tolerance.",
              "",
              "| shape | N | active | mask | impl | ms | floor ms | ratio | r6 | vs best | "
              "first s | peak extra GiB | logp/loss diff | grad relerr | status |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        pe = r.get("peak_extra_bytes")
        status = r.get("status", "")
        if r.get("flag"):
            status = f"{status} {r['flag']}"
        if r.get("notes"):
            status = f"{status} ({r['notes']})"
        diff = r.get("loss_diff") if r.get("loss_diff") is not None else r.get("logp_diff")
        lines.append(
            f"| {r['shape']} | {r['N']} | {r['active']:.3f} | {r['mask']} | {r['impl']} | "
            f"{fmt(r.get('ms'), '.3f')} | {fmt(r.get('floor_ms'), '.3f')} | "
            f"{fmt(r.get('ratio'), '.3f')} | {fmt(r.get('ratio_onepass'), '.3f')} | "
            f"{fmt(r.get('vs_best_peer'), '.2f')} | {fmt(r.get('first_call_s'), '.1f')} | "
            f"{fmt(None if pe is None else pe / GIB, '.3f')} | "
            f"{fmt(diff, '.2e')} | {fmt(r.get('grad_relerr'), '.2e')} | {status} |")
    pts = {}
    for r in records:
        pts.setdefault((r["shape"], r["N"], r["active_target"], r["mask"]), []).append(r)
    summ = []
    for key, rs in pts.items():
        best, best2 = best_peers(rs)
        if best is None:
            continue
        row = [key[0], str(key[1]), f"{rs[0]['active']:.3f}", key[3]]
        for impl in (("spanhead", "spanhead-onepass") if mode == "logprob"
                     else ("spanhead+torch", "spanhead-policy")):
            s = [r for r in rs if r["impl"] == impl and r.get("ms") is not None]
            row += ([f"{s[0]['ms']:.3f}", fmt(s[0].get("ratio"), ".3f"),
                     fmt(s[0].get("ratio_onepass"), ".3f"), f"{s[0]['ms'] / best['ms']:.2f}"]
                    if s else ["-"] * 4)
        row += [best["impl"], f"{best['ms']:.3f}", fmt(best.get("ratio"), ".3f")]
        row += ([best2["impl"], f"{best2['ms']:.3f}"] if best2 else ["-", "-"])
        summ.append("| " + " | ".join(row) + " |")
    if summ:
        a, b = (("general", "one-pass") if mode == "logprob" else ("logprobs+torch", "fused"))
        lines += ["", "## spanhead against the fastest peer at each point", "",
                  f"vs = spanhead ms / fastest peer ms (< 1: spanhead faster). The last two "
                  f"columns leave out the peers that compute their gradients inside the "
                  f"forward ({', '.join(sorted(ONE_PASS_PEERS))}): the comparison for "
                  f"spanhead's general path, which takes its gradient after the forward.", "",
                  f"| shape | N | active | mask | {a} ms | ratio | r6 | vs | {b} ms | ratio | "
                  f"r6 | vs | fastest peer | its ms | its ratio | fastest taking the gradient "
                  f"after the forward | its ms |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"] + summ
    firsts = {}
    for r in records:
        if r.get("first_call_s") is not None and r.get("ms") is not None:
            firsts.setdefault(r["impl"], []).append(r["first_call_s"] - r["ms"] * 1e-3)
    if firsts:
        lines += ["", "## first-call cost (compilation, autotuning; not in ms)", "",
                  "| impl | points | total s | max s |", "|---|---|---|---|"]
        for k, v in firsts.items():
            lines.append(f"| {k} | {len(v)} | {sum(v):.1f} | {max(v):.1f} |")
    if notes:
        lines += ["", "## notes", ""] + [f"- {n}" for n in notes]
    Path(path).write_text("\n".join(lines) + "\n")


def final_table(records, mode):
    """A short table for the end of the log (the device tool returns only its tail)."""
    pts = {}
    for r in records:
        pts.setdefault((r["shape"], r["N"], r["active_target"], r["mask"]), []).append(r)
    a, b = (("spanhead", "spanhead-onepass") if mode == "logprob"
            else ("spanhead+torch", "spanhead-policy"))
    out = [f"# final ({mode}): ms, ratio to 8NHV (r8) / 6NHV (r6), vs = ms / fastest peer",
           f"# {'point':<28} {a + ' ms':>16} r8    {b + ' ms':>18} r6    fastest peer"]
    for key, rs in pts.items():
        best, _ = best_peers(rs)

        def cell(impl, ratio_key):
            s = [r for r in rs if r["impl"] == impl and r.get("ms") is not None]
            if not s:
                return f"{'-':>16} {'-':>5}"
            return f"{s[0]['ms']:16.2f} {fmt(s[0].get(ratio_key), '5.2f')}"

        name = f"{key[0]} {key[1] // 1024}K {rs[0]['active']:.2f} {key[3]}"
        bp = (f"{best['impl']} {best['ms']:.2f} ({fmt(best.get('ratio'), '.2f')})"
              if best else "-")
        out.append(f"  {name:<28} {cell(a, 'ratio')} {cell(b, 'ratio_onepass'):>24} {bp}")
    fails = [f"{r['impl']}@{r['shape']}/{r['N'] // 1024}K/{r['active']:.2f}/{r['mask']}: "
             f"{r['status']}" for r in records
             if r.get("ms") is None and not str(r.get("status", "")).startswith("skipped")]
    skips = sorted({f"{r['impl']}: {str(r['status'])[len('skipped: '):]}" for r in records
                    if str(r.get("status", "")).startswith("skipped")})
    flags = [f"{r['impl']}@{r['shape']}/{r['active']:.2f}/{r['mask']}: {r['flag']}"
             for r in records if r.get("flag")]
    for title, items in (("failed", fails), ("skipped", skips), ("flagged", flags)):
        if items:
            out.append(f"# {title}: " + "; ".join(items)[:1500])
    return "\n".join(out)


def write_plot(path, records):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001
        log(f"# plot skipped: matplotlib unavailable ({e})")
        return
    shapes = []
    for r in records:
        if (r["shape"], r["N"]) not in shapes:
            shapes.append((r["shape"], r["N"]))
    if not shapes:
        return
    n = len(shapes)
    cols = min(n, 2)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(7 * cols, 4.8 * rows), squeeze=False)
    impls = [i for i in IMPLS if any(r["impl"] == i for r in records)]
    cmap = plt.get_cmap("tab20")
    color = {impl: cmap(j % 20) for j, impl in enumerate(impls)}
    for k, (shape, N) in enumerate(shapes):
        ax = axes[k // cols][k % cols]
        rs = [r for r in records if r["shape"] == shape and r["N"] == N and r.get("ms")]
        labelled = set()
        for mask, ls, mk in (("response", "-", "o"), ("fragmented", ":", "s")):
            # fragmented is not run at 1.0: its line starts from response's dense point
            m = [r for r in rs if r["mask"] == mask or (mask == "fragmented" and
                                                        r["mask"] == "response" and
                                                        r["active"] >= 1.0)]
            if not any(r["mask"] == mask for r in m):
                continue
            for impl in impls:
                pts = sorted((r["active"], r["ms"]) for r in m if r["impl"] == impl)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], ls, marker=mk,
                            color=color[impl], label=None if impl in labelled else impl)
                    labelled.add(impl)
            for key, fls, lab in (("floor_ms", "-", "8NHV floor"),
                                  ("floor_onepass_ms", "--", "6NHV floor")):
                fl = sorted({(r["active"], r[key]) for r in m if r.get(key)})
                if fl:
                    ax.plot([p[0] for p in fl], [p[1] for p in fl], fls if mask == "response"
                            else ":", color="black", lw=1.8 if key == "floor_ms" else 1.2,
                            label=None if lab in labelled else lab)
                    labelled.add(lab)
        for r in rs:        # packed-rl: one point per impl at the batch's fraction
            if r["mask"] == "packed-rl":
                ax.plot([r["active"]], [r["ms"]], "X", ms=8, color=color[r["impl"]],
                        label=None if r["impl"] in labelled else r["impl"])
                labelled.add(r["impl"])
        ax.set_title(f"{shape}: H {rs[0]['H'] if rs else '?'}, V {rs[0]['V_local'] if rs else '?'}"
                     f", N {N} (solid: response, dotted: fragmented, X: packed-rl)", fontsize=9)
        ax.set_xlabel("active fraction")
        ax.set_ylabel("forward + backward ms")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6, ncol=2)
    for k in range(n, rows * cols):
        axes[k // cols][k % cols].axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def commit_hash():
    c = os.environ.get("SPH_COMMIT")
    if c:
        return c
    try:
        r = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                           capture_output=True, text=True, timeout=10)
        if r.returncode == 0 and r.stdout.strip():
            return r.stdout.strip()
    except Exception:  # noqa: BLE001
        pass
    return "unknown"


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
