"""peers.py, part: importing each peer (versions, path fixes, the QuACK semantic-key patch) and
checking its call signature."""

import importlib
import importlib.util
import inspect
import os
import sys
import time
import types
from pathlib import Path

from .common import REPO, log


# ----------------------------------------------------------------------------------------
# Peers: each loader returns (object, version string) or raises


def version_of(dist):
    try:
        from importlib import metadata
        return metadata.version(dist)
    except Exception:  # noqa: BLE001 - metadata missing is not an error here
        return "?"


def load_spanhead():
    if importlib.util.find_spec("spanhead") is None:
        sys.path.insert(0, str(REPO / "python"))
        if not list((REPO / "python" / "spanhead").glob("_spanhead*.so")):
            raise ImportError("python/spanhead/_spanhead.abi3.so is not built (make "
                              "python/spanhead/_spanhead.abi3.so here, then carry it)")
    if "SPANHEAD_LIB" not in os.environ and "SPANHEAD_BUILD_DIR" not in os.environ:
        for c in ("build/libspanhead.so", "build-peers/libspanhead.so",
                  "build-cpu/libspanhead.so"):
            if (REPO / c).exists():
                os.environ["SPANHEAD_LIB"] = str(REPO / c)
                break
    import spanhead
    import spanhead.torch as sht
    missing = getattr(spanhead, "missing_functions", lambda: [])()
    ver = getattr(spanhead, "library_version", lambda: "?")()
    return sht, f"{ver} ({spanhead.LIBRARY_PATH})" + (f", missing {missing}" if missing else "")


def load_liger():
    from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction
    return LigerFusedLinearCrossEntropyFunction, version_of("liger-kernel")


def load_cce():
    import cut_cross_entropy
    from cut_cross_entropy import linear_cross_entropy
    impls = getattr(cut_cross_entropy, "LinearCrossEntropyImpl", None)
    has_exact = impls is not None and any(m.name.lower() == "cce_exact" for m in impls)
    return (linear_cross_entropy, has_exact), version_of("cut-cross-entropy")


def load_verl():
    """verl's fused kernel without verl: its package __init__ pulls ray, hydra, datasets...
    Only verl/utils/kernel/{kernels,linear_cross_entropy}.py are loaded, under stub parent
    packages, with verl.utils.device (all the kernel module imports from verl) stubbed on
    torch.cuda."""
    import torch
    mod = sys.modules.get("verl.utils.kernel.linear_cross_entropy")
    if mod is not None:
        return mod.linear_cross_entropy, version_of("verl")
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("No module named 'verl' (wheel not installed)")
    kdir = Path(list(spec.submodule_search_locations)[0]) / "utils" / "kernel"
    for f in ("kernels.py", "linear_cross_entropy.py"):
        if not (kdir / f).exists():
            raise ImportError(f"verl {version_of('verl')}: {kdir / f} missing")

    def pkg(name, path):
        m = types.ModuleType(name)
        m.__path__ = [str(path)] if path else []
        m.__package__ = name
        sys.modules[name] = m
        return m

    saved = {k: sys.modules.get(k) for k in ("verl", "verl.utils", "verl.utils.device",
                                             "verl.utils.kernel")}
    try:
        root, utils, kern = pkg("verl", None), pkg("verl.utils", None), \
            pkg("verl.utils.kernel", kdir)
        dev = types.ModuleType("verl.utils.device")
        dev.is_cuda_available = torch.cuda.is_available()
        dev.get_device_name = lambda: "cuda"
        dev.get_torch_device = lambda: torch.cuda
        dev.get_device_capability = lambda device_id=0: (
            torch.cuda.get_device_capability(device_id) if torch.cuda.is_available()
            else (None, None))
        sys.modules["verl.utils.device"] = dev
        root.utils, utils.device, utils.kernel = utils, dev, kern
        importlib.import_module("verl.utils.kernel.kernels")
        lce = importlib.import_module("verl.utils.kernel.linear_cross_entropy")
    except BaseException:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
        raise
    return lce.linear_cross_entropy, version_of("verl")


def in_site_dir(path):
    p = str(path)
    return f"{os.sep}site-packages{os.sep}" in p or f"{os.sep}dist-packages{os.sep}" in p


def ensure_cutlass_path():
    """`import cutlass` works once nvidia_cutlass_dsl/dsl_packages is on sys.path. A site
    directory does that through nvidia-cutlass-dsl's .pth file; a pip --target directory on
    PYTHONPATH processes no .pth files, so add the folder here. Returns the cutlass module."""
    if importlib.util.find_spec("cutlass") is None:
        spec = importlib.util.find_spec("nvidia_cutlass_dsl")
        if spec is None or not spec.submodule_search_locations:
            raise ImportError("No module named 'cutlass' (nvidia-cutlass-dsl not installed)")
        dsl = Path(list(spec.submodule_search_locations)[0]) / "dsl_packages"
        if not (dsl / "cutlass").is_dir():
            raise ImportError(f"nvidia-cutlass-dsl: {dsl / 'cutlass'} missing")
        sys.path.insert(0, str(dsl))
    import cutlass
    return cutlass


def patch_quack_semantic_key():
    """QuACK (0.6.x) keys its compile cache on a fingerprint of each epilogue function and the
    globals it reads (quack.gemm_runtime.identity). Functions of installed libraries are keyed
    by name only, and 'installed' means a file under a site-packages or dist-packages folder.
    Installed with pip --target into a folder named otherwise (/tmp/site), cutlass's functions
    are fingerprinted by their globals too, down to a ContextVar, and the first epilogue fails
    with "epilogue fn depends on <ContextVar name='_LOC_TRANSFORMS' ...> ..., which has no
    fail-closed semantic key". The fix is to install under a path holding /site-packages/
    (scripts/device/peers_run.sh does); where that is not so, this treats every file under
    cutlass's and tvm_ffi's folders as installed, which gives the same keys a site-packages
    install gives (checked: same digests). Returns a note, or None when nothing was patched."""
    import cutlass
    import tvm_ffi
    roots = tuple(os.path.realpath(os.path.dirname(m.__file__)) + os.sep
                  for m in (cutlass, tvm_ffi))
    if all(in_site_dir(r) for r in roots):
        return None
    import quack.gemm_runtime.identity as idm
    orig = getattr(idm, "_is_extern_function", None)
    if orig is None:
        return ("cutlass is outside site-packages but quack.gemm_runtime.identity has no "
                "_is_extern_function to patch: expect 'no fail-closed semantic key'")
    if getattr(orig, "_sph_patched", False):
        return "quack.gemm_runtime.identity._is_extern_function patched (earlier)"

    def _is_extern_function(fn):
        if orig(fn):
            return True
        code = getattr(fn, "__code__", None)
        return code is not None and os.path.realpath(code.co_filename).startswith(roots)

    _is_extern_function._sph_patched = True
    idm._is_extern_function = _is_extern_function
    return (f"patched quack.gemm_runtime.identity._is_extern_function: {', '.join(roots)} "
            f"not under site-packages")


def load_quack():
    ensure_cutlass_path()
    import quack
    note = patch_quack_semantic_key()
    import quack.linear_cross_entropy as qlce
    fn = getattr(qlce, "chunked_linear_cross_entropy", None)
    if fn is None:
        raise ImportError(f"quack {quack.__version__}: no chunked_linear_cross_entropy")
    params = inspect.signature(fn).parameters
    info = {"fn": fn, "has_tuned": "tuned" in params, "has_scaled": "use_scaled_exp" in params,
            "supported": getattr(qlce, "scaled_exp_lce_supported", None), "note": note}
    ver = (f"{getattr(quack, '__version__', version_of('quack-kernels'))}, nvidia-cutlass-dsl "
           f"{version_of('nvidia-cutlass-dsl')}, apache-tvm-ffi {version_of('apache-tvm-ffi')}")
    return info, ver + (f" ({note})" if note else "")


def load_liger_cute():
    ensure_cutlass_path()
    mod = importlib.import_module("liger_kernel.ops.cutedsl.ops.fused_linear_cross_entropy_sm90")
    F = mod.LigerFusedLinearCrossEntropySM90Function
    return ((F, int(getattr(mod, "TILE_M", 128)), int(getattr(mod, "TILE_N", 256))),
            f"{version_of('liger-kernel')}, nvidia-cutlass-dsl {version_of('nvidia-cutlass-dsl')}")


def load_liger_grpo():
    from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss
    return LigerFusedLinearGRPOLoss, version_of("liger-kernel")


LOADERS = {"spanhead": load_spanhead, "liger": load_liger, "cce": load_cce, "verl": load_verl,
           "quack": load_quack, "liger-cute": load_liger_cute, "liger-grpo": load_liger_grpo}
IMPL_LOADER = {"spanhead": "spanhead", "spanhead-onepass": "spanhead", "liger-sum": "liger",
               "liger-none": "liger", "cce": "cce", "cce-exact": "cce", "verl": "verl",
               "torch-eager": None, "quack": "quack", "quack-compact": "quack",
               "liger-cute": "liger-cute", "liger-cute-compact": "liger-cute",
               "spanhead+torch": "spanhead", "spanhead-policy": "spanhead",
               "torch-eager-policy": None, "liger-grpo": "liger-grpo"}


def load_all(impls):
    """{loader name: (object, version)} and {impl: reason it is unavailable}."""
    loaded, unavailable = {}, {}
    for impl in impls:
        key = IMPL_LOADER[impl]
        if key is None or key in loaded:
            continue
        if key in unavailable:
            unavailable[impl] = unavailable[key]
            continue
        t0 = time.monotonic()
        try:
            loaded[key] = LOADERS[key]()
            log(f"# {key}: {loaded[key][1]} (import {time.monotonic() - t0:.1f} s)")
        except BaseException as e:  # noqa: BLE001 - any import failure skips the peer
            if isinstance(e, KeyboardInterrupt):
                raise
            msg = f"{type(e).__name__}: {e}".splitlines()[0][:300]
            unavailable[key] = msg
            log(f"# {key}: not importable, skipped ({msg})")
    for impl in impls:
        key = IMPL_LOADER[impl]
        if key is not None and key in unavailable:
            unavailable[impl] = unavailable[key]
    return loaded, unavailable


def check_apis(loaded):
    """The call surface each peer is driven through, against what is installed: a list of
    (peer, 'ok' or the mismatch). Catches an upgrade that renames an argument before any GPU
    time is spent."""
    out = []

    def params_of(fn):
        try:
            return set(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            return set()

    def need(name, fn, want):
        miss = sorted(set(want) - params_of(fn))
        out.append((name, "ok" if not miss else f"missing parameters {miss}"))

    if "quack" in loaded:
        info = loaded["quack"][0]
        need("quack chunked_linear_cross_entropy", info["fn"],
             ["x", "weight", "target", "chunk_size", "ignore_index", "reduction", "tuned",
              "use_scaled_exp"])
        out.append(("quack scaled_exp_lce_supported",
                    "ok" if callable(info["supported"]) else "absent (base pipeline only)"))
        try:
            import quack.gemm_runtime.identity as idm
            out.append(("quack monkeypatch target identity._is_extern_function",
                        "ok" if callable(getattr(idm, "_is_extern_function", None))
                        else "absent"))
        except ImportError as e:
            out.append(("quack monkeypatch target", f"absent ({e})"))
        try:
            import quack.epilogue.frontend as fe
            src = inspect.getsource(fe._infer_kind)
            out.append(("quack m == n operand inference (chunk != H rule)",
                        "present" if "m == n" in src else "not found (rule harmless)"))
        except (ImportError, AttributeError, OSError, TypeError) as e:
            out.append(("quack epilogue frontend", f"not inspected ({type(e).__name__})"))
    if "liger-cute" in loaded:
        F, tm, tn = loaded["liger-cute"][0]
        need("liger-cute LigerFusedLinearCrossEntropySM90Function.forward", F.forward,
             ["_input", "weight", "target", "ignore_index", "reduction"])
        out.append(("liger-cute tiles", "ok" if (tm, tn) == (128, 256)
                    else f"TILE_M {tm}, TILE_N {tn} (expected 128, 256)"))
    if "liger-grpo" in loaded:
        G = loaded["liger-grpo"][0]
        need("liger-grpo LigerFusedLinearGRPOLoss.__init__", G.__init__,
             ["beta", "compiled", "use_ref_model", "chunk_size", "epsilon_low", "epsilon_high",
              "loss_type"])
        need("liger-grpo LigerFusedLinearGRPOLoss.forward", G.forward,
             ["_input", "lin_weight", "selected_token_ids", "attention_mask", "advantages",
              "old_per_token_logps"])
    if "liger" in loaded:
        need("liger-sum/none LigerFusedLinearCrossEntropyFunction.forward",
             loaded["liger"][0].forward, ["_input", "weight", "target"])
    if "spanhead" in loaded:
        sht = loaded["spanhead"][0]
        need("spanhead.torch.logprobs", sht.logprobs, ["loss_mask", "spans"])
        pl = getattr(sht, "policy_loss", None)
        if pl is None:
            out.append(("spanhead.torch.policy_loss", "absent (issue 14 not in this tree: "
                        "spanhead-policy is skipped)"))
        else:
            need("spanhead.torch.policy_loss", pl,
                 ["loss_mask", "loss_type", "clip_low", "clip_high", "agg"])
    return out
