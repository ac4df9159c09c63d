"""A checkpoint's two programs optimized in child processes, one each, in parallel.

A cold `Generator.from_pretrained` optimizes two programs of the same model, the decode step
and the prefill chunk, each mostly single-threaded Python (capture, saturation, extraction):
10-11 s each for the 22-layer TinyLlama shape. On a machine with two cores or more, a child
process optimizes each (and compiles its C into the compile cache, codegen/c/build.py) and
stores it in the on-disk program cache (program_cache.py), from which this process then
takes it, as a warm start would. This process never optimizes: what saturation and
extraction leave in a process (0.15 GB of native memory at TinyLlama's shape, kept after
they return) stays in the children, which exit before the weights load (docs/memory.md).
Anything that goes wrong in a child (it fails, it is too slow, its key differs) only costs
the time: this process then optimizes that program itself, and the report says so
(`GeneratorReport.decode_optimized`, `prefill_optimized`). A warm start (a program found in
the cache) stops the children at once.

Used when the program cache is on, at least two cores are ours, the model has
PARALLEL_MIN_LAYERS layers or more (a child's imports cost about 2 s: a shallow model
optimizes sooner than that), and every option is plain data the child can be handed
(`EQSAT_PARALLEL_START=0` turns it off)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

PARALLEL_MIN_LAYERS = 8


@dataclass
class ProgramWorker:
    """A running child optimizing one program: its process and where its errors go."""
    process: subprocess.Popen
    errors: Path

    def wait(self, seconds: float) -> str:
        """Wait for the child; "" when it stored its program, else why not (it is stopped)."""
        try:
            code = self.process.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            self.stop()
            return f"the child took over {seconds:.0f} s"
        why = "" if code == 0 else self._last_error(code)
        self.errors.unlink(missing_ok=True)
        return why

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.errors.unlink(missing_ok=True)

    def _last_error(self, code: int) -> str:
        lines = self.errors.read_text(errors="replace").strip().splitlines()
        return f"the child exited with {code}" + (f": {lines[-1]}" if lines else "")


def start_workers(path: str | Path, layers: int, *, max_seq_len: int, batch_size: int,
                  chunk: int, dtype: torch.dtype | None, options: dict[str, Any],
                  record: str | None = None) -> dict[int, ProgramWorker]:
    """Children optimizing the checkpoint `path`'s programs (the decode step, 1 token, and
    the prefill chunk, `chunk` tokens) of a model of `layers` layers into the program cache,
    by their tokens, each storing its part of the start record `record` (warm_start.py);
    none where that does not apply (module docstring)."""
    if os.environ.get("EQSAT_PARALLEL_START", "1") == "0" or \
            os.environ.get("EQSAT_PROGRAM_CACHE", "1") == "0" or \
            _cores() < 2 or layers < PARALLEL_MIN_LAYERS:
        return {}
    handed = {k: v for k, v in options.items() if k != "progress"}
    job = {"path": str(path), "max_seq_len": max_seq_len, "batch_size": batch_size,
           "dtype": None if dtype is None else str(dtype).split(".")[-1], "options": handed,
           "record": record}
    try:
        json.dumps(job)
    except TypeError:  # an option that is not plain data (rule objects, a callable)
        return {}
    # the children import this package from where this process did (a source tree put on
    # sys.path by a script, not installed: found all the same)
    env = os.environ.copy()
    here = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([here, *filter(None, [env.get("PYTHONPATH")])])
    workers = {}
    for tokens in dict.fromkeys((1, chunk)):
        fd, name = tempfile.mkstemp(prefix=f"eqsat-program-{tokens}-", suffix=".log")
        with os.fdopen(fd, "w") as errors:
            process = subprocess.Popen(
                [sys.executable, "-m", "eqsat_llm.generation.parallel_start",
                 json.dumps(job | {"tokens": tokens})],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errors, env=env)
        workers[tokens] = ProgramWorker(process, Path(name))
    return workers


def layers_in(config_json: Path) -> int:
    """num_hidden_layers of a config.json, read as JSON (transformers not imported: a start
    that finds its programs and start record never does)."""
    try:
        config = json.loads(config_json.read_text())
    except (OSError, ValueError):
        return 0
    layers = config.get("num_hidden_layers") or (config.get("text_config") or {}).get(
        "num_hidden_layers")
    return layers if isinstance(layers, int) else 0


def _cores() -> int:
    """The cores this process may run on (all of them where the OS does not say)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def wait_budget(layers: int) -> float:
    """How long a program's child may take: generous (the 32-layer 7B shape's optimize
    takes about 45 s on two cores; a child that is late only costs time)."""
    return 120.0 + 10.0 * layers


def main(argv: list[str]) -> None:
    """The child: the model of the checkpoint on the meta device, its program for the job's
    tokens optimized as Generator.from_pretrained would, stored by optimize() in the cache."""
    import warnings

    from . import warm_start
    from .checkpoint import Checkpoint
    from .generator import cached_step, example_inputs, optimize_step, program_options

    warnings.filterwarnings("ignore")
    job = json.loads(argv[0])
    dtype = getattr(torch, job["dtype"]) if job["dtype"] else None
    ckpt = Checkpoint(job["path"])
    model = ckpt.empty_model(dtype)
    step_dtype, options = program_options(model, job["options"])
    step = cached_step(model, job["batch_size"], job["max_seq_len"], step_dtype, meta=True)
    compiled = optimize_step(step, example_inputs(job["tokens"], job["batch_size"],
                                                  job["max_seq_len"], True), options)
    if compiled.target_backend == "c":  # its C compiled too: the loader's compile is a hit
        from ..codegen.c.runtime import compiled_program

        compiled_program(compiled.graph, compiled.plan)
    if job["record"] and compiled.cached_as is not None:
        warm_start.store_part(job["record"], job["tokens"], compiled,
                              warm_start.facts(ckpt, model, step, [compiled.graph]))


if __name__ == "__main__":
    main(sys.argv[1:])
