import importlib.util
import os
import sys
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from eqsat_llm.frontend import capture
from eqsat_llm.workloads import WORKLOADS

torch.set_num_threads(2)
warnings.filterwarnings("ignore", category=FutureWarning)

WORKLOAD_NAMES = list(WORKLOADS)


@pytest.fixture(scope="session")
def workload_cache():
    return {}


@pytest.fixture(params=WORKLOAD_NAMES)
def workload(request, workload_cache):
    """(name, model, inputs, captured) for each reference workload, built once per session."""
    name = request.param
    if name not in workload_cache:
        model, inputs = WORKLOADS[name]()
        workload_cache[name] = (name, model, inputs, capture(model, inputs))
    return workload_cache[name]


def load_benchmark(name: str):
    """benchmarks/<name>.py as a module (the benchmarks are scripts, not a package)."""
    path = Path(__file__).resolve().parent.parent / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[f"bench_{name}"] = mod
    spec.loader.exec_module(mod)
    return mod


def as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


def max_error(expected, got) -> float:
    return max((a - b).abs().max().item() for a, b in zip(as_tuple(expected), as_tuple(got)))
