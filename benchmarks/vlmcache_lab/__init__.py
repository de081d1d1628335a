"""vlmcache's laboratory: the harnesses behind the figures in ``benchmarks/results/``.

Not installed with vlmcache (users run ``vlmcache bench``, which lives in the package).
Scripts in ``benchmarks/`` import it as ``vlmcache_lab`` (their folder is on ``sys.path``);
the tests find it through pytest's ``pythonpath``.
"""

from __future__ import annotations

import os
from pathlib import Path

LAB_PARENT = str(Path(__file__).resolve().parent.parent)


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with the lab importable, for ``python -m
    vlmcache_lab.X`` children started from anywhere."""
    out = dict(os.environ if env is None else env)
    paths = [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p]
    if LAB_PARENT not in paths:
        out["PYTHONPATH"] = os.pathsep.join([LAB_PARENT, *paths])
    return out
