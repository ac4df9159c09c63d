"""`torch.compile(model, backend="eqsat_llm")`: the dynamo backend.

Dynamo hands over each captured graph (an fx.GraphModule over the graph's tensor inputs) with
example inputs; it is optimized like any model and the compiled program is returned. The
backend is registered through the `torch_dynamo_backends` entry point of the package and, for
source checkouts without installed metadata, on import of `eqsat_llm`.
"""

from __future__ import annotations

from typing import Any

import torch


def eqsat_llm_backend(gm: torch.fx.GraphModule, example_inputs: list[Any], **options: Any):
    from .api import optimize

    compiled = optimize(gm, tuple(example_inputs), **options)

    def run(*args: Any) -> Any:
        return compiled(*args)

    run.compiled = compiled  # type: ignore[attr-defined]
    return run


def register() -> None:
    from torch._dynamo.backends.registry import _BACKENDS, register_backend

    if "eqsat_llm" not in _BACKENDS:
        register_backend(name="eqsat_llm")(eqsat_llm_backend)
