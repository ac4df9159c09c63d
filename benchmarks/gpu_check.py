"""The GPU path checked in one command (scripts/gpu-check runs it on a CUDA machine).

    python benchmarks/gpu_check.py [--budget 480] [--write]     # a CUDA machine
    python benchmarks/gpu_check.py --interpret [--families llama]  # any machine: tiny, slow

Steps, each timed, under one time budget (a step that would start past it is reported as
not run), then one summary table:

1. **Model matrix on compiled Triton**: every family of eqsat_llm.models.model_matrix (its
   small config) optimized with `backend="triton"` on the device, its logits against eager's
   on the device: float32 (within 1e-4 of the largest logit) and bfloat16 (within 3e-2).
2. **Generator** on two families (llama, mixtral): greedy tokens on the Triton backend
   against transformers' `generate` on the device, 12 new tokens from a 9-token prompt.
3. **Triton kernel tests, compiled**: pytest on tests/test_triton_*.py with
   `TRITON_INTERPRET=0` (the tests move their inputs to the device the runtime runs on).
4. **benchmarks/gpu.py** (bf16, its rounds; `--write` writes its RESULTS section).

`--interpret` runs steps 1 and 2 on `--families` (default llama) in Triton's interpreter on
the CPU and gpu.py at its --quick shapes, without step 3 (the test suite runs those tests
interpreted): it checks this script, not a GPU. Exit status 1 when any check failed."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

GENERATOR_FAMILIES = ("llama", "mixtral")
TOLERANCE = {"float32": 1e-4, "bfloat16": 3e-2}


@dataclass
class Step:
    name: str
    rows: list[tuple[str, str, bool]] = field(default_factory=list)  # (what, detail, ok)
    seconds: float = 0.0
    skipped: str = ""

    @property
    def ok(self) -> bool:
        return not self.skipped and all(ok for _, _, ok in self.rows)


def _quiet(fn: Callable[[], object]) -> object:
    import numpy as np

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return fn()


def model_matrix(step: Step, families: list[str], dtypes: list[str], dev: str) -> None:
    import gpu
    import torch

    from eqsat_llm import optimize
    from eqsat_llm.models.model_matrix import build

    for family in families:
        for dtype in dtypes:
            what = f"{family} {dtype}"
            try:
                model, (ids,) = build(family, seq=8)
                model = model.to(dev, getattr(torch, dtype))
                ids = ids.to(dev)
                compiled = _quiet(lambda m=model, i=ids: optimize(
                    m, (i,), backend="triton", measure_eager=False))
                with torch.no_grad():
                    want = gpu.first(model(ids)).float()
                    got = gpu.first(_quiet(lambda c=compiled, i=ids: c(i))).float()
                err = ((got - want).abs().max() / want.abs().max().clamp_min(1e-12)).item()
                steps = compiled.report.torch_ops
                detail = f"max error {err:.1e} of the largest logit" + (
                    f"; torch steps {dict(steps)}" if steps else "")
                step.rows.append((what, detail, err <= TOLERANCE[dtype]))
            except Exception as exc:  # noqa: BLE001 - every family is reported, then the next
                step.rows.append((what, f"{type(exc).__name__}: {str(exc)[:160]}", False))


def generator(step: Step, families: list[str], dev: str) -> None:
    import torch

    from eqsat_llm import Generator
    from eqsat_llm.models.model_matrix import build

    for family in families:
        try:
            model = build(family, seq=1)[0].model.to(dev)
            ids = torch.randint(3, 999, (1, 9), generator=torch.Generator().manual_seed(0))
            ids = ids.to(dev)
            gen = _quiet(lambda m=model: Generator(m, 32, backend="triton"))
            with torch.no_grad():
                want = _quiet(lambda m=model, i=ids: m.generate(
                    i, attention_mask=torch.ones_like(i), max_new_tokens=12, do_sample=False))
                got = _quiet(lambda g=gen, i=ids: g.generate(i, max_new_tokens=12))
            same = torch.equal(got.cpu(), want.cpu())
            step.rows.append((family, "greedy tokens equal transformers'" if same else
                              f"tokens differ: {got[0, 9:].tolist()} vs "
                              f"{want[0, 9:].tolist()}", same))
        except Exception as exc:  # noqa: BLE001
            step.rows.append((family, f"{type(exc).__name__}: {str(exc)[:160]}", False))


def kernel_tests(step: Step) -> None:
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_triton_*.py"))
    env = dict(os.environ, TRITON_INTERPRET="0", HF_HUB_OFFLINE="1")
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          *files], cwd=ROOT, env=env, capture_output=True, text=True,
                         check=False)
    tail = (out.stdout.strip().splitlines() or ["(no output)"])[-1]
    step.rows.append((" ".join(Path(f).name for f in files), tail, out.returncode == 0))


def gpu_benchmark(step: Step, quick: bool, write: bool) -> None:
    import gpu

    args = ["--quick", "--rounds", "1"] if quick else []
    try:
        text = _quiet(lambda: gpu.main(args + (["--write"] if write else [])))
        rows = [line for line in str(text).splitlines() if "eqsat-llm triton" in line]
        for line in rows:
            cells = [c.strip() for c in line.strip("|").split("|")]
            step.rows.append((cells[0], f"{cells[2]} ms, {cells[3]} of inductor's best", True))
    except SystemExit as exc:  # gpu.py exits on a system that differs from eager
        step.rows.append(("gpu.py", str(exc)[:200], False))


def summary(steps: list[Step], device: str) -> str:
    lines = [f"Device: {device}", "", "| step | check | result | ok |", "|---|---|---|---|"]
    for s in steps:
        if s.skipped:
            lines.append(f"| {s.name} | | not run: {s.skipped} | no |")
            continue
        for what, detail, ok in s.rows:
            lines.append(f"| {s.name} ({s.seconds:.0f} s) | {what} | {detail} | "
                         f"{'yes' if ok else '**no**'} |")
    failed = [s.name for s in steps if not s.ok]
    lines += ["", "All checks passed." if not failed else f"Failed: {', '.join(failed)}."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> tuple[str, bool]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget", type=float, default=480.0, help="seconds for all the steps")
    ap.add_argument("--interpret", action="store_true",
                    help="Triton's interpreter on the CPU (no GPU needed; tiny and slow)")
    ap.add_argument("--families", default=None,
                    help="comma-separated (default: every family; --interpret: llama)")
    ap.add_argument("--write", action="store_true", help="gpu.py writes its RESULTS section")
    args = ap.parse_args(argv)
    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    from eqsat_llm.models.model_matrix import FAMILIES

    cuda = torch.cuda.is_available() and not args.interpret
    if not cuda and not args.interpret:
        raise SystemExit("no CUDA device: run with --interpret to check this script on the CPU")
    dev = "cuda" if cuda else "cpu"
    device = torch.cuda.get_device_name() if cuda else "cpu (Triton interpreter)"
    families = (args.families.split(",") if args.families else
                ["llama"] if args.interpret else sorted(FAMILIES))
    plan: list[tuple[Step, Callable[[Step], None]]] = [
        (Step("model matrix"), lambda s: model_matrix(s, families, ["float32", "bfloat16"],
                                                      dev)),
        (Step("Generator"), lambda s: generator(
            s, [f for f in GENERATOR_FAMILIES if f in families] or families[:1], dev)),
    ]
    if cuda:
        plan.append((Step("Triton kernel tests, compiled"), kernel_tests))
    plan.append((Step("benchmarks/gpu.py"), lambda s: gpu_benchmark(s, not cuda, args.write)))
    start = time.perf_counter()
    for step, run in plan:
        if time.perf_counter() - start > args.budget:
            step.skipped = f"the {args.budget:.0f} s budget was spent"
            continue
        t = time.perf_counter()
        print(f"== {step.name}", flush=True)
        run(step)
        step.seconds = time.perf_counter() - t
    steps = [s for s, _ in plan]
    text = summary(steps, device)
    print(text)
    return text, all(s.ok for s in steps)


if __name__ == "__main__":
    sys.exit(0 if main()[1] else 1)
