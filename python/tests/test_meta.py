"""Host metadata through the binding: against the formulas of docs/design.md section 3 (written
independently here) and against the CLI's JSON (SPANHEAD_CLI, when set)."""

import json
import math
import os
import subprocess

import numpy as np
import pytest

import spanhead

FP8S = ["none", "blockwise", "mxfp8"]


def align_ref(tp, cp, fp8):
    seq = 2 * tp * cp if cp > 1 else 1
    total = 2 * tp * cp if cp > 1 else tp
    f = {"none": None, "mxfp8": 32 * tp * cp,
         "blockwise": 128 * tp * cp if tp > 1 else 16 * cp}[fp8]
    lcm = lambda a, b: a * b // math.gcd(a, b)  # noqa: E731
    if f:
        total = lcm(total, f)
    unpacked = 0 if cp > 1 else (lcm(tp, f) if f else tp)
    return {"sequence_align": seq, "total_align": total, "unpacked_align": unpacked}


@pytest.mark.parametrize("fp8", FP8S)
@pytest.mark.parametrize("tp,cp", [(1, 1), (2, 1), (4, 1), (1, 2), (2, 2), (4, 2), (8, 1),
                                   (1, 8), (3, 1)])
def test_alignment(tp, cp, fp8):
    assert spanhead.alignment(tp=tp, cp=cp, fp8=fp8) == align_ref(tp, cp, fp8)


@pytest.mark.parametrize("fp8", FP8S)
@pytest.mark.parametrize("tp,cp", [(1, 1), (2, 1), (2, 2), (4, 2), (1, 4)])
def test_layout(rng, tp, cp, fp8):
    lengths = rng.integers(1, 300, int(rng.integers(1, 12))).tolist()
    out = spanhead.layout(lengths, tp=tp, cp=cp, fp8=fp8)
    a = align_ref(tp, cp, fp8)
    seq, total = a["sequence_align"], a["total_align"]
    padded = [-(-n // seq) * seq for n in lengths]
    padded[-1] += (-sum(padded)) % total
    assert out["padded_lengths"] == padded
    assert out["cu_seqlens_padded"] == [0] + np.cumsum(padded).tolist()
    assert out["sequence_align"] == seq and out["total_align"] == total


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_cp_local_rows_partition(cp):
    P = 2 * cp * 5
    seen = []
    for r in range(cp):
        rows = spanhead.cp_local_rows(P, cp, r)
        c = P // (2 * cp)
        assert rows == list(range(r * c, (r + 1) * c)) + \
            list(range((2 * cp - 1 - r) * c, (2 * cp - r) * c))
        seen += rows
    assert sorted(seen) == list(range(P))


def unpacked_mask_ref(loss, S, A):
    B = len(loss)
    m = np.zeros((B, S), np.uint8)
    for b in range(B):
        m[b, S - 1 - A:S - 1] = loss[b]
    return m.reshape(-1)


@pytest.mark.parametrize("gap", [0, 1, 4, 128])
def test_spans_unpacked(rng, gap):
    B, S, A = 3, 20, 7
    loss = (rng.random((B, A)) < 0.5).astype(int).tolist()
    doc = {"layout": "unpacked", "sequence_length": S, "num_actions": A, "loss_mask": loss}
    out = spanhead.spans(doc, gap=gap, full=True)
    ref = unpacked_mask_ref(loss, S, A)
    assert out["active_mask"] == ref.tolist()
    assert out["active_rows"] == int(ref.sum()) == out["local_active_rows"]
    assert out["local_rows"] == B * S == out["global_rows"]
    sp = np.asarray(out["spans"]).reshape(-1, 2)
    assert sp.tolist() == spanhead.spans_from_mask(ref, gap=gap).tolist()
    spanhead.validate_spans(sp, B * S, ref)
    # spans cover every active row and only merge gaps of at most `gap` rows
    for (a0, a1), (b0, _) in zip(sp[:-1], sp[1:]):
        assert b0 - a1 > gap
    # the same document as a JSON string and as a file
    assert spanhead.spans(json.dumps(doc), gap=gap, full=True) == out


def test_spans_packed_cp(rng):
    B, S, A = 2, 24, 10
    loss = (rng.random((B, A)) < 0.6).astype(int).tolist()
    doc = {"layout": "packed", "sequence_length": S, "num_actions": A, "loss_mask": loss,
           "sub_seq_lengths": [[10, 14], [24]]}
    total_local = 0
    full = None
    for r in range(2):
        out = spanhead.spans(doc, tp=1, cp=2, cp_rank=r, full=True)
        full = full or out
        assert out["local_rows"] == out["global_rows"] // 2
        assert len(out["local_mask"]) == out["local_rows"]
        spanhead.validate_spans(out["spans"], out["local_rows"], out["local_mask"])
        total_local += out["local_active_rows"]
        assert out["cu_seqlens_padded"][-1] == out["global_rows"]
    assert total_local == full["active_rows"]


def test_spans_bad_input():
    doc = {"layout": "unpacked", "sequence_length": 5, "num_actions": 2,
           "loss_mask": [[1, 0], [1]]}
    with pytest.raises(spanhead.ShapeError, match=r"loss_mask\[1\]"):
        spanhead.spans(doc)
    doc["loss_mask"] = [[1, 2], [1, 0]]
    with pytest.raises(spanhead.InvalidArgumentError, match="not 0 or 1"):
        spanhead.spans(doc)
    doc["loss_mask"] = [[1, 0], [1, 0]]
    doc["num_actions"] = 2
    doc["sequence_length"] = 2  # A > S - 1
    with pytest.raises(spanhead.Error, match="num_actions"):
        spanhead.spans(doc)
    with pytest.raises(spanhead.InvalidArgumentError):
        spanhead.spans(dict(doc, layout="diagonal"))
    with pytest.raises(spanhead.InvalidArgumentError, match="cp_rank"):
        spanhead.spans({"layout": "packed", "sequence_length": 8, "num_actions": 2,
                        "loss_mask": [[1, 0]]}, cp=2, cp_rank=2)
    with pytest.raises(spanhead.ParseError):
        spanhead.spans("{not json")
    with pytest.raises(spanhead.InvalidArgumentError, match="unpacked"):
        spanhead.spans({"layout": "unpacked", "sequence_length": 8, "num_actions": 2,
                        "loss_mask": [[1, 0]]}, cp=2)


@pytest.mark.parametrize("key", ["atention_mask", "loss_masks", "Layout", "sub_seq_length", ""])
def test_spans_unknown_key(key, tmp_path):
    """An unknown key of a spans document is refused naming it, as the CLI refuses it (was:
    ignored, so a misspelt attention_mask gave another layout). Dict, JSON text and file."""
    import json
    doc = {"layout": "unpacked", "sequence_length": 5, "num_actions": 2,
           "loss_mask": [[1, 0], [1, 1]], key: [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]}
    with pytest.raises(spanhead.InvalidArgumentError, match=f"unknown key '{key}'"):
        spanhead.spans(doc)
    with pytest.raises(spanhead.InvalidArgumentError, match=f"unknown key '{key}'"):
        spanhead.spans(json.dumps(doc))
    f = tmp_path / "doc.json"
    f.write_text(json.dumps(doc))
    with pytest.raises(spanhead.InvalidArgumentError, match="unknown key"):
        spanhead.spans(str(f))
    del doc[key]
    spanhead.spans(doc)  # every known key passes
    spanhead.spans(dict(doc, attention_mask=[[1] * 5] * 2))
    spanhead.spans(dict(doc, layout="packed", sub_seq_lengths=[[5], [5]]))


def test_spans_keys_match_the_cli():
    """The Python list of document keys is the CLI's (src/cli/json_util.c)."""
    import os
    import re
    src = os.path.join(os.path.dirname(__file__), "..", "..", "src", "cli", "json_util.c")
    if not os.path.exists(src):
        pytest.skip("the CLI's source is not beside this checkout")
    text = open(src, encoding="utf-8").read()
    m = re.search(r"known\[\] = \{([^}]*)\}", text)
    assert m, "json_util.c: the known-key list moved"
    cli = tuple(re.findall(r'"([a-z_]+)"', m.group(1)))
    assert cli == spanhead.meta.SPANS_DOC_KEYS


@pytest.mark.parametrize("bad", [0.5, -1, 2, float("nan")])
def test_host_mask_rule(bad):
    """spans_from_mask / validate_spans follow the library's mask rule (0 or 1)."""
    m = np.array([1, 1, 0, 1, 0, 0], np.float32)
    m[3] = bad
    with pytest.raises(spanhead.InvalidArgumentError, match=r"mask\[3\]"):
        spanhead.spans_from_mask(m)
    with pytest.raises(spanhead.InvalidArgumentError, match=r"mask\[3\]"):
        spanhead.validate_spans([[0, 2], [3, 4]], 6, m)
    m[3] = 1
    assert spanhead.spans_from_mask(m).tolist() == [[0, 2], [3, 4]]
    assert spanhead.spans_from_mask(m.astype(bool)).tolist() == [[0, 2], [3, 4]]


@pytest.mark.parametrize("algorithm", ["ffd", "mffd", "balanced"])
def test_pack_properties(rng, algorithm):
    lengths = rng.integers(1, 500, 60).tolist()
    cap = 1024
    out = spanhead.pack(lengths, capacity=cap, algorithm=algorithm, tp=2)
    padded = lengths  # tp=2, cp=1: the sequence alignment is 1
    items = sorted(i for b in out["bins"] for i in b)
    assert items == list(range(len(lengths)))
    assert out["bin_tokens"] == [sum(padded[i] for i in b) for b in out["bins"]]
    if algorithm != "balanced":
        assert max(out["bin_tokens"]) <= cap
    assert len(out["bins"]) >= -(-sum(padded) // cap)
    assert out["utilization"] == pytest.approx(sum(padded) / (len(out["bins"]) * cap))
    more = spanhead.pack(lengths, capacity=cap, algorithm=algorithm, min_bins=40,
                         bin_multiple=8)
    assert len(more["bins"]) >= 40 and len(more["bins"]) % 8 == 0


def test_pack_bad_input():
    with pytest.raises(spanhead.InvalidArgumentError):
        spanhead.pack([5, 0, 3], capacity=10)
    with pytest.raises(spanhead.InvalidArgumentError):
        spanhead.pack([50], capacity=10)
    with pytest.raises(spanhead.InfeasibleError):
        spanhead.pack([5, 5], capacity=10, min_bins=3)
    with pytest.raises(spanhead.InvalidArgumentError, match="algorithm"):
        spanhead.pack([5], capacity=10, algorithm="best")
    with pytest.raises(spanhead.InvalidArgumentError, match="lengths"):
        spanhead.pack("12", capacity=10)
    with pytest.raises(spanhead.InvalidArgumentError, match="fp8"):
        spanhead.layout([3], fp8="fp4")


# ---- the CLI's JSON ---------------------------------------------------------------------

def cli(*args, stdin=None):
    exe = os.environ.get("SPANHEAD_CLI")
    if not exe or not os.path.exists(exe):
        pytest.skip("SPANHEAD_CLI not set: the CLI comparison needs the built program")
    p = subprocess.run([exe, *map(str, args)], input=stdin, capture_output=True, text=True,
                       timeout=60)
    if p.returncode != 0 and "not built yet" in p.stderr:
        pytest.skip(f"this CLI build lacks the command: {p.stderr.strip()}")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.mark.parametrize("fp8", FP8S)
@pytest.mark.parametrize("tp,cp", [(1, 1), (2, 1), (2, 2), (4, 2)])
def test_layout_matches_cli(rng, tp, cp, fp8):
    lengths = rng.integers(1, 400, int(rng.integers(1, 9))).tolist()
    got = cli("layout", "--tp", tp, "--cp", cp, "--fp8", fp8, *lengths)
    assert spanhead.layout(lengths, tp=tp, cp=cp, fp8=fp8) == got


@pytest.mark.parametrize("algorithm", ["ffd", "mffd", "balanced"])
def test_pack_matches_cli(rng, algorithm):
    lengths = rng.integers(1, 700, 40).tolist()
    got = cli("pack", "--capacity", 2048, "--algorithm", algorithm, "--tp", 2, "--min-bins", 3,
              "--bin-multiple", 2, "-", stdin=json.dumps(lengths))
    py = spanhead.pack(lengths, capacity=2048, algorithm=algorithm, tp=2, min_bins=3,
                       bin_multiple=2)
    assert set(py) == set(got)
    assert py["bins"] == got["bins"] and py["bin_tokens"] == got["bin_tokens"]
    # the CLI prints the utilization to 9 significant digits
    assert py["utilization"] == pytest.approx(got["utilization"], abs=5e-7)


def _docs(rng):
    """Valid documents of each layout: the loss mask is 0 where a column is padding or not
    attended (the library rejects a loss on those)."""
    B, S, A = 3, 32, 12
    loss = (rng.random((B, A)) < 0.5).astype(int)

    def masked(valid_cols):  # valid_cols[b]: number of leading columns that hold tokens
        m = loss.copy()
        for b, n in enumerate(valid_cols):
            m[b, max(0, n - (S - A)):] = 0
        return m.tolist()

    base = {"sequence_length": S, "num_actions": A}
    att = [[1] * (S - 3 * b) + [0] * (3 * b) for b in range(B)]
    subs = [[10, 22], [32], [5, 5, 20]]
    return [dict(base, layout="unpacked", loss_mask=loss.tolist()),
            dict(base, layout="packed", loss_mask=loss.tolist()),
            dict(base, layout="packed", sub_seq_lengths=subs,
                 loss_mask=masked([sum(r) for r in subs])),
            dict(base, layout="packed", attention_mask=att,
                 loss_mask=masked([S - 3 * b for b in range(B)]))]


@pytest.mark.parametrize("k", range(4))
@pytest.mark.parametrize("tp,cp,rank", [(1, 1, 0), (2, 1, 0), (1, 2, 1), (2, 2, 0)])
def test_spans_match_cli(rng, k, tp, cp, rank):
    doc = _docs(rng)[k]
    if doc["layout"] == "unpacked" and (cp > 1 or tp > 1):
        pytest.skip("unpacked spans exist only for an unpadded C = 1 layout")
    got = cli("spans", "--tp", tp, "--cp", cp, "--cp-rank", rank, "--gap", 2, "-",
              stdin=json.dumps(doc))
    py = spanhead.spans(doc, tp=tp, cp=cp, cp_rank=rank, gap=2)
    assert set(py) == set(got), f"keys: python {sorted(py)} vs CLI {sorted(got)}"
    assert py == got


def test_cli_and_binding_reject_alike():
    """A loss on a column that is not attended: the same library message from both."""
    doc = {"layout": "packed", "sequence_length": 4, "num_actions": 2, "loss_mask": [[1, 1]],
           "attention_mask": [[1, 1, 1, 0]]}
    with pytest.raises(spanhead.InvalidArgumentError) as e:
        spanhead.spans(doc)
    exe = os.environ.get("SPANHEAD_CLI")
    if not exe or not os.path.exists(exe):
        pytest.skip("SPANHEAD_CLI not set: the CLI comparison needs the built program")
    p = subprocess.run([exe, "spans", "-"], input=json.dumps(doc), capture_output=True,
                       text=True, timeout=60)
    assert p.returncode != 0 and str(e.value) in p.stderr, p.stderr
