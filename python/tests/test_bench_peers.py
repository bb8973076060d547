"""bench/cuda/peers.py without a GPU: its arguments, its point plan, the packed-rl batch (the
same rows as `spanhead bench --mask packed-rl`, through the library and without it), the
padding rules it applies to QuACK and liger's CuTe kernel, and its outputs from synthetic
records. The GPU measurements themselves run on the device (scripts/device/peers_run.sh)."""

import importlib.util
import json
import os
import subprocess
from types import SimpleNamespace

import numpy as np
import pytest

import spanhead

HERE = os.path.dirname(os.path.abspath(__file__))
PEERS = os.path.join(HERE, "..", "..", "bench", "cuda", "peers.py")


@pytest.fixture(scope="module")
def peers():
    spec = importlib.util.spec_from_file_location("peers_bench", PEERS)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def parse(peers, *argv):
    return peers.build_parser().parse_args(list(argv))


def test_arguments(peers, capsys):
    a = parse(peers)
    assert [s[0] for s in a.shapes] == ["A", "B", "C", "D", "E"]
    assert a.shapes[4] == ("E", 4096, 128256)
    assert a.N == [16384] and a.fractions == [1.0, 0.5, 0.25] and a.mode == "logprob"
    a = parse(peers, "--shapes", "e,512x1000", "--N", "16384,65536", "--masks", "packed-rl",
              "--impls", "quack,liger-cute-compact", "--quack-scaled-exp", "off")
    assert a.shapes == [("E", 4096, 128256), ("512x1000", 512, 1000)]
    assert a.impls == ["quack", "liger-cute-compact"] and a.quack_scaled_exp == "off"
    for bad in (["--shapes", "F"], ["--shapes", "0x10"], ["--N", "0"], ["--N", ""],
                ["--fractions", "1.5"], ["--masks", "random"], ["--impls", "nope"],
                ["--mode", "sft"], ["--quack-scaled-exp", "maybe"]):
        with pytest.raises(SystemExit):
            parse(peers, *bad)
    capsys.readouterr()
    # an impl of the other mode, and out-of-range policy knobs, are refused by main()
    for bad in (["--mode", "policy", "--impls", "quack"], ["--impls", "liger-grpo"],
                ["--clip-low", "1.5"], ["--old-noise", "-1"], ["--budget-s", "0"]):
        with pytest.raises(SystemExit):
            peers.main(bad + ["--dry-run"])
    err = capsys.readouterr().err
    assert "not in --mode policy" in err and "--clip-low 1.5" in err


def test_points_order(peers):
    a = parse(peers, "--shapes", "A,E", "--N", "16384,65536",
              "--masks", "fragmented,packed-rl,response")
    pts = peers.make_points(a)
    # response 0.5 first (both N, both shapes), then 1.0, then 0.25, then packed-rl (once per
    # shape and N), then fragmented 0.5 and 0.25 (never 1.0)
    combos = [(p[5], p[4]) for p in pts]
    assert combos[:4] == [("response", 0.5)] * 4
    assert combos[4:12] == [("response", 1.0)] * 4 + [("response", 0.25)] * 4
    assert combos[12:16] == [("packed-rl", None)] * 4
    assert combos[16:] == [("fragmented", 0.5)] * 4 + [("fragmented", 0.25)] * 4
    assert [(p[0], p[3]) for p in pts[:4]] == [("A", 16384), ("E", 16384), ("A", 65536),
                                               ("E", 65536)]
    a.order = "shape"
    assert [p[0] for p in peers.make_points(a)][:9] == ["A"] * 9


@pytest.mark.parametrize("N", [4096, 16384, 65536])
def test_packed_rl_matches_the_library(peers, N):
    lens, prompts = peers.packed_rl_batch(N, 1)
    assert sum(lens) == N and all(1 <= p <= ln for p, ln in zip(prompts, lens))
    mask, spans, how = peers.packed_rl_mask(N, 1, 0)
    assert how == "spanhead.meta.spans" and mask.shape == (N,)
    # the same rows computed without the library: row c - 1 is active when token c is a
    # response token (TP1/CP1: the sequences lie end to end)
    ref = np.zeros(N, dtype=np.uint8)
    c0 = 0
    for ln, p in zip(lens, prompts):
        ref[c0 + p - 1:c0 + ln - 1] = 1
        c0 += ln
    np.testing.assert_array_equal(mask, ref)
    np.testing.assert_array_equal(spans, peers.spans_of(ref, 0))
    spanhead.validate_spans(spans, N, mask)


def test_packed_rl_matches_the_cli(peers):
    cli = os.environ.get("SPANHEAD_CLI")
    if not cli or not os.path.exists(cli):
        pytest.skip("SPANHEAD_CLI not set")
    p = subprocess.run([cli, "bench", "--shape", "A", "--N", "4096,16384,65536", "--mask",
                        "packed-rl", "--list"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    got = {}
    for line in p.stdout.splitlines():
        cols = [c.strip() for c in line.strip("|").split("|")]
        if len(cols) == 7 and cols[5] == "packed-rl":
            got[int(cols[3])] = float(cols[4])
    assert sorted(got) == [4096, 16384, 65536]
    for N, act in got.items():
        mask, _, _ = peers.packed_rl_mask(N, 1, 0)
        assert abs(mask.sum() / N - act) < 1e-4, (N, mask.sum() / N, act)


def test_quack_padding_rules(peers):
    """QuACK 0.6.5's scaled-exp dx epilogue refuses a chunk of exactly H rows (m == n): the
    chunk doubles where it equals H, and a gathered batch whose last chunk would be H rows
    gets padding rows; its base pipeline wants M % 8 == 0."""
    args = SimpleNamespace(quack_chunk=4096, quack_scaled_exp="auto")
    yes = {"has_scaled": True, "supported": lambda *a: True}
    no = {"has_scaled": True, "supported": lambda *a: False}

    def plan(impl, N, H, n, info=yes):
        P = {"h": SimpleNamespace(shape=(N, H)), "w": None, "n_act": n}
        return peers.quack_plan(impl, P, args, info)[:3]

    assert plan("quack", 16384, 4096, 8192) == (16384, 8192, True)
    assert plan("quack-compact", 16384, 4096, 8192) == (8192, 8192, True)
    assert plan("quack-compact", 16384, 4096, 12288) == (12296, 8192, True)  # last: 4096
    assert plan("quack-compact", 16384, 4096, 4096) == (4104, 8192, True)
    assert plan("quack-compact", 16384, 2048, 2048) == (2056, 4096, True)
    assert plan("quack-compact", 16384, 2048, 8192) == (8192, 4096, True)
    assert plan("quack-compact", 16384, 5120, 5120) == (5120, 4096, True)
    assert plan("quack-compact", 16384, 4096, 4097, no) == (4104, 4096, False)
    args.quack_scaled_exp = "off"
    assert plan("quack", 16384, 4096, 100) == (16384, 4096, False)
    assert peers.pad_rows(1, 128) == 128 and peers.pad_rows(256, 128) == 256
    assert peers.pad_rows(0, 8) == 8


def test_outputs(peers, tmp_path):
    """write_md, final_table, annotate_point and the JSON fields from synthetic rows."""
    base = {"shape": "E", "H": 4096, "V_local": 128256, "N": 16384, "active": 0.5,
            "active_target": 0.5, "mask": "response", "floor_ms": 50.0,
            "floor_onepass_ms": 37.5}
    rows = [dict(base, impl="spanhead", ms=55.0, ratio=1.1, ratio_onepass=55 / 37.5),
            dict(base, impl="spanhead-onepass", ms=45.0, ratio=0.9, ratio_onepass=1.2),
            dict(base, impl="quack-compact", ms=42.0, ratio=0.84, first_call_s=31.0,
                 pipeline="scaled-exp", chunk=8192),
            dict(base, impl="liger-none", ms=120.0, ratio=2.4),
            dict(base, impl="liger-cute", ms=None, status="skipped: V 62080 % 256 != 0"),
            dict(base, impl="quack", ms=None, status="failed: RuntimeError: x")]
    peers.annotate_point(rows)
    assert rows[0]["best_peer"] == "quack-compact" and rows[0]["best_peer_general"] == \
        "liger-none"
    assert abs(rows[1]["vs_best_peer"] - 45 / 42) < 1e-12
    assert rows[4]["vs_best_peer"] is None
    meta = {"gpu": "cuda test", "date": "d", "commit": "c", "torch": "t", "triton": "t",
            "python": "3", "dtype": "bf16", "versions": {"quack": "0.6.5"},
            "unavailable": {"cce": "not importable"}, "gemm": {"E": 7e14}, "mode": "logprob"}
    md = tmp_path / "peers.md"
    peers.write_md(md, meta, rows, ["a note"])
    text = md.read_text()
    assert "| E | 16384 | 0.500 | response | quack-compact | 42.000 |" in text
    assert "fastest peer" in text and "quack-compact | 42.000 | 0.840 | liger-none" in text
    assert "first-call cost" in text and "a note" in text
    tab = peers.final_table(rows, "logprob")
    assert "E 16K 0.50 response" in tab and "quack-compact 42.00 (0.84)" in tab
    assert "failed: quack@E/16K/0.50/response" in tab
    assert "skipped: liger-cute: V 62080 % 256 != 0" in tab
    json.dumps(rows)       # every field serializable


def test_dry_run_without_torch(peers, capsys):
    if importlib.util.find_spec("torch") is not None:
        pytest.skip("torch is installed: the dry run would import the peers and run the CPU "
                    "harness (bench/cuda/README-peers.md runs it by hand)")
    assert peers.main(["--dry-run", "--masks", "response,packed-rl"]) == 0
    out = capsys.readouterr().out
    assert "torch not importable" in out and "'packed-rl'" in out
