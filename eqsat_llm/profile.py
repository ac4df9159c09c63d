"""Predicted against measured time per kernel of a compiled program (docs/cost-model.md,
"Predicted against measured").

`profile_program(compiled, inputs)` runs the program as its backend runs it and times each
backend kernel: on C, a profiling build of the same source (`CRuntime.profiling`: every
generated kernel adds its wall time to `eq_profile`) with each torch step timed alone; on the
reference backend, each planned torch step; on Triton, each node's launches with CUDA events
(not run on a GPU yet; under Triton's interpreter nothing is timed). Each kernel is listed with
the IR nodes it computes and the cost model's prediction for them. `attach_profile` stores the
result on the report.
"""

from __future__ import annotations

import os
import re
import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree

from .errors import EqsatError
from .extraction.calibrate import CpuShare
from .extraction.costmodel import CostError, CostModel, KernelCost
from .ir import VALUE_LEAVES, Graph, Node, TensorType, node_label
from .ops import get_op

# a kernel whose measured time is off the prediction by more than this factor is flagged
FLAG_RATIO = 1.5
WARMUP_CALLS = 2  # untimed calls first: caches, page faults, lazily loaded code
STATISTICS: dict[str, Callable[[list[float]], float]] = {
    "median": statistics.median, "min": min, "mean": statistics.mean}


@dataclass
class Group:
    """A backend kernel: its name, the IR nodes it computes, and how it runs."""

    name: str
    node_ids: list[int]
    # "c" (a generated kernel), "torch" (a torch step of the C or Triton backend),
    # "reference" (a step of the reference runtime), "triton"
    runs: str = "c"
    copy_out: bool = False  # copies an output that views the arena into the caller's tensor


def profile_program(compiled: Any, inputs: Any, repeats: int = 20,
                    statistic: str = "median") -> dict[str, Any]:
    """Time every backend kernel of `compiled` over `repeats` calls on `inputs` (positional,
    as given to `compiled(*inputs)`); a kernel's time is `statistic` ("median", "min" or
    "mean") over the calls of its time per call. The state the program writes (a KV cache)
    is copied first: the module's buffers are left alone. Returns the profile dict
    (docs/cost-model.md gives its keys)."""
    if statistic not in STATISTICS:
        raise EqsatError(f"unknown statistic {statistic!r}; one of {sorted(STATISTICS)}")
    backend = compiled.report.backend
    args = _runtime_inputs(compiled, inputs)
    if backend not in PROFILERS:
        raise EqsatError(f"cannot profile a program on the {backend!r} backend")
    with torch.no_grad():
        groups, call, why = PROFILERS[backend](compiled, args)
        share = CpuShare()
        samples = _repeat(call, repeats) if call is not None else {}
        busy = share.others()
    pick = STATISTICS[statistic]
    model = compiled.cost_model or CostModel()
    kernels = [_entry(compiled.graph, model, g,
                      pick(samples[g.name]) * 1e6 if samples.get(g.name) else None, why)
               for g in groups]
    result = _summary(backend, repeats, statistic, kernels, why)
    result["other_cpu"] = busy  # others' share of the CPUs while timing: noise
    return result


def attach_profile(report: Any, result: dict[str, Any]) -> None:
    """`report.profile = result`; each entry of `report.kernels` gets its backend kernel's
    name (`group`) and that kernel's measured time (`measured_us`; a kernel of several nodes
    gives each of them its whole time)."""
    report.profile = result
    by_node = {nid: k for k in result["kernels"] for nid in k["node_ids"]}
    for entry in report.kernels:
        k = by_node.get(entry["id"])
        entry["group"] = k["name"] if k else None
        entry["measured_us"] = k["measured_us"] if k else None


# --- running the program, kernel by kernel ----------------------------------------------------
Samples = dict[str, list[float]]
Call = Callable[[], dict[str, float]]  # one call of the program: seconds by kernel name
# a backend's kernels, the timed call (None: not timed) and why not
Profiler = tuple[list[Group], Call | None, str | None]


def _runtime_inputs(compiled: Any, inputs: Any) -> list[Any]:
    """What the runtime is called with: the flat inputs, then copies of the state the
    program reads and writes (Compiled binds the module's own buffers there)."""
    flat = pytree.tree_flatten((tuple(inputs), {}))[0]
    return [x.contiguous() if isinstance(x, torch.Tensor) else x for x in flat] + [
        s.clone() for s in getattr(compiled, "_state", [])]


def _repeat(call: Call, repeats: int) -> Samples:
    """`call` runs the program once and returns seconds by kernel name: `repeats` samples each,
    after WARMUP_CALLS untimed calls."""
    for _ in range(WARMUP_CALLS):
        call()
    samples: Samples = {}
    for _ in range(repeats):
        for name, s in call().items():
            samples.setdefault(name, []).append(s)
    return samples


def _profile_c(compiled: Any, args: list[Any]) -> Profiler:
    """A profiling build of the program's C source: seconds per generated kernel from
    `eq_profile`, per torch step from the runtime's timer."""
    rt = compiled._runtime.profiling()
    groups = [Group(k.name, [*(k.fused or (k.node,)), *k.epilogue], copy_out=k.op == "copy_out")
              for k in rt.program.kernels]
    steps = {nid: f"torch:{op}#{nid}" for nid, op in rt.torch_steps}
    groups += [Group(name, [nid], runs="torch") for nid, name in steps.items()]

    def call() -> dict[str, float]:
        rt.profile_reset()
        rt.run(args)
        kernels, stepped = rt.profile_read()
        times = {k.name: s for k, s in zip(rt.program.kernels, kernels)}
        times.update({steps[nid]: s for nid, s in stepped.items() if nid in steps})
        return times

    return _in_plan_order(compiled, groups), call, None


def _profile_reference(compiled: Any, args: list[Any]) -> Profiler:
    """The reference runtime's planned torch steps (a fresh runtime on the same plan), each
    timed alone: one kernel per IR node."""
    from .codegen.c.runtime import timed_steps
    from .codegen.planned import PlannedRuntime

    steps = PlannedRuntime(compiled.graph, compiled.plan).steps
    names = {node.id: _name(node.id, _label(node)) for node, *_ in steps.steps
             if node.op != "input"}
    groups = [Group(name, [nid], runs="reference") for nid, name in names.items()]

    def call() -> dict[str, float]:
        seconds: dict[int, float] = {}
        timed_steps(steps, list(steps.static), args, {}, 0, len(steps.steps), seconds)
        return {names[nid]: s for nid, s in seconds.items() if nid in names}

    return groups, call, None


def _profile_triton(compiled: Any, args: list[Any]) -> Profiler:
    """Each node's launches (a fused group's at its root) and each torch step, timed with
    CUDA events on a GPU. Under Triton's interpreter nothing is timed. (Written without a
    GPU to run it on: untested there.)"""
    rt = compiled._runtime
    prog = rt.program
    groups = [Group(_name(nid, compiled.graph.node(nid).op), list(prog.fused.get(nid, (nid,))),
                    runs="triton") for nid in prog.launches]
    groups += [Group(f"torch:{op}#{nid}", [nid], runs="torch") for nid, op in rt.torch_steps]
    groups = _in_plan_order(compiled, groups)
    if os.environ.get("TRITON_INTERPRET") == "1" or rt.device.type != "cuda":
        return groups, None, ("not measured: Triton's interpreter (TRITON_INTERPRET=1) runs the "
                            "kernels on the CPU in numpy; their times say nothing of a GPU's")
    names = {g.node_ids[-1]: g.name for g in groups}

    def call() -> dict[str, float]:
        events: dict[int, list[Any]] = {}
        rt._call(args, timer=_cuda_timer(events))
        torch.cuda.synchronize()
        return {names[nid]: sum(a.elapsed_time(b) for a, b in pairs) / 1e3
                for nid, pairs in events.items() if nid in names}

    return groups, call, None


def _cuda_timer(events: dict[int, list[Any]]) -> Callable[[int], Any]:
    """A timer for TritonRuntime._call: CUDA events around each node's launches."""
    @contextmanager
    def timed(nid: int) -> Iterator[None]:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        yield
        b.record()
        events.setdefault(nid, []).append((a, b))
    return timed


def _in_plan_order(compiled: Any, groups: list[Group]) -> list[Group]:
    pos = {nid: p for p, nid in enumerate(compiled.plan.order)}
    return sorted(groups, key=lambda g: max(pos.get(i, -1) for i in g.node_ids))


PROFILERS: dict[str, Callable[[Any, list[Any]], Profiler]] = {
    "c": _profile_c, "reference": _profile_reference, "triton": _profile_triton}


def _label(node: Node) -> str:
    """A node as reports name it (ir.node_label); a fallback by the aten op it runs."""
    return str(node.attrs["target"]) if node.op == "fallback" else node_label(node)


def _name(nid: int, label: str) -> str:
    """A kernel's name as the C backend spells it (emit.py): k<node id>_<label>."""
    return f"k{nid}_" + re.sub(r"\W+", "_", label).strip("_")


# --- predicted against measured ---------------------------------------------------------------
def node_costs(graph: Graph, model: CostModel, ids: list[int]) -> list[KernelCost]:
    """The cost model's price of each node it can price (types known)."""
    out = []
    for nid in ids:
        n = graph.node(nid)
        ins = [graph.node(i).type for i in n.inputs]
        if n.op in VALUE_LEAVES or not all(isinstance(t, TensorType) for t in ins):
            continue
        try:
            out.append(model.kernel(n.op, n.attrs, ins, n.type))
        except CostError:
            continue
    return out


def _entry(graph: Graph, model: CostModel, g: Group, measured: float | None,
           why: str | None) -> dict[str, Any]:
    costs = node_costs(graph, model, g.node_ids)
    predicted = sum(c.micros for c in costs)
    ratio = measured / predicted if measured is not None and predicted > 0 else None
    labels = "+".join(_label(graph.node(i)) for i in g.node_ids)
    flagged = (ratio is not None and not 1 / FLAG_RATIO <= ratio <= FLAG_RATIO) or (
        predicted == 0 and bool(measured))
    reason = why if measured is None else _reason(graph, model, g, costs, measured, ratio) \
        if flagged else None
    return {"name": g.name, "node_ids": list(g.node_ids),
            "ops": f"copy_out({labels})" if g.copy_out else labels,
            "predicted_us": predicted, "measured_us": measured, "ratio": ratio,
            "flagged": flagged, "reason": reason}


def _reason(graph: Graph, model: CostModel, g: Group, costs: list[KernelCost],
            measured_us: float, ratio: float | None) -> str:
    """Why a flagged kernel's time is off the model's, in words: how it runs, or what it
    achieved against what the model assumed (its rate, bandwidth or fixed per-call charge)."""
    ops = "+".join(graph.node(i).op for i in g.node_ids)
    if g.runs == "torch":
        return (f"runs in torch: no kernel is generated for {ops}, so it runs as a torch step "
                f"between the C segments ({measured_us:.1f} us); the model prices a generated "
                "kernel")
    if g.copy_out:
        return ("not priced: copies an output that is a view of the arena into the caller's "
                "tensor; the model charges views nothing")
    if ratio is None:
        return f"not priced: the model charges {ops} nothing (a view), but it runs a copy"
    predicted = sum(c.seconds for c in costs)
    secs = measured_us * 1e-6
    head = f"{ratio:.2f}x {'slower' if ratio > 1 else 'faster'} than predicted"
    fixed = sum(model.overhead(get_op(graph.node(i).op).cost in ("matmul", "attention"))
                for i in g.node_ids if graph.node(i).op not in VALUE_LEAVES)
    if fixed >= predicted / 2:
        return (f"overhead-dominated, {head}: {fixed * 1e6:.2f} of the predicted "
                f"{predicted * 1e6:.2f} us is the model's fixed per-call charge; the kernel's "
                "own fixed costs (thread start, setup) differ")
    bound = max(costs, key=lambda c: c.seconds).bound
    if bound == "compute":
        flops = sum(c.flops for c in costs)
        return (f"compute-bound, {head}: ran at {flops / secs / 1e9:.1f} GFLOP/s; the model "
                f"assumed {flops / predicted / 1e9:.1f} (its rate at this shape)")
    moved = sum(c.bytes_read + c.bytes_written for c in costs)
    return (f"memory-bound, {head}: moved {moved / secs / 1e9:.1f} GB/s; the model assumed "
            f"{moved / predicted / 1e9:.1f} (its bandwidth for {moved / 2**20:.2f} MiB)")


def _summary(backend: str, repeats: int, statistic: str, kernels: list[dict[str, Any]],
             why: str | None) -> dict[str, Any]:
    rated = [k for k in kernels if k["ratio"] is not None]
    worst = max(rated, key=lambda k: max(k["ratio"], 1 / k["ratio"]), default=None)
    measured = [k["measured_us"] for k in kernels if k["measured_us"] is not None]
    return {
        "backend": backend, "repeats": repeats, "statistic": statistic, "reason": why,
        "kernels": kernels,
        "median_ratio": statistics.median(k["ratio"] for k in rated) if rated else None,
        "worst_ratio": max(worst["ratio"], 1 / worst["ratio"]) if worst else None,
        "worst_kernel": worst["name"] if worst else None,
        "flagged": sum(k["flagged"] for k in kernels),
        "total_predicted_us": sum(k["predicted_us"] for k in kernels),
        "total_measured_us": sum(measured) if measured else None}
