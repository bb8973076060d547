#!/usr/bin/env python3
"""Issue 23's remaining distance at every measured point: for each (shape, N, mask, active)
of the peers.py JSON lines given, spanhead's one-pass (and general) time against the fastest
peer measured in the same run at that point (the ratio is same-run; times across runs are not
compared). The newest run wins where several measured a point.
    python3 distance.py RUN/peers*.jsonl ... > distance.md"""
import json
import sys

pts = {}
for path in sys.argv[1:]:
    recs = {}
    for line in open(path):
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if r.get("ms") is None or "impl" not in r or "MISMATCH" in str(r.get("flag", "")):
            continue  # a peer whose result disagreed with the reference does not count
        frac = "packed" if r["mask"] == "packed-rl" else f"{r['active_target']:.2f}"
        key = (r["shape"], r["N"], r["mask"], frac)
        recs.setdefault(key, {})[r["impl"]] = (r["ms"], r.get("commit"), r.get("date", "")[:10],
                                               path.split("/")[0])
    for k, v in recs.items():
        pts[k] = v  # later files (newer runs) win
order = {"A": 0, "B": 1, "C": 2, "D": 3, "E": 4}
print("| shape | N | mask | active | one-pass ms | general ms | fastest peer | ms | one-pass / peer |"
      " general / peer | run |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
worst = []
for k in sorted(pts, key=lambda k: (order.get(k[0], 9), k[1], k[2], k[3])):
    v = pts[k]
    peers = {i: m for i, m in v.items() if not i.startswith("spanhead")}
    if not peers or "spanhead-onepass" not in v:
        continue
    bp = min(peers, key=lambda i: peers[i][0])
    pm = peers[bp][0]
    op = v["spanhead-onepass"][0]
    ge = v.get("spanhead", (None,))[0]
    worst.append(op / pm)
    print(f"| {k[0]} | {k[1] // 1024}K | {k[2]} | {k[3]} | {op:.3f} | "
          f"{'-' if ge is None else f'{ge:.3f}'} | {bp} | {pm:.3f} | {op / pm:.2f} | "
          f"{'-' if ge is None else f'{ge / pm:.2f}'} | {v['spanhead-onepass'][3]} |")
if worst:
    print(f"\n{len(worst)} points; one-pass / fastest peer: min {min(worst):.2f}, "
          f"median {sorted(worst)[len(worst) // 2]:.2f}, max {max(worst):.2f}")
