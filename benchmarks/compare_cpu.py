"""eqsat-llm against eager PyTorch, torch.compile (inductor) and ONNX Runtime on the CPU.

    .venv/bin/python benchmarks/compare_cpu.py [--workloads NAME ...] [--rounds 7]
        [--calls N] [--quick] [--write] [--max-load 1.0] [--wait-load 600]

One process, torch.set_num_threads(2). Per workload (eqsat_llm.models.workloads.WORKLOADS) each
system is prepared once (compile/export time excluded from the timings, reported apart), its outputs
are checked against eager (max abs error, on the example inputs and on fresh ones of the same
shapes), then timed in interleaved rounds: in each round every system runs N calls back to back (the
order rotates from round to round); the figure is the median over rounds of the time per call. A
system whose outputs differ from eager by more than --tol is reported WRONG and gets no ratio. With
--write the section below in benchmarks/RESULTS.md is replaced; before measuring, --write waits (up
to --wait-load seconds) for the 1-minute load average to fall below --max-load, and says in the
section when it did not. How to read it: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import logging
import os
import platform
import re
import shlex
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree

sys.path.insert(0, str(Path(__file__).resolve().parent))
from optimize_time import write_section

from eqsat_llm import optimize
from eqsat_llm.api import BackendFallbackWarning, FallbackWarning
from eqsat_llm.models.workloads import WORKLOADS

SECTION = "## CPU: eqsat-llm against eager, torch.compile and ONNX Runtime"
SYSTEMS = ("eager", "inductor", "ort", "eqsat")
LABEL = {"eager": "eager PyTorch", "inductor": "torch.compile (inductor)",
         "ort": "ONNX Runtime", "eqsat": "eqsat-llm"}
PHASES = ("capture", "encode", "saturate", "serialize", "extract", "decode", "fold", "plan",
          "codegen")
OTHERS_CPU_MAX = 0.1  # cores' worth of CPU used by other processes above which a run is flagged
SETTLE_S = 0.06  # untimed calls before each timed round (settle())
TARGET_ROUND_S = 0.15  # about the time one system spends per round when --calls is not given


@dataclass
class System:
    name: str
    fn: Callable[[], Any] | None = None  # one call on the example inputs
    fresh: Callable[[], Any] | None = None  # one call on fresh inputs
    setup_s: float = 0.0
    note: str = ""
    error: str | None = None  # setup or run failure: not timed
    err_example: float | None = None
    err_fresh: float | None = None
    wrong: bool = False
    calls: int = 0  # calls per round
    times: list[float] = field(default_factory=list)  # seconds per call, one per round

    @property
    def timed(self) -> bool:
        return self.fn is not None and self.error is None and not self.wrong

    def median_ms(self) -> float:
        return statistics.median(self.times) * 1e3

    def spread_ms(self) -> tuple[float, float]:
        return min(self.times) * 1e3, max(self.times) * 1e3


# ---------------------------------------------------------------- inputs and comparison

def fresh_inputs(inputs: tuple[torch.Tensor, ...], seed: int = 1) -> tuple[torch.Tensor, ...]:
    """Inputs of the same shapes and dtypes, other values (token ids stay below the largest
    example id + 1, so they stay inside the vocabulary)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for x in inputs:
        if x.dtype.is_floating_point:
            out.append(torch.randn(x.shape, generator=gen, dtype=x.dtype))
        else:
            out.append(torch.randint(0, int(x.max()) + 1, x.shape, generator=gen, dtype=x.dtype))
    return tuple(out)


def flat_tensors(out: Any) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


def max_abs_err(got: Any, want: Any) -> float:
    g, w = flat_tensors(got), flat_tensors(want)
    if len(g) != len(w):
        return float("inf")
    err = 0.0
    for a, b in zip(g, w):
        if tuple(a.shape) != tuple(b.shape):
            return float("inf")
        d = (a.double() - b.double()).abs()
        if d.numel():
            m = d.max().item()
            err = max(err, float("inf") if d.isnan().any() else m)  # NaN counts as wrong
    return err


def short(exc: BaseException) -> str:
    msg = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {msg[:300]}"


# ---------------------------------------------------------------- the four systems

def make_eager(model: torch.nn.Module, inputs: tuple, fresh: tuple) -> System:
    def run(args: tuple) -> Any:
        with torch.no_grad():
            return model(*args)
    return System("eager", lambda: run(inputs), lambda: run(fresh))


def make_inductor(model: torch.nn.Module, inputs: tuple, fresh: tuple) -> System:
    s = System("inductor", note="default mode")
    try:
        t = time.perf_counter()
        torch._dynamo.reset()
        compiled = torch.compile(model)  # backend="inductor", mode=None

        def run(args: tuple) -> Any:
            with torch.no_grad():
                return compiled(*args)
        run(inputs)  # compiles
        s.setup_s = time.perf_counter() - t
        s.fn, s.fresh = (lambda: run(inputs)), (lambda: run(fresh))
    except Exception as exc:  # noqa: BLE001 - record it and go on: the others still run
        s.error = short(exc)
    return s


def make_ort(model: torch.nn.Module, inputs: tuple, fresh: tuple, tmp: Path,
             name: str) -> System:
    import onnxruntime  # noqa: F401 - missing: fail before the export, not after

    s = System("ort")
    path = tmp / f"{name}.onnx"
    t = time.perf_counter()
    errors = []
    for dynamo in (True, False):
        try:
            with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
                warnings.simplefilter("ignore")
                torch.onnx.export(model, inputs, str(path), dynamo=dynamo)
            s.note = "dynamo exporter" if dynamo else "legacy (TorchScript) exporter"
            break
        except Exception as exc:  # noqa: BLE001 - try the other exporter
            errors.append(f"{'dynamo' if dynamo else 'legacy'} export: {short(exc)}")
    else:
        s.error = "; ".join(errors)
        return s
    export_s = time.perf_counter() - t
    try:
        run = ort_runner(path, len(inputs))
        run(inputs)
        s.setup_s = time.perf_counter() - t
        s.note += f", export {export_s:.1f} s"
        s.fn, s.fresh = (lambda: run(inputs)), (lambda: run(fresh))
    except Exception as exc:  # noqa: BLE001 - recorded in the table
        s.error = short(exc)
    return s


def ort_runner(path: Any, n_inputs: int, sequential: bool = False
               ) -> Callable[[tuple], list[torch.Tensor]]:
    """An ONNX Runtime session of the model at `path` (ORT_ENABLE_ALL, 2 intra-op threads,
    1 inter-op) as a function of the inputs, returning torch tensors."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = 2
    so.inter_op_num_threads = 1
    if sequential:
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    if len(names) != n_inputs:
        raise RuntimeError(f"the ONNX model takes {len(names)} inputs, the model "
                           f"{n_inputs} (an input was constant-folded away?)")

    def run(args: tuple) -> list[torch.Tensor]:
        # zero-copy numpy views in and out: the conversion is part of the call
        outs = sess.run(None, {n: x.numpy() for n, x in zip(names, args)})
        return [torch.from_numpy(o) for o in outs]
    return run


def make_eqsat(model: torch.nn.Module, inputs: tuple, fresh: tuple) -> tuple[System, Any]:
    s = System("eqsat")
    try:
        t = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            compiled = optimize(model, inputs, measure_eager=False)  # backend="c" by default
        s.setup_s = time.perf_counter() - t
        rt = compiled._runtime
        s.note = f"backend {compiled.report.backend}"
        if compiled.report.backend == "c":
            s.note += (", linked with OpenBLAS (used per GEMM shape)" if getattr(
                rt, "uses_blas", False) else ", generated GEMMs only (no BLAS)")
            if getattr(rt, "cache_hit", False):
                s.note += ", C build cached"
        for w in caught:  # the optimizer's own warnings: fallbacks to torch or to Python
            if issubclass(w.category, (FallbackWarning, BackendFallbackWarning)):
                s.note += f"; {w.category.__name__}: {str(w.message)[:200]}"
        s.fn, s.fresh = (lambda: compiled(*inputs)), (lambda: compiled(*fresh))
        return s, compiled
    except Exception as exc:  # noqa: BLE001 - recorded in the table
        s.error = short(exc)
        return s, None


# ---------------------------------------------------------------- measuring

def time_calls(fn: Callable[[], Any], calls: int) -> float:
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t) / calls


def settle(fn: Callable[[], Any], seconds: float = SETTLE_S) -> None:
    """Untimed calls for `seconds` before a system's timed round: the thread pool of the system
    that ran before it (ONNX Runtime's spins for ~30 ms after a run, OpenMP's for a while too)
    goes idle meanwhile instead of taking a core from the round (measured: the packed GEMM's
    first calls after ORT ran 5x slower)."""
    end = time.perf_counter() + seconds
    fn()
    while time.perf_counter() < end:
        fn()


def interleaved_medians(fns: dict[str, Callable[[], Any]], rounds: int,
                        round_s: float) -> dict[str, float]:
    """Median seconds per call of each function: `rounds` rounds, the order rotated each
    round, each function `settle`d and then called back to back for about `round_s`."""
    calls = {}
    for name, fn in fns.items():
        t = time.perf_counter()
        fn()
        calls[name] = max(5, int(round_s / max(time.perf_counter() - t, 1e-6)))
    names = list(fns)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        k = r % len(names)
        for n in names[k:] + names[:k]:
            settle(fns[n])
            samples[n].append(time_calls(fns[n], calls[n]))
    return {n: statistics.median(v) for n, v in samples.items()}


def pick_calls(fn: Callable[[], Any], target: float) -> int:
    """Calls per round so that a round of `fn` takes about `target` seconds (the best of three
    short probes, so that a burst of load during the probe does not shrink it to 1)."""
    fn()
    per_call = min(time_calls(fn, 3) for _ in range(3))
    return max(3, min(5000, round(target / max(per_call, 1e-6))))


def add_write_options(p: argparse.ArgumentParser) -> None:
    """--write (replace the script's section in RESULTS.md), and the quiet machine it waits
    for first: --max-load, --wait-load."""
    p.add_argument("--write", action="store_true", help="replace the section in RESULTS.md")
    p.add_argument("--max-load", type=float, default=1.0)
    p.add_argument("--wait-load", type=float, default=600.0,
                   help="with --write, seconds to wait for the load to fall below --max-load")


def busy_cpu_s() -> float | None:
    """CPU seconds the whole machine has been busy (/proc/stat), or None off Linux."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = v[3] + (v[4] if len(v) > 4 else 0)  # idle + iowait
    return (sum(v[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def run_workload(name: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    load_before = os.getloadavg()
    torch.manual_seed(0)
    model, inputs = WORKLOADS[name]()
    model.eval()
    fresh = fresh_inputs(inputs)
    with torch.no_grad():
        want, want_fresh = model(*inputs), model(*fresh)

    built = {"eager": make_eager(model, inputs, fresh)}
    compiled = None
    if "eqsat" in args.systems:
        built["eqsat"], compiled = make_eqsat(model, inputs, fresh)
    if "ort" in args.systems:
        built["ort"] = make_ort(model, inputs, fresh, tmp, name)
    if "inductor" in args.systems:  # last: dynamo's state does not touch the others' setup
        built["inductor"] = make_inductor(model, inputs, fresh)
    systems = [built[k] for k in SYSTEMS if k in built]

    for s in systems:
        if s.fn is None or s.error:
            continue
        try:
            s.err_example = max_abs_err(s.fn(), want)
            s.err_fresh = max_abs_err(s.fresh(), want_fresh)
        except Exception as exc:  # noqa: BLE001 - recorded in the table
            s.error = f"call failed: {short(exc)}"
            continue
        s.wrong = max(s.err_example, s.err_fresh) > args.tol

    timed = [s for s in systems if s.timed]
    # other processes' CPU is counted over the timing only (setup runs compilers in children)
    busy0, mine0, wall0 = busy_cpu_s(), time.process_time(), time.perf_counter()
    for s in timed:  # calibrate, then one warm-up round
        s.calls = args.calls or pick_calls(s.fn, args.target)
        time_calls(s.fn, s.calls)
    for r in range(args.rounds):
        k = r % max(len(timed), 1)
        for s in timed[k:] + timed[:k]:  # rotate the order: no system always runs first
            settle(s.fn)
            s.times.append(time_calls(s.fn, s.calls))

    row: dict[str, Any] = {"name": name, "systems": systems,
                           "load": (load_before[0], os.getloadavg()[0]),
                           "others_cpu": others_cpu(busy0, mine0, wall0),
                           "shapes": ", ".join("x".join(map(str, x.shape)) for x in inputs)}
    if compiled is not None:
        r = compiled.report
        row["timings"] = {p: r.timings.get(p, 0.0) for p in PHASES if p in r.timings}
        row["ops"] = (sum(r.op_counts_before.values()), sum(r.op_counts_after.values()))
    return row


# ---------------------------------------------------------------- reporting

def others_cpu(busy0: float | None, mine0: float, wall0: float) -> float:
    """Cores' worth of CPU used by other processes since (busy0, mine0, wall0): the machine's
    busy time minus this process's (all its threads), over the wall time."""
    busy1 = busy_cpu_s()
    if busy0 is None or busy1 is None:
        return float("nan")
    wall = time.perf_counter() - wall0
    return max(0.0, (busy1 - busy0) - (time.process_time() - mine0)) / max(wall, 1e-9)


def blas_info() -> list[str]:
    """What BLAS/OpenMP libraries are loaded (threadpoolctl), and torch's own build config."""
    lines = []
    try:
        from threadpoolctl import threadpool_info

        for lib in threadpool_info():
            desc = (f"{lib.get('internal_api')} {lib.get('version') or ''}".strip()
                    + f" ({Path(lib.get('filepath', '?')).name}, prefix {lib.get('prefix')}, "
                    f"{lib.get('num_threads')} threads")
            if lib.get("architecture"):
                desc += f", kernel {lib['architecture']}"
            if lib.get("threading_layer"):
                desc += f", threading {lib['threading_layer']}"
            lines.append(desc + ")")
    except ImportError:
        lines.append("threadpoolctl not installed")
    cfg = torch.__config__.show()
    blas = re.findall(r"\b((?:BLAS|LAPACK)_INFO=[\w.-]+)", cfg)
    omp = re.search(r"OpenMP (\d+)", torch.__config__.parallel_info())
    lines.append(f"torch's BLAS: {', '.join(blas) or 'unknown'} (MKL linked statically, so "
                 "threadpoolctl lists it only if it is loaded as a library), "
                 f"mkldnn {torch.backends.mkldnn.is_available()}, OpenMP "
                 f"{omp.group(1) if omp else '?'}, CPU capability "
                 f"{torch.backends.cpu.get_cpu_capability()}")
    try:
        from eqsat_llm.codegen.c.blas import openblas_dir

        d = openblas_dir()
        lines.append("eqsat-llm C backend's BLAS: " + (
            f"scipy-openblas32 from {d} (libscipy_openblas.so in the list above, 1 thread; "
            "the generated code splits GEMMs over its OpenMP threads)" if d else
            "none (scipy-openblas32 not found or EQSAT_C_NO_BLAS set): generated GEMMs"))
    except ImportError:
        pass
    env = {k: os.environ.get(k, "(unset)") for k in
           ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    lines.append("env: " + ", ".join(f"{k}={v}" for k, v in env.items()))
    return lines


def fmt_err(e: float | None) -> str:
    return "-" if e is None else f"{e:.1e}"


def workload_table(row: dict[str, Any]) -> str:
    by = {s.name: s for s in row["systems"]}
    lines = [(f"### {row['name']} (inputs {row['shapes']}; 1-minute load {row['load'][0]:.2f} "
              f"before, {row['load'][1]:.2f} after; other processes used "
              f"{row['others_cpu']:.2f} of the {os.cpu_count()} cores while it was timed)"), "",
             ("| system | median ms/call | min-max ms over rounds | calls/round "
              "| max abs err (example / fresh) | status | setup s | notes |"),
             "|---|---|---|---|---|---|---|---|"]
    for s in row["systems"]:
        if s.error:
            status, med, spread = f"FAILED: {s.error}", "-", "-"
        else:
            status = "WRONG (not timed)" if s.wrong else "ok"
            med = f"{s.median_ms():.3f}" if s.times else "-"
            spread = "{:.3f}-{:.3f}".format(*s.spread_ms()) if s.times else "-"
        lines.append(f"| {LABEL[s.name]} | {med} | {spread} | {s.calls or '-'} | "
                     f"{fmt_err(s.err_example)} / "
                     f"{fmt_err(s.err_fresh)} | {status} | {s.setup_s:.1f} | "
                     f"{s.note.replace('|', '/')} |")
    eq = by.get("eqsat")
    ratios = []
    for other in ("ort", "eager", "inductor"):
        o = by.get(other)
        if eq is None or o is None:
            continue
        if eq.timed and o.timed and eq.times and o.times:
            ratios.append(f"eqsat/{other} **{eq.median_ms() / o.median_ms():.2f}**")
        else:
            ratios.append(f"eqsat/{other} n/a")
    lines += ["", "Ratios of medians (< 1: eqsat-llm faster): " + ", ".join(ratios) + "."]
    if "timings" in row:
        t = row["timings"]
        lines.append(f"eqsat-llm optimize: ops {row['ops'][0]} -> {row['ops'][1]}; "
                     + ", ".join(f"{p} {v:.2f}" for p, v in t.items())
                     + f" s (sum {sum(t.values()):.2f} s).")
    return "\n".join(lines)


def summary_table(rows: list[dict[str, Any]]) -> str:
    head = ("| workload | " + " | ".join(f"{LABEL[k]} ms" for k in SYSTEMS)
            + " | eqsat/ORT | eqsat/eager | eqsat/inductor |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for row in rows:
        by = {s.name: s for s in row["systems"]}
        cells = []
        for k in SYSTEMS:
            s = by.get(k)
            if s is None:
                cells.append("-")
            elif s.error:
                cells.append("failed")
            elif s.wrong:
                cells.append(f"WRONG (err {max(s.err_example or 0, s.err_fresh or 0):.1e})")
            else:
                cells.append(f"{s.median_ms():.3f}")
        eq = by.get("eqsat")
        for k in ("ort", "eager", "inductor"):
            o = by.get(k)
            ok = eq is not None and o is not None and eq.timed and o.timed
            cells.append(f"{eq.median_ms() / o.median_ms():.2f}" if ok else "n/a")
        lines.append(f"| {row['name']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def wait_for_load(max_load: float, wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    while True:
        one = os.getloadavg()[0]
        if one < max_load:
            return True
        if time.monotonic() >= deadline:
            return False
        print(f"load average {one:.2f} >= {max_load}: waiting "
              f"({deadline - time.monotonic():.0f} s left)", flush=True)
        time.sleep(min(30.0, max(1.0, deadline - time.monotonic())))


def load_str(la: tuple[float, float, float]) -> str:
    return "/".join(f"{x:.2f}" for x in la)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    p.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=0,
                   help="calls per system per round (default: about "
                   f"{TARGET_ROUND_S * 1e3:.0f} ms of the slowest system)")
    p.add_argument("--quick", action="store_true",
                   help="3 rounds of about 20 ms: a smoke run, not a measurement")
    p.add_argument("--tol", type=float, default=1e-4, help="max abs error to count as correct")
    add_write_options(p)
    args = p.parse_args(argv)
    args.target = TARGET_ROUND_S
    if args.quick:
        args.rounds, args.target = min(args.rounds, 3), 0.02
    if "eager" not in args.systems:
        args.systems = ["eager", *args.systems]

    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    logging.getLogger("onnxscript").setLevel(logging.ERROR)
    torch.set_num_threads(2)
    import onnxruntime as ort

    load_ok = True
    if args.write:
        load_ok = wait_for_load(args.max_load, args.wait_load)
    load_start = os.getloadavg()
    print(f"load average at start (1/5/15 min): {load_str(load_start)}", flush=True)
    t0 = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory(prefix="compare_cpu_") as tmp:
        for name in args.workloads:
            try:
                rows.append(run_workload(name, args, Path(tmp)))
            except Exception:  # noqa: BLE001 - the other workloads still run
                traceback.print_exc()
                print(f"{name}: failed, skipped", flush=True)
                continue
            print(workload_table(rows[-1]) + "\n", flush=True)
    load_end = os.getloadavg()
    total = time.perf_counter() - t0

    cmd = ".venv/bin/python benchmarks/compare_cpu.py" + (
        " " + shlex.join(sys.argv[1:]) if len(sys.argv) > 1 else "")
    load_note = (f"Load average (1/5/15 min) {load_str(load_start)} at the start, "
                 f"{load_str(load_end)} at the end")
    if args.write and not load_ok:
        load_note += (f" **(the 1-minute load did not fall below {args.max_load} within "
                      f"{args.wait_load:.0f} s: other work shared the 2 cores; read the "
                      "figures with that in mind)**")
    load_note += (" (this run's own 2 threads count in these); CPU used by other processes "
                  "while each workload was timed: " + ", ".join(
                      f"{r['name']} {r['others_cpu']:.2f} cores" for r in rows))
    busy = [r["name"] for r in rows if not r["others_cpu"] < OTHERS_CPU_MAX]
    if busy:
        load_note += (f". **Other processes used more than {OTHERS_CPU_MAX} of a core during "
                      f"{', '.join(busy)}: the OpenMP systems (eager, inductor, eqsat-llm) slow "
                      "down far more than ORT when a core is taken; those figures are not "
                      "representative**")
    date = f"{datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}"
    head = (f"{SECTION}\n\nCommand: `{cmd}` ({date}, {platform.machine()}, {os.cpu_count()} cores, "
            f"{platform.processor() or platform.platform()}, torch {torch.__version__} with "
            f"{torch.get_num_threads()} threads, onnxruntime {ort.__version__} "
            "(ORT_ENABLE_ALL, intra_op 2, inter_op 1), Python "
            f"{platform.python_version()}; run took {total:.0f} s). {load_note}.\n\n"
            f"Method: one process; per workload, {args.rounds} interleaved rounds (order "
            "rotated each round), each system N calls per round (N calibrated per system to "
            f"about {args.target * 1e3:.0f} ms per round unless --calls); figure = median over "
            "rounds "
            f"of ms per call; before each timed round, {SETTLE_S * 1e3:.0f} ms of untimed "
            "calls of the same system (the previous system's thread pool stops spinning "
            "meanwhile). "
            "Compile/export time excluded (setup column), warm-up excluded. "
            "Max abs error vs eager on the example inputs and on fresh inputs of the same "
            f"shapes; above {args.tol:g} a system is WRONG and not timed. Ratio < 1: eqsat-llm "
            "faster. How to read it and caveats: docs/benchmarks.md.\n\n"
            "BLAS and thread pools loaded (threadpoolctl, after all systems ran):\n\n"
            + "\n".join(f"- {ln}" for ln in blas_info()))
    text = (head + "\n\n" + summary_table(rows) + "\n\n"
            + "\n\n".join(workload_table(r) for r in rows))
    print(text)
    if args.write:
        write_section(text, SECTION)
        print(f"\nwrote the section {SECTION!r} of benchmarks/RESULTS.md")


if __name__ == "__main__":
    main()
