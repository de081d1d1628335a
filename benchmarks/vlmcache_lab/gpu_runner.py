"""One engine of the GPU benchmark (:mod:`vlmcache_lab.gpu_native_path`) in this process:
the benchmark's requests (~620-680-token image prompts, dummy weights), batch-1 and batched
timing, and per request what was reused and where its time went."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any, Sequence

from vlmcache_lab.phase_timing import OURS, PHASES, phase_medians, phases
from vlmcache_lab.proc_stats import engine_core_cpu
from vlmcache_lab.turns import Turns

QUESTION = ("Describe the scene in this picture in detail: the objects, their colours and "
            "positions, and any text that can be read in it.")


def _prompt(geometry: Path) -> tuple[str, int]:
    """(prompt, image side in pixels) for the geometry's model family."""
    cfg = json.loads((geometry / "config.json").read_text())
    if cfg.get("model_type") == "qwen2_vl":
        return ("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>"
                f"{QUESTION}<|im_end|>\n<|im_start|>assistant\n", 672)
    return f"USER: <image>\n{QUESTION} ASSISTANT:", 336


def _image(seed: int, side: int) -> Any:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8))

def _engine_args(args: argparse.Namespace) -> dict[str, Any]:
    return {"load_format": "dummy", "enforce_eager": args.eager,
            "gpu_memory_utilization": args.gpu_memory_utilization,
            "max_model_len": args.max_model_len, "limit_mm_per_prompt": {"image": 1},
            "seed": 0, "max_num_seqs": 64, "enable_prefix_caching": True,
            "block_size": args.block_size,
            "disable_log_stats": False}  # per-request engine timestamps (where time goes)


def _direct_call(fn: Any) -> Any:
    return fn()


def _vlmcache_llm(args: argparse.Namespace, engine_args: dict[str, Any]) -> Any:
    import vlmcache.api
    from vlmcache.api import CachedLLM
    from vlmcache.config import VlmCacheConfig

    if not args.stack_room:  # diagnostic (vlmcache@tight): the engine started as before
        vlmcache.api.call_with_stack_room = _direct_call

    config = VlmCacheConfig(store_path=args.store, memory_budget=args.cpu_bytes,
                            disk_budget=args.disk_bytes, enable_encoder_cache=False,
                            enable_exact=False, log_requests=False,
                            model_revision="dummy-weights", kv_io_threads=args.kv_io_threads,
                            admission_memory=args.admission_memory,
                            kv_block_layout=args.kv_block_layout)
    return CachedLLM(args.geometry, config, engine_args=engine_args)


def _native_llm(mode: str, args: argparse.Namespace, engine_args: dict[str, Any]) -> Any:
    from vllm import LLM

    if mode.startswith("native_wired"):  # vlmcache's engine wiring, driven as plain vLLM
        from vlmcache.api import _device_type
        from vlmcache.config import VlmCacheConfig
        from vlmcache.vllm.engine_config import engine_wiring

        config = VlmCacheConfig(store_path=args.store, memory_budget=args.cpu_bytes,
                                disk_budget=args.disk_bytes, enable_encoder_cache=False,
                                model_revision="dummy-weights", kv_io_threads=args.kv_io_threads,
                                admission_memory=args.admission_memory,
                                kv_block_layout=args.kv_block_layout)
        engine_args.update(engine_wiring(config, _device_type()).llm_kwargs(block_size=False))
    elif mode == "native_cpu":
        engine_args["kv_offloading_size"] = args.cpu_bytes / 1024**3
    elif mode.startswith("native_tiering"):
        from vllm.config import KVTransferConfig

        tiers = ([] if mode == "native_tiering_cpu" else
                 [{"type": "fs", "root_dir": args.store + "-fs"}])
        extra = {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": args.cpu_bytes,
                 "secondary_tiers": tiers}
        engine_args["kv_transfer_config"] = KVTransferConfig(
            kv_connector="OffloadingConnector", kv_role="kv_both",
            kv_connector_extra_config=extra)
        engine_args["prefix_caching_hash_algo"] = "sha256_cbor"
    return LLM(model=args.geometry, **engine_args)


class _SpanTimed:
    """``vllm.LLM`` with the start and end of its last ``generate`` call noted in ``span``."""

    def __init__(self, llm: Any, span: list[float]) -> None:
        self._llm, self._span = llm, span

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        self._span[0] = time.perf_counter()
        try:
            return self._llm.generate(*args, **kwargs)
        finally:
            self._span[1] = time.perf_counter()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._llm, name)


class Runner:
    """One engine in this process."""

    def __init__(self, mode: str, args: argparse.Namespace, turns: Turns) -> None:
        from vllm import SamplingParams

        self.turns = turns
        # diagnostic: each request also sent as plain vLLM on the same engine (vlmcache_ab)
        self.ab, self.plain_facts = mode == "vlmcache_ab", []
        # diagnostic: vlmcache's engine (started by CachedLLM) sent plain vLLM requests only
        self.plain_only = mode == "vlmcache_plain"
        self.prompt, self.side = _prompt(Path(args.geometry))
        self.store, self.block_size = args.store, args.block_size
        self.params = SamplingParams(temperature=0.0, max_tokens=1)
        self.params2 = SamplingParams(temperature=0.0, max_tokens=2)
        engine_args = _engine_args(args)
        with turns.turn():  # engines sharing the GPU size their KV caches one at a time
            self.cached = (_vlmcache_llm(args, engine_args) if mode.startswith("vlmcache")
                           else None)
            self.llm = self.cached.llm if self.cached else _native_llm(mode, args, engine_args)
        if self.cached is not None:  # the geometries carry no tokenizer_config to read it from
            self.cached.image_placeholder = ("<|image_pad|>" if "<|image_pad|>" in self.prompt
                                             else "<image>")
            self._engine_span = [0.0, 0.0]
            self.cached.llm = _SpanTimed(self.cached.llm, self._engine_span)

    def generate(self, seeds: Sequence[int], params: Any = None) -> list[dict[str, Any]]:
        """One ``generate`` call; per request: prompt tokens, loaded, from prefix cache, where
        its time went, and the call's wall time (``wall_s``: the call alone, not making the
        images nor the benchmark's own look at the store)."""
        images = [_image(s, self.side) for s in seeds]
        with self.turns.turn():
            if self.plain_only:
                return self._plain(images, params or self.params)
            if not self.ab:
                return self._generate(images, params or self.params)
            plain_first = len(self.plain_facts) % 2 == 1  # neither kind always goes first
            if plain_first:
                self.plain_facts += self._plain(images, params or self.params)
            facts = self._generate(images, params or self.params)
            if not plain_first:
                self.plain_facts += self._plain(images, params or self.params)
            return facts

    def _generate(self, images: list[Any], params: Any) -> list[dict[str, Any]]:
        if self.cached is None:
            return self._plain(images, params)
        from vlmcache.api import VlmRequest

        start = time.perf_counter()
        outs = self.cached.generate([VlmRequest(self.prompt, (im,)) for im in images],
                                    params)
        end = time.perf_counter()
        # vlmcache's own share of the front and return phases (the rest is vLLM's)
        ours = {"ours_front_ms": (self._engine_span[0] - start) * 1e3,
                "ours_return_ms": (end - self._engine_span[1]) * 1e3}
        return [{"wall_s": end - start, **ours,
                 "prompt": o.report.prompt_tokens, "loaded": o.report.tokens_loaded,
                 "prefix": o.report.tokens_from_prefix_cache,
                 "stored": self._stored_tokens(o.report.chunk_keys),
                 "choice": o.report.kv_cost_choice, "reason": o.report.kv_cost_reason,
                 **phases(o.output, start, end)} for o in outs]

    def _plain(self, images: list[Any], params: Any) -> list[dict[str, Any]]:
        start = time.perf_counter()
        prompts = [{"prompt": self.prompt, "multi_modal_data": {"image": im}} for im in images]
        llm = self.cached.llm if self.cached is not None else self.llm
        outs = llm.generate(prompts, params, use_tqdm=False)
        end = time.perf_counter()
        # vLLM reports one number for its prefix cache plus what a connector loaded
        return [{"wall_s": end - start,
                 "prompt": len(o.prompt_token_ids or ()), "cached": o.num_cached_tokens or 0,
                 **phases(o, start, end)} for o in outs]

    def _stored_tokens(self, chunk_keys: Sequence[str]) -> int:
        """Tokens of the request's leading chunks found in the persistent store's files."""
        from vlmcache.store.chunkfile import SUFFIX

        root = Path(self.store) / "kv" / "chunks"
        stored = 0
        for key in chunk_keys:
            if not (root / key[:2] / f"{key}{SUFFIX}").exists():
                break
            stored += 1
        return stored * self.block_size

    def timed(self, seeds: Sequence[int]) -> dict[str, Any]:
        """Batch 1: each request alone; median latency and what was reused."""
        ms, facts = [], []
        self.plain_facts = []
        for s in seeds:
            facts += self.generate([s])
            ms.append(facts[-1]["wall_s"] * 1e3)
            facts[-1]["core"] = engine_core_cpu()  # where its engine's main thread ran
            facts[-1]["place"] = self.turns.place  # its turn's place in the round
        out = _timed_summary(ms, facts)
        if self.plain_facts:
            out["plain"] = _timed_summary([f["wall_s"] * 1e3 for f in self.plain_facts],
                                          self.plain_facts)
        return out

    def batched(self, seeds: Sequence[int]) -> dict[str, Any]:
        facts = self.generate(seeds)
        wall = facts[0]["wall_s"]
        tokens = sum(f["prompt"] for f in facts)
        return {"batch": len(seeds), "wall_ms": round(wall * 1e3, 1),
                "prompt_tok_s": round(tokens / wall), **_token_summary(facts)}

    def reset_gpu_cache(self, settle_s: float) -> None:
        time.sleep(settle_s)  # asynchronous stores land first
        with self.turns.turn():
            if not self.llm.reset_prefix_cache():
                raise RuntimeError("vLLM refused to reset its prefix cache")

    def close(self) -> None:
        if self.cached is not None:
            with self.turns.turn():
                self.cached.close()


def _timed_summary(ms: list[float], facts: list[dict[str, Any]]) -> dict[str, Any]:
    by_place: dict[int, list[float]] = {}
    for m, f in zip(ms, facts):
        if f.get("place") is not None:
            by_place.setdefault(f["place"], []).append(m)
    return {"median_ms": round(statistics.median(ms), 2), "min_ms": round(min(ms), 2),
            "all_ms": [round(m, 2) for m in ms], **_token_summary(facts),
            # where the turn's place in its round mattered (turns.py): median, count
            "by_place_ms": {str(p): [round(statistics.median(v), 2), len(v)]
                            for p, v in sorted(by_place.items())},
            "phases_ms": [{**{k: round(f[k], 2) for k in PHASES + OURS if k in f},
                           "core": f.get("core"), "place": f.get("place")} for f in facts]}


def _token_summary(facts: list[dict[str, Any]]) -> dict[str, Any]:
    """Median tokens per request: prompt, loaded, from prefix cache, computed; and the
    median time per phase."""
    def med(fn: Any) -> float:
        return statistics.median(fn(f) for f in facts)

    if "cached" in facts[0]:  # plain vLLM: loaded and prefix-cached are one number
        out = {"prompt_tokens": med(lambda f: f["prompt"]),
               "tokens_cached": med(lambda f: f["cached"]),
               "tokens_computed": med(lambda f: f["prompt"] - f["cached"])}
        return {**out, **phase_medians(facts)}
    choices = sorted({str(f["choice"]) for f in facts if f["choice"]})
    return {"prompt_tokens": med(lambda f: f["prompt"]),
            "tokens_loaded": med(lambda f: f["loaded"]),
            "tokens_from_prefix_cache": med(lambda f: f["prefix"]),
            "tokens_computed": med(lambda f: f["prompt"] - f["loaded"] - f["prefix"]),
            "tokens_stored": med(lambda f: f["stored"]),
            "cost_model_choices": choices,
            "cost_model_reason": next((f["reason"] for f in facts if f["reason"]), None),
            **phase_medians(facts)}
