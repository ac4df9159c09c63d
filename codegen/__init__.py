"""Backends that run an optimized IR program: the reference runtime (torch ops, one per node);
the C and Triton backends follow the same interface: `Backend(graph).run(inputs) -> outputs`."""

from .planned import PlannedRuntime
from .reference import ReferenceRuntime

__all__ = ["PlannedRuntime", "ReferenceRuntime"]
