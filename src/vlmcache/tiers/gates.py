"""Gates where similarity lies: refuse a paraphrase hit that changes what the answer hinges on.

Sentence embeddings score "Is there a circle?" close to "Is there no circle?", "red"
close to "blue" and "open" close to "closed". A paraphrase hit is refused when the two
questions differ in negation, colour, shape, number, spatial side or a state word, or ask for different things (a colour, a shape, a
count, a yes/no). The check is lexical and cheap (microseconds); it errs towards refusing
(a refused hit is only a miss).

:func:`facets_known` says whether a question's facets were all read with confidence (its
kind is recognised); the text tier accepts a lower cosine only for such questions, when
all their facets agree (the second stage).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_WORD_RE = re.compile(r"[a-z]+(?:'[a-z]+)?|\d+(?:\.\d+)?")

NEGATIONS = frozenset({
    "no", "not", "none", "nothing", "never", "neither", "nor", "without", "lack", "lacks",
    "lacking", "missing", "absent", "nobody", "nowhere", "cannot", "except", "free",
})
_YES_NO_START = frozenset({
    "is", "are", "does", "do", "can", "could", "was", "were", "has", "have", "did", "will",
    "would", "should", "am", "isn't", "aren't", "doesn't", "don't", "can't", "there's"})
_WH_START = frozenset({"what", "which", "name", "tell", "identify", "describe", "say",
                       "whats", "what's", "give", "state"})
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
# Opposite states (either word of a pair): "is the door open?" vs "closed?" scores 0.93.
STATES = frozenset("""
open opened closed shut off big large small little tiny huge full empty hot cold warm
wet dry day night daytime nighttime old new young up down high low tall short long light
dark bright dim clean dirty fast slow happy sad awake asleep sleeping alive dead inside
outside male female man woman boy girl adult child standing sitting lying walking running
smiling frowning same different filled hollow thick thin wide narrow heavy light moving
still broken whole
""".split())
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
    states: frozenset[str] = frozenset()
    asks: str = "other"  # "yes/no", "count", "colour", "shape" or "other" (unrecognised)


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
        states=frozenset(w for w in words if w in STATES),
        asks=_asks(words),
    )


def _asks(words: list[str]) -> str:
    """What the question asks for, from its first words and its nouns."""
    if not words:
        return "other"
    text = " ".join(words)
    if "how many" in text or words[0] == "count" or "number of" in text:
        return "count"
    wh = bool(set(words[:4]) & _WH_START)
    if words[0] in _YES_NO_START and not wh:
        return "yes/no"
    if wh or text.startswith("the shape is"):
        if "color" in words:
            return "colour"
        if "shape" in words or "kind" in words or set(words) & set(SHAPES):
            return "shape"
    return "other"


def facets_known(question: str) -> bool:
    """Whether the question's kind was recognised (the second stage may then trust it)."""
    return facets(question).asks != "other"


# Words that carry no meaning of their own in a VQA question about "the image": function
# words, ways of saying "is it there" / "what is it", and words the facets already compare
# (negations, colour and shape names, numbers, sides).
_FILLER = frozenset("""
a an the any some this that these those it its is are was were be there here in on of at
to for with from by all do does did can could would will you me i we see spot find found
shown show shows showing visible present pictured drawn depicted appear appears contain
contains containing have has got include includes including what which whats what's tell
name identify describe say give state kind type sort shape shapes color colored painted
object objects thing things one item image picture photo photograph scene anything
something please
""".split())
_SYNONYMS = {"pic": "picture", "img": "image"}


def content_words(question: str) -> frozenset[str]:
    """The question's words that are neither filler nor facets (see :func:`facets`)."""
    words = _WORD_RE.findall(question.casefold().replace("colour", "color"))
    drop = _FILLER | NEGATIONS | set(COLOURS) | set(SHAPES) | set(NUMBERS) | set(SIDES)
    words = [w.removesuffix("'s") for w in words]  # the shape's colour: the shape, colour
    return frozenset(_SYNONYMS.get(w, w) for w in words
                     if w not in drop and not w.endswith("n't") and not w[0].isdigit())


def second_stage_ok(question: str, cached: str) -> bool:
    """Whether a lower cosine may be trusted: the gate passes, the question's kind is
    recognised, and both have the same content words (``door open`` vs ``door closed``,
    ``colour of the car`` vs ``of the sky`` differ)."""
    return (check_paraphrase(question, cached).ok and facets_known(question)
            and content_words(question) == content_words(cached))


def check_paraphrase(question: str, cached: str) -> GateVerdict:
    """Whether ``question`` may be answered as ``cached`` (same facets)."""
    a, b = facets(question), facets(cached)
    for name in ("asks", "negated", "colours", "shapes", "numbers", "sides", "states"):
        if getattr(a, name) != getattr(b, name):
            return GateVerdict(False, f"{name} differ: {getattr(a, name)} vs {getattr(b, name)}")
    return GateVerdict(True)
