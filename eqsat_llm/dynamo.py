"""`torch.compile(model, backend="eqsat_llm")`: the dynamo backend.

Dynamo hands over each captured graph (an fx.GraphModule over the graph's tensor inputs) with
example inputs; it is optimized like any model and the compiled program is returned. The
backend is registered through the `torch_dynamo_backends` entry point of the package and, for
source checkouts without installed metadata, on import of `eqsat_llm`.

Programs have static shapes. A graph dynamo made dynamic (a second input shape under automatic
dynamic shapes, `dynamic=True`, `mark_dynamic`) has symbolic sizes and SymInt inputs: it is
specialised at call time to the concrete sizes and ints it is called with, one program per
(shapes, dtypes, ints), cached, the ints bound as constants. A specialisation that cannot be
optimized runs the graph in eager PyTorch, with one `EagerFallbackWarning` per graph.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

import torch


def eqsat_llm_backend(gm: torch.fx.GraphModule, example_inputs: list[Any], **options: Any):
    from .api import optimize

    if _symbolic(gm, example_inputs):
        return Specialising(gm, options)
    compiled = optimize(gm, tuple(example_inputs), **options)

    def run(*args: Any) -> Any:
        return compiled(*args)

    run.compiled = compiled  # type: ignore[attr-defined]
    return run


def _symbolic(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> bool:
    """Whether dynamo made the graph dynamic: symbolic numbers among the inputs, or a
    placeholder whose recorded example has a symbolic size."""
    sym = (torch.SymInt, torch.SymFloat, torch.SymBool)
    if any(isinstance(x, sym) for x in example_inputs):
        return True
    for node in gm.graph.find_nodes(op="placeholder"):
        val = node.meta.get("example_value", node.meta.get("val"))
        if isinstance(val, sym) or (isinstance(val, torch.Tensor) and any(
                isinstance(d, torch.SymInt) for d in val.shape)):
            return True
    return False


class _Bound(torch.nn.Module):
    """A dynamo graph with its non-tensor arguments bound as constants: export sees only the
    tensors, with the concrete sizes they have."""

    def __init__(self, gm: torch.fx.GraphModule, args: tuple[Any, ...]):
        super().__init__()
        self.gm = gm
        self.template = [None if isinstance(a, torch.Tensor) else a for a in args]

    def forward(self, *tensors: torch.Tensor) -> Any:
        it = iter(tensors)
        return self.gm(*[next(it) if a is None else a for a in self.template])


class Specialising:
    """The callable returned for a dynamic graph: at each call, the program optimized for the
    concrete shapes, dtypes and ints of the arguments (optimized on first sight, then cached);
    the graph in eager for a specialisation that could not be optimized."""

    def __init__(self, gm: torch.fx.GraphModule, options: dict[str, Any]):
        self.gm = gm
        self.options = options
        self.programs: dict[tuple, Any] = {}  # key -> Compiled, or None: runs in eager
        self._lock = threading.Lock()
        self._warned = False

    def __call__(self, *args: Any) -> Any:
        key = tuple((tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else
                    (type(a), a) for a in args)
        program = self.programs.get(key, False)
        if program is False:
            with self._lock:
                program = self.programs.get(key, False)
                if program is False:
                    program = self.programs[key] = self._specialise(args)
        if program is None:
            return self.gm(*args)
        return program(*[a for a in args if isinstance(a, torch.Tensor)])

    def _specialise(self, args: tuple[Any, ...]) -> Any:
        from .api import EagerFallbackWarning, optimize

        # fresh aliases: export must not see dynamo's marks (mark_dynamic) on the caller's
        # tensors, which ask it to keep the sizes symbolic
        tensors = tuple(a.detach() for a in args if isinstance(a, torch.Tensor))
        try:
            return optimize(_Bound(self.gm, args), tensors, **self.options)
        except Exception as exc:  # noqa: BLE001 - export raises many types; never crash here
            why = f"{type(exc).__name__}: {str(exc)[:500]}"
        if not self._warned:
            self._warned = True
            shapes = ", ".join(str(list(t.shape)) for t in tensors)
            warnings.warn(f"eqsat_llm could not specialise the dynamic graph to the shapes "
                          f"{shapes} ({why}); it runs in eager PyTorch", EagerFallbackWarning,
                          stacklevel=3)
        return None


def register() -> None:
    from torch._dynamo.backends.registry import _BACKENDS, register_backend

    if "eqsat_llm" not in _BACKENDS:
        register_backend(name="eqsat_llm")(eqsat_llm_backend)
