"""Replays a benchmark's requests through one mode's engine and records each outcome.

Runs in its own process per mode (``python -m vlmcache.bench.harness SPEC MODE OUT``) so
modes share nothing but the request list, which every process rebuilds from the same
:class:`BenchSpec`. Prints ``progress i n`` lines for the parent's progress bar and writes
one :class:`~vlmcache.bench.types.RequestResult` JSON per line.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from vlmcache.bench.modes import MODES, Mode, gpu_available
from vlmcache.bench.types import BenchRequest, RequestResult
from vlmcache.bench.video import (BUILTIN_VIDEO_MODEL, VideoBenchRequest, build_video_requests,
                                  video_engine_args)

logger = logging.getLogger(__name__)

BUILTIN_MODEL = "builtin:tiny-vqa"


@dataclass(frozen=True)
class BenchSpec:
    """Everything that decides a run's requests and engine settings (JSON round-trips)."""

    dataset: str = "easy-vqa"
    image_dir: str | None = None
    limit: int | None = 400
    workloads: tuple[str, ...] = ()
    n: int = 200
    seed: int = 0
    tenants: int = 2
    model: str = BUILTIN_MODEL
    model_dir: str = ".cache/tiny-vqa"
    prompt_template: str | None = None
    max_tokens: int = 4
    threshold: float = 0.85
    store_root: str = ""
    offload_gib: float = 1.0
    engine: dict[str, Any] = field(default_factory=dict)
    workload: str = "image"  # "image" (dataset workloads) | "video" (bench.video's trace)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> "BenchSpec":
        data = json.loads(text)
        data["workloads"] = tuple(data.get("workloads", ()))
        return cls(**data)


def build_requests(spec: BenchSpec) -> list[BenchRequest] | list[VideoBenchRequest]:
    """The run's requests, identical in every process for the same ``spec``."""
    if spec.workload == "video":
        return build_video_requests(spec.n, spec.seed, spec.tenants)
    from vlmcache.bench.datasets import load_dataset
    from vlmcache.bench.workloads import DEFAULT_WORKLOADS
    from vlmcache.bench.workloads import build_requests as build

    samples = load_dataset(spec.dataset, limit=spec.limit,
                           image_dir=Path(spec.image_dir) if spec.image_dir else None)
    return build(samples, spec.workloads or DEFAULT_WORKLOADS, spec.n, spec.seed,
                 tenants=spec.tenants)


def model_path(spec: BenchSpec) -> str:
    """The model directory (the built-in models are assembled on first use)."""
    if spec.model == BUILTIN_VIDEO_MODEL:
        from vlmcache.testing.tiny_video import build_tiny_video

        return str(build_tiny_video(spec.model_dir))
    if spec.model != BUILTIN_MODEL:
        return spec.model
    from vlmcache.models.tiny_vqa import build_tiny_vqa

    return str(build_tiny_vqa(spec.model_dir))


def prompt_format(spec: BenchSpec) -> tuple[Callable[[str], str], Callable[[str], str]]:
    """(question -> prompt, output text -> normalized answer) for the spec's model."""
    if spec.prompt_template is None and spec.model == BUILTIN_VIDEO_MODEL:
        from vlmcache.testing.tiny_video import TINY_VIDEO_PROMPT

        return (lambda q: TINY_VIDEO_PROMPT.format(question=q)), normalize_text
    if spec.prompt_template is None:
        if spec.model != BUILTIN_MODEL:
            raise ValueError("--prompt-template is needed for a model other than the built-in")
        from vlmcache.models.tiny_vqa import make_prompt, normalize_answer

        return make_prompt, normalize_answer
    template = spec.prompt_template
    return (lambda q: template.format(question=q)), normalize_text


def normalize_text(text: str) -> str:
    """Lower case, no surrounding punctuation or articles: how answers are compared."""
    text = re.sub(r"[^\w\s]", " ", text.strip().lower())
    return " ".join(w for w in text.split() if w not in ("a", "an", "the"))


def engine_args(spec: BenchSpec, mode: Mode) -> dict[str, Any]:
    """Shared engine settings plus the mode's own (prefix caching, offloading)."""
    # vLLM records a request's timestamps (TTFT, queue -> last token) only with stats on
    args: dict[str, Any] = {"max_model_len": 512, "enforce_eager": True,
                            "limit_mm_per_prompt": {"image": 1}, "seed": 0,
                            "disable_log_stats": False}
    if spec.workload == "video":
        args.update(video_engine_args())
    if spec.model == BUILTIN_MODEL:
        args.update({"dtype": "float32", "block_size": 32})
    elif spec.model == BUILTIN_VIDEO_MODEL:
        args["block_size"] = 32
    if not gpu_available():
        args["gpu_memory_utilization"] = 0.3
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    args.update(spec.engine)
    args.update(mode.engine_overrides(spec.offload_gib))
    return args


#: vlmcache's CPU tier (bytes of /dev/shm) per engine when the benchmark runs on the CPU.
CPU_MEMORY_BUDGET = 512 * 1024**2


def cache_config(spec: BenchSpec, mode: Mode) -> Any:
    """The mode's :class:`VlmCacheConfig` on this run's store (shared across restarts)."""
    from vlmcache.config import VlmCacheConfig

    store = Path(spec.store_root) / mode.name.replace(":", "-")
    builtin = spec.model in (BUILTIN_MODEL, BUILTIN_VIDEO_MODEL)
    block = 32 if builtin else spec.engine.get("block_size")
    # the CPU tier is a fixed shared-memory region of memory_budget bytes: keep it small
    # beside a CPU engine (vLLM-CPU's own KV space is 1 GiB here)
    memory = {} if gpu_available() else {"memory_budget": CPU_MEMORY_BUDGET}
    switches = mode.config_overrides()
    if spec.workload != "video":  # no videos to match: the tier would only log a "skip"
        switches["enable_video_near_duplicates"] = False
    return VlmCacheConfig(store_path=str(store), block_size=block, log_requests=False, **memory,
                          image_threshold=spec.threshold, semantic_text_threshold=spec.threshold,
                          prompt_threshold=spec.threshold, **switches)


class ModeRunner:
    """One mode's engine, restartable on the same store."""

    def __init__(self, spec: BenchSpec, mode: Mode) -> None:
        self.spec, self.mode = spec, mode
        self.model = model_path(spec)
        self.make_prompt, self.normalize = prompt_format(spec)
        from vllm import SamplingParams

        self.params = SamplingParams(temperature=0.0, max_tokens=spec.max_tokens)
        self.llm = self._start()
        # (tenant, image content hash, question) -> (this mode's answer, true answer): what
        # a similarity hit on that request would answer, for the threshold sweep
        self._served: dict[tuple[str | None, str, str], tuple[str, str | None]] = {}

    def _start(self) -> Any:
        from vlmcache.api import CachedLLM

        return CachedLLM(self.model, cache_config(self.spec, self.mode),
                         enabled=self.mode.vlmcache,
                         engine_args=engine_args(self.spec, self.mode))

    def restart(self) -> None:
        """Close the engine (the store persists what it holds) and start a new one."""
        self.llm.close()
        self.llm = self._start()

    def run(self, req: BenchRequest | VideoBenchRequest, after_restart: bool) -> RequestResult:
        vreq, own_hash = self._vlm_request(req)
        # the threshold sweep scores image and text candidates: image requests only
        scores, pointers = self._candidates(vreq, own_hash) if own_hash else ({}, {})
        start = time.perf_counter()
        out = self.llm.generate([vreq], self.params)[0]
        wall_ms = (time.perf_counter() - start) * 1e3
        rep = out.report
        answered = {k: self._served[p] for k, p in pointers.items() if p in self._served}
        if own_hash:
            self._served.setdefault((req.tenant, own_hash, req.question),
                                    (self.normalize(out.text), req.answer))
        return RequestResult(
            mode=self.mode.name, index=req.index, workload=req.workload, tenant=req.tenant,
            image_id=req.medium_id, question=req.question, answer_gt=req.answer,
            output=self.normalize(out.text), latency_ms=round(wall_ms, 3),
            ttft_ms=round(rep.ttft_s * 1e3, 3) if rep.ttft_s else None,
            prompt_tokens=rep.prompt_tokens, tokens_loaded=rep.tokens_loaded,
            tokens_prefix_cache=rep.tokens_from_prefix_cache,
            tokens_computed=rep.tokens_computed, hit_tier=rep.hit_tier,
            statuses=dict(rep.statuses), similarity=rep.similarity,
            images_loaded=rep.images_loaded, images_encoded=rep.images_encoded,
            after_restart=after_restart, log_line=rep.log_line(), candidates=scores,
            candidate_answers={k: a for k, (a, _) in answered.items()},
            candidate_gts={k: gt for k, (_, gt) in answered.items()})

    def _vlm_request(self, req: BenchRequest | VideoBenchRequest) -> tuple[Any, str | None]:
        """The request for ``CachedLLM`` and its image's content hash (``None``: a video)."""
        from vlmcache.api import VlmRequest
        from vlmcache.keys import image_content_hash

        prompt = self.make_prompt(req.question)
        if isinstance(req, VideoBenchRequest):
            # the clip is encoded here, outside the timed call, as a client would send it
            return VlmRequest(prompt, (), req.tenant, req.question, (req.clip.load(),)), None
        image = req.image.load()
        return VlmRequest(prompt, (image,), req.tenant, req.question), image_content_hash(image)

    def _candidates(self, vreq: Any, own_hash: str) -> tuple[
            dict[str, float], dict[str, tuple[str | None, str, str]]]:
        """Best similarity scores before the request runs (for the threshold sweep), and
        per key the cached request each candidate points to."""
        cascade = self.llm._cascade
        if cascade.image is None and cascade.text is None:
            return {}, {}
        found = cascade.best_candidates(vreq.prompt, (own_hash,), vreq.tenant,
                                        images=vreq.images, question=vreq.question)
        scores = {k: round(float(v), 4) for k, v in
                  (("image", found.image_score), ("text", found.text_score)) if v is not None}
        pointers: dict[str, tuple[str | None, str, str]] = {}
        if found.image_canonical is not None:
            pointers["image"] = (vreq.tenant, found.image_canonical, vreq.question)
        if found.text_question is not None:
            image_hit = (found.image_score is not None and cascade.image is not None
                         and found.image_score >= cascade.image.threshold)
            context = found.image_canonical if image_hit and found.image_canonical else own_hash
            pointers["text"] = (vreq.tenant, context, found.text_question)
        return scores, pointers

    def close(self) -> None:
        self.llm.close()


def run_mode(spec: BenchSpec, mode_name: str, out: Path,
             progress: Callable[[int, int], None] | None = None) -> None:
    """Replay every request in ``mode_name``; one JSON result per line in ``out``."""
    requests = build_requests(spec)
    runner = ModeRunner(spec, MODES[mode_name])
    try:
        with out.open("w", encoding="utf-8") as f:
            for i, req in enumerate(requests):
                if req.restart_before:
                    runner.restart()
                result = runner.run(req, after_restart=req.restart_before)
                f.write(json.dumps(result.to_json()) + "\n")
                if progress is not None:
                    progress(i + 1, len(requests))
    finally:
        runner.close()


def read_results(path: Path) -> list[RequestResult]:
    """The results a mode's process wrote."""
    with path.open(encoding="utf-8") as f:
        return [RequestResult.from_json(json.loads(line)) for line in f if line.strip()]


def _print_progress(done: int, total: int) -> None:
    print(f"progress {done} {total}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 3:
        print("usage: python -m vlmcache.bench.harness SPEC.json MODE OUT.jsonl", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING)
    spec = BenchSpec.from_json(Path(args[0]).read_text())
    run_mode(spec, args[1], Path(args[2]), _print_progress)
    return 0


if __name__ == "__main__":
    sys.exit(main())
