"""A checkpoint's prefill program optimized in a second process, beside the decode step.

A cold `Generator.from_pretrained` optimizes two programs of the same model, one after the
other, each mostly single-threaded Python (capture, saturation, extraction): 10-11 s each
for the 22-layer TinyLlama shape. On a machine with two cores or more, a child process
optimizes the prefill chunk while this one optimizes the decode step; the child stores its
program in the on-disk program cache (program_cache.py), from which this process then takes
it, as a warm start would, and compiles its C (the compile cache's, codegen/c/build.py),
while this process compiles the decode step's. Anything that goes wrong in the child (it
fails, it is too slow, its key differs) only costs the time: this process then optimizes
the program itself, and the report says so (`GeneratorReport.prefill_optimized`). A warm
start (the decode step found in the cache) stops the child at once.

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
_WAIT_FACTOR = 3.0  # the child may take this many times the decode step's optimize (+ 60 s)


@dataclass
class PrefillWorker:
    """A running child: its process and where its errors go."""
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


def start_prefill_worker(path: str | Path, config: Any, *, max_seq_len: int, batch_size: int,
                         chunk: int, dtype: torch.dtype | None, options: dict[str, Any]
                         ) -> PrefillWorker | None:
    """A child optimizing the prefill chunk of the checkpoint `path` into the program cache,
    or None where that does not apply (module docstring)."""
    layers = getattr(config.get_text_config() if hasattr(config, "get_text_config") else config,
                     "num_hidden_layers", 0) or 0
    if os.environ.get("EQSAT_PARALLEL_START", "1") == "0" or \
            os.environ.get("EQSAT_PROGRAM_CACHE", "1") == "0" or \
            _cores() < 2 or layers < PARALLEL_MIN_LAYERS:
        return None
    handed = {k: v for k, v in options.items() if k != "progress"}
    job = {"path": str(path), "max_seq_len": max_seq_len, "batch_size": batch_size,
           "chunk": chunk, "dtype": None if dtype is None else str(dtype).split(".")[-1],
           "options": handed}
    try:
        text = json.dumps(job)
    except TypeError:  # an option that is not plain data (rule objects, a callable)
        return None
    # the child imports this package from where this process did (a source tree put on
    # sys.path by a script, not installed: found all the same)
    env = os.environ.copy()
    here = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([here, *filter(None, [env.get("PYTHONPATH")])])
    fd, name = tempfile.mkstemp(prefix="eqsat-prefill-", suffix=".log")
    with os.fdopen(fd, "w") as errors:
        process = subprocess.Popen([sys.executable, "-m", "eqsat_llm.parallel_start", text],
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                   stderr=errors, env=env)
    return PrefillWorker(process, Path(name))


def _cores() -> int:
    """The cores this process may run on (all of them where the OS does not say)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def wait_budget(decode_seconds: float) -> float:
    return _WAIT_FACTOR * decode_seconds + 60.0


def main(argv: list[str]) -> None:
    """The child: the model of the checkpoint on the meta device, its prefill program
    optimized as Generator.from_pretrained would, stored by optimize() in the cache."""
    import warnings

    from .checkpoint import Checkpoint
    from .generation import optimize_on_meta, program_options

    warnings.filterwarnings("ignore")
    job = json.loads(argv[0])
    dtype = getattr(torch, job["dtype"]) if job["dtype"] else None
    model = Checkpoint(job["path"]).empty_model(dtype)
    step_dtype, options = program_options(model, job["options"])
    compiled = optimize_on_meta(model, job["batch_size"], job["max_seq_len"], step_dtype,
                                job["chunk"], options)
    if compiled.target_backend == "c":  # its C compiled too: the loader's compile is a hit
        from .codegen.c.runtime import compiled_program

        compiled_program(compiled.graph, compiled.plan)


if __name__ == "__main__":
    main(sys.argv[1:])
