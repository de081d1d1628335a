"""The front inside a real vLLM OpenAI server, driven with the official `openai` client."""

from __future__ import annotations

import base64
import io

import httpx
import openai
import pytest
from PIL import Image

pytestmark = pytest.mark.vllm

COLOR_Q = "what is the color of the shape?"


def _url(image: Image.Image, fmt: str = "PNG") -> str:
    buf = io.BytesIO()
    image.convert("RGB").save(buf, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def images() -> list[Image.Image]:
    """easy-vqa test images whose shapes have different colours (answers differ)."""
    from vlmcache.bench.datasets import load_easy_vqa

    seen: dict[str, Image.Image] = {}
    for s in load_easy_vqa("test", limit=600):
        if s.question == COLOR_Q and s.answer not in seen:
            seen[s.answer] = Image.open(s.image_path).convert("RGB")
    return list(seen.values())[:4]


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def ask(client, model, question, image_url, *, uuid=None, tenant=None, **kw):
    part = {"type": "image_url", "image_url": {"url": image_url}}
    if uuid is not None:
        part["uuid"] = uuid
    extra = {"cache_salt": tenant} if tenant else {}
    resp = client.chat.completions.create(
        model=model, temperature=0, max_tokens=4, extra_body=extra or None,
        messages=[{"role": "user", "content": [part, {"type": "text", "text": question}]}], **kw)
    return resp.choices[0].message.content, resp.model_extra["vlmcache"]


def test_repeat_then_spacing_then_paraphrase(client, server, images):
    model = str(server.argv[4])
    url = _url(images[0])
    first, r1 = ask(client, model, COLOR_Q, url, tenant="acme")
    assert r1["hit_tier"] is None and r1["statuses"]["response"] == "miss"
    again, r2 = ask(client, model, COLOR_Q, url, tenant="acme")
    assert (again, r2["hit_tier"]) == (first, "response")
    spaced, r3 = ask(client, model, "  What is the color of   the shape? ", url, tenant="acme")
    assert r3["hit_tier"] == "text:exact" and spaced == first
    assert r3["tokens_loaded"] + r3["tokens_from_prefix_cache"] > 0
    para, r4 = ask(client, model, "which colour does the shape have?", url, tenant="acme")
    assert r4["hit_tier"] in ("semantic_text", "embedding:prompt"), r4
    assert para == first and r4["canonical_prompt"] is not None


def test_a_second_question_names_the_held_image_by_identity_alone(client, server, images):
    """vLLM answers from its processor cache when the front names an image it processed
    without the image's data (``held_media_bytes``): the answer the full image gets."""
    model = str(server.argv[4])
    url = _url(images[2])
    ask(client, model, COLOR_Q, url, tenant="held")
    named, r = ask(client, model, "what shape is in the image?", url, tenant="held")
    assert r["held_media"] == "elided" and r["hit_tier"] is None, r
    full, other = ask(client, model, "what shape is in the image?", url, tenant="held-2")
    assert "held_media" not in other and named == full


def test_re_encoded_image_is_canonicalized_and_reuses_the_prompt(client, server, images):
    model = str(server.argv[4])
    first, _ = ask(client, model, "what shape is in the image?", _url(images[1]), tenant="acme")
    jpeg, r = ask(client, model, "what shape is in the image?", _url(images[1], "JPEG"),
                  tenant="acme")
    assert r["hit_tier"] == "embedding:vision" and r["canonical_images"], r
    assert r["tokens_loaded"] + r["tokens_from_prefix_cache"] > 0
    assert jpeg == first


def test_a_canonicalized_request_aborts_the_engine_call_started_before_it(client, server,
                                                                          images):
    """A miss's engine call starts while the cascade looks (``miss_overlap_max_inflight``):
    on a near-duplicate it is aborted inside vLLM, and only the canonical request finishes."""
    model = str(server.argv[4])
    _idle(server.url)  # an earlier test's dropped call winding down holds an overlap slot
    before = _finished(server.url)
    first, r1 = ask(client, model, "what shape is in the image?", _url(images[2]),
                    tenant="overlap")
    _idle(server.url)
    jpeg, r2 = ask(client, model, "what shape is in the image?", _url(images[2], "JPEG"),
                   tenant="overlap")
    assert (r1["miss_overlap"], r2["miss_overlap"]) == ("kept", "dropped")
    assert r2["hit_tier"] == "embedding:vision" and jpeg == first
    assert _finished(server.url) == before + 2  # the dropped call never finished


def test_a_streamed_canonicalized_request_gets_only_the_canonical_stream(client, server,
                                                                          images):
    model = str(server.argv[4])
    _idle(server.url)
    before = _finished(server.url)
    first, _ = ask(client, model, "what shape is in the image?", _url(images[2]),
                   tenant="overlap-stream")
    _idle(server.url)
    stream = client.chat.completions.create(
        model=model, temperature=0, max_tokens=4, stream=True,
        extra_body={"cache_salt": "overlap-stream"},
        messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": _url(images[2], "JPEG")}},
            {"type": "text", "text": "what shape is in the image?"}]}])
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    report = chunks[-1].model_extra["vlmcache"]
    assert (report["miss_overlap"], report["hit_tier"]) == ("dropped", "embedding:vision")
    assert text == first
    assert _finished(server.url) == before + 2


def _idle(url: str, timeout_s: float = 60.0) -> None:
    """Wait until vLLM runs and queues no request (a front counts an engine call in flight
    until vLLM has let it go: ``miss_overlap_max_inflight``), and the front's bookkeeping
    after it."""
    import time

    from prometheus_client.parser import text_string_to_metric_families

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        busy = sum(s.value for f in text_string_to_metric_families(
            httpx.get(url + "/metrics").text) for s in f.samples
            if s.name in ("vllm:num_requests_running", "vllm:num_requests_waiting"))
        if busy == 0:
            time.sleep(0.5)
            return
        time.sleep(0.1)
    raise AssertionError(f"vLLM still busy after {timeout_s} s")


def _finished(url: str) -> float:
    """Requests vLLM finished with an answer (stop or length), from its own metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    return sum(s.value for f in text_string_to_metric_families(httpx.get(url + "/metrics").text)
               for s in f.samples if s.name == "vllm:request_success_total"
               and s.labels.get("finished_reason") in ("stop", "length"))


def test_other_tenant_misses_every_tier(client, server, images):
    model = str(server.argv[4])
    url = _url(images[2])
    ask(client, model, COLOR_Q, url, tenant="acme")
    _, r = ask(client, model, COLOR_Q, url, tenant="globex")
    assert r["hit_tier"] is None
    assert r["statuses"]["response"] == "miss" and r["statuses"]["exact_text"] == "miss"
    assert r["tokens_loaded"] == 0 and r["tokens_from_prefix_cache"] == 0


def test_shared_uuid_attack_does_not_leak(client, server, images):
    """Issue 12: image 4 under uuid "img-shared-1" (no salt), then image 5 under the same
    uuid for tenant B: B must get image 5's answer, computed from image 5."""
    model = str(server.argv[4])
    a, b = images[0], images[3]
    honest_b, _ = ask(client, model, COLOR_Q, _url(b), tenant="honest-c")
    honest_a, _ = ask(client, model, COLOR_Q, _url(a), tenant="honest-c")
    assert honest_a != honest_b  # the attack would be visible
    ask(client, model, COLOR_Q, _url(a), uuid="img-shared-1")
    answer, report = ask(client, model, COLOR_Q, _url(b), uuid="img-shared-1", tenant="B")
    assert answer == honest_b
    assert report["images_loaded"] == 0


def test_streaming_matches_and_a_streamed_repeat_is_a_response_hit(client, server, images):
    model = str(server.argv[4])
    url = _url(images[3])
    plain, _ = ask(client, model, "what shape does the image contain?", url)
    for expected_tier in ("response", "response"):
        stream = client.chat.completions.create(
            model=model, temperature=0, max_tokens=4, stream=True,
            messages=[{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": url}},
                {"type": "text", "text": "what shape does the image contain?"}]}])
        chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == plain
        assert chunks[-1].model_extra["vlmcache"]["hit_tier"] == expected_tier


@pytest.mark.parametrize("content, field", [
    ([{"type": "image_url", "image_url": {"url": "data:image/png;base64,aGVsbG8="}}],
     "messages[0].content[0].image_url"),
    ([{"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 400_000}}],
     "messages[0].content[0].image_url"),
    ([{"type": "image_embeds", "image_embeds": "AAAA"}], "messages[0].content[0]"),
])
def test_bad_inputs_get_a_400_naming_the_field(client, server, content, field):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=str(server.argv[4]), max_tokens=2, messages=[
            {"role": "user", "content": [*content, {"type": "text", "text": "hi"}]}])
    assert err.value.body["param"] == field if isinstance(err.value.body, dict) else True
    assert field in str(err.value)


def test_unknown_option_and_oversized_prompt_are_refused_and_the_server_keeps_serving(
        client, server, images):
    model = str(server.argv[4])
    with pytest.raises(openai.BadRequestError, match="vlmcache"):
        client.chat.completions.create(model=model, max_tokens=2, messages=[
            {"role": "user", "content": "hi"}], extra_body={"vlmcache": {"bypas": True}})
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model, max_tokens=2, temperature=0, messages=[
            {"role": "user", "content": "word " * 3000}])
    text, report = ask(client, model, "what shape is present?", _url(images[0]))
    assert text and report["statuses"]["response"] == "miss"


def test_metrics_count_what_the_responses_said_and_logs_reach_the_server_log(client, server,
                                                                              images):
    from prometheus_client.parser import text_string_to_metric_families

    model = str(server.argv[4])
    url = _url(images[1])
    before = _response_hits(server.url)
    for _ in range(3):
        ask(client, model, "is there a red shape?", url, tenant="metrics")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(httpx.get(server.url + "/metrics").text)
               for s in f.samples}
    hits = samples[("vlmcache_tier_lookups_total",
                    (("status", "hit"), ("tenant", "metrics"), ("tier", "response")))]
    misses = samples[("vlmcache_tier_lookups_total",
                      (("status", "miss"), ("tenant", "metrics"), ("tier", "response")))]
    assert (hits, misses) == (2, 1)
    assert _response_hits(server.url) == before + 2
    # vLLM's own histograms stay beside ours (benchmarks/vlmcache_lab/engine_metrics reads them)
    for name in ("vllm:time_to_first_token_seconds", "vllm:request_queue_time_seconds",
                 "vllm:request_prefill_time_seconds"):
        assert sum(v for (n, _), v in samples.items() if n == name + "_count") >= 1, name
    log = server.log()
    assert "vlmcache front: model" in log and "hit (response)" in log


def _response_hits(url: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for f in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for s in f.samples:
            if s.name == "vlmcache_front_requests_total" and s.labels.get("hit_tier") == \
                    "response":
                total += s.value
    return total


def _responses(server, model, text, salt):
    body = {"model": model, "input": text, "max_output_tokens": 2, "temperature": 0,
            "cache_salt": salt}
    return httpx.post(server.url + "/v1/responses", json=body, timeout=120)


def test_no_cache_hit_oracle_on_other_routes_and_no_salt_in_argv(client, server):
    """Issue 33: /v1/responses binds the tenant (a's derived salt sent there is another
    tenant), refused routes and a deep JSON body are 4xx, the salt is in no argv or log."""
    import os
    from pathlib import Path

    from vlmcache.keys import tenant_cache_salt

    model = str(server.argv[4])
    store = Path(next(a.split("=", 1)[1] for a in server.argv if a.startswith("store_path=")))
    salt = (store / "tenant_salt").read_text().strip()
    text = "Describe a quiet harbour at dawn with boats and gulls. " * 5
    client.chat.completions.create(  # tenant a's prompt, through the cascade
        model=model, temperature=0, max_tokens=2, extra_body={"cache_salt": "a"},
        messages=[{"role": "user", "content": text}])
    own = _responses(server, model, text, "a")
    assert own.status_code == 200, own.text  # a itself on /v1/responses: a's cache
    assert own.json()["usage"]["input_tokens_details"]["cached_tokens"] > 0
    # the oracle: a's salt as the front derives it, sent by someone else
    probe = _responses(server, model, text, tenant_cache_salt(salt, "a")).json()["usage"]
    assert probe["input_tokens_details"]["cached_tokens"] == 0  # not a's cache
    assert httpx.post(server.url + "/reset_prefix_cache").status_code in (403, 404)
    deep = httpx.post(server.url + "/v1/responses", content=b"[" * 100_000)
    assert deep.status_code == 400 and httpx.get(server.url + "/health").status_code == 200
    pgid = server.proc.pid
    for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
        try:
            if os.getpgid(int(pid)) == pgid:
                assert salt not in Path(f"/proc/{pid}/cmdline").read_bytes().decode(
                    errors="replace")
        except (OSError, ProcessLookupError):
            continue
    assert salt not in server.log()
