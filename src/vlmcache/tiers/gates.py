"""Gates where similarity lies: refuse a paraphrase hit that changes what the answer hinges on.

Sentence embeddings score "Is there a circle?" close to "Is there no circle?" and "red"
close to "blue". A paraphrase hit is refused when the two questions differ in negation,
colour, shape, number or spatial side. The check is lexical and cheap (microseconds); it
errs towards refusing (a refused hit is only a miss).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_WORD_RE = re.compile(r"[a-z]+(?:'[a-z]+)?|\d+(?:\.\d+)?")

NEGATIONS = frozenset({
    "no", "not", "none", "nothing", "never", "neither", "nor", "without", "lack", "lacks",
    "lacking", "missing", "absent", "nobody", "nowhere", "cannot", "except",
})
COLOURS = {w: w for w in (
    "red", "green", "blue", "black", "white", "yellow", "orange", "purple", "pink", "brown",
    "teal", "cyan", "magenta", "violet", "gold", "silver", "beige", "maroon", "navy")}
COLOURS.update({"grey": "gray", "gray": "gray"})
SHAPES = {w: w for w in (
    "circle", "square", "rectangle", "triangle", "oval", "ellipse", "star", "hexagon",
    "pentagon", "diamond", "cube", "sphere", "cylinder", "cone", "line", "dot")}
SHAPES.update({w + "s": w for w in list(SHAPES)})
# "one" is left out: mostly a pronoun ("each one"); "single" and "1" count.
NUMBERS = {w: str(i) for i, w in enumerate(
    ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
     "eleven", "twelve")) if w != "one"}
NUMBERS.update({"single": "1", "pair": "2", "couple": "2", "both": "2", "twice": "2"})
SIDES = {"left": "left", "right": "right", "top": "top", "bottom": "bottom", "above": "top",
         "below": "bottom", "under": "bottom", "upper": "top", "lower": "bottom",
         "front": "front", "behind": "behind", "inside": "inside", "outside": "outside"}


@dataclass(frozen=True)
class QuestionFacets:
    """What a VQA answer hinges on, as found in a question."""

    negated: bool
    colours: frozenset[str]
    shapes: frozenset[str]
    numbers: frozenset[str]
    sides: frozenset[str]


@dataclass(frozen=True)
class GateVerdict:
    """``ok`` is False when the two questions differ in a facet; ``reason`` names it."""

    ok: bool
    reason: str = ""


def facets(question: str) -> QuestionFacets:
    """Extract negation, colours, shapes, numbers and sides from ``question``."""
    words = _WORD_RE.findall(question.casefold().replace("colour", "color"))
    negated = any(w in NEGATIONS or w.endswith("n't") for w in words)
    numbers = {NUMBERS.get(w, w) for w in words if w in NUMBERS or w[0].isdigit()}
    return QuestionFacets(
        negated=negated,
        colours=frozenset(COLOURS[w] for w in words if w in COLOURS),
        shapes=frozenset(SHAPES[w] for w in words if w in SHAPES),
        numbers=frozenset(numbers),
        sides=frozenset(SIDES[w] for w in words if w in SIDES),
    )


def check_paraphrase(question: str, cached: str) -> GateVerdict:
    """Whether ``question`` may be answered as ``cached`` (same facets)."""
    a, b = facets(question), facets(cached)
    for name in ("negated", "colours", "shapes", "numbers", "sides"):
        if getattr(a, name) != getattr(b, name):
            return GateVerdict(False, f"{name} differ: {getattr(a, name)} vs {getattr(b, name)}")
    return GateVerdict(True)
