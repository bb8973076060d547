"""run 30: the device image's test_numpy_topk[ref-*] failures (a CPU test): for seeds that fail
there, print the swapped pair's float64 values as NumPy computes them (matmul and an explicit
loop) and the ids and log-probs the library's reference context returns."""
import os, sys
import numpy as np
sys.path.insert(0, "python/tests")
import spanhead
from test_topk import case, oracle

print("numpy", np.__version__, np.show_config.__module__)
for seed in [int(s) for s in sys.argv[1:]]:
    for (N, H, V), K in [((37, 19, 613), 64), ((23, 16, 300), 256)]:
        for T, cap in [(1.0, 0.0), (0.6, 2.5)]:
            name = f"test_numpy_topk[ref-{T}-{cap}-shape{0 if V == 613 else 3}-{K}]"
            h_ = sum(ord(c) * 131 ** (i % 7) for i, c in enumerate(name)) & 0xFFFFFFFF
            rng = np.random.default_rng([seed, h_])
            h, w, t, mask = case(rng, N, H, V)
            c = spanhead.Context("cpu", kernel="ref")
            r = spanhead.head_forward(h, w, t, active_mask=mask, temperature=T, softcap=cap,
                                      topk=K, lse=True, context=c)
            order, ref = oracle(h, w, T, cap)
            a = np.flatnonzero(mask.astype(bool))
            for ri, i in enumerate(a):
                got = r.topk_ids[i]
                bad = np.flatnonzero(got != order[i, :K])
                if len(bad):
                    k = bad[0]
                    ids = (order[i, k], order[i, k + 1] if k + 1 < V else -1)
                    u = h[i].astype(np.float64) @ w.astype(np.float64).T
                    loop = [sum(float(h[i, q]) * float(w[j, q]) for q in range(H)) for j in ids]
                    print(name, "row", i, "pos", k, "oracle ids", ids, "got", got[k:k + 2],
                          "matmul u", [repr(u[j]) for j in ids], "loop u", [repr(x) for x in loop],
                          "w rows equal", bool(np.array_equal(w[ids[0]], w[ids[1]])),
                          "lib lp", r.topk_logprobs[i, k:k + 2])
                    break
            c.close()
