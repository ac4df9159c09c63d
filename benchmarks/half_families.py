"""How far a bf16 model's logits are from eager's, per family and backend: the model matrix's
families (eqsat_llm.models.model_matrix, small configs, 8 tokens) in bfloat16, compiled to C
(float32 compute inside, bf16 weights) and to Triton (bf16 activations; in Triton's
interpreter on a machine without CUDA), each against eager PyTorch in bf16: the largest
difference relative to eager's largest logit. The tests hold every family to 3e-2
(tests/test_triton_backend.py); this prints the spread that bound covers.

    .venv/bin/python benchmarks/half_families.py [--families llama gpt2 ...] [--write]

--write puts the table in benchmarks/RESULTS.md ("bf16 models against eager, per backend")."""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from optimize_time import cpu_name, write_section

from eqsat_llm import optimize
from eqsat_llm.models.model_matrix import FAMILIES, build


def relative_error(family: str, backend: str) -> float:
    model, inputs = build(family, seq=8)
    model = model.to(torch.bfloat16)
    with warnings.catch_warnings(), torch.no_grad(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        compiled = optimize(model, inputs, backend=backend, measure_eager=False)
        want, got = model(*inputs).float(), compiled(*inputs).float()
    return float((got - want).abs().max() / want.abs().max())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--families", nargs="*", default=list(FAMILIES))
    p.add_argument("--write", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(2)
    start = time.time()
    rows = ["| family | C | Triton |", "|---|---|---|"]
    errors: dict[str, list[float]] = {"c": [], "triton": []}
    for family in args.families:
        cells = []
        for backend in ("c", "triton"):
            e = relative_error(family, backend)
            errors[backend].append(e)
            cells.append(f"{e:.1e}")
        rows.append(f"| {family} | " + " | ".join(cells) + " |")
        print(rows[-1], flush=True)
    rows.append("| range | " + " | ".join(f"{min(v):.1e} to {max(v):.1e}"
                                         for v in errors.values()) + " |")
    print(rows[-1])
    if args.write:
        head = (f"Command: `.venv/bin/python benchmarks/half_families.py {' '.join(sys.argv[1:])}` "
                f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(start))}, {cpu_name()}; "
                f"torch {torch.__version__}; Triton in its interpreter). Max |logit - eager's| "
                "over eager's largest |logit|, the model and eager in bfloat16, 8 tokens.")
        write_section(head + "\n\n" + "\n".join(rows),
                      "## bf16 models against eager, per backend (benchmarks/half_families.py)")


if __name__ == "__main__":
    main()
