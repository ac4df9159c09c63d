"""Side-by-side timing of the C backend against eager torch on the LLaMA-style block
(interleaved rounds, medians). `python -m eqsat_llm.codegen.c.bench [shape ...]`."""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

import torch


def _time(fn: Any, reps: int) -> float:
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps


def bench_block(shape: str, rounds: int = 30, use_blas: bool | None = None
                ) -> dict[str, float]:
    from ...api import optimize
    from ...models.workloads import llama_block_case
    from .runtime import CRuntime

    torch.set_num_threads(2)
    model, inputs = llama_block_case(shape)
    rt = CRuntime(optimize(model, inputs).graph, use_blas=use_blas)
    ins = list(inputs)
    reps = 20 if shape == "prefill" else 200

    def eager() -> None:
        with torch.no_grad():
            model(*inputs)

    def c() -> None:
        rt.run(ins)

    eager(), c()
    te, tc = [], []
    for _ in range(rounds):
        te.append(_time(eager, reps))
        tc.append(_time(c, reps))
    return {"eager_ms": statistics.median(te) * 1e3, "c_ms": statistics.median(tc) * 1e3}


def main(argv: list[str]) -> None:
    for shape in argv or ["prefill", "decode", "decode_kv"]:
        r = bench_block(shape)
        print(f"{shape:10s} eager {r['eager_ms']:.3f} ms   C {r['c_ms']:.3f} ms   "
              f"x{r['eager_ms'] / r['c_ms']:.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
