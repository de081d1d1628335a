"""End-to-end front_ms (call -> engine core queued_ts) for CachedLLM vs plain vllm.LLM."""
import json, os, statistics, sys, tempfile, time
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
import numpy as np
from PIL import Image

def main():
    mode = sys.argv[1]          # cached | plain
    side = int(sys.argv[2]) if len(sys.argv) > 2 else 336
    N = int(sys.argv[3]) if len(sys.argv) > 3 else 30
    from pathlib import Path

    from vlmcache.testing.tiny_llava import build_tiny_llava

    work = Path(os.environ.get("PICKUP_DIR", "/tmp/engine-pickup"))
    work.mkdir(parents=True, exist_ok=True)
    MODEL = str(work / "tiny")
    if not (work / "tiny" / "config.json").exists():
        build_tiny_llava(work / "tiny")
    QUESTION = ("Please describe in detail every colored shape that you can see in this picture "
                "and say where each of them is placed.")
    PROMPT = f"USER: <image>\n{QUESTION} ASSISTANT:"

    def _image(seed, side):
        rng = np.random.default_rng(seed)
        return Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8))

    from vlmcache.bench.phase_timing import phases
    from vllm import SamplingParams
    params = SamplingParams(temperature=0.0, max_tokens=1)
    eargs = {"gpu_memory_utilization": 0.3, "max_model_len": 1024, "enforce_eager": True, "seed": 0,
             "block_size": 32, "limit_mm_per_prompt": {"image": 1}, "enable_prefix_caching": True,
             "disable_log_stats": False, "max_num_seqs": 64}
    if mode.startswith("plain"):
        from vllm import LLM
        if mode == "plain_cbor":
            eargs["prefix_caching_hash_algo"] = "sha256_cbor"
        llm = LLM(model=MODEL, **eargs); cached = None
    else:
        from vlmcache.api import CachedLLM, VlmRequest
        from vlmcache.config import VlmCacheConfig
        store = tempfile.mkdtemp(prefix="store-", dir=str(work))
        extra = {}
        if mode == "cached_always":
            extra["admission_memory"] = "always"
        if mode == "cached_mem":
            extra["disk_budget"] = 0
        cfg = VlmCacheConfig(store_path=store, memory_budget=256 * 1024**2, enable_encoder_cache=False,
                             enable_exact=False, log_requests=False, model_revision="dummy-weights",
                             block_size=32, **extra)
        cached = CachedLLM(MODEL, cfg, engine_args=eargs); llm = cached.llm
        cached.image_placeholder = "<image>"
        # record when CachedLLM hands over to vLLM
        handoff = []
        orig = llm.generate
        def wrapped(*a, **k):
            handoff.append(time.perf_counter()); return orig(*a, **k)
        llm.generate = wrapped

    global seed
    # ---- main-process instrumentation (profiling only) ----
    TL = {}
    def _wrap(obj, name, key, is_class=False):
        o = getattr(obj, name)
        def w(*a, **k):
            t0 = time.perf_counter(); r = o(*a, **k); t1 = time.perf_counter()
            TL.setdefault(key, []).append((t0, t1)); return r
        setattr(obj, name, w)
    eng = llm.llm_engine
    _wrap(llm, "_preprocess_cmpl_one", "render")
    _wrap(eng, "add_request", "engine_add")
    _wrap(eng.input_processor, "process_inputs", "process_inputs")
    _wrap(eng.engine_core, "add_request", "core_send")
    from vllm.multimodal.processing.inputs import ProcessorInputs
    _o_h = ProcessorInputs.get_mm_hashes
    def _h(self, *a, **k):
        t0 = time.perf_counter(); r = _o_h(self, *a, **k); TL.setdefault("mm_hash", []).append((t0, time.perf_counter())); return r
    ProcessorInputs.get_mm_hashes = _h
    _o_send = eng.engine_core.add_request

    global ROWS
    ROWS = []
    seed = [1000]
    def one(kind, gap):
        seed[0] += 1
        im = _image(seed[0], side)
        if gap: time.sleep(gap)
        start = time.perf_counter()
        if kind == "cached":
            out = cached.generate([VlmRequest(PROMPT, (im,))], params)[0].output
            pre = (handoff[-1] - start) * 1e3
        elif kind == "raw_plain":
            out = orig_gen([{"prompt": PROMPT, "multi_modal_data": {"image": im}}], params, use_tqdm=False)[0]
            pre = 0.0
        elif kind == "raw_ours":  # exactly what CachedLLM sends, prebuilt outside the timer
            from vlmcache.api import _with_transfer_params
            from vlmcache.keys import image_content_hash, image_uuid
            h = image_content_hash(im)
            p = _with_transfer_params(params, False, None)
            pr = {"prompt": PROMPT, "multi_modal_data": {"image": im},
                  "multi_modal_uuids": {"image": [image_uuid("", None, h)]}}
            start = time.perf_counter()
            out = orig_gen([pr], [p], use_tqdm=False)[0]
            pre = 0.0
        end = time.perf_counter()
        ph = phases(out, start, end)
        def last(k):
            v = TL.get(k); return v[-1] if v else (float("nan"), float("nan"))
        r0, r1 = last("render"); h0, h1 = last("mm_hash"); a0, a1 = last("engine_add")
        p0, p1 = last("process_inputs"); s0, s1 = last("core_send")
        q = out.metrics.queued_ts
        ph.update({"t_to_render_ms": (r0 - start) * 1e3, "render_ms": (r1 - r0) * 1e3,
                   "mm_hash_ms": (h1 - h0) * 1e3 if h0 >= start else 0.0,
                   "render_to_engine_add_ms": (a0 - r1) * 1e3, "process_inputs_ms": (p1 - p0) * 1e3,
                   "to_core_send_ms": (s0 - p1) * 1e3, "core_send_ms": (s1 - s0) * 1e3,
                   "send_to_queued_ms": (q - s0) * 1e3})
        ROWS.append({"kind": kind, "gap": gap, "rid": out.request_id, "start": start, "send": s0, "queued": q, **ph})
        ph["pre_ms"] = pre
        ph["total_ms"] = (end - start) * 1e3
        return ph

    orig_gen = orig if cached else llm.generate
    kinds = ["cached", "raw_ours", "raw_plain"] if cached else ["raw_plain"]
    for _ in range(5):
        one(kinds[0], 0)
    res = {}
    for gap in (0.0, 0.3):
        for kind in kinds:
            rows = [one(kind, gap) for _ in range(N)]
            rows = [r for r in rows if "front_ms" in r]
            res[f"{kind} gap={gap}"] = {k: round(statistics.median(r[k] for r in rows), 3)
                                        for k in ("pre_ms", "t_to_render_ms", "render_ms", "mm_hash_ms", "render_to_engine_add_ms", "process_inputs_ms", "to_core_send_ms", "core_send_ms", "send_to_queued_ms", "front_ms", "queue_ms", "engine_ms", "return_ms", "total_ms")} | {"n": len(rows)}
    for k, v in res.items():
        print(f"RESULT {mode} side={side} {k}: {json.dumps(v)}")
    json.dump(res, open(work / f"e2e_{mode}_{side}.json", "w"), indent=1)
    json.dump(ROWS, open(work / f"rows_{mode}_{side}.json", "w"))
    if cached: cached.close()

if __name__ == '__main__':
    main()
