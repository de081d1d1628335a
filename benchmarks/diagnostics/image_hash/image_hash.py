"""What hashing an image's pixels costs in a request's front: SHA-256 (vlmcache before
f438b9c) vs BLAKE3 (``keys.image_content_hash`` now, and vLLM's own image hash), and
``CachedLLM.generate``'s own time around a fake engine (no vLLM engine started).

    python benchmarks/diagnostics/image_hash/image_hash.py --out X.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import time

import numpy as np
from PIL import Image


def _ms(fn, n: int = 100, rounds: int = 5) -> float:
    """The fastest of ``rounds`` means over ``n`` calls (the machine's noise is one-sided)."""
    fn()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - start) / n)
    return round(best * 1e3, 3)


def _sha256(im: Image.Image) -> str:
    h = hashlib.sha256(f"{im.mode}\0{im.size[0]}x{im.size[1]}\0".encode())
    h.update(im.tobytes())
    return h.hexdigest()


class _Out:
    def __init__(self, i: int) -> None:
        self.request_id, self.kv_transfer_params, self.num_cached_tokens = str(i), None, 0
        self.prompt_token_ids, self.metrics = [1] * 680, None


class _Engine:
    def generate(self, prompts, params, use_tqdm=False):
        return [_Out(i) for i, _ in enumerate(prompts)]


def _front_ms(side: int) -> float:
    from vllm import SamplingParams

    from vlmcache.api import CachedLLM, VlmRequest
    from vlmcache.config import VlmCacheConfig

    cfg = VlmCacheConfig(enable_encoder_cache=False, enable_exact=False, log_requests=False,
                         model_revision="dummy", store_path="/tmp/image-hash-store")
    cached = CachedLLM("benchmarks/geometries/llava7b", cfg, engine=_Engine())
    cached.image_placeholder = "<image>"
    im = Image.fromarray(np.random.default_rng(0).integers(0, 256, (side, side, 3), np.uint8))
    req = [VlmRequest("USER: <image>\nWhat? ASSISTANT:", (im,))]
    params = SamplingParams(temperature=0.0, max_tokens=1)
    return _ms(lambda: cached.generate(req, params))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    from vlmcache.keys import image_content_hash

    rows = []
    for side in (336, 672):
        im = Image.fromarray(np.random.default_rng(side).integers(0, 256, (side, side, 3),
                                                                  np.uint8))
        rows.append({"side_px": side, "tobytes_ms": _ms(im.tobytes),
                     "sha256_ms": _ms(lambda: _sha256(im)),
                     "image_content_hash_ms": _ms(lambda: image_content_hash(im)),
                     "cachedllm_front_fake_engine_ms": _front_ms(side)})
    result = {"command": "python benchmarks/diagnostics/image_hash/image_hash.py --out "
              + args.out, "machine": f"{platform.node()}; CPU", "rows": rows}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
