"""Text probes of the fidelity benchmark: a wide held-out paraphrase set and facet changes.

``WIDE_PARAPHRASES`` are wordings written for this benchmark: none is one of tiny-vqa's
training rewordings (``TRAIN_PARAPHRASES``) or of its held-out evaluation set
(``EVAL_PARAPHRASES``) (a test checks it). Facet changes turn a cached question into one
with another answer: negation, colour, shape, count, left/right.
"""

from __future__ import annotations

import re

from vlmcache.models.paraphrases import COLORS, SHAPES, parse_question

_COLOUR_Q = ["Could you tell me the colour of the shape?", "What colour has the shape got?",
             "In what color is the shape painted?", "Which color does the shape have?",
             "What's the shape's colour?"]
_COLOUR_OF = ["Could you tell me the colour of the {shape}?", "What colour has the {shape} got?",
              "In what color is the {shape} painted?", "Which color does the {shape} have?",
              "What's the colour of that {shape}?"]
_SHAPE_Q = ["Which shape do you see in this image?", "What shape can you spot here?",
            "What's the shape in this image?", "Which kind of shape is pictured?",
            "What shape appears in this image?"]
_WHAT_IS_COLOUR = ["Which shape here is {color}?", "What is the {color} object's shape?",
                   "What shape is the {color} thing?", "Which kind of shape is {color}?",
                   "What's the shape that is {color}?"]
_POS_COLOUR = ["Can you see a {color} shape in this picture?", "Is some {color} shape visible here?",
               "Does this image have a {color} shape in it?", "Is anything {color} shown here?",
               "Is a {color} shape in this image?"]
_NEG_COLOUR = ["Is there no {color} shape at all here?", "Does this image lack any {color} shape?",
               "Is a {color} shape missing from this image?", "Is no {color} shape shown here?",
               "Is this image without any {color} shape?"]
_POS_SHAPE = ["Can you see a {shape} in this picture?", "Is some {shape} visible here?",
              "Does this image have a {shape} in it?", "Is a {shape} shown here?",
              "Is a {shape} in this image?"]
_NEG_SHAPE = ["Is there no {shape} at all here?", "Does this image lack any {shape}?",
              "Is a {shape} missing from this image?", "Is no {shape} shown here?",
              "Is this image without any {shape}?"]

WIDE_PARAPHRASES: dict[str, list[str]] = {
    "what color is the shape?": _COLOUR_Q, "what is the color of the shape?": _COLOUR_Q,
    "what color is the {shape}?": _COLOUR_OF, "what is the color of the {shape}?": _COLOUR_OF,
    "what shape is in the image?": _SHAPE_Q, "what shape does the image contain?": _SHAPE_Q,
    "what shape is present?": _SHAPE_Q, "what is the {color} shape?": _WHAT_IS_COLOUR,
    "is a {color} shape present?": _POS_COLOUR, "is there a {color} shape?": _POS_COLOUR,
    "is there a {color} shape in the image?": _POS_COLOUR,
    "does the image contain a {color} shape?": _POS_COLOUR,
    "does the image not contain a {color} shape?": _NEG_COLOUR,
    "is there not a {color} shape?": _NEG_COLOUR,
    "is there not a {color} shape in the image?": _NEG_COLOUR,
    "is no {color} shape present?": _NEG_COLOUR,
    "is a {shape} present?": _POS_SHAPE, "is there a {shape}?": _POS_SHAPE,
    "is there a {shape} in the image?": _POS_SHAPE, "does the image contain a {shape}?": _POS_SHAPE,
    "does the image not contain a {shape}?": _NEG_SHAPE, "is there not a {shape}?": _NEG_SHAPE,
    "is there not a {shape} in the image?": _NEG_SHAPE, "is no {shape} present?": _NEG_SHAPE,
}

#: Extra cached questions per image, so that count and left/right changes have a near
#: neighbour to (wrongly) hit: (cached, changed).
SIDE_PAIR = ("is the shape on the left?", "is the shape on the right?")
COUNT_PAIR = ("is there one shape?", "are there two shapes?")
_NEGATIONS = ((re.compile(r"^is there a "), "is there not a "),
              (re.compile(r"^is there not a "), "is there a "),
              (re.compile(r"^does the image contain a "), "does the image not contain a "),
              (re.compile(r"^does the image not contain a "), "does the image contain a "),
              (re.compile(r"^is a "), "is no "), (re.compile(r"^is no "), "is a "))


def wide_paraphrase(question: str, variant: int) -> str:
    """A held-out rewording of an easy-vqa template question."""
    template, slots = parse_question(question)
    options = WIDE_PARAPHRASES[template]
    return options[variant % len(options)].format(**slots)


def facet_changes(question: str, variant: int) -> dict[str, str]:
    """``{"facet:negation"|"facet:colour"|"facet:shape": changed question}`` where the
    change applies (each has another answer than ``question`` on one-shape images
    whose answer it mentions)."""
    out: dict[str, str] = {}
    for pattern, repl in _NEGATIONS:
        if pattern.search(question):
            out["facet:negation"] = pattern.sub(repl, question)
            break
    for name, words in (("facet:colour", COLORS), ("facet:shape", SHAPES)):
        found = [w for w in words if re.search(rf"\b{w}\b", question)]
        if found:
            others = [w for w in words if w != found[0]]
            out[name] = re.sub(rf"\b{found[0]}\b", others[variant % len(others)], question)
    return out
