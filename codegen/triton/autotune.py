"""Tile choices by measurement: a launch that has several good tilings is timed once per
kernel shape on the device, and the fastest one kept, cached per device.

A planner gives `Launch.choices`: (grid, constexprs) candidates, the planner's fixed choice
first. The first call of such a launch (`settle`) looks its shape up (`launch_key`: the
kernel, its integer arguments, its operands' dtypes, its other constexprs) in this device's
tuning file; when absent, it runs every candidate on the call's own operands, its outputs
redirected to scratch tensors of the same layout (an input that shares an output's memory, a
residual added in place, is read unchanged by every run), and keeps the fastest of those
whose result equals the fixed choice's within the summation-order tolerance (a candidate
that fails to compile, runs out of shared memory or differs is dropped). The launch then
runs with its choice from that call on; a CUDA graph captures the chosen kernels, since the
runtime's warm-up call comes first.

    EQSAT_TUNE          unset: tune on a device, keep the fixed choice in the interpreter
                        (whose time per program says nothing about a GPU); 0: never; 1: also
                        in the interpreter (the tests)
    EQSAT_TUNE_BUDGET   seconds of tuning a process spends in all (default 60); past it,
                        launches keep their fixed choice

The tuning file: cache_dir("triton-tuning")/<device name>-triton<version>.json, a JSON object
{launch key: chosen constexprs}, read once per process and rewritten atomically after each
new choice. A choice that is no longer among a launch's candidates is tuned again."""

from __future__ import annotations

import json
import os
import re
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import triton

from ...cache import cache_dir, write_atomic
from .launch import Launch, interpreting

Choice = tuple[tuple[int, ...], dict[str, Any]]  # (grid, constexprs)
# seconds a call of the function (one tiling's launch) takes; the tiling for a test's clock
Timer = Callable[[Callable[[], None], dict[str, Any]], float]

DEFAULT_BUDGET_S = 60.0
REPEATS = 5


def enabled() -> bool:
    """Whether launches with choices are tuned in this process (EQSAT_TUNE)."""
    switch = os.environ.get("EQSAT_TUNE", "")
    return switch == "1" or (switch == "" and not interpreting())


class _State:
    """The process's tuning: the choices read or made (per device file) and the time spent."""

    def __init__(self) -> None:
        self.files: dict[str, dict[str, dict[str, Any]]] = {}
        self.spent_s = 0.0
        self.timer: Timer | None = None  # tests replace the clock
        # the candidates left out, and why: (launch key, tiling, reason)
        self.dropped: list[tuple[str, dict[str, Any], str]] = []

    def budget_left(self) -> float:
        return float(os.environ.get("EQSAT_TUNE_BUDGET", DEFAULT_BUDGET_S)) - self.spent_s


STATE = _State()


def device_name() -> str:
    """The device the kernels run on, as the tuning file names it."""
    name = torch.cuda.get_device_name() if not interpreting() else "interpreter"
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name) + f"-triton{triton.__version__}"


def _path(device: str) -> Path:
    return cache_dir("triton-tuning") / f"{device}.json"


def _table(device: str) -> dict[str, dict[str, Any]]:
    if device not in STATE.files:
        try:
            table = json.loads(_path(device).read_text())
            STATE.files[device] = table if isinstance(table, dict) else {}
        except (OSError, ValueError):  # absent, or not ours to read: tuned afresh
            STATE.files[device] = {}
    return STATE.files[device]


def launch_key(launch: Launch, choices: list[Choice], args: list[Any]) -> str:
    """What a launch's best tiling depends on: the kernel, its integer arguments (sizes,
    strides), its operands' dtypes and the constexprs no choice changes."""
    tuned = set().union(*(c for _, c in choices))
    fn = getattr(getattr(launch.kernel, "fn", launch.kernel), "__name__", launch.name)
    ints = [a for a in args if isinstance(a, int) and not isinstance(a, bool)]
    dtypes = [str(a.dtype)[6:] if isinstance(a, torch.Tensor) else "-" for a in args
              if isinstance(a, torch.Tensor) or a is None]
    fixed = {k: v for k, v in sorted(launch.constexprs.items()) if k not in tuned}
    return f"{fn}|{ints}|{dtypes}|{fixed}"


def settle(launch: Launch, args: list[Any]) -> None:
    """Give `launch` its tiling (read from the tuning file, or measured on these arguments)
    and clear its choices: its later calls launch straight away."""
    choices, launch.choices = launch.choices, []
    if not enabled() or len(choices) < 2:
        return
    device = device_name()
    table, key = _table(device), launch_key(launch, choices, args)
    known = table.get(key)
    found = next((c for c in choices if c[1] == known), None)
    if found is None:
        if STATE.budget_left() <= 0:
            return
        start = time.perf_counter()
        found = _measure(launch, args, choices, key)
        STATE.spent_s += time.perf_counter() - start
        table[key] = found[1]
        write_atomic(_path(device), json.dumps(table, indent=1, sort_keys=True).encode())
    launch.grid = found[0]
    launch.constexprs = {**launch.constexprs, **found[1]}


def _measure(launch: Launch, args: list[Any], choices: list[Choice], key: str) -> Choice:
    """The fastest of `choices` on these arguments whose result is the first choice's."""
    scratch = list(args)
    for i in launch.writes:
        t = args[i]
        scratch[i] = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    timer = STATE.timer or _event_timer

    def run(choice: Choice) -> None:
        grid, constexprs = choice
        launch.kernel[grid](*scratch, **{**launch.constexprs, **constexprs})

    run(choices[0])  # the fixed choice: the reference result, and it must run
    reference = [scratch[i].clone() for i in launch.writes]
    best, best_s = choices[0], timer(lambda: run(choices[0]), choices[0][1])
    for choice in choices[1:]:
        try:
            run(choice)  # compiles it; the first run's result is the one compared
        except Exception as e:  # noqa: BLE001 (out of shared memory, registers: not a choice)
            STATE.dropped.append((key, choice[1], f"{type(e).__name__}: {e}"))
            continue
        if not all(_same(scratch[i], want) for i, want in zip(launch.writes, reference)):
            STATE.dropped.append((key, choice[1], "its result differs from the fixed tiling's"))
            continue
        seconds = timer(lambda c=choice: run(c), choice[1])
        if seconds < best_s:
            best, best_s = choice, seconds
    return best


def _same(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal up to a different order of float sums: 1e-3 of the largest value in float32
    (TF32 tiles included), 2e-2 in a half dtype; NaNs where the reference has them."""
    if not want.numel():
        return True
    if not torch.equal(got.isnan(), want.isnan()):
        return False
    tol = 1e-3 if want.dtype == torch.float32 else 2e-2
    scale = max(1.0, float(want.float().nan_to_num().abs().max()))
    return float((got.float() - want.float()).nan_to_num().abs().max()) <= tol * scale


def _event_timer(fn: Callable[[], None], tiling: dict[str, Any]) -> float:
    """The median of REPEATS timed calls (CUDA events on a device, the wall clock in the
    interpreter), after one untimed call."""
    fn()
    if interpreting():
        times = []
        for _ in range(REPEATS):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(REPEATS)]
    for begin, end in events:
        begin.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(b.elapsed_time(e) for b, e in events) / 1e3
