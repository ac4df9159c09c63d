"""Refusing a program that does not fit in memory, before allocating it.

A compiled program allocates, beyond the model's own weights: the constants folding computes
(merged or transposed weights, masks, rotary tables), the weights a backend prepares (the C
backend's packed GEMM panels), one arena (`MemoryPlan.arena_bytes`) and its outputs per call.
Each is estimated from types and the plan before it is allocated and compared with the memory
available: `EQSAT_MEMORY_LIMIT` when set (bytes, or with a unit: `512M`, `16G`, `1.5GiB`;
`off` disables the check), else the smaller of MemAvailable (/proc/meminfo) and what the
cgroup's memory.max leaves. A program that needs more raises `MemoryLimitError` naming the
parts, instead of being killed by the OS part-way. Where neither source is readable (not
Linux) nothing is checked. docs/errors.md.
"""

from __future__ import annotations

import functools
import os
import re
import threading
from pathlib import Path
from typing import Any

from .errors import EqsatError, MemoryLimitError

ENV = "EQSAT_MEMORY_LIMIT"
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_bytes(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text, re.IGNORECASE)
    if m is None:
        raise EqsatError(f"{ENV}={text!r}: expected bytes, e.g. 8000000000, 512M, 16G, or 'off'")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _cgroup_available() -> int | None:
    """What the cgroup (v2, else v1) still allows this process group to allocate."""
    for limit, usage in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                         ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                          "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            cap = Path(limit).read_text().strip()
            if cap == "max" or int(cap) >= 1 << 60:  # unlimited
                return None
            return max(0, int(cap) - int(Path(usage).read_text().strip()))
        except (OSError, ValueError):
            continue
    return None


def available_bytes(device: Any = None) -> tuple[int | None, str]:
    """The bytes a program may still allocate (on `device`: host memory unless it is a CUDA
    device, whose free memory torch reports), and where that number comes from; None: no
    limit known (or the check switched off)."""
    raw = os.environ.get(ENV, "").strip()
    if raw:
        if raw.lower() in ("off", "none"):
            return None, f"{ENV}={raw}"
        return parse_bytes(raw), f"{ENV}={raw}"
    if getattr(device, "type", None) == "cuda":
        import torch

        free, _total = torch.cuda.mem_get_info(device)
        return free, f"free memory of {device} (torch.cuda.mem_get_info)"
    found = [(n, where) for n, where in ((_meminfo_available(), "MemAvailable in /proc/meminfo"),
                                         (_cgroup_available(), "the cgroup's memory.max"))
             if n is not None]
    return min(found) if found else (None, "")


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def check_fits(parts: dict[str, int], what: str, device: Any = None) -> None:
    """Raise MemoryLimitError when the bytes of `parts` (name -> bytes about to be allocated,
    on `device`: host memory by default) exceed the memory available; `what`: what they are
    allocated for."""
    need = sum(parts.values())
    have, source = available_bytes(device)
    if have is None or need <= have:
        return
    shown = ", ".join(f"{name} {_size(b)}" for name, b in parts.items() if b)
    raise MemoryLimitError(
        f"not enough memory to {what}: it needs about {_size(need)} more ({shown}) but "
        f"{_size(have)} is available ({source}). Free memory, use smaller shapes (batch, "
        f"sequence length), or store the weights as integers (quantize='int8'); {ENV} sets "
        "the limit (bytes or e.g. 16G; 'off' disables this check)")


def output_bytes(graph: Any) -> int:
    """The bytes of a graph's tensor outputs: allocated per call."""
    from .ir import TensorType, dtype_of

    types = [graph.node(i).type for i in graph.outputs]
    return sum(t.numel * dtype_of(t.dtype).itemsize for t in types
               if isinstance(t, TensorType) and not t.dtype.startswith("py_"))


def fold_bytes(graph: Any, keep: frozenset[str]) -> int:
    """An upper bound of what folding `graph` allocates: every value computed only from
    constants (the ops in `keep` are never folded), at its full size (a folded view that
    shares its input's storage is counted as a copy); values computed from meta-device
    weights (no storage) count nothing."""
    import torch

    from .ir import TensorType, dtype_of

    const: dict[int, bool] = {}  # node id -> whether its value is on the meta device
    total = 0
    live = graph.live_ids()
    for node in graph.nodes:
        if node.id not in live:
            continue
        if node.op in ("param", "const"):
            t = graph.constants[node.attrs["name"]]
            const[node.id] = isinstance(t, torch.Tensor) and t.is_meta
        elif node.op == "scalar":
            const[node.id] = False
        elif node.op not in keep and all(i in const for i in node.inputs):
            meta = any(const[i] for i in node.inputs)
            const[node.id] = meta
            t = node.type
            if not meta and isinstance(t, TensorType) and not t.dtype.startswith("py_"):
                total += t.numel * dtype_of(t.dtype).itemsize
    return total


def release_freed_memory() -> None:
    """Hand the heap pages freed so far back to the operating system (glibc's malloc_trim;
    nothing elsewhere). Optimizing a model and loading its weights free many mid-sized blocks
    that glibc keeps for reuse: trimmed between the phases, they do not add to the peak of
    the next (TinyLlama shape, int4 from bf16: 0.18 GB kept after optimizing)."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


HUGE_PAGE = 2 << 20
ADJACENT = 2 * 4096  # bytes between storages still joined: the allocator's chunk headers
MADV_COLLAPSE = 25  # Linux 6.1 and later


def collapse_into_huge_pages(tensors: list[Any], smallest: int = HUGE_PAGE) -> int:
    """Back the large tensors' memory with 2 MiB pages where the OS can (Linux's
    madvise(MADV_COLLAPSE), which copies each 2 MiB-aligned stretch into a huge page in
    place, addresses and values unchanged, whatever the system's THP setting; elsewhere, or
    where it refuses, nothing happens). Returns the bytes collapsed. `EQSAT_HUGE_PAGES=0`
    turns it off. Slow (the kernel finds, zeroes and fills each huge page: done in place it
    made a warm bf16 TinyLlama start 1.5 s slower): collapse_in_background runs it off the
    caller's path."""
    libc = _libc()
    if libc is None or os.environ.get("EQSAT_HUGE_PAGES", "1") == "0" or \
            not hasattr(libc, "madvise"):
        return 0
    import ctypes

    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    done = 0
    for start, end in _huge_stretches(tensors, smallest):
        if libc.madvise(start, end - start, MADV_COLLAPSE) == 0:
            done += end - start
    return done


def collapse_in_background(tensors: list[Any]) -> threading.Thread | None:
    """collapse_into_huge_pages on a daemon thread (madvise releases the GIL; the tensors
    stay usable, and referenced, while it runs), when any of them is large enough; the
    thread, or None. A decode step streams its weights once per token, and with 4 KiB pages
    each 4 KiB costs a TLB walk (docs/c-backend.md, "Weights on 2 MiB pages")."""
    if os.environ.get("EQSAT_HUGE_PAGES", "1") == "0" or not _huge_stretches(tensors):
        return None
    thread = threading.Thread(target=collapse_into_huge_pages, args=(list(tensors),),
                              name="eqsat-huge-pages", daemon=True)
    thread.start()
    return thread


def _huge_stretches(tensors: list[Any], smallest: int = HUGE_PAGE) -> list[tuple[int, int]]:
    """The 2 MiB-aligned address ranges inside the CPU storages of the tensors, each storage
    once, storages that lie back to back (at most ADJACENT bytes apart: the allocator's
    headers between consecutive allocations) joined first, so that a weight of 2-3 MiB
    whose own span holds no whole aligned 2 MiB range still moves with its neighbours; the
    joined spans of `smallest` bytes or more."""
    spans = sorted({(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
                    for t in tensors if hasattr(t, "untyped_storage") and t.device.type == "cpu"})
    joined: list[list[int]] = []
    for ptr, size in spans:
        if size == 0:
            continue
        if joined and ptr - joined[-1][1] <= ADJACENT:
            joined[-1][1] = max(joined[-1][1], ptr + size)
        else:
            joined.append([ptr, ptr + size])
    out = []
    for lo, hi in joined:
        start, end = -(-lo // HUGE_PAGE) * HUGE_PAGE, hi // HUGE_PAGE * HUGE_PAGE
        if hi - lo >= smallest and end > start:
            out.append((start, end))
    return out


@functools.cache
def _libc() -> Any:
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None
