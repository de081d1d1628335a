from vlmcache.tiers.exact import ExactTextTier, normalize_prompt


def tier(tmp_path, max_entries=100, ns="ns1"):
    return ExactTextTier(tmp_path / "exact.jsonl", ns, max_entries)


import unicodedata

import pytest

#: Prompts that differ in meaning (issue 13's eleven, and a few more): never one key.
DISTINCT = [
    ("Solve x² + 1 = 0", "Solve x2 + 1 = 0"), ("What is H₂O?", "What is H2O?"),
    ("Add ½ cup", "Add 1/2 cup"), ("Read item ①", "Read item 1"),
    ("Is it 30℃?", "Is it 30°C?"), ("Spell Straße", "Spell strasse"),
    ("Does the sign say 'STOP'?", "Does the sign say 'stop'?"),
    ("Is the code aB3x?", "Is the code Ab3X?"), ("Call `getValue()`", "Call `getvalue()`"),
    ('Is the word "Polish"?', 'Is the word "polish"?'), ("Is the flag US?", "Is the flag us?"),
    ("Type ｗｈａｔ", "Type what"), ("Roman Ⅳ", "Roman IV"),
    ("```\nif x:\n    y\n```", "```\nif x:\n y\n```"),
    # issue 33: no case folding after ':', '?', '.', '!' or a newline inside a prompt
    ("Which country is it: Turkey?", "Which country is it: turkey?"),
    ("What language is this? Polish", "What language is this? polish"),
    ("Name the verb or the language. Polish", "Name the verb or the language. polish"),
    ("Say it! Turkey", "Say it! turkey"),
    ("Options:\nTurkey\nGreece", "Options:\nturkey\ngreece"),
    ("USER: <image>\nTurkey or Greece? ASSISTANT:", "USER: <image>\nturkey or Greece? ASSISTANT:"),
    ("Polish sausage?", "polish sausage?"), ("Turkey?", "turkey?"), ("May I?", "may I?"),
    ("Pick one:\nA\nB", "Pick one:\na\nB"), ("Is it red? Is it", "Is it red? is it"),
]


@pytest.mark.parametrize("a,b", DISTINCT)
def test_normalize_keeps_meaning_apart(a, b):
    assert normalize_prompt(a) != normalize_prompt(b)


def test_normalize_folds_spacing_first_letter_case_and_unicode_form():
    assert normalize_prompt("  What color\tis\n the  car? ") == "what color is the car?"
    assert normalize_prompt("what's it?  Is it red") == normalize_prompt("What's it? Is it red")
    assert normalize_prompt("USER: <image>\nWhat is it?") == "USER: <image> what is it?"
    assert normalize_prompt("Café") == normalize_prompt(unicodedata.normalize("NFD", "Café"))
    assert normalize_prompt("What COLOR is it?") != normalize_prompt("what color is it?")


def test_lookup_hits_normalized_variant_and_returns_canonical_text(tmp_path):
    t = tier(tmp_path)
    assert t.lookup("What color is the car?", ["h1"], None) is None
    t.record("What color is the car?", ["h1"], None, ["k1", "k2"], 70)
    rec = t.lookup("what   color is  the car?", ["h1"], None)
    assert rec is not None and rec.canonical_prompt == "What color is the car?"
    assert rec.chunk_keys == ("k1", "k2") and rec.prompt_tokens == 70


def test_images_tenants_and_namespace_separate_entries(tmp_path):
    t = tier(tmp_path)
    t.record("q", ["h1"], "tenant-a", ["k"], 10)
    assert t.lookup("q", ["h2"], "tenant-a") is None  # other image
    assert t.lookup("q", ["h1"], "tenant-b") is None  # other tenant
    assert t.lookup("q", ["h1"], None) is None
    assert t.lookup("q", [], "tenant-a") is None
    assert tier(tmp_path / "x", ns="ns2").lookup("q", ["h1"], "tenant-a") is None


def test_persists_across_instances_and_skips_torn_lines(tmp_path, caplog):
    t = tier(tmp_path)
    t.record("first prompt", ["h"], None, ["k1"], 5)
    t.record("second prompt", ["h"], None, ["k2"], 6)
    with open(tmp_path / "exact.jsonl", "a") as f:
        f.write('{"key": "torn')  # a crash mid-append
    again = tier(tmp_path)
    assert len(again) == 2
    assert again.lookup("First  prompt", ["h"], None).chunk_keys == ("k1",)
    assert "unreadable line" in caplog.text


def test_bounded_and_compacted(tmp_path):
    t = tier(tmp_path, max_entries=3)
    for i in range(200):
        t.record(f"prompt {i}", [], None, [f"k{i}"], i)
    assert len(t) == 3
    assert t.lookup("prompt 0", [], None) is None and t.lookup("prompt 199", [], None)
    lines = (tmp_path / "exact.jsonl").read_text().splitlines()
    assert len(lines) <= 2 * 64 + 1  # compacted, not 200 lines
    assert len(tier(tmp_path, max_entries=3)) == 3


def test_rerecording_keeps_first_canonical_text(tmp_path):
    t = tier(tmp_path)
    t.record("Is it red?", [], None, ["a"], 3)
    t.record("is it RED?", [], None, ["b"], 3)
    assert t.lookup("is it red?", [], None).canonical_prompt == "Is it red?"


def test_unwritable_path_keeps_memory_entries(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    t = ExactTextTier(blocker / "sub" / "exact.jsonl", "ns", 10)
    t.record("q", [], None, ["k"], 1)
    assert t.lookup("q", [], None) is not None
    assert "cannot persist" in caplog.text


def test_case_folds_only_at_the_first_word_of_a_line():
    """Issue 33: only the first word of a line is folded ("What" -> "what"): a question's
    start in a templated prompt and each message and part of a chat transcript; and only a
    function word: a capital anywhere else (after ':' or '?', a name) may carry meaning."""
    from vlmcache.serving.openai_req import encode_transcript

    def chat(*texts):
        return normalize_prompt(encode_transcript([["system", "Answer briefly."],
                                                   ["user", ["<image-id>", *texts]]]))

    assert chat("What is it?") == chat("what is it?") == chat("  What  is it? ")
    assert chat("What is it?", "Is it red?") == chat("what is it?", "is it red?")
    assert chat("Which country: Turkey?") != chat("which country: turkey?")
    assert chat("Polish or not?") != chat("polish or not?")  # a first word, but a name
    assert chat("Turkey?") != chat("turkey?")
    assert chat("WHAT is it?") != chat("what is it?")  # not sentence case: kept
    assert normalize_prompt("USER: <image>\nPlease describe it. ASSISTANT:") == \
        normalize_prompt("USER: <image>\n  please describe it. ASSISTANT:")


def test_records_keyed_by_the_old_looser_normalization_are_never_hit(tmp_path):
    """A log written before issue 33 keyed "Which country: Turkey?" as "... : turkey?"; the
    lowercase question (another meaning) must not find it after the upgrade."""
    import hashlib
    import json

    old_key = hashlib.sha256(json.dumps(["ns1", None, "which country: turkey?", ["h"]],
                                        separators=(",", ":")).encode()).hexdigest()
    record = {"key": old_key, "canonical_prompt": "Which country: Turkey?",
              "image_hashes": ["h"], "chunk_keys": ["k"], "prompt_tokens": 9, "created": 1.0}
    (tmp_path / "exact.jsonl").write_text(json.dumps(record) + "\n")
    t = tier(tmp_path)
    assert len(t) == 1  # loaded, but unreachable
    assert t.lookup("Which country: turkey?", ["h"], None) is None
    assert t.lookup("which country: turkey?", ["h"], None) is None
