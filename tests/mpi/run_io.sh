#!/usr/bin/env bash
# run_io.sh - `spanhead run --inputs DIR --outputs DIR` under mpirun: rank 0 reads global .npy
# inputs (ragged lengths, a loss mask with ignored targets, upstream gradients), the gathered
# outputs are written as one process would write them, and an independent numpy float64
# oracle checks them (logprob, entropy, dhidden, dweight), for (T,C,D) = (2,1,1) and (1,2,1).
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
run() {
    local np=$1
    shift
    rm -rf "$tmp/out"
    "$mpirun" --oversubscribe --allow-run-as-root -np "$np" "$cli" run --inputs "$tmp/in" \
        --outputs "$tmp/out" --temperature 0.9 "$@"
    "$py" - "$tmp/in" "$tmp/out" <<'PY'
import sys, numpy as np
i, o = sys.argv[1], sys.argv[2]
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
sys.exit(1 if bad else 0)
PY
}
run 2 --tp 2 "$@"
run 2 --cp 2 "$@"
run 4 --tp 2 --dp 2 "$@"
echo "run_io: PASS"
