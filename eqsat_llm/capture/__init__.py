"""Capture a model as an IR graph: its repeated layers traced once and spliced in per call
(stamping.py) where they can be, else every op traced (frontend.py).

    frontend   torch.export and its core-aten decompositions, each aten op mapped to the IR
    stamping   repeated layers traced once, spliced in per call
    state      a model's writes into its own buffers run in place
"""

from __future__ import annotations

from typing import Any

from .frontend import Captured, capture_plain
from .stamping import capture_stamped


def capture(model: Any, example_inputs: tuple, example_kwargs: dict | None = None) -> Captured:
    return capture_stamped(model, example_inputs, example_kwargs) or \
        capture_plain(model, example_inputs, example_kwargs)
