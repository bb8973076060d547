"""Host metadata: alignment, packed layouts, CP-local rows, active masks and spans, packing.

Each function mirrors a CLI subcommand and returns the dictionary that subcommand prints as
JSON (same keys, same values), so a script can move between the two freely.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np

from . import _spanhead as _ext
from ._errors import InvalidArgumentError, ParseError, ShapeError
from ._tensors import host_mask_u8, int64_pairs

_FP8 = {"none": 0, "blockwise": 1, "mxfp8": 2}
_ALGO = {"ffd": 0, "mffd": 1, "balanced": 2}
_LAYOUT = {"unpacked": 0, "packed": 1}


def _fp8(fp8: Any) -> int:
    if fp8 is None or fp8 is False:
        return 0
    key = str(fp8).lower()
    if key not in _FP8:
        raise InvalidArgumentError(f"fp8: {fp8!r} is not one of none, blockwise, mxfp8")
    return _FP8[key]


def _int(v: Any, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise InvalidArgumentError(f"{name}: expected an integer, got {v!r}")
    return int(v)


def _ints(seq: Any, name: str) -> List[int]:
    if isinstance(seq, (str, bytes)) or not hasattr(seq, "__iter__"):
        raise InvalidArgumentError(f"{name}: expected a sequence of integers, got "
                                   f"{type(seq).__name__}")
    return [_int(v, f"{name}[{i}]") for i, v in enumerate(seq)]


def alignment(tp: int = 1, cp: int = 1, fp8: Optional[str] = "none") -> Dict[str, int]:
    """Token alignments for TP size ``tp``, CP size ``cp`` and an FP8 recipe.

    Returns {"sequence_align", "total_align", "unpacked_align"} (unpacked_align is 0 when
    cp > 1: unpacked layouts do not exist under context parallelism).
    """
    s, t, u = _ext.alignment(_int(tp, "tp"), _int(cp, "cp"), _fp8(fp8))
    return {"sequence_align": s, "total_align": t, "unpacked_align": u}


def layout(lengths: Sequence[int], tp: int = 1, cp: int = 1,
           fp8: Optional[str] = "none") -> Dict[str, Any]:
    """Packed segment layout of raw sequence lengths, as ``spanhead layout`` prints it:
    {"sequence_align", "total_align", "padded_lengths", "cu_seqlens_padded"}."""
    tp, cp, f = _int(tp, "tp"), _int(cp, "cp"), _fp8(fp8)
    s, t, _ = _ext.alignment(tp, cp, f)
    padded, cu = _ext.layout_packed(tp, cp, f, _ints(lengths, "lengths"))
    return {"sequence_align": s, "total_align": t, "padded_lengths": padded,
            "cu_seqlens_padded": cu}


def cp_local_rows(padded_length: int, cp: int, cp_rank: int) -> List[int]:
    """Rows (offsets inside a padded segment) held by CP rank ``cp_rank``: chunk r then chunk
    2C-1-r of P/(2C) rows each."""
    return _ext.cp_local_rows(_int(padded_length, "padded_length"), _int(cp, "cp"),
                              _int(cp_rank, "cp_rank"))


def _mask_rows(rows: Any, name: str, width: Optional[int]) -> bytes:
    """[[0/1, ...], ...] of equal widths -> flattened bytes."""
    if isinstance(rows, np.ndarray):
        rows = rows.tolist()
    if not isinstance(rows, (list, tuple)):
        raise ShapeError(f"{name}: expected a list of rows")
    out = bytearray()
    for b, row in enumerate(rows):
        if isinstance(row, np.ndarray):
            row = row.tolist()
        if not isinstance(row, (list, tuple)):
            raise ShapeError(f"{name}[{b}]: expected a list of 0/1")
        if width is not None and len(row) != width:
            raise ShapeError(f"{name}[{b}]: has {len(row)} entries, expected {width}")
        for j, v in enumerate(row):
            if v is True or v is False:
                v = int(v)
            if not isinstance(v, (int, np.integer)) or v not in (0, 1):
                raise InvalidArgumentError(f"{name}[{b}][{j}]: {v!r} is not 0 or 1")
            out.append(int(v))
    return bytes(out)


# The keys of a spans document: the CLI's list (src/cli/json_util.c, batch_from), which refuses
# any other key the same way (a misspelt "atention_mask" must not give another layout).
SPANS_DOC_KEYS = ("layout", "sequence_length", "num_actions", "loss_mask", "attention_mask",
                  "sub_seq_lengths")


def _load_doc(doc: Any) -> Mapping[str, Any]:
    if isinstance(doc, Mapping):
        return doc
    if isinstance(doc, (str, os.PathLike)):
        text = str(doc)
        if isinstance(doc, os.PathLike) or not text.lstrip().startswith("{"):
            with open(doc, "r", encoding="utf-8") as f:
                text = f.read()
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise ParseError(f"spans: malformed JSON: {e}") from None
    raise InvalidArgumentError(f"spans: doc must be a dict, a JSON string or a file path, got "
                               f"{type(doc).__name__}")


def spans(doc: Any, tp: int = 1, cp: int = 1, cp_rank: int = 0, fp8: Optional[str] = "none",
          gap: int = 0, full: bool = False) -> Dict[str, Any]:
    """Active mask and spans of a micro-batch, as ``spanhead spans`` prints them.

    doc: the CLI's input document (a dict, a JSON string or a path):
        {"layout": "packed" | "unpacked", "sequence_length": S, "num_actions": A,
         "loss_mask": [[...A 0/1...] x B], "attention_mask": [[...S...] x B] (optional),
         "sub_seq_lengths": [[l, ...] x B] (optional)}
    Returns {"active_mask": flattened 0/1 forward mask of the full layout, "active_rows",
    "local_rows", "local_active_rows", "spans": [[start, end), ...] over this CP rank's rows}.
    full=True adds "global_rows", "local_mask" (this rank's rows), "n_segments" and
    "cu_seqlens_padded" (None for unpacked layouts).
    """
    d = _load_doc(doc)
    unknown = [k for k in d if k not in SPANS_DOC_KEYS]
    if unknown:
        raise InvalidArgumentError(f"spans: unknown key {str(unknown[0])!r} in the document "
                                   f"(expected some of {', '.join(SPANS_DOC_KEYS)})")
    for key in ("layout", "sequence_length", "num_actions", "loss_mask"):
        if key not in d:
            raise InvalidArgumentError(f"spans: the document lacks {key!r}")
    kind = d["layout"]
    if kind not in _LAYOUT:
        raise InvalidArgumentError(f"layout: {kind!r} is not 'packed' or 'unpacked'")
    S, A = _int(d["sequence_length"], "sequence_length"), _int(d["num_actions"], "num_actions")
    loss = d["loss_mask"]
    B = len(loss) if hasattr(loss, "__len__") else -1
    if B < 0:
        raise ShapeError("loss_mask: expected a list of rows")
    lm = _mask_rows(loss, "loss_mask", A)
    am = None
    if d.get("attention_mask") is not None:
        if len(d["attention_mask"]) != B:
            raise ShapeError(f"attention_mask: has {len(d['attention_mask'])} rows, expected "
                             f"{B} (the loss mask's)")
        am = _mask_rows(d["attention_mask"], "attention_mask", S)
    ssl = ssc = None
    if d.get("sub_seq_lengths") is not None:
        rows = d["sub_seq_lengths"]
        if len(rows) != B:
            raise ShapeError(f"sub_seq_lengths: has {len(rows)} rows, expected {B}")
        ssl, ssc = [], []
        for b, r in enumerate(rows):
            vals = _ints(r, f"sub_seq_lengths[{b}]")
            ssl += vals
            ssc.append(len(vals))
    r = _ext.spans_build(_LAYOUT[kind], B, S, A, lm, am, ssl, ssc, _int(tp, "tp"),
                         _int(cp, "cp"), _fp8(fp8), _int(cp_rank, "cp_rank"), _int(gap, "gap"))
    out = {"active_mask": list(r["active_mask"]), "active_rows": r["active_rows"],
           "local_rows": r["local_rows"], "local_active_rows": r["local_active_rows"],
           "spans": r["spans"]}
    if full:
        out.update(global_rows=r["global_rows"], local_mask=list(r["local_mask"]),
                   n_segments=r["n_segments"], cu_seqlens_padded=r["cu_seqlens_padded"])
    return out


def spans_from_mask(mask: Any, gap: int = 0) -> np.ndarray:
    """Ordered [start, end) runs of the 1 entries of a host 1-d 0/1 mask, merged across gaps
    of at most ``gap`` zeros, as an (n_spans, 2) int64 array (what head calls take). The mask
    follows the library's rule (bool or values exactly 0 / 1; 0.5, 2, -1, NaN refused)."""
    m = np.asarray(mask)
    if m.ndim != 1:
        raise ShapeError(f"mask: shape is {m.shape}, expected (N,)")
    b = host_mask_u8(m, "mask").tobytes()
    sp = _ext.spans_from_mask(b, _int(gap, "gap"))
    return np.asarray(sp, dtype=np.int64).reshape(-1, 2)


def validate_spans(spans_: Any, n: int, mask: Any = None) -> None:
    """Raises unless spans are ordered, disjoint, inside [0, n) and cover every 1 of mask."""
    a = int64_pairs(spans_, "spans").reshape(-1)
    mb = None if mask is None else host_mask_u8(mask, "mask").tobytes()
    _ext.spans_validate(a.tolist(), _int(n, "n"), mb)


def pack(lengths: Sequence[int], capacity: int, algorithm: str = "ffd", tp: int = 1,
         cp: int = 1, fp8: Optional[str] = "none", min_bins: int = 0,
         bin_multiple: int = 1) -> Dict[str, Any]:
    """Packs sequences (their padded lengths under tp/cp/fp8) into bins of at most ``capacity``
    tokens, as ``spanhead pack`` prints it: {"bins": [[sequence index, ...], ...],
    "bin_lengths": [[length, ...], ...], "bin_tokens": [...], "utilization": x}.

    algorithm: 'ffd' (first-fit decreasing), 'mffd' (modified FFD, Johnson & Garey) or
    'balanced' (least-loaded, soft capacity). min_bins / bin_multiple raise the bin count to a
    minimum and to a multiple of the data-parallel size (InfeasibleError when impossible).
    """
    algo = str(algorithm).lower()
    if algo not in _ALGO:
        raise InvalidArgumentError(f"algorithm: {algorithm!r} is not one of ffd, mffd, balanced")
    lens = _ints(lengths, "lengths")
    bins, tokens, util = _ext.pack(lens, _int(capacity, "capacity"),
                                   _ALGO[algo], _int(tp, "tp"), _int(cp, "cp"), _fp8(fp8),
                                   _int(min_bins, "min_bins"), _int(bin_multiple, "bin_multiple"))
    return {"bins": bins, "bin_lengths": [[int(lens[i]) for i in b] for b in bins],
            "bin_tokens": tokens, "utilization": util}


__all__ = ["alignment", "layout", "cp_local_rows", "spans", "spans_from_mask", "validate_spans",
           "pack"]
