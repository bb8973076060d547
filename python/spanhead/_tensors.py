"""DLPack export of caller tensors and allocation of outputs in the caller's framework.

The C extension consumes DLPack capsules; this module produces them from any object with
``__dlpack__`` / ``__dlpack_device__`` (NumPy >= 1.22, PyTorch, CuPy, JAX, ...), asking for a
versioned capsule first (so read-only NumPy arrays can be passed as inputs) and falling back to
the legacy protocol. Outputs are allocated with the framework of a reference input (NumPy,
PyTorch or CuPy) on its device, or passed in by the caller.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np

from ._errors import DeviceError, DTypeError, InvalidArgumentError, ShapeError, SizeOverflowError

CPU, CUDA, CUDA_HOST = 1, 2, 3
_DEVICE_NAMES = {CPU: "cpu", CUDA: "cuda", CUDA_HOST: "cuda_host"}

# (code, bits) of the C API's dtypes
F32, F16, BF16, I32, I64, U8, BOOL = (2, 32), (2, 16), (4, 16), (0, 32), (0, 64), (1, 8), (6, 8)


class bfloat16:
    """Marks a 16-bit tensor holding raw bfloat16 bits (e.g. a NumPy ``uint16`` array, as NumPy
    has no bfloat16) so spanhead reads it as bf16. Frameworks with a real bfloat16 dtype (torch)
    need no wrapper.

    >>> h = spanhead.bfloat16(spanhead.to_bf16_bits(hidden_f32))
    """

    __slots__ = ("bits",)

    def __init__(self, bits: Any):
        if isinstance(bits, bfloat16):
            bits = bits.bits
        if not hasattr(bits, "__dlpack__"):
            raise DTypeError(f"bfloat16: expected a DLPack tensor of 16-bit elements, got "
                             f"{type(bits).__name__}")
        itemsize = getattr(getattr(bits, "dtype", None), "itemsize", 2)
        if itemsize != 2:
            raise DTypeError(f"bfloat16: expected 16-bit elements, got {bits.dtype}")
        self.bits = bits

    @property
    def shape(self):
        return tuple(self.bits.shape)

    def __dlpack__(self, **kw):
        return self.bits.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.bits.__dlpack_device__()

    def __repr__(self) -> str:
        return f"spanhead.bfloat16(shape={self.shape})"


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 array -> uint16 array of bfloat16 bits (round to nearest even, NaN kept)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = ((u + (np.uint32(0x7FFF) + ((u >> 16) & 1))) >> 16).astype(np.uint16)
    return np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), r)


def from_bf16_bits(b: Any) -> np.ndarray:
    """uint16 array of bfloat16 bits (or a spanhead.bfloat16) -> float32 array."""
    if isinstance(b, bfloat16):
        b = b.bits
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def int64_pairs(x: Any, name: str) -> np.ndarray:
    """A contiguous (n, 2) int64 array of integer pairs (spans): anything that is not made of
    integers is refused, never truncated ([[0.5, 3.2]] is a DTypeError, not [[0, 3]])."""
    if hasattr(x, "__dlpack__") and not isinstance(x, np.ndarray) and framework(x) == "torch":
        x = x.detach().cpu().numpy()
    try:
        a = np.asarray(x)
    except (ValueError, TypeError) as e:
        raise ShapeError(f"{name}: not an (n, 2) array of integers ({e})") from None
    if a.size == 0:
        return np.zeros((0, 2), dtype=np.int64)
    if a.dtype == object:
        for v in a.reshape(-1):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise DTypeError(f"{name}: {v!r} is not an integer")
            if not -2**63 <= int(v) < 2**63:
                raise SizeOverflowError(f"{name}: {v} does not fit in a signed 64-bit integer")
        a = a.astype(np.int64)
    if a.dtype.kind not in "iu":
        raise DTypeError(f"{name}: dtype is {a.dtype}, expected integers (spans are row indices;"
                         f" got e.g. {a.reshape(-1)[0].item()!r})")
    if a.dtype == np.uint64 and a.size and int(a.max()) >= 2**63:
        raise SizeOverflowError(f"{name}: {int(a.max())} does not fit in a signed 64-bit "
                                f"integer")
    if a.ndim != 2 or a.shape[1] != 2:
        raise ShapeError(f"{name}: shape is {a.shape}, expected (n_spans, 2)")
    return np.ascontiguousarray(a, dtype=np.int64)


def is_capsule(x: Any) -> bool:
    return type(x).__name__ == "PyCapsule"


def device_of(x: Any, name: str) -> Tuple[int, int]:
    """(DLPack device type, id) of a tensor, with a clear error for non-tensors."""
    obj = x.bits if isinstance(x, bfloat16) else x
    fn = getattr(obj, "__dlpack_device__", None)
    if fn is None:
        raise DTypeError(f"{name}: expected a tensor supporting DLPack (numpy, torch, cupy, jax), "
                         f"got {type(x).__name__}")
    dev = fn()
    t, i = int(dev[0]), int(dev[1])
    if t not in _DEVICE_NAMES:
        raise DeviceError(f"{name}: DLPack device type {t} is not supported (cpu, cuda, "
                          f"cuda_host)")
    return t, i


def device_name(dev: Tuple[int, int]) -> str:
    t, i = dev
    return "cpu" if t == CPU else f"{_DEVICE_NAMES[t]}:{i}"


def same_memory_space(a: Tuple[int, int], b: Tuple[int, int]) -> bool:
    host = (CPU, CUDA_HOST)
    if a[0] in host and b[0] in host:
        return True
    return a == b


def export(x: Any, name: str, stream: Optional[int] = None) -> Any:
    """A DLPack capsule (or (capsule, code, bits) for a bfloat16 wrapper) of tensor x.

    stream: for CUDA tensors, the consumer stream handed to ``__dlpack__`` (the producer makes
    its pending work visible to that stream); None for host tensors.
    """
    if x is None:
        return None
    override = None
    if isinstance(x, bfloat16):
        override, x = BF16, x.bits
    if getattr(x, "requires_grad", False) and framework(x) == "torch":
        x = x.detach()  # torch refuses to export tensors that require grad
    if is_capsule(x):
        cap = x
    else:
        fn = getattr(x, "__dlpack__", None)
        if fn is None:
            raise DTypeError(f"{name}: expected a tensor supporting DLPack (numpy, torch, cupy, "
                             f"jax), got {type(x).__name__}")
        kw = {} if stream is None else {"stream": stream}
        try:
            cap = fn(max_version=(1, 0), **kw)
        except TypeError:
            cap = fn(**kw)  # a producer of the pre-1.0 protocol
        except BufferError as e:
            raise InvalidArgumentError(f"{name}: cannot export through DLPack: {e}") from None
    if override is not None:
        return (cap, override[0], override[1])
    return cap


def framework(x: Any) -> str:
    if isinstance(x, bfloat16):
        return "numpy-bf16" if isinstance(x.bits, np.ndarray) else framework(x.bits)
    mod = type(x).__module__.split(".")[0]
    if mod in ("numpy", "torch", "cupy"):
        return mod
    return mod or "unknown"


def dtype_of(x: Any) -> Tuple[int, int]:
    """(code, bits) of a tensor's element type, for choosing gradient dtypes."""
    if isinstance(x, bfloat16):
        return BF16
    fw = framework(x)
    if fw == "numpy":
        return {np.dtype(np.float32): F32, np.dtype(np.float16): F16,
                np.dtype(np.float64): (2, 64)}.get(x.dtype, (-1, 0))
    if fw == "torch":
        import torch
        return {torch.float32: F32, torch.float16: F16, torch.bfloat16: BF16,
                torch.float64: (2, 64)}.get(x.dtype, (-1, 0))
    if fw == "cupy":
        return {np.dtype(np.float32): F32, np.dtype(np.float16): F16}.get(np.dtype(x.dtype),
                                                                         (-1, 0))
    return (-1, 0)


def empty(ref: Any, shape: Tuple[int, ...], dt: Tuple[int, int], name: str) -> Any:
    """An uninitialised tensor of dtype dt in ref's framework and on ref's device."""
    fw = framework(ref)
    if fw in ("numpy", "numpy-bf16"):
        if dt == BF16:
            return bfloat16(np.empty(shape, dtype=np.uint16))
        return np.empty(shape, dtype=_np_dtype(dt))
    if fw == "torch":
        import torch
        tdt = {F32: torch.float32, F16: torch.float16, BF16: torch.bfloat16, I64: torch.int64,
               U8: torch.uint8}[dt]
        return torch.empty(shape, dtype=tdt, device=ref.device)
    if fw == "cupy":
        import cupy
        if dt == BF16:
            raise DTypeError(f"{name}: cupy has no bfloat16; pass the output tensor explicitly")
        with cupy.cuda.Device(ref.device.id):
            return cupy.empty(shape, dtype=_np_dtype(dt))
    if device_of(ref, name)[0] in (CPU, CUDA_HOST):  # host memory: NumPy serves any producer
        if dt == BF16:
            return bfloat16(np.empty(shape, dtype=np.uint16))
        return np.empty(shape, dtype=_np_dtype(dt))
    raise InvalidArgumentError(
        f"{name}: cannot allocate a GPU output for inputs of type {type(ref).__name__} "
        f"(torch and cupy are supported); pass the output tensor explicitly")


def _np_dtype(dt: Tuple[int, int]):
    return {F32: np.float32, F16: np.float16, I64: np.int64, U8: np.uint8, I32: np.int32,
            BF16: np.uint16}[dt]


def data_ptr(x: Any) -> int:
    fw = framework(x)
    if fw == "torch":
        return x.data_ptr()
    if fw == "cupy":
        return x.data.ptr
    return x.ctypes.data


def nbytes_buffer(ref: Any, nbytes: int, align: int = 256) -> Any:
    """A 1-d byte tensor of nbytes starting at an align-byte boundary, in ref's framework."""
    raw = empty(ref if framework(ref) != "numpy-bf16" else np.empty(0), (nbytes + align,), U8,
                "workspace")
    off = (-data_ptr(raw)) % align
    return raw[off:off + nbytes]


# ---- rules every Python front end shares (NumPy, torch, metadata) ---------------------------

def check_int64(v: Any, name: str) -> int:
    """An integer argument the library takes as int64: SizeOverflowError naming it beyond
    [-2^63, 2^63) (as the C boundary does), DTypeError for a non-integer."""
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise DTypeError(f"{name}: expected an integer, got {v!r}")
    if not -2**63 <= int(v) < 2**63:
        raise SizeOverflowError(f"{name}: {int(v)} does not fit in a signed 64-bit integer")
    return int(v)


def host_mask_u8(mask: Any, name: str = "loss_mask") -> np.ndarray:
    """The rule of a host active / loss mask for every Python front end, the C library's
    (active_mask: 0 or 1): bool, integer or float values, each exactly 0 or 1 (0.5, -1, 2, NaN
    are refused naming the first such row and its value); returned as a flat uint8 array."""
    a = np.asarray(mask).reshape(-1)
    if a.dtype == np.bool_:
        return a.astype(np.uint8)
    if a.dtype.kind not in "iuf":
        raise DTypeError(f"{name}: dtype is {a.dtype}, expected bool or 0/1 integers")
    bad = np.flatnonzero((a != 0) & (a != 1))  # NaN is neither
    if bad.size:
        i = int(bad[0])
        raise InvalidArgumentError(f"{name}[{i}]: {a[i].item()!r}, expected 0 or 1")
    return a.astype(np.uint8)

