"""eqsat-llm: an equality-saturation optimizer for LLM inference graphs.

    compiled = eqsat_llm.optimize(model, example_inputs)
    out = compiled(*inputs)
    print(compiled.report.summary())

    gen = eqsat_llm.Generator(causal_lm, max_seq_len=256)
    tokens = gen.generate(input_ids, max_new_tokens=32)
"""

import os as _os
import sys as _sys

import torch as _torch

# Without a CUDA device Triton compiles nothing: its kernels (the Triton backend's) can only run
# in its interpreter, which is chosen when Triton decorates a kernel, its standard library's
# included, at import. So it is set before anything here imports Triton (torch.export does).
if "triton" not in _sys.modules and not _torch.cuda.is_available():
    _os.environ.setdefault("TRITON_INTERPRET", "1")

from .api import Compiled, EagerFallbackWarning, FallbackWarning, optimize, optimize_graph
from .egraph.saturate import Limits
from .errors import (
    CaptureError,
    EncodeError,
    EqsatError,
    GraphError,
    MemoryLimitError,
    RuleError,
)
from .generation.generator import Generator, generate
from .reporting.report import Report

__all__ = [
    "CaptureError",
    "Compiled",
    "EagerFallbackWarning",
    "EncodeError",
    "EqsatError",
    "FallbackWarning",
    "Generator",
    "GraphError",
    "Limits",
    "MemoryLimitError",
    "Report",
    "RuleError",
    "generate",
    "optimize",
    "optimize_graph",
]
__version__ = "0.1.0"


def _register_dynamo_backend() -> None:
    """torch.compile(backend="eqsat_llm") finds the backend by the package's entry point
    (pyproject.toml). Registering it here imports torch._dynamo, a second of every start, so
    only where that is loaded already or the package runs uninstalled (no entry point)."""
    from importlib.metadata import entry_points

    if "torch._dynamo" in _sys.modules or not any(
            e.name == "eqsat_llm" for e in entry_points(group="torch_dynamo_backends")):
        from .dynamo import register

        register()


_register_dynamo_backend()
