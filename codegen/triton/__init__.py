"""The Triton backend: a planned IR program as Triton kernels launched in the plan's order on
one preallocated arena (docs/triton-backend.md).

Where no CUDA device is present Triton cannot compile, so the kernels run in its interpreter
(`TRITON_INTERPRET=1`, which `import eqsat_llm` sets on such a machine before Triton is
imported) on CPU tensors: slow, exact to the semantics, and how the test suite checks every
kernel."""

from __future__ import annotations

from .launch import Launch, Operand, check_mode, device, interpreting

check_mode()

__all__ = ["Launch", "Operand", "check_mode", "device", "interpreting"]
