"""The poisoned-arena check, a debug mode of the runtimes that own an arena (C, Triton, planned).

    EQSAT_POISON_CHECK=1 python my_script.py      # (the test suite sets it: tests/conftest.py)

Each call then runs the program twice: first with the arena filled with a finite pattern, then,
with every input restored to what the caller passed, with the arena filled with NaN (bytes 0xFF:
NaN in float32, bf16 and fp16). A program reads only what it wrote in the same call, so both runs
must give bit-identical outputs and leave identical inputs (the state a program writes in place,
such as a KV cache); a difference means a kernel read a byte no kernel of this call wrote: a
value read after its slot was reused, a dropped or misplaced write, a view's wrong stride. The
check raises `StaleReadError` naming the output that differs. It doubles the run time, and
nothing else changes: the second run's outputs are returned.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from ..errors import EqsatError

ENV = "EQSAT_POISON_CHECK"
FIRST_FILL = 0x3F  # float32 0.747, a finite value no correct program depends on
NAN_FILL = 0xFF


class StaleReadError(EqsatError):
    """A program's result depended on arena bytes it did not write in the same call (found by
    the poisoned-arena check)."""


_SUSPENDED = threading.local()


def enabled() -> bool:
    return os.environ.get(ENV, "") not in ("", "0") and not getattr(_SUSPENDED, "on", False)


@contextmanager
def suspended() -> Iterator[None]:
    """Calls made inside run once, unchecked (a measurement of one call's allocations)."""
    before = getattr(_SUSPENDED, "on", False)
    _SUSPENDED.on = True
    try:
        yield
    finally:
        _SUSPENDED.on = before


def checked_run(arena: torch.Tensor, inputs: list[Any], run: Callable[[], list[Any]],
                what: str) -> list[Any]:
    """`run()` twice, the arena filled with FIRST_FILL and then NAN_FILL, the inputs restored
    between; raises StaleReadError unless outputs and written inputs agree bit for bit."""
    tensors = [(k, x) for k, x in enumerate(inputs) if isinstance(x, torch.Tensor)]
    before = [x.clone() for _, x in tensors]
    arena.fill_(FIRST_FILL)
    first = [_snapshot(v) for v in run()]
    first_inputs = [x.clone() for _, x in tensors]
    for (_, x), saved in zip(tensors, before):
        if not _same(x, saved):  # (an input no run writes may be an expanded view: not copied)
            x.copy_(saved)
    arena.fill_(NAN_FILL)
    outs = run()
    for k, (a, b) in enumerate(zip(first, outs)):
        if not _same(a, b):
            raise StaleReadError(f"{what}: output {k} differs between two runs whose arenas "
                                 f"were filled differently ({_difference(a, b)}): a kernel "
                                 "read arena bytes that no kernel of this call wrote")
    for (k, x), a in zip(tensors, first_inputs):
        if not _same(a, x):
            raise StaleReadError(f"{what}: input {k} (written in place) differs between two "
                                 f"runs whose arenas were filled differently "
                                 f"({_difference(a, x)})")
    return outs


def _snapshot(v: Any) -> Any:
    return v.clone() if isinstance(v, torch.Tensor) else v


def _same(a: Any, b: Any) -> bool:
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return type(a) is type(b) and (a == b or math.isnan(a) and math.isnan(b)
                                       if isinstance(a, float) else a == b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(torch.equal(_bits(a), _bits(b)))


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's values as integers of its width: NaN compares equal to the same NaN."""
    t = t.detach().contiguous()
    if t.dtype == torch.bool or t.element_size() == 1:
        return t.view(torch.uint8)
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _difference(a: Any, b: Any) -> str:
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or \
            a.shape != b.shape or a.dtype != b.dtype:
        return f"{a!r} against {b!r}"
    differ = _bits(a) != _bits(b)
    return f"{int(differ.sum())} of {a.numel()} elements"
