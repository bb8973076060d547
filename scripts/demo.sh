#!/usr/bin/env bash
# make demo: the main job of spanhead, told in five steps on an embedded default. The CLI's
# JSON (pack, layout, spans, run --json) is turned into a few readable lines per step:
#   1. pack a sample of 24 sequence lengths into bins (lengths and utilization per bin)
#   2. the packed segment layout of the first bin under TP 2 x CP 2
#   3. the loss mask of an RL batch -> its active rows and spans on one CP rank
#   4. the LM head's forward and backward on a packed RL batch, timed against the active floor,
#      with the memory the dense logits would have taken
#   5. the same outputs checked against the float64 reference
# usage: scripts/demo.sh [PATH_TO_SPANHEAD]   (exit 1 when any step fails)
set -euo pipefail
cli=${1:-build/spanhead}
here=$(cd "$(dirname "$0")/.." && pwd)
data=$here/tests/data/demo
py=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$cli" pack --capacity 4096 --algorithm mffd --tp 2 --cp 2 --bin-multiple 2 "$data/lengths.json" >"$tmp/pack.json"
first=$("$py" -c 'import json,sys; print(" ".join(map(str, json.load(open(sys.argv[1]))["bin_lengths"][0])))' "$tmp/pack.json")
"$cli" layout --tp 2 --cp 2 $first >"$tmp/layout.json"
"$cli" spans --tp 2 --cp 2 --cp-rank 1 "$data/batch.json" >"$tmp/spans.json"
rc=0
"$cli" run --check --json >"$tmp/run.json" 2>"$tmp/run.err" || rc=$?

"$py" - "$data/lengths.json" "$tmp" "$rc" <<'PY'
import json, sys

lengths = json.load(open(sys.argv[1]))
d = sys.argv[2]
rc = int(sys.argv[3])
J = lambda n: json.load(open(f"{d}/{n}.json"))
pack, lay, sp = J("pack"), J("layout"), J("spans")
run = J("run") if open(f"{d}/run.json").read().strip() else None
MiB = 1 << 20


def row(label, values, width=96, indent=5):
    """label, then the values, wrapped; indent < 0: no label column."""
    out, line = [], f"   {label:<{indent}}" if indent >= 0 else "  "
    indent = max(indent, -1)
    for v in map(str, values):
        if len(line) + len(v) + 1 > width:
            out.append(line)
            line = " " * (indent + 3)
        line += " " + v
    return "\n".join(out + [line])


print(f"spanhead demo: the LM head of one RL training step, on this machine "
      f"({run['context'] if run else 'cpu'})\n")

cap = 4096
print(f"1. Pack {len(lengths)} sequences of {min(lengths)}..{max(lengths)} tokens into bins of "
      f"{cap} tokens (mffd),\n   each padded for TP 2 x CP 2:")
for b, (ls, tok) in enumerate(zip(pack["bin_lengths"], pack["bin_tokens"])):
    print(f"   bin {b}: {tok:4d} tokens, {tok / cap:6.1%} full  <- lengths "
          + " ".join(map(str, ls)))
lb = -(-sum(pack["bin_tokens"]) // cap)
print(f"   {len(pack['bins'])} bins (the tokens need {lb}; data parallelism 2 wants an even count), "
      f"utilization {pack['utilization']:.1%}\n")

print(f"2. Lay out bin 0 for TP 2 x CP 2: each sequence padded to a multiple of "
      f"{lay['sequence_align']},\n   the total to a multiple of {lay['total_align']}:")
print(row("lengths", pack["bin_lengths"][0], indent=11))
print(row("padded", lay["padded_lengths"], indent=11))
print(row("cu_seqlens", lay["cu_seqlens_padded"], indent=11) + "\n")

spans = sp["spans"]
print("3. The loss mask of an RL batch (tests/data/demo/batch.json: prompts carry no loss),\n"
      "   on CP rank 1 of 2:")
print(f"   {sp['active_rows']} of {len(sp['active_mask'])} rows carry loss; this rank holds "
      f"{sp['local_rows']} rows, {sp['local_active_rows']} of them active, in {len(spans)} spans:")
print(row("", [f"[{a},{b})" for a, b in spans], indent=-1) + "\n")

if run is None:
    print("4. spanhead run failed:\n   " + open(f"{d}/run.err").read().strip())
    sys.exit(1)
N, H, V, na = run["N"], run["H"], run["V_loc"], run["active_rows"]
print(f"4. The head, forward + backward, on a packed RL batch of {run['packed_sequences']} "
      f"sequences (RL advantages as dlogprob,\n   an entropy bonus): N = {N} rows, {na} active "
      f"({na / N:.0%}), H = {H}, V = {V}, {run['dtype']}:")
f, b = run["forward_ms"], run["backward_ms"]
print(f"   forward {f:8.2f} ms   backward {b:8.2f} ms   total {f + b:8.2f} ms")
if run["floor_ms"]:
    print(f"   floor   {run['floor_ms']:8.2f} ms = 8 N_active H V = {run['floor_flops'] / 1e9:.2f} "
          f"GFLOP at this machine's sgemm rate, {run['gemm_rate_gflops']:.1f} GFLOP/s")
    print(f"   -> {run['ratio']:.2f}x the active floor (rows without loss cost nothing: a dense "
          f"head would do {N / na:.2f}x the work)")
print(f"   memory: {run['workspace_bytes'] / MiB:.1f} MiB of workspace; the [N x V] fp32 logits it "
      f"never stored would be {run['dense_logits_bytes'] / MiB:.1f} MiB")
print(f"   (they grow with N x V: at 16K tokens and a 128K vocabulary, 8 GiB per rank)\n")

c = run["check"]
print(f"5. Check against the float64 reference ({c['seconds']:.1f} s), normwise relative error "
      f"(tolerance {c['tolerance']:.0e}):")
print(row("", [f"{k} {v:.1e}" for k, v in c["errors"].items()], indent=-1))
print(f"   {'passed' if c['passed'] else 'FAILED'}")
sys.exit(0 if c["passed"] and rc == 0 else 1)
PY
