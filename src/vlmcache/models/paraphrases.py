"""Question paraphrases for easy-vqa's 24 question templates.

easy-vqa questions come from 24 templates with ``{color}`` / ``{shape}`` slots
(``TEMPLATES``).  For each template there are two disjoint lists of rewordings:

* ``TRAIN_PARAPHRASES``: used as data augmentation when training tiny-vqa.
* ``EVAL_PARAPHRASES``: never seen in training; the paraphrase evaluation set is built
  from them (``paraphrase_set``).  A test question keeps its image and answer; only the
  wording changes (same meaning, same answer).
"""

from __future__ import annotations

import re

COLORS = ["red", "green", "blue", "black", "gray", "teal", "brown", "yellow"]
SHAPES = ["circle", "rectangle", "triangle"]

TEMPLATES = [
    # what-questions
    "what color is the shape?",
    "what color is the {shape}?",
    "what is the color of the shape?",
    "what is the color of the {shape}?",
    "what shape is in the image?",
    "what shape does the image contain?",
    "what shape is present?",
    "what is the {color} shape?",
    # yes/no about a color
    "is a {color} shape present?",
    "is there a {color} shape?",
    "is there a {color} shape in the image?",
    "does the image contain a {color} shape?",
    "does the image not contain a {color} shape?",
    "is there not a {color} shape?",
    "is there not a {color} shape in the image?",
    "is no {color} shape present?",
    # yes/no about a shape
    "is a {shape} present?",
    "is there a {shape}?",
    "is there a {shape} in the image?",
    "does the image contain a {shape}?",
    "does the image not contain a {shape}?",
    "is there not a {shape}?",
    "is there not a {shape} in the image?",
    "is no {shape} present?",
]

# Training rewordings.  The second line of each list was added for the patch-8 retraining;
# like the first, it was written to avoid the held-out EVAL_PARAPHRASES wordings (their
# distinctive words "picture", "lack", "drawn", "seen", "coloured", "have" are not used).
_COLOR_Q = ["which color is the shape?", "tell me the color of the shape.", "what colour is the shape?",
            "what is the shape's color?", "the shape is which color?", "what color is used for the shape?"]
_COLOR_OF_SHAPE_Q = ["which color is the {shape}?", "tell me the color of the {shape}.",
                     "what colour is the {shape}?",
                     "what is the {shape}'s color?", "the {shape} is which color?",
                     "what color is used for the {shape}?"]
_SHAPE_Q = ["which shape is in the image?", "name the shape in the image.", "what kind of shape is shown?",
            "what shape is visible?", "identify the shape in this image.", "which shape appears in the image?"]
_POS_COLOR = ["is any {color} shape shown?", "do you see a {color} shape?", "can you find a {color} shape?",
              "is a {color} shape visible?", "does the image include a {color} shape?",
              "is there a {color} shape in this image?"]
_NEG_COLOR = ["is the image missing a {color} shape?", "is the image without a {color} shape?",
              "is there no {color} shape?",
              "is the image free of {color} shapes?", "is a {color} shape absent?",
              "does the image not include a {color} shape?"]
_POS_SHAPE = ["is any {shape} shown?", "do you see a {shape}?", "can you find a {shape}?",
              "is a {shape} visible?", "does the image include a {shape}?", "is there a {shape} in this image?"]
_NEG_SHAPE = ["is the image missing a {shape}?", "is the image without a {shape}?", "is there no {shape}?",
              "is the image free of {shape}s?", "is a {shape} absent?", "does the image not include a {shape}?"]

TRAIN_PARAPHRASES: dict[str, list[str]] = {
    "what color is the shape?": _COLOR_Q,
    "what color is the {shape}?": _COLOR_OF_SHAPE_Q,
    "what is the color of the shape?": _COLOR_Q,
    "what is the color of the {shape}?": _COLOR_OF_SHAPE_Q,
    "what shape is in the image?": _SHAPE_Q,
    "what shape does the image contain?": _SHAPE_Q,
    "what shape is present?": _SHAPE_Q,
    "what is the {color} shape?": ["which shape is {color}?", "name the {color} shape.",
                                   "what kind of shape is the {color} one?",
                                   "identify the {color} shape.", "the {color} shape is which shape?",
                                   "what shape is the {color} one?"],
    "is a {color} shape present?": _POS_COLOR,
    "is there a {color} shape?": _POS_COLOR,
    "is there a {color} shape in the image?": _POS_COLOR,
    "does the image contain a {color} shape?": _POS_COLOR,
    "does the image not contain a {color} shape?": _NEG_COLOR,
    "is there not a {color} shape?": _NEG_COLOR,
    "is there not a {color} shape in the image?": _NEG_COLOR,
    "is no {color} shape present?": _NEG_COLOR,
    "is a {shape} present?": _POS_SHAPE,
    "is there a {shape}?": _POS_SHAPE,
    "is there a {shape} in the image?": _POS_SHAPE,
    "does the image contain a {shape}?": _POS_SHAPE,
    "does the image not contain a {shape}?": _NEG_SHAPE,
    "is there not a {shape}?": _NEG_SHAPE,
    "is there not a {shape} in the image?": _NEG_SHAPE,
    "is no {shape} present?": _NEG_SHAPE,
}

_E_COLOR_Q = ["Which colour is the shape?", "What colour does the shape have?"]
_E_COLOR_OF_SHAPE_Q = ["Which colour is the {shape}?", "What colour does the {shape} have?"]
_E_SHAPE_Q = ["Which shape can be seen in the picture?", "What shape is drawn in the picture?"]
_E_POS_COLOR = ["Is there any {color} shape in the picture?", "Does the picture show a {color} shape?"]
_E_NEG_COLOR = ["Is there no {color} shape in the picture?", "Does the picture lack a {color} shape?"]
_E_POS_SHAPE = ["Is there any {shape} in the picture?", "Does the picture show a {shape}?"]
_E_NEG_SHAPE = ["Is there no {shape} in the picture?", "Does the picture lack a {shape}?"]

EVAL_PARAPHRASES: dict[str, list[str]] = {
    "what color is the shape?": _E_COLOR_Q,
    "what color is the {shape}?": _E_COLOR_OF_SHAPE_Q,
    "what is the color of the shape?": _E_COLOR_Q,
    "what is the color of the {shape}?": _E_COLOR_OF_SHAPE_Q,
    "what shape is in the image?": _E_SHAPE_Q,
    "what shape does the image contain?": _E_SHAPE_Q,
    "what shape is present?": _E_SHAPE_Q,
    "what is the {color} shape?": ["Which shape in the picture is {color}?",
                                   "What shape is coloured {color}?"],
    "is a {color} shape present?": _E_POS_COLOR,
    "is there a {color} shape?": _E_POS_COLOR,
    "is there a {color} shape in the image?": _E_POS_COLOR,
    "does the image contain a {color} shape?": _E_POS_COLOR,
    "does the image not contain a {color} shape?": _E_NEG_COLOR,
    "is there not a {color} shape?": _E_NEG_COLOR,
    "is there not a {color} shape in the image?": _E_NEG_COLOR,
    "is no {color} shape present?": _E_NEG_COLOR,
    "is a {shape} present?": _E_POS_SHAPE,
    "is there a {shape}?": _E_POS_SHAPE,
    "is there a {shape} in the image?": _E_POS_SHAPE,
    "does the image contain a {shape}?": _E_POS_SHAPE,
    "does the image not contain a {shape}?": _E_NEG_SHAPE,
    "is there not a {shape}?": _E_NEG_SHAPE,
    "is there not a {shape} in the image?": _E_NEG_SHAPE,
    "is no {shape} present?": _E_NEG_SHAPE,
}

_COLOR_RE = re.compile(r"\b(" + "|".join(COLORS) + r")\b")
_SHAPE_RE = re.compile(r"\b(" + "|".join(SHAPES) + r")\b")


def parse_question(question: str) -> tuple[str, dict[str, str]]:
    """('is there a {color} shape?', {'color': 'red'}) for 'is there a red shape?'."""
    slots: dict[str, str] = {}
    m = _COLOR_RE.search(question)
    if m:
        slots["color"] = m.group(1)
    m = _SHAPE_RE.search(question)
    if m:
        slots["shape"] = m.group(1)
    template = _COLOR_RE.sub("{color}", question)
    template = _SHAPE_RE.sub("{shape}", template)
    if template not in TRAIN_PARAPHRASES:
        raise KeyError(f"not an easy-vqa template: {question!r} -> {template!r}")
    return template, slots


def paraphrase(question: str, variant: int, table: dict[str, list[str]] = EVAL_PARAPHRASES) -> str:
    template, slots = parse_question(question)
    options = table[template]
    return options[variant % len(options)].format(**slots)


def paraphrase_set(questions, answers, image_ids, per_template: int = 100):
    """Deterministic paraphrase evaluation set: for each of the 24 templates, the first
    ``per_template`` test questions of that template, each reworded with a held-out
    variant (variants cycle).  Returns a list of (question, answer, image_id, original)."""
    taken: dict[str, int] = {t: 0 for t in TEMPLATES}
    out = []
    for q, a, i in zip(questions, answers, image_ids):
        template, _ = parse_question(q)
        n = taken[template]
        if n >= per_template:
            continue
        taken[template] = n + 1
        out.append((paraphrase(q, n), a, i, q))
    return out
