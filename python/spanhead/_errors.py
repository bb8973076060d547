"""The exception hierarchy: one class per C status code, all under spanhead.Error.

Each class also derives from the closest built-in exception, so code that catches ValueError,
TypeError, MemoryError, OverflowError, NotImplementedError, OSError or RuntimeError keeps
working. Every instance has ``.status`` (the C status code, an int) and its message is the C
library's message (what failed, which argument, expected vs got).
"""

from __future__ import annotations


class Error(Exception):
    """Base class of every error spanhead raises."""

    status: int = -1

    def __init__(self, message: str = "", status: int | None = None):
        super().__init__(message)
        if status is not None:
            self.status = status


class InvalidArgumentError(Error, ValueError):
    """A null pointer or a value out of its domain (SPH_ERR_INVALID_ARG)."""
    status = 1


class ShapeError(Error, ValueError):
    """Shapes disagree across arguments, a bad ndim or strides (SPH_ERR_SHAPE)."""
    status = 2


class DTypeError(Error, TypeError):
    """An unsupported or mismatched dtype, or an object that is not a tensor (SPH_ERR_DTYPE)."""
    status = 3


class DeviceError(Error, ValueError):
    """A tensor on the wrong device, or tensors on different devices (SPH_ERR_DEVICE)."""
    status = 4


class AllocError(Error, MemoryError):
    """A host or device allocation failed (SPH_ERR_ALLOC)."""
    status = 5


class SizeOverflowError(Error, OverflowError):
    """An integer size or sum overflows int64 (SPH_ERR_OVERFLOW)."""
    status = 6


class UnsupportedError(Error, NotImplementedError):
    """A valid request this build or device cannot serve (SPH_ERR_UNSUPPORTED)."""
    status = 7


class CudaError(Error, RuntimeError):
    """A CUDA runtime, driver or cuBLAS error (SPH_ERR_CUDA)."""
    status = 8


class MPIError(Error, RuntimeError):
    """An MPI error (SPH_ERR_MPI)."""
    status = 9


class NCCLError(Error, RuntimeError):
    """An NCCL error (SPH_ERR_NCCL)."""
    status = 10


class ParseError(Error, ValueError):
    """Malformed JSON or text input (SPH_ERR_PARSE)."""
    status = 11


class InfeasibleError(Error, ValueError):
    """A request no solution satisfies, e.g. an impossible bin count (SPH_ERR_INFEASIBLE)."""
    status = 12


class FileError(Error, OSError):
    """A file could not be read or written (SPH_ERR_IO)."""
    status = 13


class WorkspaceError(Error, RuntimeError):
    """Workspace missing, too small or misaligned (SPH_ERR_WORKSPACE)."""
    status = 14


class MismatchError(Error, RuntimeError):
    """Ranks of a communicator disagree on the configuration (SPH_ERR_MISMATCH)."""
    status = 15


class NoDeviceError(Error, RuntimeError):
    """No CUDA device present (SPH_ERR_NO_DEVICE)."""
    status = 16


class InternalError(Error, RuntimeError):
    """A broken invariant inside spanhead: a bug, please report it (SPH_ERR_INTERNAL)."""
    status = 17


class NonFiniteError(Error, FloatingPointError):
    """NaN or infinity in the statistics of an active row (SPH_ERR_NONFINITE): NaN/inf in
    hidden or weight, or logits beyond float. CUDA passes do not raise it; see
    Context.nonfinite / sph_ctx_nonfinite."""
    status = 18


#: Exception class of each status code (index = code; 0 is success and maps to Error).
BY_STATUS = (Error, InvalidArgumentError, ShapeError, DTypeError, DeviceError, AllocError,
             SizeOverflowError, UnsupportedError, CudaError, MPIError, NCCLError, ParseError,
             InfeasibleError, FileError, WorkspaceError, MismatchError, NoDeviceError,
             InternalError, NonFiniteError)

__all__ = [c.__name__ for c in BY_STATUS] + ["BY_STATUS"]
