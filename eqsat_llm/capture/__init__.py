"""Capture a model as an IR graph: its repeated layers traced once and spliced in per call
(stamping.py) where they can be, else every op traced.

    export       torch.export with the core-aten decompositions; its failures explained
    converter    the exported fx graph -> the IR, node by node (fallbacks for the rest)
    aten_table   one converter per aten op
    stamping     repeated layers traced once, spliced in per call
    state        a model's writes into its own buffers run in place
"""

from __future__ import annotations

from typing import Any

from . import aten_table  # noqa: F401  (registers the aten conversions)
from .converter import Captured, capture_plain
from .stamping import capture_stamped


def capture(model: Any, example_inputs: tuple, example_kwargs: dict | None = None) -> Captured:
    captured, why = capture_stamped(model, example_inputs, example_kwargs)
    if captured is None:  # (stamped_calls stays 0)
        captured = capture_plain(model, example_inputs, example_kwargs)
        captured.stamping_fallback = why
    return captured
