"""The fuzzing loop: hypothesis draws models, each is checked on every backend, failures are
shrunk and saved as regression tests (JSON files the test suite replays)."""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .check import Failure, available_backends, check_spec
from .generate import HypothesisDraw, generate
from .shrink import shrink
from .spec import Spec


@dataclass
class Found:
    """A failing model: as drawn, as shrunk, and where it was saved."""
    index: int
    spec: Spec
    failures: list[Failure]
    shrunk: Spec | None = None
    saved: Path | None = None


@dataclass
class FuzzResult:
    seed: int
    backends: list[str]
    models: int = 0
    steps: int = 0  # in all models
    found: list[Found] = field(default_factory=list)
    seconds: float = 0.0
    holds: Counter = field(default_factory=Counter)  # models holding each CENSUS kind

    def summary(self) -> str:
        lines = [(f"{self.models} models ({self.steps} steps), seed {self.seed}, backends "
                 f"{', '.join(self.backends)}: {len(self.found)} failing, "
                 f"{self.seconds:.0f} s")]
        for f in self.found:
            lines.append(f"model {f.index}: " + "; ".join(str(x) for x in f.failures))
            lines.append("  " + (f.shrunk or f.spec).describe().replace("\n", "\n  "))
            if f.saved:
                lines.append(f"  saved as {f.saved}")
        return "\n".join(lines)


def fuzz(count: int, seed: int = 0, backends: list[str] | None = None, *,
         shrink_failures: bool = True, save_dir: Path | None = None, max_steps: int = 8,
         structures_weight: int = 1,
         progress: Callable[[str], None] | None = None) -> FuzzResult:
    """Draw `count` models with hypothesis (reproducible from `seed`), check each on every
    backend, shrink each failing one and save it under `save_dir` (when given).
    `structures_weight`: generate()'s, more of the big families."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as seeded
    from hypothesis import strategies as st

    backends = backends or available_backends()
    result = FuzzResult(seed, backends)
    start = time.perf_counter()

    @seeded(seed)
    @settings(max_examples=count, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def one(data) -> None:
        index = result.models
        spec = generate(HypothesisDraw(data), seed=seed * 1_000_003 + index,
                        max_steps=max_steps, structures_weight=structures_weight)
        failures = check_spec(spec, backends)
        result.models += 1
        result.steps += len(spec.steps)
        result.holds.update(census(spec))
        if failures:  # shrunk and saved at once: a long run may be stopped at any time
            found = Found(index, spec, failures)
            if shrink_failures:
                found.shrunk = shrink(spec, lambda s: bool(check_spec(s, backends)),
                                      progress=progress)
            if save_dir is not None:
                found.saved = save_regression(found, save_dir, seed)
            result.found.append(found)
        if progress and (failures or result.models % 25 == 0 or result.models == count):
            progress(f"model {result.models}/{count}: {len(result.found)} failing, "
                     f"{time.perf_counter() - start:.0f} s"
                     + (f"; model {index}: {failures[0]}" if failures else ""))

    one()
    result.seconds = time.perf_counter() - start
    return result


CENSUS = {"KV cache write": {"index_copy_"},
          "other state write": {"index_put_", "slice_assign_", "add_", "mul_"},
          "layer stack": {"layers"}, "MoE routing (topk)": {"topk"},
          "integer ops": {"floor_divide", "remainder", "bitwise_and", "bitwise_or",
                          "bitwise_xor", "argmax"}}


def census(spec: Spec) -> set[str]:
    """What of note a model holds (the long runs report how many models held each)."""
    ops = {op for op, _, _ in spec.steps}
    kinds = {kind for kind, names in CENSUS.items() if ops & names}
    if any(op == "layers" and kw["count"] >= 4 for op, _, kw in spec.steps):
        kinds.add("stamped layer stack (4-5)")
    if "sdpa" in ops and any(t.dtype == "int64" and t.high == 2 and len(t.shape) == 2
                             for t in spec.inputs):
        kinds.add("run-time padding mask")
    if any(max(t.shape, default=0) >= 256 for t in spec.inputs + spec.params + spec.buffers):
        kinds.add("K or T >= 256")
    return kinds


def save_regression(found: Found, directory: Path, seed: int) -> Path:
    """Write the (shrunk) failing model as a regression case the test suite replays."""
    spec = found.shrunk or found.spec
    text = spec.to_json()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"fuzz-{hashlib.sha256(text.encode()).hexdigest()[:10]}.json"
    path.write_text(json.dumps({
        "found_by": f"eqsat-llm fuzz --seed {seed}, model {found.index}",
        "failures": [str(f) for f in found.failures],
        "spec": json.loads(text)}, indent=1) + "\n")
    return path


def load_regression(path: Path) -> Spec:
    return Spec.from_json(json.dumps(json.loads(path.read_text())["spec"]))
