#!/usr/bin/env bash
# run_io.sh - `spanhead run --inputs DIR --outputs DIR` under mpirun: rank 0 reads global .npy
# inputs (ragged lengths, a loss mask with ignored targets, upstream gradients), the gathered
# outputs are written as one process would write them: the same files as `spanhead run
# --inputs --outputs` without mpirun (logprob, entropy, lse, logit_mean, dhidden, dweight),
# matching them, and an independent numpy float64 oracle checks logprob, entropy, dhidden and
# dweight, for (T,C,D) = (2,1,1), (1,2,1) and (2,1,2).
# usage: run_io.sh SPANHEAD MPIRUN PYTHON [extra run arguments...]
set -euo pipefail
cli=$1 mpirun=$2 py=$3
shift 3
if ! "$py" -c 'import numpy' 2>/dev/null; then
    echo "skipped: numpy is not installed"
    exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
seed=${SPH_TEST_SEED:-$RANDOM}
echo "run_io: seed $seed"
"$py" - "$tmp/in" "$seed" <<'PY'
import os, sys, numpy as np
d, seed = sys.argv[1], int(sys.argv[2])
os.makedirs(d)
rng = np.random.default_rng(seed)
lengths = rng.integers(2, 30, size=7).astype(np.int64)
R, H, V = int(lengths.sum()), 13, 157
h = rng.standard_normal((R, H)).astype(np.float32)
w = (rng.standard_normal((V, H)) * 0.4).astype(np.float32)
t = rng.integers(0, V, size=R).astype(np.int64)
m = (rng.random(R) < 0.6).astype(np.uint8)
t[rng.random(R) < 0.1] = -100
g = rng.standard_normal(R).astype(np.float32)
e = (0.5 * rng.standard_normal(R)).astype(np.float32)
for name, a in dict(hidden=h, weight=w, targets=t, mask=m, lengths=lengths, dlogprob=g,
                    dentropy=e).items():
    np.save(os.path.join(d, name + ".npy"), a)
PY
# the single-process run of the same inputs
"$cli" run --inputs "$tmp/in" --outputs "$tmp/one" --entropy --temperature 0.9 >/dev/null
run() {
    local np=$1
    shift
    rm -rf "$tmp/out"
    "$mpirun" --oversubscribe --allow-run-as-root -np "$np" "$cli" run --inputs "$tmp/in" \
        --outputs "$tmp/out" --temperature 0.9 "$@"
    "$py" - "$tmp/in" "$tmp/out" "$tmp/one" <<'PY'
import os, sys, numpy as np
i, o, one = sys.argv[1], sys.argv[2], sys.argv[3]
L = lambda d, n: np.load(f"{d}/{n}.npy")
h, w = L(i, "hidden").astype(np.float64), L(i, "weight").astype(np.float64)
t, m = L(i, "targets"), L(i, "mask").astype(bool)
g, e = L(i, "dlogprob").astype(np.float64), L(i, "dentropy").astype(np.float64)
T = 0.9
z = h @ w.T / T
mx = z.max(1, keepdims=True)
lse = (mx + np.log(np.exp(z - mx).sum(1, keepdims=True)))[:, 0]
p = np.exp(z - lse[:, None])
mu = (p * z).sum(1)
ok_t = t >= 0
zt = np.where(ok_t, z[np.arange(len(t)), np.where(ok_t, t, 0)], 0.0)
logprob = np.where(m & ok_t, zt - lse, 0.0)
entropy = np.where(m, lse - mu, 0.0)
onehot = np.zeros_like(z)
onehot[np.arange(len(t))[ok_t], t[ok_t]] = 1
gg = np.where(m & ok_t, g, 0.0)[:, None]
ee = np.where(m, e, 0.0)[:, None]
dz = gg * (onehot - p) + ee * p * (mu[:, None] - z)
du = dz / T
ref = dict(logprob=logprob, entropy=entropy, dhidden=du @ w, dweight=du.T @ h)
bad = 0
for k, r in ref.items():
    got = L(o, k)
    if got.shape != r.shape or got.dtype != np.float32:
        print(f"{k}: shape {got.shape} dtype {got.dtype}, expected {r.shape} float32"); bad += 1
        continue
    err = np.abs(got - r) / (1e-4 + 1e-4 * np.abs(r))
    print(f"  numpy oracle {k}: max abs err {np.abs(got - r).max():.3e} (ratio {err.max():.3f})")
    bad += err.max() > 1
names = sorted(os.listdir(one))
if sorted(os.listdir(o)) != names:
    print(f"files differ from one process: {sorted(os.listdir(o))} vs {names}"); bad += 1
for n in names:
    a, b = np.load(f"{o}/{n}"), np.load(f"{one}/{n}")
    if a.shape != b.shape or a.dtype != b.dtype:
        print(f"{n}: {a.shape} {a.dtype} vs one process {b.shape} {b.dtype}"); bad += 1
        continue
    err = np.abs(a - b) / (1e-4 + 1e-4 * np.abs(b))
    print(f"  vs one process {n}: max abs diff {np.abs(a - b).max():.3e} (ratio {err.max():.3f})")
    bad += err.max() > 1
sys.exit(1 if bad else 0)
PY
}
run 2 --tp 2 "$@"
run 2 --cp 2 "$@"
run 4 --tp 2 --dp 2 "$@"

# bf16 inputs travel as uint16 bits (--dtype bf16), in one process and distributed alike
"$py" - "$tmp/in" "$tmp/bf" <<'PY'
import os, shutil, sys, numpy as np
i, o = sys.argv[1], sys.argv[2]
shutil.copytree(i, o)
for n in ("hidden", "weight"):
    x = np.load(f"{i}/{n}.npy").astype(np.float32).view(np.uint32)
    bits = ((x + 0x7FFF + ((x >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even
    np.save(f"{o}/{n}.npy", bits)
PY
"$cli" run --inputs "$tmp/bf" --outputs "$tmp/bf_one" --entropy --temperature 0.9 --dtype bf16 \
    >/dev/null
rm -rf "$tmp/bf_out"
"$mpirun" --oversubscribe --allow-run-as-root -np 4 "$cli" run --inputs "$tmp/bf" \
    --outputs "$tmp/bf_out" --temperature 0.9 --dtype bf16 --tp 2 --cp 2 "$@"
"$py" - "$tmp/bf_out" "$tmp/bf_one" <<'PY'
import os, sys, numpy as np
o, one = sys.argv[1], sys.argv[2]
bad = 0
for n in sorted(os.listdir(one)):
    a, b = np.load(f"{o}/{n}"), np.load(f"{one}/{n}")
    err = np.abs(a - b) / (1e-4 + 1e-4 * np.abs(b))
    print(f"  bf16 vs one process {n}: max abs diff {np.abs(a - b).max():.3e} (ratio {err.max():.3f})")
    bad += a.shape != b.shape or err.max() > 1
sys.exit(1 if bad else 0)
PY
echo "run_io: PASS"
