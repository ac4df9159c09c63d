"""TritonRuntime: a planned program run as Triton kernels (same interface as CRuntime).

    rt = TritonRuntime(graph)            # or TritonRuntime(graph, plan)
    outs = rt.run(inputs)                # inputs on rt.device

One arena (a byte tensor on the device, the plan's size) holds every intermediate at its
planned offset; the constants are copied to the device once; a call launches the kernels in
the plan's order and runs the nodes no kernel is generated for as torch steps on the same
arena (`torch_steps`). On CUDA the whole call may be captured as a CUDA graph (`cuda_graph`:
replayed when the inputs are the same tensors as last time, e.g. a decode step's static
buffers). Not reentrant: one call at a time (they share the arena)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ...errors import GraphError
from ...ir import Graph, TensorType, dtype_of
from ...plan import COPY_OUT, OUTPUT, MemoryPlan, plan_memory
from ..c.errors import KernelIndexError
from ..c.runtime import torch_op_name
from ..planned import ArenaSteps, aligned_bytes
from .launch import device as backend_device
from .program import plan_program


class TritonRuntime:
    def __init__(self, graph: Graph, plan: MemoryPlan | None = None):
        self.device = backend_device()
        self.plan = plan = plan if plan is not None else plan_memory(graph)
        self.graph = graph
        self.program = prog = plan_program(graph, plan)
        on_device = dataclasses.replace(graph, constants={
            k: v.detach().to(self.device).contiguous() for k, v in graph.constants.items()})
        self.arena = aligned_bytes(plan.arena_bytes, self.device)
        self._steps = ArenaSteps(on_device, plan, self.arena)
        self.copy_in_ops = self._steps.copy_in_ops
        self.torch_steps = [(nid, torch_op_name(graph.node(nid))) for nid in prog.torch_nodes]
        inner = prog.inner
        # what a call does, step by step: launch a node's kernels, or run its torch step
        self._actions: list[tuple[int, Any]] = []
        for p, (node, *_rest) in enumerate(self._steps.steps):
            if node.id in inner:
                continue
            self._actions.append((p, prog.launches.get(node.id)))
        self._outputs = {nid for nid in prog.launches if plan.kinds[nid] == OUTPUT}
        self.n_inputs = 1 + max((n.attrs["index"] for n in graph.nodes if n.op == "input"),
                                default=-1)
        self._in_types = {n.attrs["index"]: n.type for n in graph.nodes if n.op == "input"}
        self.kernel_count = sum(len(v) for v in prog.launches.values())
        self._index_flags = [ln.index_error for ls in prog.launches.values() for ln in ls
                             if ln.index_error is not None]

    @property
    def source(self) -> str:
        """The generated kernels and the launch listing."""
        return self.program.module_text + "\n\n" + "\n".join(
            "# " + line if not line.startswith("#") else line
            for line in self.program.listing(self.graph, self.plan.order).split("\n")) + "\n"

    def run(self, inputs: list[torch.Tensor]) -> list[Any]:
        if len(inputs) < self.n_inputs:
            raise GraphError(f"the program reads {self.n_inputs} inputs, got {len(inputs)}")
        ins = list(inputs)
        for k, t in self._in_types.items():
            x = ins[k]
            assert isinstance(t, TensorType)
            if tuple(x.shape) != t.shape or x.dtype != dtype_of(t.dtype):
                raise GraphError(f"input {k}: expected {t}, got {x.dtype}{list(x.shape)}")
            if x.device != self.device:
                raise GraphError(f"input {k} is on {x.device}; the Triton program runs on "
                                 f"{self.device}")
            if not x.is_contiguous():
                ins[k] = x.contiguous()
        with torch.no_grad():
            outs = self._call(ins)
        if self._index_flags and any(bool(f.item()) for f in self._index_flags):
            for f in self._index_flags:
                f.zero_()
            raise KernelIndexError("an index is out of range (an embedding id): torch raises "
                                   "here too")
        return outs

    def _call(self, ins: list[torch.Tensor]) -> list[Any]:
        steps = self._steps
        values = list(steps.static)
        copies: dict[int, torch.Tensor] = {}
        for nid in self._outputs:  # outputs a kernel writes: this call's tensors
            t = self.graph.node(nid).type
            values[nid] = torch.empty_strided(t.shape, self.plan.strides[nid],
                                              dtype=dtype_of(t.dtype), device=self.device)
        for p, launches in self._actions:
            if launches is None:
                steps.run(values, ins, copies, p, p + 1)
                continue
            for launch in launches:
                launch(values)
            for i in steps.free_after[p]:
                values[i] = None
        return [copies[i] if self.plan.kinds.get(i) == COPY_OUT and i in copies else values[i]
                for i in self.graph.outputs]
