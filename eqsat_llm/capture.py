"""Capture a model as an IR graph: its repeated layers traced once and spliced in per call
(stamping.py) where they can be, else every op traced (frontend.py)."""

from __future__ import annotations

from typing import Any

from .frontend import Captured, capture_plain
from .stamping import capture_stamped


def capture(model: Any, example_inputs: tuple, example_kwargs: dict | None = None) -> Captured:
    return capture_stamped(model, example_inputs, example_kwargs) or \
        capture_plain(model, example_inputs, example_kwargs)
