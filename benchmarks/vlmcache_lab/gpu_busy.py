"""How busy the GPU was over a phase: ``nvidia-smi``'s utilization (the share of time a
kernel ran) sampled every 100 ms. Busy seconds divided by the phase's requests is the GPU
time one request cost, batching included, when the phase's server is the only one at work
(``serve_gpu`` runs its two servers in turns)."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from typing import Iterable


def mean_utilization(lines: Iterable[str]) -> tuple[float, int] | None:
    """(mean percent, samples) of ``nvidia-smi --format=csv,noheader,nounits`` lines;
    ``None`` without a number."""
    values = []
    for line in lines:
        try:
            values.append(float(line.strip().split(",")[0]))
        except ValueError:
            continue
    return (sum(values) / len(values), len(values)) if values else None


class GpuBusy:
    """Context manager: samples the first visible GPU while the block runs; ``result()``
    is ``{"busy_s", "utilization_pct", "samples"}``, or ``None`` where there is no
    ``nvidia-smi`` (the CPU)."""

    def __init__(self, interval_ms: int = 100) -> None:
        self.interval_ms = interval_ms
        self._proc: subprocess.Popen[str] | None = None
        self._lines: list[str] = []
        self._reader: threading.Thread | None = None
        self._wall = 0.0

    def __enter__(self) -> "GpuBusy":
        exe = shutil.which("nvidia-smi")
        if exe is not None:
            gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"
            self._proc = subprocess.Popen(
                [exe, "-i", gpu, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                 "-lms", str(self.interval_ms)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                text=True)
            self._reader = threading.Thread(target=self._read, daemon=True)
            self._reader.start()
        self._wall = time.monotonic()
        return self

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            self._lines.append(line)

    def __exit__(self, *exc: object) -> None:
        self._wall = time.monotonic() - self._wall
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(timeout=5)
        if self._reader is not None:
            self._reader.join(timeout=5)

    def result(self) -> dict[str, float] | None:
        mean = mean_utilization(self._lines)
        if mean is None:
            return None
        pct, samples = mean
        return {"busy_s": round(pct / 100.0 * self._wall, 3), "utilization_pct": round(pct, 1),
                "samples": samples}
