"""One fuzz model through the optimizer and every backend, against eager PyTorch."""

from __future__ import annotations

import traceback
import warnings
from dataclasses import dataclass

import torch

from .compare import mismatch, model_rtol
from .spec import FuzzModel, Spec, make_inputs


@dataclass
class Failure:
    backend: str  # "optimize" when optimizing itself failed
    message: str

    def __str__(self) -> str:
        return f"[{self.backend}] {self.message}"


def available_backends() -> list[str]:
    """The backends this machine can run: C with a compiler, Triton on CUDA or in Triton's
    interpreter (set when eqsat_llm was imported first), and the reference runtime."""
    from ..codegen.c.build import compiler
    from ..codegen.triton.launch import check_mode
    from ..errors import EqsatError

    found = ["c"] if compiler() is not None else []
    try:
        check_mode()
        found.append("triton")
    except (EqsatError, ImportError):
        pass
    return found + ["reference"]


def check_spec(spec: Spec, backends: list[str]) -> list[Failure]:
    """Optimize the spec's model once, run the program on each backend, compare with eager
    (the outputs, and the buffers a model writes in place after the call); the failures found
    (none: the model passed)."""
    from .. import optimize

    inputs = make_inputs(spec)
    with torch.no_grad():
        reference = FuzzModel(spec).eval()  # eager runs on a copy: it writes its buffers
        eager = reference(*inputs) + tuple(reference.buffers())
        wide = FuzzModel(spec, wide=True)
        exact = wide(*inputs) + tuple(wide.buffers())
    model = FuzzModel(spec).eval()
    state = [x.clone() for x in model.buffers()]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compiled = optimize(model, inputs, backend=backends[0], measure_eager=False)
    except Exception as e:  # noqa: BLE001 - a valid model must optimize; any error is a bug
        return [Failure("optimize", _describe(e))]
    failures = []
    for backend in backends:
        for x, x0 in zip(model.buffers(), state):  # each backend from the initial state
            x.copy_(x0)
        try:
            program = compiled if backend == backends[0] else compiled.on_backend(backend)
            failures += _run(program, model, backend, inputs, eager, exact,
                             model_rtol(spec.dtypes()))
        except Exception as e:  # noqa: BLE001
            failures.append(Failure(backend, _describe(e)))
    return failures


def _run(program, model, backend: str, inputs: tuple, eager: tuple, exact: tuple,
         rtol: float) -> list[Failure]:
    before = [x.clone() for x in inputs]
    got = program(*inputs)
    got = (got if isinstance(got, tuple) else (got,)) + tuple(model.buffers())
    failures = []
    if len(got) != len(eager):
        return [Failure(backend, f"{len(got)} outputs, eager has {len(eager)}")]
    n_out = len(eager) - len(list(model.buffers()))
    for k, (g, e, x) in enumerate(zip(got, eager, exact)):
        why = mismatch(g, e, x, rtol)
        if why is not None:
            what = f"output {k}" if k < n_out else f"buffer b{k - n_out} after the call"
            failures.append(Failure(backend, f"{what}: {why}"))
    for k, (x, x0) in enumerate(zip(inputs, before)):
        if not torch.equal(x.nan_to_num(), x0.nan_to_num()):
            failures.append(Failure(backend, f"input {k} was written"))
    return failures


def _describe(e: Exception) -> str:
    where = traceback.extract_tb(e.__traceback__)[-1]
    first = str(e).strip().split("\n")[0][:300]
    return f"{type(e).__name__}: {first} (at {where.filename.split('/')[-1]}:{where.lineno})"
