"""What the CUDA context costs on the device, taken apart (issue 27): run on a machine with an NVIDIA GPU.

``python3 tools/probe_cuda_context.py OUT.json [CUDART_DIR ...]``

Each case runs in a fresh process (a context is per process) and reports ``total − free`` from
``cuMemGetInfo`` / ``cudaMemGetInfo`` — the figure vLLM's ``MemorySnapshot`` prints as ``cuda_memory``
and ``traces/groundtruth-h200/non_torch.json`` calls ``used_bytes`` — minus what PyTorch's allocator
reserved where PyTorch is in the process:

* ``driver`` — the primary context made through the driver API alone (no runtime, no module), its
  limits (``cuCtxGetLimit``: stack per thread, printf FIFO, device malloc heap) and the device's SM count
  and resident threads per SM; then the stack limit raised step by step (``cuCtxSetLimit``), which the
  driver backs with local memory for every resident thread;
* ``cudart:DIR`` — the same context made by a CUDA runtime (``cudaFree(0)``) of another major version,
  on the same driver, from each ``libcudart.so.*`` in DIR;
* ``torch_empty`` / ``torch_zeros`` / ``torch_eager`` — PyTorch's context with one tensor and no kernel,
  with a fill kernel (lazily loaded module), and with ``CUDA_MODULE_LOADING=EAGER``;
* ``torch_pg`` — as vLLM's worker is when it prints its init snapshot at world size 1: a NCCL
  process group of one rank, no collective yet.

Nothing here is read by the package; the recorded JSON is a fact table (``traces/``).
"""

from __future__ import annotations

import ctypes
import glob
import json
import os
import subprocess
import sys

STACK, PRINTF_FIFO, MALLOC_HEAP = 0, 1, 2  # CUlimit
SM_COUNT, THREADS_PER_SM = 16, 39  # CUdevice_attribute


def driver() -> ctypes.CDLL:
    cuda = ctypes.CDLL("libcuda.so.1")
    assert cuda.cuInit(0) == 0
    return cuda


def used(cuda: ctypes.CDLL) -> int:
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    assert cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)) == 0
    return total.value - free.value


def limits(cuda: ctypes.CDLL) -> dict[str, int]:
    out = {}
    for name, lim in (("stack_bytes", STACK), ("printf_fifo_bytes", PRINTF_FIFO), ("malloc_heap_bytes", MALLOC_HEAP)):
        v = ctypes.c_size_t()
        out[name] = v.value if cuda.cuCtxGetLimit(ctypes.byref(v), lim) == 0 else -1
    return out


def case_driver() -> dict:
    cuda = driver()
    dev, ctx, ver = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_int()
    assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
    cuda.cuDriverGetVersion(ctypes.byref(ver))
    attrs = {}
    for name, a in (("sm_count", SM_COUNT), ("threads_per_sm", THREADS_PER_SM)):
        v = ctypes.c_int()
        cuda.cuDeviceGetAttribute(ctypes.byref(v), a, dev)
        attrs[name] = v.value
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
    assert cuda.cuCtxSetCurrent(ctx) == 0
    out = {"driver_version": ver.value, **attrs, "limits": limits(cuda), "used_bytes": used(cuda), "stack_sweep": []}
    for stack in (0, 512, 1024, 2048, 4096, 8192):
        rc = cuda.cuCtxSetLimit(STACK, ctypes.c_size_t(stack))
        out["stack_sweep"].append({"stack_bytes": stack, "rc": rc, "got": limits(cuda)["stack_bytes"],
                                   "used_bytes": used(cuda)})
    rc = cuda.cuCtxSetLimit(MALLOC_HEAP, ctypes.c_size_t(64 << 20))
    out["heap_64mib"] = {"rc": rc, "used_bytes": used(cuda)}
    return out


def case_cudart(path: str) -> dict:
    rt = ctypes.CDLL(path)
    assert rt.cudaFree(ctypes.c_void_p(0)) == 0
    rv, dv = ctypes.c_int(), ctypes.c_int()
    rt.cudaRuntimeGetVersion(ctypes.byref(rv))
    rt.cudaDriverGetVersion(ctypes.byref(dv))
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    assert rt.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total)) == 0
    stack = ctypes.c_size_t()
    rt.cudaDeviceGetLimit(ctypes.byref(stack), STACK)
    return {"lib": path.split("/nvidia/")[-1] if "/nvidia/" in path else os.path.basename(os.path.dirname(path)), "runtime_version": rv.value, "driver_version": dv.value,
            "used_bytes": total.value - free.value, "stack_bytes": stack.value}


def case_torch(kind: str) -> dict:
    import torch

    x = torch.zeros(1, device="cuda") if kind != "empty" else torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    out = {"torch": torch.__version__, "cuda": torch.version.cuda,
           "module_loading": os.environ.get("CUDA_MODULE_LOADING", "")}
    if kind == "pg":
        import torch.distributed as dist

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29577")
        dist.init_process_group("nccl", rank=0, world_size=1)
    free, total = torch.cuda.mem_get_info()
    cuda = driver()
    out.update(used_bytes=total - free, torch_reserved_bytes=torch.cuda.memory_reserved(),
               non_torch_bytes=total - free - torch.cuda.memory_reserved(), total_bytes=total,
               limits=limits(cuda))
    del x
    return out


def child(name: str) -> dict:
    if name == "driver":
        return case_driver()
    if name.startswith("cudart:"):
        return case_cudart(name.split(":", 1)[1])
    return case_torch(name.removeprefix("torch_"))


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--child":
        print(json.dumps(child(argv[1])))
        return 0
    out_path, dirs = argv[0], argv[1:]
    result: dict = {"cases": {}}
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        result["nvml_no_context"] = {"used_bytes": mem.used, "total_bytes": mem.total,
                                     "driver": pynvml.nvmlSystemGetDriverVersion(), "name": pynvml.nvmlDeviceGetName(h)}
    except Exception as exc:  # noqa: BLE001 - the probe records what it could not read
        result["nvml_no_context"] = {"error": repr(exc)}
    libs = sorted(p for d in dirs for p in glob.glob(os.path.join(d, "*", "libcudart.so.*")))
    site = os.path.join(os.path.dirname(sys.executable), "..", "lib", "python3*", "site-packages", "nvidia")
    libs += sorted(glob.glob(os.path.join(site, "*", "lib", "libcudart.so.*")))
    cases = ["driver", *(f"cudart:{p}" for p in libs), "torch_empty", "torch_zeros", "torch_eager", "torch_pg"]
    for name in cases:
        env = dict(os.environ)
        if name == "torch_eager":
            env["CUDA_MODULE_LOADING"] = "EAGER"
        proc = subprocess.run([sys.executable, __file__, "--child", name], capture_output=True, text=True, env=env,
                              timeout=180)
        lines = proc.stdout.strip().splitlines()
        try:
            result["cases"][name] = json.loads(lines[-1])
        except (IndexError, json.JSONDecodeError):
            result["cases"][name] = {"rc": proc.returncode, "stderr": proc.stderr[-800:]}
        print(name, json.dumps(result["cases"][name]), flush=True)
    with open(out_path, "w") as fh:
        json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
