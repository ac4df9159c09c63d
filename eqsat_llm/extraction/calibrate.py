"""Measure this machine's roofline numbers with torch and cache them (docs/cost-model.md).

    eqsat-llm calibrate [--quick]        # -> main_calibrate(quick)

The cache is one JSON file per machine (host name + CPU model + torch threads) under
`$XDG_CACHE_HOME/eqsat-llm/` (default `~/.cache/eqsat-llm/`; machine.py reads and writes it);
`machine.machine_of_this_host()` returns it, or `machine.DEFAULT` when this machine was never
calibrated.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from ..errors import EqsatError
from ..ir import Graph, TensorType
from ..ops import EXP_FLOPS, evaluate
from .machine import DEFAULT, Machine, machine_key, save

# --------------------------------------------------------------------------- measuring


def time_call(fn: Callable[[], object], repeats: int = 7, batch_s: float = 1e-3,
              stat: str = "min", warmup_s: float = 5e-3) -> float:
    """Seconds per call of `fn`: the minimum (or "median") over `repeats` batches of at least
    `batch_s` each, after `warmup_s` of warm-up. The minimum is the default because other
    processes on a shared machine only ever add time."""
    start = time.perf_counter()
    calls = 0
    while calls < 3 or time.perf_counter() - start < warmup_s:
        t = time.perf_counter()
        fn()
        one = time.perf_counter() - t
        calls += 1
    inner = max(1, min(10_000, int(batch_s / max(one, 1e-7))))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - t) / inner)
    return min(times) if stat == "min" else statistics.median(times)


def _cache_size(index: int, default: int) -> int:
    try:
        text = Path(f"/sys/devices/system/cpu/cpu0/cache/index{index}/size").read_text()
    except OSError:
        return default
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip()
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


# A VM reports its host's whole L3 (480 MiB on the reference VM), shared with other tenants:
# there, `out = a + b` at 256 MiB runs at half its 16 MiB speed. The model uses at most this.
L3_CAP = 32 << 20


# A probe: name -> (call, work): `call` runs it once; work is the flops or bytes of one call.
Probes = dict[str, tuple[Callable[[], object], float]]


def _probes(quick: bool, threads: int) -> tuple[Probes, int, int]:
    """The timed probes of torch ops, and the L2 and L3 sizes."""
    probes: Probes = {}
    one = torch.rand(1)  # tiny ops, as the reference runtime runs them
    probes["overhead"] = (lambda: evaluate("add", [one, one], {}), 0.0)
    a1, b1 = torch.rand(1, 64), torch.rand(64, 64)
    probes["gemm_overhead"] = (lambda: evaluate("mm", [a1, b1], {"alpha": 1.0}), 0.0)
    shapes = [(256, 512, 512)] if quick else [(512, 512, 512), (1024, 1024, 1024),
                                              (128, 512, 1536)]
    for m, k, n in shapes:
        a, b = torch.rand(m, k), torch.rand(k, n)
        probes[f"gemm {m}x{k}x{n}"] = (lambda a=a, b=b: torch.mm(a, b), 2.0 * m * k * n)
    v, w = torch.rand(1, 512), torch.rand(512, 1024)  # a 2 MiB matrix: in L2
    probes["gemv"] = (lambda: torch.mm(v, w), 2.0 * 512 * 1024)
    x = torch.rand(1 << 16)
    probes["vector"] = (lambda: torch.exp(x), EXP_FLOPS * x.numel())
    l2 = _cache_size(2, DEFAULT.l2_bytes // max(DEFAULT.threads, 1)) * threads
    l3 = max(min(_cache_size(3, DEFAULT.l3_bytes), L3_CAP), 4 * l2)
    sets = {"l2_bw": l2 // 2, "l3_bw": (l2 + l3) // 2,
            "dram_bw": (2 if quick else 4) * l3}
    for name, working_set in sets.items():  # out = a + b: bytes read + written
        n = max(1024, working_set // 12)
        ta, tb, tc = torch.rand(n), torch.rand(n), torch.empty(n)
        probes[name] = (lambda ta=ta, tb=tb, tc=tc: torch.add(ta, tb, out=tc), 12.0 * n)
    return probes, l2, l3


# builds a one-node program in a graph: (its output node, the inputs to call it with)
Build = Callable[[Graph], tuple[int, list[torch.Tensor]]]


class KernelProbe:
    """A one-node program on the C backend, built for profiling: calling it runs the program
    once; `seconds` is the generated kernel's own time per call (its `eq_profile`), without
    the runtime's per-call work (ctypes, output tensors), which a program pays once."""

    def __init__(self, build: Build):
        from ..codegen.c import CRuntime

        g = Graph()
        out, self.inputs = build(g)
        g.outputs = [out]
        self.rt = CRuntime(g, profile=True)

    def __call__(self) -> object:
        return self.rt.run(self.inputs)

    def seconds(self, repeats: int, batch_s: float = 1e-3) -> float:
        """The kernel's time per call: the minimum over `repeats` batches of ~batch_s."""
        self()
        t = time.perf_counter()
        self()
        inner = max(1, min(1000, int(batch_s / max(time.perf_counter() - t, 1e-6))))
        best = math.inf
        for _ in range(repeats):
            self.rt.profile_reset()
            for _ in range(inner):
                self()
            best = min(best, sum(self.rt.profile_read()[0]) / inner)
        return best


def _kernel_probes(quick: bool) -> dict[str, tuple[KernelProbe, float]]:
    """Probes of the kernels the C backend generates (GEMMs against a packed constant
    weight, as a model's linear layers are; exp; a one-element add), or none when they
    cannot be built (no C compiler): the fused cost model prices these kernels."""
    from ..codegen.c import CCompileError

    def mm(m: int, k: int, n: int) -> Build:
        def build(g: Graph) -> tuple[int, list[torch.Tensor]]:
            x = _input(g, (m, k))
            g.constants["w"] = torch.rand(k, n)
            w = g.append("const", (), {"name": "w"}, TensorType((k, n), "float32"))
            return g.add("mm", (x, w), alpha=1.0), [torch.rand(m, k)]
        return build

    def unary(op: str, n: int, arity: int = 1) -> Build:
        def build(g: Graph) -> tuple[int, list[torch.Tensor]]:
            xs = [_input(g, (n,)) for _ in range(arity)]
            return g.add(op, tuple(xs)), [torch.rand(n) for _ in xs]
        return build

    shapes = [(256, 512, 512)] if quick else [(512, 512, 512), (128, 512, 1536)]
    builds = {f"c gemm {m}x{k}x{n}": (mm(m, k, n), 2.0 * m * k * n) for m, k, n in shapes}
    builds.update({"c gemv": (mm(1, 512, 1024), 2.0 * 512 * 1024),
                   "c gemm_overhead": (mm(1, 64, 64), 0.0),
                   "c vector": (unary("exp", 1 << 16), EXP_FLOPS * (1 << 16)),
                   "c overhead": (unary("add", 1, 2), 0.0)})
    try:
        return {name: (KernelProbe(build), work) for name, (build, work) in builds.items()}
    except (CCompileError, EqsatError, OSError):
        return {}


def _input(g: Graph, shape: tuple[int, ...]) -> int:
    k = sum(n.op == "input" for n in g.nodes)
    return g.append("input", (), {"name": f"x{k}", "index": k}, TensorType(shape, "float32"))


def calibrate(quick: bool = False, passes: int | None = None, kernels: bool = True) -> Machine:
    """Measure GEMM and GEMV rates, the vector rate, bandwidth at L2/L3/DRAM-sized working
    sets and the per-call overheads at torch's current thread count. The rates and the
    generated kernels' overheads are measured on kernels the C backend generates (the fused
    model prices those) when `kernels` and a C compiler allow (`rates_from="c"`), else on
    torch's ops; bandwidths and torch's per-op overhead on torch's ops. Each probe is timed in
    `passes` interleaved passes (default 3 quick, 5 full) and its fastest time kept: other
    processes only ever slow a probe down. `quick` takes about a second once the probes'
    programs are compiled (cached)."""
    passes = passes or (3 if quick else 5)
    reps = 7 if quick else 15
    threads = torch.get_num_threads()
    with torch.no_grad():
        probes, l2, l3 = _probes(quick, threads)
        gen = _kernel_probes(quick) if kernels else {}
        best = dict.fromkeys([*probes, *gen], math.inf)
        for _ in range(passes):
            for name, (fn, work) in probes.items():
                best[name] = min(best[name], time_call(fn, 3 if work > 1e8 else reps))
            for name, (probe, work) in gen.items():
                best[name] = min(best[name], probe.seconds(3 if work > 1e8 else reps))
    works = {name: work for name, (_fn, work) in [*probes.items(), *gen.items()]}
    prefix = "c " if gen else ""
    overhead = best["overhead"]
    kernel_overhead = best[f"{prefix}overhead"]
    gemm_overhead = max(best[f"{prefix}gemm_overhead"], kernel_overhead)

    def rate(name: str, minus: float) -> float:
        t = best[name]
        return works[name] / max(t - minus, t / 10)

    gemm = max(rate(n, gemm_overhead) for n in best if n.startswith(f"{prefix}gemm "))
    # the bandwidth probes, inverted through the model's level rule (Machine.memory_time)
    moved = {n: works[n] for n in ("l2_bw", "l3_bw", "dram_bw")}
    seconds = {n: max(best[n] - overhead, best[n] / 10) for n in moved}
    l2_bw = moved["l2_bw"] / seconds["l2_bw"]
    t_l2 = l2 / l2_bw
    l3_bw = _level_bw(moved["l3_bw"] - l2, seconds["l3_bw"] - t_l2, l2_bw)
    dram_bw = _level_bw(moved["dram_bw"] - l3, seconds["dram_bw"] - t_l2 - (l3 - l2) / l3_bw,
                        l3_bw)
    return replace(DEFAULT, name=machine_key(), gemm_flops=gemm,
                   gemv_flops=min(rate(f"{prefix}gemv", gemm_overhead), gemm),
                   vector_flops=rate(f"{prefix}vector", kernel_overhead), l2_bytes=l2,
                   l2_bw=l2_bw, l3_bytes=l3, l3_bw=l3_bw, dram_bw=dram_bw,
                   call_overhead=overhead, threads=threads, gemm_overhead=gemm_overhead,
                   kernel_overhead=kernel_overhead, rates_from="c" if gen else "torch")


def _level_bw(nbytes: float, seconds: float, faster: float) -> float:
    """Bandwidth of a level that moved `nbytes` beyond the faster levels in `seconds`; at
    most the faster level's (noise can leave too little time to attribute)."""
    if seconds <= nbytes / faster:
        return faster
    return nbytes / seconds


class CpuShare:
    """How much of the CPUs other processes used since construction (from /proc/stat and
    this process's own CPU time): timings taken meanwhile ran slow by up to that much."""

    def __init__(self) -> None:
        self._start = (time.perf_counter(), self._busy(), self._own())

    @staticmethod
    def _busy() -> float | None:
        try:
            fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        except OSError:
            return None
        ticks = [int(x) for x in fields]  # user nice system idle iowait irq softirq steal
        busy = ticks[0] + ticks[1] + ticks[2] + sum(ticks[5:8])
        return busy / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _own() -> float:
        """This process's CPU time and its finished children's (the C compiler a profiling
        build runs is not another process's load)."""
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    def others(self) -> float | None:
        """Fraction of all CPUs' time that other processes used, or None if unknown."""
        t0, busy0, own0 = self._start
        busy = self._busy()
        elapsed = time.perf_counter() - t0
        if busy is None or busy0 is None or elapsed <= 0:
            return None
        used = (busy - busy0) - (self._own() - own0)
        return min(1.0, max(0.0, used / (elapsed * (os.cpu_count() or 1))))  # tick-grained

    def warning(self, threshold: float = 0.2) -> str | None:
        share = self.others()
        if share is None or share < threshold:
            return None
        return (f"warning: other processes used {share:.0%} of the CPUs meanwhile, so these "
                "timings may be slow; run again when the machine is idle")


def describe(m: Machine) -> str:
    mib = 1 << 20
    return "\n".join([
        f"machine       {m.name} ({m.threads} threads)",
        f"GEMM          {m.gemm_flops / 1e9:8.1f} GFLOP/s large, "
        + f"{m.gemv_flops / 1e9:.1f} GFLOP/s GEMV",
        f"vector        {m.vector_flops / 1e9:8.1f} GFLOP/s (flop-equivalents, exp = "
        + f"{EXP_FLOPS:g})",
        f"L2            {m.l2_bw / 1e9:8.1f} GB/s up to {m.l2_bytes / mib:g} MiB",
        f"L3            {m.l3_bw / 1e9:8.1f} GB/s up to {m.l3_bytes / mib:g} MiB",
        f"DRAM          {m.dram_bw / 1e9:8.1f} GB/s",
        f"call overhead {m.call_overhead * 1e6:8.2f} us per torch op, {m.kernel_overhead * 1e6:.2f}"
        + f" us per generated kernel, {m.gemm_overhead * 1e6:.2f} us per matmul/attention call",
        f"rates from    {m.rates_from}",
    ])


def implausible(m: Machine) -> list[str]:
    """The rates of `m` below 1/20 of DEFAULT's: a sign that other processes held the CPUs
    (a real machine this slow should pass `force`)."""
    names = ("gemm_flops", "gemv_flops", "vector_flops", "l2_bw", "l3_bw", "dram_bw")
    return [n for n in names if getattr(m, n) < getattr(DEFAULT, n) / 20]


def calibrate_checked(quick: bool = False) -> tuple[Machine, str | None]:
    """`calibrate(quick)`, and why its numbers should not be saved (None if they may)."""
    share = CpuShare()
    m = calibrate(quick)
    busy = share.others() or 0.0
    if busy >= 0.5:
        return m, f"other processes used {busy:.0%} of the CPUs meanwhile"
    low = implausible(m)
    if low:
        return m, f"implausibly low {', '.join(low)} (a busy machine?)"
    return m, None


def main_calibrate(quick: bool = False, force: bool = False) -> int:
    """`eqsat-llm calibrate [--quick] [--force]`: measure, cache and print this machine's
    numbers. Numbers taken while other processes held half the CPUs, or implausibly low
    ones, are not saved (they would mislead the cost model) unless `force`; returns 1 then,
    else 0."""
    t = time.perf_counter()
    share = CpuShare()
    m, problem = calibrate_checked(quick)
    print(describe(m))
    warning = share.warning()
    if warning:
        print(warning)
    if problem and not force:
        print(f"not saved: {problem}; calibrate again when the machine is idle "
              "(--force saves anyway)")
        return 1
    path = save(m)
    print(f"saved to {path} ({time.perf_counter() - t:.1f} s)")
    return 0
