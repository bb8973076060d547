#!/usr/bin/env python3
"""A model of the fused top-k's threshold in the sm_90a statistics epilogue (head_sm90.cu
epi_topk_*, head_extras.cu's seed), to predict a row's candidates before a device run.

Per row, the epilogue of column tile t reads the row's threshold tau as the tiles up to t - L
left it (L: the tiles of a row in flight at once under the grouped raster), appends the
logits z >= tau, raises the slots and, where the row's count crossed a multiple of 2^every,
reads the slots back and raises tau. The candidates depend only on the logits' order within
a row (iid logits: any continuous distribution gives the same counts; the seed's margin is
modelled as a shift of `margin` standard deviations). What it prints per configuration: the
mean candidates per row, the share of (tile, warp, row half, group of 8 positions) that hold
no candidate (a warp-uniform skip of the group's compares fires there), the read-backs per
row, and the epilogue's top-k warp instructions per 16K rows from the SASS counts of
scripts/sass_epi.sh: the count (with and without the group skip), the emission (per trip of
its loop: the warp's largest lane count, not per candidate) and the read-backs (once per warp
row half with a row reading). Each run of a row's tiles is sequential here (L models the
tiles in flight), so the counts are per row and split, the whole vocabulary one split.
The group skip, the 2 K' slots' K-th rule and the small seed were v30's A/B bits (5, 4, 6),
removed after run 37 (notes/cuda-notes.md, "Run 37 measured"): here they are models only,
their SASS counts those of v30's scripts/sass_epi.sh.

    python3 bench/cuda/topk_sim.py                 # the calibration rows and the variants
    python3 bench/cuda/topk_sim.py --V 128256      # E's vocabulary

Calibration (run 33 call 3, SPH_TEST_TOPK_COUNT, K 64, 16K rows, v24's rule which is today's):
A (V 62080) 679 candidates per row, E (V 128256) 906.
"""
import argparse
import math

import numpy as np

STAGE = 24  # SM90_TK_STAGE


def seed_rank(K, m, w):
    """head_extras.cu topk_seed_rank: the smallest s with P(Poisson((K-1) m / w) >= s) <= 2^-30"""
    lam = (K - 1) * m / w
    term, tail, s = math.exp(-lam), 1.0, 0
    while s < K:
        tail -= term
        s += 1
        if tail <= 2.0**-30:
            break
        term *= lam / s
    return s


def simulate(z, K, ks, every, m, L, rule, margin, seed_s=None, group=8):
    """z: (rows, V) logits, rows a multiple of 16 (a warp's two row halves of 8 rows).
    rule 'min': tau = min of the ks slots; 'kth': tau = the K-th largest slot."""
    rows, V = z.shape
    nt = (V + 255) // 256
    ninf = -np.inf
    # the seed
    if m and V >= 8 * m:
        stride = V // m
        samp = z[:, : stride * m : stride]
        s = seed_s or seed_rank(K, m, V)
        tau0 = -np.sort(-samp, axis=1)[:, s - 1] - margin
    else:
        tau0 = np.full(rows, ninf)
    tau_after = [tau0.copy()]  # tau_after[t + 1]: after tile t
    tau = tau0.copy()
    slots = np.full((rows, ks), ninf)
    count = np.zeros(rows, dtype=np.int64)
    groups_total = 0
    groups_empty = 0
    emit_trips = emit_halves = rb_events = 0
    reads = 0
    pos = np.arange(256)
    q4_of = (pos % 8) // 2  # column 8 j + 2 q4 + e
    j_of = pos // 8
    for t in range(nt):
        c0 = 256 * t
        w = min(256, V - c0)
        zt = np.full((rows, 256), np.nan)
        zt[:, :w] = z[:, c0 : c0 + w]
        tr = tau_after[max(t - L + 1, 0)] if L > 0 else tau
        cand = zt >= tr[:, None]  # NaN (past the split) never
        # group skip statistics: a warp's row half = 8 rows, group = `group` positions per
        # thread (group / 2 values of j, both e) over the quad's 4 threads: 4 * group columns
        gcols = group // 2 * 8  # columns per group: j block of group/2, all 8 (q4, e)
        cg = cand.reshape(rows // 8, 8, 256 // gcols, gcols).any(axis=(1, 3))
        groups_total += cg.size
        groups_empty += (~cg).sum()
        # per thread (row, q4): counts and the stage
        n_thr = np.stack([cand[:, q4_of == q].sum(axis=1) for q in range(4)], axis=1)
        # rows in pairs (r, r + 8) share a thread's stage: the first half stages min(n0,
        # STAGE), the second overflows when that plus its own count passes the stage
        rr = np.arange(rows)
        half = (rr // 8) % 2
        partner = np.where(half == 0, rr + 8, rr - 8)
        n_first = np.where((half == 1)[:, None], np.minimum(n_thr[partner], STAGE), 0)
        over = n_first + n_thr > STAGE
        zc = np.where(cand, zt, ninf)
        for q in range(4):
            sel = q4_of == q
            zq = zc[:, sel]
            mx = zq.max(axis=1)
            ov = over[:, q].astype(bool)
            # staged: slot (4 t + q) mod ks raised to the thread's largest candidate
            sl = (4 * t + q) % ks
            st = ~ov & (n_thr[:, q] > 0)
            slots[st, sl] = np.maximum(slots[st, sl], mx[st])
            # overflowing: every candidate raises its column's slot
            if ov.any():
                cols = c0 + pos[sel]
                for k, c in enumerate(cols):
                    if c >= V:
                        continue
                    s = c % ks
                    v = zq[ov, k]
                    slots[ov, s] = np.maximum(slots[ov, s], v)
        # the emission loop runs its warp's largest lane count (staged path), per row half
        nh = n_thr.reshape(rows // 8, 32)
        emit_trips += nh.max(axis=1).sum()
        emit_halves += (nh.sum(axis=1) > 0).sum()
        total = n_thr.sum(axis=1)
        base = count.copy()
        count += total
        look = (total > 0) & ((base >> every) != ((base + total) >> every))
        rb_events += look.reshape(rows // 8, 8).any(axis=1).sum()
        if look.any():
            reads += look.sum()
            if rule == "min":
                mn = slots.min(axis=1)
            elif rule == "kth":
                mn = -np.sort(-slots, axis=1)[:, K - 1]
            elif rule.startswith("bisect"):
                # R rounds of bisection between lo = max(tau, min) and hi = max: the highest
                # point K slots reach (lo always does: tau does, or every slot is >= min)
                R = int(rule.split(":")[1])
                lo = np.maximum(tau, slots.min(axis=1))
                hi = slots.max(axis=1)
                lo = np.where(np.isfinite(lo), lo, np.nan)
                for _ in range(R):
                    v = 0.5 * (lo + hi)
                    ok = (slots >= v[:, None]).sum(axis=1) >= K
                    lo = np.where(ok, v, lo)
                    hi = np.where(ok, hi, v)
                mn = np.where(np.isnan(lo), slots.min(axis=1), lo)
            else:  # "probes:f1,f2,..": the highest of the probes lo + f (hi - lo) K slots reach
                fs = [float(f) for f in rule.split(":")[1].split(",")]
                lo = np.maximum(tau, slots.min(axis=1))
                hi = slots.max(axis=1)
                mn = lo.copy()
                for f in fs:
                    v = lo + f * (hi - lo)
                    ok = (slots >= v[:, None]).sum(axis=1) >= K
                    mn = np.where(ok & (v > mn), v, mn)
            tau = np.where(look, np.maximum(tau, mn), tau)
        tau_after.append(tau.copy())
    halves = rows // 8 * nt  # (warp row half, tile) pairs
    # warp instructions per (row half, tile), scaled to 16K rows: the count (4 per position,
    # 64 positions; with the group skip 32 per group scanned + 2 per group), the emission
    # (~17 per trip of its loop, ~30 to set it up: scripts/sass_epi.sh, v26), the read-back
    # (the minimum's ~40, 80 + 113 per bisection, once per warp row half with a row reading)
    scale = 16384 / rows
    rb_cost = 40  # the minimum's rule
    if rule.startswith("bisect"):
        rb_cost = 80 + 113 * int(rule.split(":")[1])  # loads and extremes, then the rounds
    elif rule == "kth":
        rb_cost = 530
    cost = dict(
        count=256 * halves * scale,
        count_gs=((groups_total - groups_empty) * 32 + 16 * halves) * scale,
        emit=(17 * emit_trips + 30 * emit_halves) * scale,
        readback=rb_cost * rb_events * scale,
    )
    return count.mean(), groups_empty / groups_total, reads / rows, cost


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--V", type=int, default=62080)
    ap.add_argument("--K", type=int, default=64)
    ap.add_argument("--rows", type=int, default=128)
    ap.add_argument("--L", type=int, nargs="*", default=[8])
    ap.add_argument("--margin", type=float, default=0.02)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="the current configuration only")
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    z = rng.standard_normal((a.rows, a.V)).astype(np.float64)
    K = a.K
    k2 = 8
    while k2 < K:
        k2 *= 2
    m0 = max(1024, 16 * k2)
    configs = [("today: ks K', min, every 256, m %d" % m0, dict(ks=k2, every=8, m=m0, rule="min"))]
    if not a.quick:
        for ev in (7, 6, 5):
            configs.append(("every %d" % (1 << ev), dict(ks=k2, every=ev, m=m0, rule="min")))
        for m in (512, 256, 128):
            configs.append(("m %d" % m, dict(ks=k2, every=8, m=m, rule="min")))
            configs.append(("m %d, every 64" % m, dict(ks=k2, every=6, m=m, rule="min")))
        for ksm in (2, 4):
            for ev in (8, 6):
                configs.append(("ks %d K', K-th, every %d" % (ksm, 1 << ev),
                                dict(ks=ksm * k2, every=ev, m=m0, rule="kth")))
                configs.append(("ks %d K', K-th, every %d, m 256" % (ksm, 1 << ev),
                                dict(ks=ksm * k2, every=ev, m=256, rule="kth")))
        for pr in ("0.25,0.5,0.75", "0.3,0.4,0.5", "0.2,0.35,0.5", "0.4,0.5,0.6", "0.1,0.2,0.3,0.4,0.5"):
            for ev, m in ((6, m0), (6, 256), (7, 256)):
                configs.append(("ks 2 K', probes %s, every %d, m %d" % (pr, 1 << ev, m),
                                dict(ks=2 * k2, every=ev, m=m, rule="probes:" + pr)))
        for R in (2, 3, 4, 5, 6, 8):
            for ev, m in ((6, m0), (6, 256), (7, 256), (8, 256), (7, m0), (8, m0)):
                configs.append(("ks 2 K', bisect %d, every %d, m %d" % (R, 1 << ev, m),
                                dict(ks=2 * k2, every=ev, m=m, rule="bisect:%d" % R)))
        configs.append(("no seed", dict(ks=k2, every=8, m=0, rule="min")))
    print("V %d, K %d, %d rows; seed rank at m: %s" % (
        a.V, K, a.rows, ", ".join("%d: %d" % (m, seed_rank(K, m, a.V)) for m in (128, 256, 512, 1024))))
    print("| configuration | L | candidates per row | empty groups of 8 | read-backs per row "
          "| M warp instructions per 16K rows: count / with the group skip / emission / "
          "read-backs |")
    print("|---|---|---|---|---|---|")
    for name, c in configs:
        for L in a.L:
            n, empty, reads, w = simulate(z, K, c["ks"], c["every"], c["m"], L, c["rule"],
                                          a.margin)
            print("| %s | %d | %.0f | %.2f | %.1f | %.0f / %.0f / %.0f / %.0f |" % (
                name, L, n, empty, reads, w["count"] / 1e6, w["count_gs"] / 1e6,
                w["emit"] / 1e6, w["readback"] / 1e6))


if __name__ == "__main__":
    main()
