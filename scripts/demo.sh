#!/usr/bin/env bash
# make demo: the main job on an embedded default. Packs a sample of sequence lengths, shows
# the packed layout and the active spans of an RL batch, then runs the LM head forward and
# backward on a packed RL-style batch and checks it against the float64 reference.
set -euo pipefail
cli=${1:-build/spanhead}
here=$(cd "$(dirname "$0")/.." && pwd)
data=$here/tests/data/demo
echo "== spanhead pack (embedded sample of 24 sequence lengths, capacity 4096, TP2 CP2) =="
packed=$("$cli" pack --capacity 4096 --algorithm mffd --tp 2 --cp 2 --bin-multiple 2 "$data/lengths.json")
echo "$packed"
echo
first_bin=$(python3 -c 'import json,sys; L=json.load(open(sys.argv[1])); P=json.loads(sys.argv[2]); print(" ".join(str(L[i]) for i in P["bins"][0]))' "$data/lengths.json" "$packed")
echo "== spanhead layout --tp 2 --cp 2 of the first bin's lengths ($first_bin) =="
"$cli" layout --tp 2 --cp 2 $first_bin
echo
echo "== spanhead spans (packed RL batch, CP rank 1 of 2) =="
# The full JSON carries the whole 0/1 mask; show it shortened.
"$cli" spans --tp 2 --cp 2 --cp-rank 1 "$data/batch.json" | python3 -c '
import json, sys
d = json.load(sys.stdin)
m = d["active_mask"]
d["active_mask"] = "[%d entries: %s ...]" % (len(m), "".join(map(str, m[:48])))
print(json.dumps(d))'
echo
echo "== spanhead run (packed RL batch of prompts and responses, forward + backward, checked) =="
"$cli" run --check
