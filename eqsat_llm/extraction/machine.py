"""A machine as the cost model sees it (`Machine`: rates, bandwidths, overheads), the
documented `DEFAULT`, and this host's calibration cached on disk. `eqsat_llm.extraction.calibrate`
measures and saves; `eqsat_llm.extraction.costmodel` prices kernels on a Machine."""

from __future__ import annotations

import json
import math
import platform
import re
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch

from ..cache import base_dir, write_atomic
from ..errors import CostError


@dataclass(frozen=True)
class Machine:
    """What the roofline needs to know about a machine. Rates are for all `threads` together;
    bandwidths count bytes read + bytes written per second."""

    name: str
    gemm_flops: float  # FLOP/s of a large fp32 GEMM
    gemv_flops: float  # FLOP/s of a matrix-vector product (M = 1) with its matrix in cache
    vector_flops: float  # flop-equivalents/s of vector (elementwise) code, from exp's rate
    l2_bytes: int  # the first l2_bytes of a working set stream at l2_bw (all cores' L2)
    l2_bw: float
    l3_bytes: int  # ... the next, up to l3_bytes, at l3_bw; the rest at dram_bw
    l3_bw: float
    dram_bw: float
    call_overhead: float  # seconds per torch op call (dispatch, allocation, thread wake-up)
    threads: int = 2
    gemm_overhead: float = 1.3e-6  # seconds per matmul/attention call (BLAS dispatch)
    # seconds per call of a generated (fused-backend) kernel that is not a GEMM: no
    # dispatcher, no allocation; a machine file without it (older calibrations) gets 1 us
    kernel_overhead: float = 1.0e-6
    # what the rates were measured on: "c" (kernels the C backend generates) or "torch"
    rates_from: str = "torch"

    def gemm_rate(self, m: int) -> float:
        """FLOP/s of a GEMM whose smallest dimension is `m`: gemm_flops * m / (m + h), with h
        chosen so that m = 1 gives gemv_flops (h = gemm_flops / gemv_flops - 1)."""
        h = max(0.0, self.gemm_flops / self.gemv_flops - 1.0)
        m = max(1, m)
        return self.gemm_flops * m / (m + h)

    def memory_time(self, moved: float) -> float:
        """Seconds to move `moved` bytes (read + written; also the working set): the first
        l2_bytes stream at l2_bw, the rest up to l3_bytes at l3_bw, the rest at dram_bw.
        Continuous and increasing in `moved`, so a bigger kernel never looks cheaper."""
        levels = ((self.l2_bytes, self.l2_bw), (self.l3_bytes, self.l3_bw),
                  (math.inf, self.dram_bw))
        t, below = 0.0, 0.0
        for size, bw in levels:
            part = min(moved, size) - below
            if part <= 0:
                break
            t += part / bw
            below = size
        return t

    def bandwidth(self, working_set: float) -> float:
        """Effective bytes/s for a kernel that moves `working_set` bytes."""
        return working_set / self.memory_time(working_set) if working_set > 0 else self.l2_bw

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Machine:
        names = {f.name for f in fields(Machine)}
        optional = {f.name for f in fields(Machine) if f.default is not MISSING}
        missing = names - d.keys() - optional
        if missing:
            raise CostError(f"machine description lacks {sorted(missing)}; recalibrate "
                            "(eqsat-llm calibrate)")
        return Machine(**{k: v for k, v in d.items() if k in names})


# A 2-core AVX-512 x86-64 machine (the project's reference VM: an Intel Xeon with 2 MiB of
# L2 per core), torch 2.13 CPU at 2 threads; rounded from `eqsat-llm calibrate` there. The
# fp32 GEMM figure is near the 2 cores' FMA peak (2 x 16 lanes x 2 flops x ~3 GHz x 2 cores);
# a GEMV reaches an eighth of it. Bandwidths count bytes read + written by `out = a + b`.
# The L3 size is a generic figure (a VM reports the host's). Overheads are torch eager's:
# one small op through the reference runtime, and one small matmul. These are torch's rates
# (`rates_from="torch"`: the generated kernels were not measured on that machine), and a
# generated kernel is charged a torch op's overhead.
DEFAULT = Machine(
    name="default-2core-avx512",
    gemm_flops=380e9,
    gemv_flops=50e9,
    vector_flops=110e9,
    l2_bytes=4 << 20,
    l2_bw=200e9,
    l3_bytes=32 << 20,
    l3_bw=55e9,
    dram_bw=25e9,
    call_overhead=1.0e-6,
    threads=2,
    gemm_overhead=1.3e-6,
    kernel_overhead=1.0e-6,
    rates_from="torch",
)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_key() -> str:
    """File-name-safe identity of this machine as the cost model sees it; a calibration of the
    kernels built for fewer instruction sets ($EQSAT_ISA) is kept apart."""
    from ..codegen.c.isa import isa_name  # (lazy: the C backend's package imports the runtime)

    isa = isa_name()
    raw = f"{platform.node()}-{cpu_model()}-{torch.get_num_threads()}t"
    raw += "" if isa == "native" else f"-{isa}"
    return re.sub(r"[^A-Za-z0-9._-]+", "_", raw).strip("_")


def cache_path() -> Path:
    return base_dir() / f"machine-{machine_key()}.json"


def save(m: Machine) -> Path:
    path = cache_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_atomic(path, (json.dumps(m.to_dict(), indent=2) + "\n").encode())
    return path


def load() -> Machine | None:
    """The cached calibration of this machine, or None (also for an unreadable file)."""
    try:
        return Machine.from_dict(json.loads(cache_path().read_text()))
    except (OSError, ValueError, TypeError, CostError):
        return None


def machine_of_this_host() -> Machine:
    """The machine the cost model should use: the cached calibration, else DEFAULT."""
    return load() or DEFAULT
