"""The paraphrase gate: refuse hits that differ in what a VQA answer hinges on."""

from __future__ import annotations

import pytest

from vlmcache.tiers.gates import check_paraphrase, facets

PAIRS = [
    # (question, cached, allowed)
    ("What color is the car?", "Which colour is the vehicle?", True),
    ("Is there a circle?", "Is there no circle?", False),
    ("Is there a red circle?", "Is there not a red circle?", False),
    ("Isn't there a circle?", "Is there a circle?", False),
    ("Is there no red shape?", "Is the image missing a red shape?", True),
    ("Does the picture lack a circle?", "Is there no circle in the image?", True),
    ("Is there a red shape?", "Is there a blue shape?", False),
    ("Is the shape grey?", "Is the shape gray?", True),
    ("Is there a circle?", "Is there a triangle?", False),
    ("Are there circles?", "Is there any circle?", True),
    ("Are there two dogs?", "Are there 3 dogs?", False),
    ("Are there two dogs?", "Are there 2 dogs?", True),
    ("Is the cup on the left?", "Is the cup on the right?", False),
    ("What is above the table?", "What is on top of the table?", True),
    ("What shape is in the image?", "Which shape is shown?", True),
]


@pytest.mark.parametrize("question,cached,allowed", PAIRS)
def test_gate_table(question, cached, allowed):
    verdict = check_paraphrase(question, cached)
    assert verdict.ok is allowed, verdict.reason
    assert verdict.ok or verdict.reason


def test_facets():
    f = facets("Isn't the second red square left of 3 blue circles?")
    assert f.negated and f.colours == {"red", "blue"} and f.shapes == {"square", "circle"}
    assert f.numbers == {"3"} and f.sides == {"left"}


@pytest.mark.parametrize("question,asks", [
    ("What colour is the shape?", "colour"), ("Could you tell me the colour of the car?", "colour"),
    ("Which shape is in the picture?", "shape"), ("Is there a circle?", "yes/no"),
    ("How many dogs are there?", "count"), ("Why is the man running?", "other"),
])
def test_question_kind(question, asks):
    assert facets(question).asks == asks


@pytest.mark.parametrize("question,cached,ok", [
    ("Can you see a red shape in this picture?", "is there a red shape?", True),
    ("Is a circle missing from this image?", "is there not a circle?", True),
    ("What's the shape's colour?", "what color is the shape?", True),
    ("is the door open?", "is the door closed?", False),
    ("what color is the car?", "what color is the sky?", False),
    ("is the man smiling?", "is the man standing?", False),
    ("Why is it here?", "Why is it there?", False),  # kind unrecognised: first stage only
    ("what color is the shape?", "what shape is it?", False),
])
def test_second_stage(question, cached, ok):
    from vlmcache.tiers.gates import second_stage_ok

    assert second_stage_ok(question, cached) is ok
