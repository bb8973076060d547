"""spanhead and PyPI torch in one process, in either import order (docs/python.md,
"Coexistence with PyTorch's CUDA libraries").

libspanhead links the CUDA runtime statically and opens cuBLAS and NCCL at run time,
preferring the copies already in the process, so it never loads a system libnccl / libcublas /
libcudart that would shadow the ones PyTorch's wheels bring. Before, `import spanhead` then
`import torch` failed with "libtorch_cuda.so: undefined symbol: ncclCommResume" (the system's
NCCL 2.28 loaded first; torch 2.15 needs its wheel's 2.30).

The import-order checks run in fresh interpreters (what a user's script does). They mean
something where torch is a CUDA build with its own NCCL wheel (PyPI's default, as
scripts/setup.sh installs) and the library was built with CUDA; elsewhere they still run and
say what they could not exercise. The CUDA checks (which cuBLAS / NCCL the library drives)
run on a GPU machine.
"""

import json
import os
import subprocess
import sys

import pytest

import spanhead

torch = pytest.importorskip("torch")

CHILD = r"""
import json, os, sys
order = sys.argv[1]
if order == "spanhead-first":
    import spanhead, torch
else:
    import torch, spanhead
import spanhead.torch as sht
dev = sys.argv[2]
h = torch.randn(6, 8, device=dev, requires_grad=True)
w = torch.randn(13, 8, device=dev, requires_grad=True)
t = torch.randint(0, 13, (6,), device=dev)
lp = sht.logprobs(h, w, t, loss_mask=torch.tensor([1, 1, 0, 1, 0, 1], dtype=torch.bool))
lp.sum().backward()
ref = torch.log_softmax(h.double() @ w.double().T, -1).gather(1, t[:, None])[:, 0]
ref = ref * torch.tensor([1, 1, 0, 1, 0, 1], device=dev)
err = (lp.double() - ref).abs().max().item()
if dev == "cuda":
    torch.cuda.synchronize()
libs = sorted({l.split()[-1] for l in open("/proc/self/maps")
               if any(k in l for k in ("libnccl", "libcudart", "libcublas"))})
print(json.dumps({"err": err, "libs": libs, "torch": torch.__version__,
                  "torch_cuda": torch.version.cuda, "spanhead": spanhead.LIBRARY_PATH,
                  "grad": bool(w.grad.abs().sum() > 0)}))
"""


def run_child(order, dev="cpu"):
    env = dict(os.environ)
    p = subprocess.run([sys.executable, "-c", CHILD, order, dev], capture_output=True,
                       text=True, env=env, timeout=300)
    assert p.returncode == 0, f"{order} on {dev}: exit {p.returncode}\n{p.stderr[-3000:]}"
    return json.loads(p.stdout.strip().splitlines()[-1])


def torch_nccl():
    """The NCCL of torch's wheel (nvidia-nccl-*), or None."""
    for base in sys.path:
        p = os.path.join(base, "nvidia", "nccl", "lib", "libnccl.so.2")
        if os.path.exists(p):
            return os.path.realpath(p)
    return None


def lib_needed(path):
    p = subprocess.run(["readelf", "-d", path], capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"readelf -d {path} failed: {p.stderr.strip()}")
    return [line.split("[")[-1].rstrip("]") for line in p.stdout.splitlines() if "NEEDED" in line]


def test_library_needs_no_cuda_library():
    needed = lib_needed(spanhead.LIBRARY_PATH)
    bad = [n for n in needed if n.startswith(("libcudart", "libcublas", "libnccl"))]
    assert not bad, f"{spanhead.LIBRARY_PATH} needs {bad}"


@pytest.mark.parametrize("order", ["spanhead-first", "torch-first"])
def test_import_order_cpu(order):
    r = run_child(order)
    assert r["err"] < 2e-5 and r["grad"], r
    # at most one NCCL / cuBLAS / cudart of each soname in the process, and never a system
    # copy beside torch's wheel copy
    for name in ("libnccl.so", "libcublas.so", "libcudart.so"):
        copies = [lib for lib in r["libs"] if os.path.basename(lib).startswith(name)]
        assert len(copies) <= 1, f"{order}: several {name}: {copies}"
    mine = torch_nccl()
    nccls = [lib for lib in r["libs"] if "libnccl" in lib]
    if mine is not None:
        assert [os.path.realpath(n) for n in nccls] == [mine], (order, nccls)


def test_spanhead_alone_loads_no_cuda_library():
    code = ("import spanhead, numpy as np\n"
            "h = np.ones((3, 4), np.float32); w = np.ones((5, 4), np.float32)\n"
            "spanhead.head_forward(h, w, np.array([0, 1, 2]))\n"
            "print([l.split()[-1] for l in open('/proc/self/maps') if any(k in l for k in "
            "('libnccl', 'libcudart', 'libcublas'))])")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == "[]", p.stdout


def _cuda_ready():
    return torch.cuda.is_available() and spanhead.cuda_device_count() > 0


@pytest.mark.skipif(not _cuda_ready(), reason="needs a GPU visible to torch and libspanhead")
@pytest.mark.parametrize("order", ["spanhead-first", "torch-first"])
def test_import_order_cuda_shares_torch_cublas(order):
    """On the GPU: spanhead's CUDA calls use the cuBLAS already in the process (torch's), so
    the process holds one libcublas."""
    r = run_child(order, "cuda")
    assert r["err"] < 2e-5 and r["grad"], r
    cublas = [lib for lib in r["libs"] if os.path.basename(lib).startswith("libcublas.so")]
    assert len(cublas) == 1, f"{order}: cuBLAS copies {cublas}"


@pytest.mark.skipif(not _cuda_ready(), reason="needs a GPU visible to torch and libspanhead")
def test_nccl_is_torchs(tmp_path):
    """A torch.distributed NCCL group of one rank: spanhead drives torch's ncclComm_t with
    torch's NCCL (opened with RTLD_NOLOAD), the process holds one libnccl."""
    code = r"""
import json, sys, torch, torch.distributed as dist
import spanhead, spanhead.torch as sht
dist.init_process_group("nccl", init_method="file://" + sys.argv[1], rank=0, world_size=1)
g = dist.new_group([0])
x = torch.ones(1, device="cuda"); dist.all_reduce(x, group=g)  # creates the communicator
h = torch.randn(5, 8, device="cuda", requires_grad=True)
w = torch.randn(11, 8, device="cuda", requires_grad=True)
t = torch.randint(0, 11, (5,), device="cuda")
lp = sht.logprobs(h, w, t, tp_group=g)
lp.sum().backward()
gw = w.grad.clone()
# the same under torch.compile(fullgraph): the group lookup is a trace-time constant
w.grad = None
lpc = torch.compile(lambda h, w, t: sht.logprobs(h, w, t, tp_group=g), fullgraph=True,
                    backend="aot_eager")(h, w, t)
lpc.sum().backward()
compiled = max((lpc - lp).abs().max().item(), (w.grad - gw).abs().max().item())
ref = torch.log_softmax(h.double() @ w.double().T, -1).gather(1, t[:, None])[:, 0]
torch.cuda.synchronize()
libs = sorted({l.split()[-1] for l in open("/proc/self/maps") if "libnccl" in l})
print(json.dumps({"err": (lp.double() - ref).abs().max().item(), "libs": libs,
                  "compiled": compiled}))
dist.destroy_process_group()
"""
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path / "pg")], capture_output=True,
                       text=True, timeout=300)
    if p.returncode != 0 and "_comm_ptr" in p.stderr:
        pytest.skip("this torch has no ProcessGroupNCCL._comm_ptr (spanhead.Comm.from_torch)")
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["err"] < 2e-5, r
    assert len(r["libs"]) == 1, r["libs"]
    assert r["compiled"] < 1e-6, r  # compiled == eager over the torch.distributed group
