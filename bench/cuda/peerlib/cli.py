"""peers.py, part: the arguments and the plan of points."""

import argparse

from .common import IMPLS, LOGPROB_IMPLS, MASKS, POLICY_IMPLS, SHAPES


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
        # response first; within it 0.5 (the headline point), 1.0, then lower; then
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
