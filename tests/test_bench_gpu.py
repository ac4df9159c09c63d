"""The GPU checks end to end before a GPU is available: benchmarks/gpu_check.py --interpret
(what scripts/gpu-check runs on a CUDA machine, here on one family in Triton's interpreter)
checks llama's logits on the Triton backend in float32 and bf16 against eager, its Generator
against transformers' tokens, and runs benchmarks/gpu.py at its --quick shapes in bf16, every
row and system checked against eager before it is timed (gpu.py exits on a mismatch)."""

import numpy as np
import pytest

from .conftest import load_benchmark

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def test_gpu_check_runs_every_step_in_the_interpreter():
    pytest.importorskip("transformers")
    check = load_benchmark("gpu_check")
    with np.errstate(all="ignore"):
        text, ok = check.main(["--interpret", "--families", "llama"])
    assert ok, text
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| ")][1:]
    checks = [(r[0].split(" (")[0].strip("| "), r[1]) for r in rows]
    assert checks == [
        ("model matrix", "llama float32"), ("model matrix", "llama bfloat16"),
        ("Generator", "llama"),
        ("benchmarks/gpu.py", "block prefill 1x16"),
        ("benchmarks/gpu.py", "block decode, KV cache 40"),
        ("benchmarks/gpu.py", "TinyLlama-shaped, 1 layers, prefill 1x8")], text
    assert all(r[-1].strip("| ") == "yes" for r in rows)
