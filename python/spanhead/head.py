"""The LM head: contexts, forward and backward.

Math (one tensor-parallel rank holding weight rows [vocab_start, vocab_start + V_loc)):

    u_ij = h_i . w_j ;  z_ij = (softcap > 0 ? softcap * tanh(u_ij / softcap) : u_ij) / T
    lse_i = log sum_j exp z_ij ;  logprob_i = z_{i,t_i} - lse_i (0 for t_i < 0: ignored)
    entropy_i = lse_i - sum_j p_ij z_ij ;  logit_mean_i = mean_j z_ij

Inactive rows (active_mask 0, or outside spans) get 0 in every per-row output and no gradient.
"""

from __future__ import annotations

import atexit
import threading
import weakref
from typing import Any, Optional, Tuple, Union

import numpy as np

from . import _spanhead as _ext
from . import _tensors as T
from ._errors import DeviceError, DTypeError, InvalidArgumentError, ShapeError

DeviceLike = Union[str, int, Tuple[str, int], None]

FORWARD, BACKWARD = 0, 1
_SLOTS = ("hidden", "weight", "targets", "candidates", "active_mask", "logprob", "entropy",
          "lse", "logit_mean", "stats", "dlogprob", "dentropy", "dlse", "dlogit_mean",
          "dhidden", "dweight", "sum_p2", "temperature_rows", "topk_ids", "topk_logprobs")


def _temperature(temperature: Any) -> Tuple[float, Any]:
    """(scalar, per-row tensor or None) of a ``temperature=`` argument: a real number, or a
    (N,) float32 tensor of per-row temperatures (any DLPack framework; its dtype, shape and
    device are the library's to check), whose scalar is then 1."""
    if getattr(temperature, "shape", None) is not None and len(temperature.shape) > 0:
        return 1.0, temperature
    if T.is_capsule(temperature):
        return 1.0, temperature
    return temperature, None


def _parse_device(device: Any) -> Tuple[int, int]:
    """'cpu', 'cuda', 'cuda:1', an int (a CUDA ordinal), ('cuda', 1), a torch.device."""
    if device is None:
        return (T.CPU, 0)
    if isinstance(device, tuple) and len(device) == 2:
        kind, idx = device
        if isinstance(kind, int):
            return (int(kind), int(idx))
        device = f"{kind}:{idx}"
    if isinstance(device, int) and not isinstance(device, bool):
        return (T.CUDA, device)
    s = str(device)
    if s == "cpu":
        return (T.CPU, 0)
    if s.startswith("cuda"):
        rest = s[4:]
        if rest == "":
            return (T.CUDA, 0)
        if rest.startswith(":") and rest[1:].isdigit():
            return (T.CUDA, int(rest[1:]))
    raise DeviceError(f"device: {device!r} is not a device (expected 'cpu', 'cuda', 'cuda:N' "
                      f"or an int)")


def _stream_handle(stream: Any) -> int:
    """An int cudaStream_t from None, an int, a torch.cuda.Stream or a cupy stream."""
    if stream is None:
        return 0
    if isinstance(stream, int) and not isinstance(stream, bool):
        if stream < 0:
            raise InvalidArgumentError(f"stream: {stream} is not a stream handle")
        return stream
    for attr in ("cuda_stream", "ptr"):
        v = getattr(stream, attr, None)
        if isinstance(v, int):
            return v
    raise InvalidArgumentError(f"stream: expected an int handle, a torch.cuda.Stream or a cupy "
                               f"stream, got {type(stream).__name__}")


class Context:
    """A spanhead context (``sph_ctx_t``): the device, its stream, threads and chosen kernels.

    Args:
        device: 'cpu' (default), 'cuda', 'cuda:N', an int CUDA ordinal or ('cuda', N).
        stream: CUDA stream the calls are enqueued on: an int handle, a torch.cuda.Stream or a
            cupy stream; None is the legacy default stream.
        threads: CPU threads (0 = all; OMP_NUM_THREADS is honoured).
        kernel: force a kernel set ('ref', 'avx2', 'avx512', 'cuda', ...); None = best.
        allow_tf32, batch_invariant, chunk_rows, chunk_bytes, tune_cache: see sph_ctx_opts.
        comm: a :class:`spanhead.Comm` for tensor parallelism (kept alive by the context).

    Workspace: host contexts keep one grow-only workspace buffer and reuse it across calls;
    CUDA contexts allocate the workspace per call with the framework of the inputs (torch's or
    cupy's caching allocator, stream-ordered, so this is cheap and CUDA-graph safe).
    A context is used by one thread at a time.
    """

    def __init__(self, device: DeviceLike = "cpu", *, stream: Any = None, threads: int = 0,
                 kernel: Optional[str] = None, allow_tf32: bool = False,
                 batch_invariant: bool = False, chunk_rows: int = 0, chunk_bytes: int = 0,
                 comm: Any = None, tune_cache: Optional[str] = None):
        self._handle = None
        self.device = _parse_device(device)
        self.stream = _stream_handle(stream)
        if self.device[0] != T.CUDA and self.stream:
            raise InvalidArgumentError("stream: only CUDA contexts take a stream")
        self.comm = comm
        self._ws = None
        handle = comm._handle if comm is not None else None
        if comm is not None and handle is None:
            raise InvalidArgumentError("comm: the communicator was closed")
        # integers go to the extension as given: it refuses floats and values that do not fit
        # the C field with spanhead's exceptions, naming the argument
        self._handle = _ext.ctx_create(self.device[0], self.device[1], self.stream, threads,
                                       kernel, int(bool(allow_tf32)), int(bool(batch_invariant)),
                                       chunk_rows, chunk_bytes, handle, tune_cache)
        _live.add(self)

    def describe(self) -> str:
        """One line naming the chosen kernels ("cpu avx512 threads=2 openblas")."""
        return _ext.ctx_describe(self._live())

    def nonfinite(self) -> Tuple[int, int]:
        """(count, first_row): the active rows whose statistics were non-finite (NaN or
        infinity in hidden or weight, logits beyond float) in this context's passes since the
        last call, and the lowest such row (-1 when none); resets both (sph_ctx_nonfinite).
        Host passes raise NonFiniteError instead of writing; CUDA passes never sync, write NaN
        for such rows and count them on the device: this call synchronizes to read the count."""
        count, first = _ext.ctx_nonfinite(self._live())
        return int(count), int(first)

    def synchronize(self) -> None:
        """Waits for the context's stream; raises any pending device error."""
        _ext.ctx_synchronize(self._live())

    def tune(self, dtype: Any = "bfloat16", *, H: int, V_loc: int, N: int, repeats: int = 0,
             verbose: bool = False) -> str:
        """Autotunes the CUDA head for a shape and stores the winner in the context's tune
        cache (sph_tune); returns a description of the winner. CUDA contexts only."""
        code, bits = _dtype_pair(dtype)
        return _ext.tune(self._live(), code, bits, H, V_loc, N, repeats, int(bool(verbose)))

    def gemm_rate(self, dtype: Any = "bfloat16", *, M: int, N: int, K: int,
                  repeats: int = 0) -> float:
        """TFLOP/s of a dense (M, K) x (N, K)^T product on the context's GPU through cuBLAS
        (sph_tune_gemm_rate: the denominator of the active floor). CUDA contexts only."""
        code, bits = _dtype_pair(dtype)
        return _ext.gemm_rate(self._live(), code, bits, M, N, K, repeats)

    def gemm_rate_sustained(self, dtype: Any = "bfloat16", *, M: int, N: int, K: int,
                            chain: int = 4, repeats: int = 0) -> float:
        """TFLOP/s of `chain` (1..64) dense (M, K) x (N, K)^T products issued back to back on
        the context's GPU, the chain timed as a whole (sph_tune_gemm_rate_sustained: the
        denominator of the sustained floor). A power-limited GPU runs one product at boost
        clocks; a chain as long as the head's (4 for forward + backward, 3 one-pass) sees the
        clocks the head sees. chain=1 is gemm_rate. CUDA contexts only."""
        code, bits = _dtype_pair(dtype)
        return _ext.gemm_rate_sustained(self._live(), code, bits, M, N, K, chain, repeats)

    def close(self) -> None:
        """Destroys the context now (also done when it is garbage collected)."""
        if self._handle is not None:
            _ext.ctx_destroy(self._handle)
            self._handle = None
        self._ws = None

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._handle is None else T.device_name(self.device)
        return f"spanhead.Context({state})"

    def _live(self):
        if self._handle is None:
            raise InvalidArgumentError("context: used after close()")
        return self._handle

    def _workspace_alloc(self, ref: Any):
        def alloc(nbytes: int):
            if self.device[0] != T.CUDA:
                if self._ws is None or self._ws.nbytes < nbytes:
                    self._ws = T.nbytes_buffer(np.empty(0), nbytes)
                return T.export(self._ws[:nbytes], "workspace")
            buf = T.nbytes_buffer(ref, nbytes)
            return T.export(buf, "workspace", self._dlpack_stream())
        return alloc

    def _dlpack_stream(self) -> Optional[int]:
        if self.device[0] != T.CUDA:
            return None
        return self.stream if self.stream else 1  # 1: the legacy default stream in DLPack


_local = threading.local()

# Contexts still open at interpreter exit are closed by Python's atexit, which runs before the
# C runtime's exit handlers (the CUDA runtime tears itself down there): destroying a CUDA
# context after that would talk to a dead runtime.
_live: "weakref.WeakSet[Context]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    from . import comm as _comm
    for ctx in list(_live):
        ctx.close()
    _comm._close_all()


def _current_stream(ref: Any, dev: Tuple[int, int]) -> int:
    fw = T.framework(ref)
    if fw == "torch":
        import torch
        return torch.cuda.current_stream(dev[1]).cuda_stream
    if fw == "cupy":
        import cupy
        return cupy.cuda.get_current_stream().ptr
    return 0


def default_context(device: Tuple[int, int], stream: int = 0) -> Context:
    """This thread's cached context for (device, stream)."""
    cache = getattr(_local, "ctx", None)
    if cache is None:
        cache = _local.ctx = {}
    key = (T.CPU if device[0] == T.CUDA_HOST else device[0], device[1], stream)
    ctx = cache.get(key)
    if ctx is None:
        ctx = cache[key] = Context(key[:2], stream=stream or None)
    return ctx


class HeadResult(dict):
    """Outputs of a head call by name (logprob, entropy, lse, logit_mean, sum_p2, topk_ids,
    topk_logprobs, stats, dhidden, dweight); also readable as attributes. Absent outputs are
    None."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            if name in ("logprob", "entropy", "lse", "logit_mean", "sum_p2", "topk_ids",
                        "topk_logprobs", "stats", "dhidden", "dweight", "workspace_bytes"):
                return None
            raise AttributeError(name) from None


def _spans_array(spans: Any) -> Optional[np.ndarray]:
    if spans is None:
        return None
    if hasattr(spans, "__dlpack_device__") and not isinstance(spans, np.ndarray):
        if spans.__dlpack_device__()[0] not in (T.CPU, T.CUDA_HOST):
            raise DeviceError("spans: must be a host array (spans are built on the host before "
                              "the device copy)")
    return T.int64_pairs(spans, "spans")


def _rows_shape(x: Any, name: str) -> Tuple[int, ...]:
    shape = getattr(x, "shape", None)
    if shape is None:
        raise DTypeError(f"{name}: expected a tensor with a shape (numpy, torch, cupy, jax), got "
                         f"{type(x).__name__}")
    return tuple(int(d) for d in shape)


def _check_devices(tensors: dict, context: Optional[Context]) -> Tuple[int, int]:
    """Every given tensor on hidden's device (host memory kinds count as one), and the
    context's device too; returns hidden's device."""
    dev = T.device_of(tensors["hidden"], "hidden")
    for name in _SLOTS:
        x = tensors.get(name)
        # a bare capsule carries no device here: the library checks it against the context
        if (x is not None and x is not True and x is not False and name != "hidden"
                and not T.is_capsule(x)):
            d = T.device_of(x, name)
            if not T.same_memory_space(d, dev):
                raise DeviceError(f"{name} is on {T.device_name(d)} but hidden is on "
                                  f"{T.device_name(dev)}: every tensor must be on one device")
    if context is not None and not T.same_memory_space(context.device, dev):
        raise DeviceError(f"hidden is on {T.device_name(dev)} but the context runs on "
                          f"{T.device_name(context.device)}")
    return dev


def _run(pass_: int, tensors: dict, *, spans, context: Optional[Context], vocab_start: int,
         vocab_total: int, temperature: float, softcap: float, acc_dh: bool, acc_dw: bool,
         allreduce_dh: bool) -> int:
    """Checks devices, exports every tensor through DLPack and calls the C head."""
    hidden = tensors["hidden"]
    dev = _check_devices(tensors, context)
    if context is None:
        stream = _current_stream(hidden, dev) if dev[0] == T.CUDA else 0
        context = default_context(dev, stream)
    s = context._dlpack_stream()
    caps = tuple(T.export(tensors.get(n), n, s) for n in _SLOTS)
    sp = _spans_array(spans)
    return _ext.head(context._live(), pass_, caps, None if sp is None else T.export(sp, "spans"),
                     context._workspace_alloc(hidden), vocab_start, vocab_total, temperature,
                     softcap, int(bool(acc_dh)), int(bool(acc_dw)), int(bool(allreduce_dh)))


def _out(spec: Any, ref: Any, shape: Tuple[int, ...], dt: Tuple[int, int], name: str) -> Any:
    """An output: spec False/None -> none; True -> allocated; a tensor -> used as given."""
    if spec is None or spec is False:
        return None
    if spec is True:
        return T.empty(ref, shape, dt, name)
    return spec


TOPK_MAX = 256  # spanhead.h's SPH_HEAD_TOPK_MAX


def _topk_outputs(kw: dict, hidden: Any, n: int) -> dict:
    """topk_ids / topk_logprobs of a forward: the given tensors, or (N, K) allocated for
    topk=K; the library judges K (1..256, <= vocab_total), the dtypes and the pair."""
    k, ids, lps = kw["topk"], kw["topk_ids"], kw["topk_logprobs"]
    if isinstance(k, bool) or not isinstance(k, int):
        raise InvalidArgumentError(f"topk: {k!r}, expected an int K (0 = none)")
    if k == 0 and ids is None and lps is None:
        return {"topk_ids": None, "topk_logprobs": None}
    if k != 0 and ids is None and lps is None:
        # the bounds before anything is allocated (K > vocab_total: the library, which knows it)
        if not 1 <= k <= TOPK_MAX:
            raise InvalidArgumentError(f"topk: {k}, expected 1 <= K <= {TOPK_MAX} (0 = none)")
        return {"topk_ids": T.empty(hidden, (n, k), T.I64, "topk_ids"),
                "topk_logprobs": T.empty(hidden, (n, k), T.F32, "topk_logprobs")}
    if k != 0:
        for name, x in (("topk_ids", ids), ("topk_logprobs", lps)):
            sh = tuple(_rows_shape(x, name)) if x is not None else None
            if sh is not None and (len(sh) != 2 or sh[1] != k):
                raise ShapeError(f"{name}: shape is {sh}, expected ({n}, {k}) for topk={k}")
    return {"topk_ids": ids, "topk_logprobs": lps}


def _dtype_pair(dtype: Any) -> Tuple[int, int]:
    names = {"float32": T.F32, "f32": T.F32, "float16": T.F16, "f16": T.F16,
             "bfloat16": T.BF16, "bf16": T.BF16}
    key = str(dtype).replace("torch.", "")
    if key not in names:
        raise InvalidArgumentError(f"dtype: {dtype!r} is not float32, float16 or bfloat16")
    return names[key]


def _grad_dtype(grad_dtype: Any, ref: Any) -> Tuple[int, int]:
    if grad_dtype is None:
        dt = T.dtype_of(ref)
        return dt if dt in (T.F32, T.F16, T.BF16) else T.F32
    names = {"float32": T.F32, "f32": T.F32, "float16": T.F16, "f16": T.F16,
             "bfloat16": T.BF16, "bf16": T.BF16}
    key = str(grad_dtype).replace("torch.", "")
    if key not in names:
        raise InvalidArgumentError(f"grad_dtype: {grad_dtype!r} is not float32, float16 or "
                                   f"bfloat16")
    return names[key]


def head_forward(hidden: Any, weight: Any, targets: Any = None, *, candidates: Any = None,
                 vocab_start: int = 0, vocab_total: int = 0, temperature: float = 1.0,
                 softcap: float = 0.0, active_mask: Any = None, spans: Any = None,
                 logprob: Any = None, entropy: Any = False, lse: Any = False,
                 logit_mean: Any = False, stats: Any = True,
                 dlogprob: Any = None, dentropy: Any = None, dlse: Any = None,
                 dlogit_mean: Any = None, dhidden: Any = False, dweight: Any = False,
                 grad_dtype: Any = None, accumulate_dhidden: bool = False,
                 accumulate_dweight: bool = False, allreduce_dhidden: bool = False,
                 context: Optional[Context] = None, sum_p2: Any = False, topk: int = 0,
                 topk_ids: Any = None, topk_logprobs: Any = None) -> HeadResult:
    """Forward of the LM head: per-row log-prob of the targets and, on request, entropy,
    log-sum-exp and mean logit, without materializing the logits.

    Args:
        hidden: (N, H) float32 / bfloat16 / float16 tensor (DLPack: numpy, torch, cupy, ...;
            wrap NumPy uint16 bf16 bits in :class:`spanhead.bfloat16`).
        weight: (V_loc, H) of the same dtype: this shard's rows of the LM-head weight.
        targets: (N,) int32/int64 global token ids; negative ids are ignored (logprob 0).
        candidates: (N, K) int ids padded with -1: sample-support mode (softmax over them).
        vocab_start, vocab_total: this shard's first global id and the full vocabulary size
            (0 = unsharded).
        temperature: T > 0, or a float32 (N,) tensor of per-row temperatures T_i (each > 0
            and finite; on the data's device; other dtypes are refused, convert first);
            softcap: tanh cap c >= 0 (0 = off), applied before T.
        active_mask: (N,) uint8/bool on the data's device; spans: host (n, 2) int64 runs of
            active rows (see :func:`spanhead.spans`). Rows outside them get 0 and no gradient.
        logprob, entropy, lse, logit_mean, stats: True to compute (allocated float32 in the
            inputs' framework), False to skip, or a tensor to write into. logprob defaults to
            True when targets are given; stats (N, 3) is needed by :func:`head_backward`.
        dlogprob, dentropy, dlse, dlogit_mean, dhidden, dweight: one-pass mode. With dhidden
            and/or dweight (True or a tensor) and the upstream float32 (N,) gradients, the
            gradients are computed in the same sweep (6*N*H*V flops instead of 8).
        grad_dtype: dtype of allocated gradients (default: the input dtype).
        context: a :class:`Context`; default: this thread's context for the inputs' device
            (and, for torch/cupy CUDA tensors, the current stream).
        sum_p2: True (or a float32 (N,) tensor): sum_j p_ij^2 of each active row (0 on
            inactive rows), no gradient (CUDA: not with candidates).
        topk: K in [1, 256], K <= vocab_total: the K most probable ids of each active row's
            distribution (descending, ties the lower id first) as ``topk_ids`` (int64 (N, K),
            global ids, -1 on inactive rows) and their log-probs ``topk_logprobs`` (float32
            (N, K), 0 on inactive rows); no gradient; not with candidates.
        topk_ids, topk_logprobs: the two output tensors to write instead of allocating them
            (both or neither; their shape gives K when topk is 0).

    Returns:
        :class:`HeadResult` with the requested outputs (None for the others).
    """
    return _head(FORWARD, locals())


def head_backward(hidden: Any, weight: Any, targets: Any = None, *, stats: Any,
                  dlogprob: Any = None, dentropy: Any = None, dlse: Any = None,
                  dlogit_mean: Any = None, candidates: Any = None, vocab_start: int = 0,
                  vocab_total: int = 0, temperature: float = 1.0, softcap: float = 0.0,
                  active_mask: Any = None, spans: Any = None, dhidden: Any = True,
                  dweight: Any = True, grad_dtype: Any = None, accumulate_dhidden: bool = False,
                  accumulate_dweight: bool = False, allreduce_dhidden: bool = False,
                  context: Optional[Context] = None) -> HeadResult:
    """Backward of the LM head: dhidden (N, H) and dweight (V_loc, H) from the forward's
    ``stats`` and the upstream float32 (N,) gradients of logprob / entropy / lse / logit_mean
    (absent = 0). Must use the same inputs, mask/spans, temperature and softcap as the forward.

    dhidden, dweight: True (allocate, in grad_dtype or the input dtype), False (skip) or a
    tensor to write into (or add into with accumulate_dhidden / accumulate_dweight).
    allreduce_dhidden sums dhidden over the context's tensor-parallel group.
    """
    kw = locals()
    kw.update(logprob=False, entropy=False, lse=False, logit_mean=False, sum_p2=False,
              topk=0, topk_ids=None, topk_logprobs=None)
    return _head(BACKWARD, kw)


def _head(pass_: int, kw: dict) -> HeadResult:
    hidden, weight, targets = kw["hidden"], kw["weight"], kw["targets"]
    if hidden is None or weight is None:
        raise InvalidArgumentError("hidden and weight are required")
    T.device_of(hidden, "hidden")
    T.device_of(weight, "weight")
    hs, ws = _rows_shape(hidden, "hidden"), _rows_shape(weight, "weight")
    if len(hs) != 2:
        raise ShapeError(f"hidden: shape is {hs}, expected (N, H)")
    if len(ws) != 2:
        raise ShapeError(f"weight: shape is {ws}, expected (V_loc, H)")
    n = hs[0]
    _check_devices({k: kw.get(k) for k in _SLOTS}, kw["context"])
    res = HeadResult()
    t = {"hidden": hidden, "weight": weight, "targets": targets,
         "candidates": kw["candidates"], "active_mask": kw["active_mask"]}
    for name in ("dlogprob", "dentropy", "dlse", "dlogit_mean"):
        t[name] = kw[name]
    temperature, t["temperature_rows"] = _temperature(kw["temperature"])
    if pass_ == FORWARD:
        lp = kw["logprob"]
        if lp is None:
            lp = targets is not None
        for name, spec in (("logprob", lp), ("entropy", kw["entropy"]), ("lse", kw["lse"]),
                           ("logit_mean", kw["logit_mean"]), ("sum_p2", kw["sum_p2"])):
            t[name] = res[name] = _out(spec, hidden, (n,), T.F32, name)
        t.update(_topk_outputs(kw, hidden, n))
        res.update((k, t[k]) for k in ("topk_ids", "topk_logprobs"))
        if kw["stats"] is None or kw["stats"] is False:
            raise InvalidArgumentError("stats: the forward always writes stats (N, 3); pass True "
                                       "or a float32 tensor")
        t["stats"] = res["stats"] = _out(kw["stats"], hidden, (n, 3), T.F32, "stats")
    else:
        if kw["stats"] is None:
            raise InvalidArgumentError("stats: the backward needs the forward's stats (N, 3)")
        t["stats"] = kw["stats"]
    for k in ("dhidden", "dweight"):
        if kw[f"accumulate_{k}"] and (kw[k] is True or kw[k] is None or kw[k] is False):
            raise InvalidArgumentError(f"accumulate_{k}: needs a {k} tensor to add into "
                                       f"(pass {k}=<tensor>)")
    gdt = None
    if any(kw[k] is True for k in ("dhidden", "dweight")):
        gdt = _grad_dtype(kw["grad_dtype"], hidden)
    t["dhidden"] = res["dhidden"] = _out(kw["dhidden"], hidden, hs, gdt, "dhidden")
    t["dweight"] = res["dweight"] = _out(kw["dweight"], weight, ws, gdt, "dweight")
    res["workspace_bytes"] = _run(
        pass_, t, spans=kw["spans"], context=kw["context"], vocab_start=kw["vocab_start"],
        vocab_total=kw["vocab_total"], temperature=temperature, softcap=kw["softcap"],
        acc_dh=kw["accumulate_dhidden"], acc_dw=kw["accumulate_dweight"],
        allreduce_dh=kw["allreduce_dhidden"])
    return res


def describe_tensor(x: Any) -> dict:
    """What spanhead sees of a tensor through DLPack (device, dtype, shape, strides, ...)."""
    info = _ext.tensor_info(T.export(x, "tensor"))
    dt, di, nd, (code, bits, lanes), shape, strides, off, ro = info
    return {"device": T.device_name((dt, di)), "ndim": nd, "dtype": (code, bits, lanes),
            "shape": tuple(shape), "strides": None if strides is None else tuple(strides),
            "byte_offset": off, "read_only": bool(ro)}


__all__ = ["Context", "HeadResult", "head_forward", "head_backward", "default_context",
           "describe_tensor"]
