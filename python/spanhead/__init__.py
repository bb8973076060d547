"""spanhead: per-token log-probs, entropy, log-sum-exp and mean logit of a language model's
output layer, forward and backward, without materializing the [tokens x vocab] logits and
paying only for the tokens that carry loss; plus the host metadata (packing, layouts, spans).

    import spanhead
    out = spanhead.head_forward(hidden, weight, targets, entropy=True)   # out.logprob, ...

Tensors travel through DLPack (NumPy on the CPU; PyTorch, CuPy, JAX on the GPU) without
copies. ``spanhead.torch`` (imported separately) holds the PyTorch autograd adapter.
Errors are :class:`spanhead.Error` subclasses carrying the C library's message.
"""

from __future__ import annotations

from ._errors import *  # noqa: F401,F403
from ._errors import BY_STATUS as _BY_STATUS
from . import _lib
from . import _spanhead as _ext
from ._tensors import bfloat16, from_bf16_bits, to_bf16_bits
from .comm import Comm
from .head import (Context, HeadResult, default_context, describe_tensor, head_backward,
                   head_forward)
from .meta import (alignment, cp_local_rows, layout, pack, spans, spans_from_mask,
                   validate_spans)
from .policy import PolicyResult, policy_loss, sequence_group
from .distill import DistillResult, distill_loss

#: Path of the loaded C library.
LIBRARY_PATH = _lib.LIBRARY_PATH
#: The C library's version (sph_version(); one source: include/spanhead.h's SPH_VERSION_*).
__version__ = _ext.version()


def library_version() -> str:
    """Version of the loaded C library ("major.minor.patch")."""
    return _ext.version()


def cuda_device_count() -> int:
    """CUDA devices visible to the library (0 without CUDA)."""
    return _ext.cuda_device_count()


def missing_functions() -> list:
    """C API functions the loaded library lacks (empty for a complete build)."""
    return _ext.missing()


__all__ = ([c.__name__ for c in _BY_STATUS] +
           ["bfloat16", "to_bf16_bits", "from_bf16_bits", "Comm", "Context", "HeadResult",
            "default_context", "describe_tensor", "head_forward", "head_backward", "alignment",
            "cp_local_rows", "layout", "pack", "spans", "spans_from_mask", "validate_spans",
            "library_version", "cuda_device_count", "missing_functions", "LIBRARY_PATH",
            "policy_loss", "PolicyResult", "sequence_group", "distill_loss", "DistillResult"])
