"""benchmarks/gpu.py end to end at its --quick shapes (Triton's interpreter without a GPU), so
the GPU benchmark is known to run before a GPU is available: every row, every system checked
against eager before it is timed (the script exits on a mismatch), in bf16 as on a GPU."""

import numpy as np
import pytest

from .conftest import load_benchmark

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def test_gpu_benchmark_runs_every_row_on_the_triton_backend():
    pytest.importorskip("transformers")
    gpu = load_benchmark("gpu")
    with np.errstate(all="ignore"):
        text = gpu.main(["--quick", "--rounds", "1"])
    rows = [line for line in text.split("\n") if "eqsat-llm triton" in line]
    assert [r.split(" | ")[0].strip("| ") for r in rows] == [
        "block prefill 1x16", "block decode, KV cache 40",
        "TinyLlama-shaped, 1 layers, prefill 1x8"]
    assert "models in bfloat16" in text  # the dtype a GPU runs (its tolerance: bf16's)
