"""Communicators for tensor parallelism (``sph_comm_t``).

A context given ``comm=`` combines the per-row softmax statistics of the vocabulary shards
across the TP group (one collective per forward) and, with ``allreduce_dhidden``, sums dhidden.
Every rank of the group passes the same configuration (sizes, vocabulary, dtype, temperature);
a mismatch raises :class:`spanhead.MismatchError` on every rank.

Sources:
  * ``Comm.none()``: a single process.
  * ``Comm.from_mpi4py(comm, ...)``: an mpi4py communicator spanning exactly the TP group (CPU
    buffers); ``nccl=True`` builds an NCCL communicator over it instead (GPU buffers).
  * ``Comm.mpi_world(...)``: splits MPI_COMM_WORLD into TP groups.
  * ``Comm.from_nccl(ptr, ...)``: an existing ``ncclComm_t`` given as an int.
  * ``Comm.from_torch(group, ...)``: the NCCL communicator of a torch.distributed NCCL process
    group, reached through ``group._get_backend(torch.device("cuda"))._comm_ptr()`` (a private
    PyTorch API present in recent releases; the group must have run one collective so that its
    communicator exists). Where that is not available, create the TP group with mpi4py and use
    ``Comm.from_mpi4py(comm, nccl=True)``.
The library must be built with MPI / NCCL for those backends (UnsupportedError otherwise).
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any, Tuple

from . import _spanhead as _ext
from . import _tensors as T
from ._errors import InvalidArgumentError, UnsupportedError

_BACKENDS = {0: "none", 1: "mpi", 2: "nccl"}


def _dtype(dtype: Any) -> Tuple[int, int]:
    key = str(dtype).replace("torch.", "").replace("numpy.", "")
    table = {"float32": T.F32, "f32": T.F32, "float16": T.F16, "f16": T.F16,
             "bfloat16": T.BF16, "bf16": T.BF16}
    if key not in table:
        raise InvalidArgumentError(f"dtype: {dtype!r} is not float32, float16 or bfloat16")
    return table[key]


def _cfg(tp, cp, dp, vocab_total, vocab_start, vocab_local, dtype, temperature):
    # as given: the extension refuses non-integers and values outside int64, naming them
    return (tp, cp, dp, vocab_total, vocab_start, vocab_local, _dtype(dtype), temperature)


class Comm:
    """A spanhead communicator; pass it to :class:`spanhead.Context` (``comm=``)."""

    def __init__(self, handle: Any, keepalive: Any = None):
        self._handle = handle
        self._keepalive = keepalive  # the mpi4py / torch object whose handle we borrow
        # The integer the torch operators carry for this communicator and the group size,
        # fixed here: under torch.compile they are plain attribute reads (constants of the
        # graph), where a call into the extension could not be traced.
        self._key = next(_keys)
        self._size = int(_ext.comm_info(handle)[2]) if handle is not None else 1
        _by_key[self._key] = self
        _live.add(self)

    def close(self) -> None:
        """Destroys the communicator now (never the borrowed MPI/NCCL communicator); contexts
        using it must be closed first. Also done when it is garbage collected."""
        if self._handle is not None:
            _ext.comm_destroy(self._handle)
            self._handle = None

    @classmethod
    def none(cls) -> "Comm":
        """A single-process communicator (tp = 1)."""
        return cls(_ext.comm_create(0, 0, None))

    @classmethod
    def from_mpi4py(cls, comm: Any, *, vocab_total: int, vocab_start: int, vocab_local: int,
                    dtype: Any = "float32", temperature: float = 1.0, cp: int = 1, dp: int = 1,
                    nccl: bool = False) -> "Comm":
        """From an mpi4py communicator of exactly the TP group (collective over it)."""
        try:
            from mpi4py import MPI
        except ImportError as e:
            raise UnsupportedError("Comm.from_mpi4py needs mpi4py") from e
        addr = MPI._addressof(comm)
        cfg = _cfg(comm.Get_size(), cp, dp, vocab_total, vocab_start, vocab_local, dtype,
                   temperature)
        return cls(_ext.comm_create(3 if nccl else 1, addr, cfg), comm)

    @classmethod
    def mpi_world(cls, *, tp: int, cp: int = 1, dp: int = 1, vocab_total: int,
                  vocab_start: int, vocab_local: int, dtype: Any = "float32",
                  temperature: float = 1.0) -> Tuple["Comm", int, int, int]:
        """Splits MPI_COMM_WORLD (rank = ((dp_rank * cp) + cp_rank) * tp + tp_rank) and returns
        (comm of this rank's TP group, tp_rank, cp_rank, dp_rank)."""
        cfg = _cfg(tp, cp, dp, vocab_total, vocab_start, vocab_local, dtype, temperature)
        h, tr, cr, dr = _ext.comm_create(4, 0, cfg)
        return cls(h), tr, cr, dr

    @classmethod
    def from_nccl(cls, nccl_comm: int, *, tp: int, vocab_total: int, vocab_start: int,
                  vocab_local: int, dtype: Any = "bfloat16", temperature: float = 1.0,
                  cp: int = 1, dp: int = 1, keepalive: Any = None) -> "Comm":
        """From an existing ncclComm_t (its pointer value as an int) of the TP group."""
        cfg = _cfg(tp, cp, dp, vocab_total, vocab_start, vocab_local, dtype, temperature)
        return cls(_ext.comm_create(2, nccl_comm, cfg), keepalive)

    @classmethod
    def from_torch(cls, group: Any, *, vocab_total: int, vocab_start: int, vocab_local: int,
                   dtype: Any = "bfloat16", temperature: float = 1.0, cp: int = 1,
                   dp: int = 1) -> "Comm":
        """From a torch.distributed NCCL process group (see the module notes)."""
        import torch
        import torch.distributed as dist
        try:
            backend = group._get_backend(torch.device("cuda"))
            ptr = backend._comm_ptr()
        except Exception as e:  # noqa: BLE001 - any failure means: not reachable here
            raise UnsupportedError(
                "Comm.from_torch: this PyTorch does not expose the NCCL communicator of the "
                "group (ProcessGroupNCCL._comm_ptr); build the TP group with mpi4py and use "
                f"Comm.from_mpi4py(comm, nccl=True) instead ({e})") from None
        if not ptr:
            raise UnsupportedError("Comm.from_torch: the group's NCCL communicator does not exist "
                                   "yet; run one collective on the group first")
        return cls.from_nccl(ptr, tp=dist.get_world_size(group), vocab_total=vocab_total,
                             vocab_start=vocab_start, vocab_local=vocab_local, dtype=dtype,
                             temperature=temperature, cp=cp, dp=dp, keepalive=group)

    def info(self) -> Tuple[str, int, int]:
        """(backend name, rank, size) of this communicator."""
        if self._handle is None:
            raise InvalidArgumentError("comm: used after close()")
        b, r, s = _ext.comm_info(self._handle)
        return _BACKENDS.get(b, str(b)), r, s

    def __repr__(self) -> str:
        try:
            b, r, s = self.info()
            return f"spanhead.Comm({b}, rank={r}, size={s})"
        except Exception:  # noqa: BLE001
            return "spanhead.Comm(?)"


_live: "weakref.WeakSet[Comm]" = weakref.WeakSet()
_keys = itertools.count(1)
_by_key: "weakref.WeakValueDictionary[int, Comm]" = weakref.WeakValueDictionary()


def _close_all() -> None:
    for c in list(_live):
        c.close()


__all__ = ["Comm"]
