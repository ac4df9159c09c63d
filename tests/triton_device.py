"""Where the Triton tests run their kernels: the CPU in Triton's interpreter (the default test
run), the CUDA device when compiled (scripts/gpu-check runs them with TRITON_INTERPRET=0).
The tests make their tensors on the CPU; these move them to the kernels' device with their
layout (storage, offset, strides: broadcasts and views stay what the plans were made for) and
bring the results back."""

from __future__ import annotations

from typing import Any

import torch

from eqsat_llm.codegen.triton.launch import device


def on_device(t: Any) -> Any:
    """t on the kernels' device, the same layout over a copy of its whole storage (t itself
    when already there; a list or tuple item by item; anything else as it is)."""
    if isinstance(t, (list, tuple)):
        return type(t)(on_device(v) for v in t)
    dev = device()
    if not isinstance(t, torch.Tensor) or t.device == dev:
        return t
    flat = torch.tensor([], dtype=t.dtype).set_(t.untyped_storage()).to(dev)
    return torch.empty(0, dtype=t.dtype, device=dev).set_(
        flat.untyped_storage(), t.storage_offset(), t.shape, t.stride())


def back(host: torch.Tensor, moved: torch.Tensor) -> torch.Tensor:
    """host with moved's values (its whole storage: what the kernels wrote through it)."""
    if moved is not host:
        torch.tensor([], dtype=host.dtype).set_(host.untyped_storage()).copy_(
            torch.tensor([], dtype=moved.dtype, device=moved.device).set_(
                moved.untyped_storage()))
    return host


def on_host(values: Any) -> Any:
    """A run's outputs (tensors, or lists of them) on the CPU, to compare with eager's."""
    if isinstance(values, (list, tuple)):
        return type(values)(on_host(v) for v in values)
    return values.cpu() if isinstance(values, torch.Tensor) else values


def run_launches(launches: list[Any], values: list[Any]) -> None:
    """Run the launches in order over `values` (their operands by index) on the kernels'
    device; every tensor among them gets back what the kernels wrote to its copy."""
    moved = [on_device(v) for v in values]
    for launch in launches:
        launch(moved)
    for host, dev in zip(values, moved):
        if isinstance(host, torch.Tensor):
            back(host, dev)
