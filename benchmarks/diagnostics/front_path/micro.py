"""Per-component micro-timings of CachedLLM.generate's front path (no engine)."""
import copy, hashlib, statistics, sys, time, json, tempfile, types
import numpy as np
from PIL import Image

from vlmcache.api import (CachedLLM, VlmRequest, validate_request, _with_transfer_params)
from vlmcache.cascade import Cascade
from vlmcache.config import VlmCacheConfig
from vlmcache.keys import image_content_hash, image_uuid
from vllm import SamplingParams
from vllm.multimodal.hasher import MultiModalHasher

N = int(sys.argv[1]) if len(sys.argv) > 1 else 300
OUT = sys.argv[2] if len(sys.argv) > 2 else "micro.json"
QUESTION = "Describe the image in detail."
PROMPT = f"USER: <image>\n{QUESTION} ASSISTANT:"

def _image(seed, side):
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8))

def timeit(fn, args_list):
    ts = []
    for a in args_list:
        t0 = time.perf_counter(); fn(a); ts.append(time.perf_counter() - t0)
    ts.sort()
    return statistics.median(ts) * 1e6, ts[int(len(ts) * 0.9)] * 1e6

# A CachedLLM shell without an engine, configured like the GPU bench's _vlmcache_llm
store = tempfile.mkdtemp(prefix="store", dir=tempfile.gettempdir())
cfg = VlmCacheConfig(store_path=store, enable_encoder_cache=False, enable_exact=False,
                     log_requests=False, model_revision="dummy-weights")
llm = CachedLLM.__new__(CachedLLM)
llm.config, llm.enabled, llm.model = cfg, True, "tiny-model-id"
llm.image_placeholder = "<image>"
llm._cascade = Cascade(None)
params = SamplingParams(temperature=0.0, max_tokens=1)

results = {}
for side in (336, 672):
    imgs = [_image(s, side) for s in range(N)]
    reqs = [VlmRequest(PROMPT, (im,)) for im in imgs]
    r = {}
    r["validate_request"] = timeit(lambda q: validate_request(q, 0, "<image>"), reqs)
    r["image_content_hash (sha256, tobytes)"] = timeit(image_content_hash, imgs)
    r["  im.tobytes() alone"] = timeit(lambda im: im.tobytes(), imgs)
    r["  np.asarray(im) alone"] = timeit(lambda im: np.asarray(im), imgs)
    byts = [im.tobytes() for im in imgs]
    r["  sha256(bytes) alone"] = timeit(lambda b: hashlib.sha256(b).digest(), byts)
    r["  blake2b(bytes) alone"] = timeit(lambda b: hashlib.blake2b(b).digest(), byts)
    try:
        import blake3
        r["  blake3(bytes) alone"] = timeit(lambda b: blake3.blake3(b).digest(), byts)
        r["  blake3(bytes, max_threads=AUTO)"] = timeit(
            lambda b: blake3.blake3(b, max_threads=blake3.blake3.AUTO).digest(), byts)
    except ImportError:
        pass
    try:
        import xxhash
        r["  xxh3_128(bytes) alone"] = timeit(lambda b: xxhash.xxh3_128_digest(b), byts)
    except ImportError:
        pass
    def h_b3(im):
        import blake3
        h = blake3.blake3(f"{im.mode}\0{im.size[0]}x{im.size[1]}\0".encode())
        h.update(im.tobytes()); return h.hexdigest()
    r["alt: blake3 over tobytes"] = timeit(h_b3, imgs)
    def h_b2(im):
        h = hashlib.blake2b(f"{im.mode}\0{im.size[0]}x{im.size[1]}\0".encode(), digest_size=32)
        h.update(im.tobytes()); return h.hexdigest()
    r["alt: blake2b over tobytes"] = timeit(h_b2, imgs)
    # vLLM's own hashing (what it does when no multi_modal_uuids are given)
    r["vLLM MultiModalHasher.hash_kwargs blake3 (no uuid)"] = timeit(
        lambda im: MultiModalHasher.hash_kwargs("blake3", model_id="tiny-model-id", image=im), imgs)
    r["vLLM MultiModalHasher.hash_kwargs sha256 (no uuid)"] = timeit(
        lambda im: MultiModalHasher.hash_kwargs("sha256", model_id="tiny-model-id", image=im), imgs)
    hashes = [(image_content_hash(im),) for im in imgs]
    r["_resolve (Cascade(None))"] = timeit(lambda i: llm._resolve(reqs[i], hashes[i], False), range(N))
    r["_with_transfer_params (deepcopy)"] = timeit(lambda _: _with_transfer_params(params, False, None), range(N))
    r["  copy.deepcopy(SamplingParams) alone"] = timeit(lambda _: copy.deepcopy(params), range(N))
    r["  params.clone() alone"] = timeit(lambda _: params.clone(), range(N))
    res = [llm._resolve(reqs[i], hashes[i], False) for i in range(N)]
    r["_vllm_prompt (incl image_uuid)"] = timeit(lambda i: llm._vllm_prompt(reqs[i], res[i], hashes[i]), range(N))
    r["  image_uuid alone"] = timeit(lambda i: image_uuid("", None, hashes[i][0]), range(N))
    # after generate: _report and _remember with a fake RequestOutput
    def fake_out(i):
        m = types.SimpleNamespace(queued_ts=1.0, last_token_ts=2.0, first_token_latency=0.1)
        kvp = {"vlmcache": {"prompt_tokens": 600, "tokens_loaded": 0, "tokens_from_prefix_cache": 0,
                            "blocks_saved": 37, "chunk_keys": [f"{j:064x}" for j in range(37)],
                            "bypass": False}}
        return types.SimpleNamespace(request_id=str(i), kv_transfer_params=kvp, ec_transfer_params=None,
                                     metrics=m, prompt_token_ids=list(range(600)), num_cached_tokens=0)
    outs = [fake_out(i) for i in range(N)]
    r["_report (after generate)"] = timeit(lambda i: llm._report(outs[i], res[i], 0.1), range(N))
    reps = [llm._report(outs[i], res[i], 0.1) for i in range(N)]
    r["_remember (after generate)"] = timeit(lambda i: llm._remember(reqs[i], res[i], reps[i]), range(N))
    # whole pre-generate block exactly as in CachedLLM.generate, for batch 1
    def pre(i):
        rq = [validate_request(q, j, llm.image_placeholder) for j, q in enumerate([reqs[i]])]
        hs = [tuple(image_content_hash(im) for im in q.images) for q in rq]
        rs = [llm._resolve(q, h, False) for q, h in zip(rq, hs)]
        ps = [_with_transfer_params(params or SamplingParams(), False, q.tenant) for q in rq]
        pr = [llm._vllm_prompt(q, s, h) for q, s, h in zip(rq, rs, hs)]
        return pr, ps
    r["TOTAL pre-generate (batch 1)"] = timeit(pre, range(N))
    results[side] = r

keys = list(results[336])
print(f"{'component':55s} {'336 med':>9s} {'336 p90':>9s} {'672 med':>9s} {'672 p90':>9s}  (us)")
for k in keys:
    a, b = results[336][k], results[672][k]
    print(f"{k:55s} {a[0]:9.1f} {a[1]:9.1f} {b[0]:9.1f} {b[1]:9.1f}")
json.dump({str(s): {k: v for k, v in r.items()} for s, r in results.items()}, open(OUT, "w"), indent=1)
