"""What the Triton kernel modules give the program: a `Launch` per kernel call, planned once
from the node's static operands (`Operand`: shape, element strides, dtype, and where its tensor
comes from at call time), so that a call only binds tensors and launches.

A planner has the signature `plan(node, out, ins) -> list[Launch] | None`: None declines (this
dtype, shape or descriptor has no kernel; the node then runs in torch on the same arena, as
the C backend's torch steps do)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from triton import knobs

from ...errors import EqsatError

# the dtypes every kernel loads and stores (computing in float32)
FLOATS = frozenset({"float32", "float16", "bfloat16"})


def interpreting() -> bool:
    """Whether kernels run in Triton's interpreter (on CPU tensors) rather than compiled
    (the knob reads TRITON_INTERPRET)."""
    return bool(knobs.runtime.interpret)


def check_mode() -> None:
    """Refuse a Triton that can run no kernel here: no CUDA device, and imported (by the
    user's code, before eqsat_llm) without TRITON_INTERPRET=1, so that even its standard
    library was decorated for a compiler that has no target."""
    from triton.language import standard

    if not torch.cuda.is_available() and type(standard.sigmoid).__name__ != \
            "InterpretedFunction":
        raise BackendUnavailable(
            "the Triton backend needs a CUDA device, or Triton's interpreter on the CPU: "
            "Triton was imported before eqsat_llm without TRITON_INTERPRET=1; set "
            "TRITON_INTERPRET=1 in the environment (or import eqsat_llm first)")


class BackendUnavailable(EqsatError):
    """The Triton backend cannot run on this machine (the message says why)."""


def device() -> torch.device:
    """Where the arena, the weights and the inputs live: the CUDA device, or the CPU when
    interpreting."""
    return torch.device("cpu") if interpreting() else torch.device("cuda")


@dataclass(frozen=True)
class Operand:
    """A value a kernel reads or writes, as planned: `values[node]` at call time (a tensor
    view at its planned place, or a Python number for a scalar node: `scalar`)."""
    node: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str  # ir dtype name: "float32", "int64", ...
    scalar: float | int | bool | None = None  # a scalar node's number (no tensor)
    constant: torch.Tensor | None = field(default=None, compare=False)  # compile-time values

    @property
    def is_scalar(self) -> bool:
        return self.scalar is not None


@dataclass
class Launch:
    """One kernel call: `kernel[grid](*args, **constexprs)`, an `Operand` argument replaced by
    its tensor at call time; any other argument (ints, floats, tensors prepared once: weights
    in a kernel's layout, scratch) is passed as is."""
    name: str  # for reports and the program listing
    kernel: Any  # a @triton.jit function
    grid: tuple[int, ...]
    args: list[Any]
    constexprs: dict[str, Any] = field(default_factory=dict)
    # a flag the kernel sets when an index is out of range (gather.py); the runtime checks it
    index_error: torch.Tensor | None = None
    # other tilings, (grid, constexprs), the one above first: measured on the first call
    # (autotune.py), which keeps the fastest
    choices: list[tuple[tuple[int, ...], dict[str, Any]]] = field(default_factory=list)
    writes: tuple[int, ...] = ()  # the positions in args of what the kernel writes

    def __call__(self, values: list[Any]) -> None:
        args = [values[a.node] if isinstance(a, Operand) else a for a in self.args]
        if self.choices:
            from .autotune import settle  # (here: autotune.py imports this module)

            settle(self, args)
        self.kernel[self.grid](*args, **self.constexprs)

    def listing(self) -> str:
        """The call as a line of Python (operands by node id: v[12])."""
        def show(a: Any) -> str:
            if isinstance(a, Operand):
                return f"v[{a.node}]"
            if isinstance(a, torch.Tensor):
                return f"<{str(a.dtype)[6:]}{list(a.shape)}>"
            return repr(a)
        args = ", ".join([show(a) for a in self.args]
                         + [f"{k}={v!r}" for k, v in self.constexprs.items()])
        fn = getattr(getattr(self.kernel, "fn", self.kernel), "__name__", self.name)
        return f"{fn}[{self.grid}]({args})"


def merge_levels(shape: tuple[int, ...], strides: list[tuple[int, ...]]
                 ) -> list[tuple[int, list[int]]]:
    """The dims of an index space shared by several operands (each one's strides over
    `shape`) as few levels as possible, outermost first: (size, strides per operand), size-1
    dims dropped, adjacent dims merged where every operand steps through them as one."""
    from ..c.loops import collapse

    sizes, merged = collapse(shape, strides)
    return [(n, [st[d] for st in merged]) for d, n in enumerate(sizes)]


def row_levels(shapes_strides: list[tuple[tuple[int, ...], tuple[int, ...]]], levels: int = 3
               ) -> list[tuple[int, list[int]]] | None:
    """merge_levels of the leading dims shared by several operands (each given as the shape,
    the same for all, and its strides) as exactly `levels` levels, padded with size 1 in
    front; None when more remain. A row r is then (r // (n1 n2), r // n2 % n1, r % n2) over
    three."""
    merged = merge_levels(shapes_strides[0][0], [st for _, st in shapes_strides])
    if len(merged) > levels:
        return None
    pad = [(1, [0] * len(shapes_strides))] * (levels - len(merged))
    return pad + merged
