"""How the book says a claim in words, from one place: a verdict reads the same on every page.

:func:`claim_text` says one claim, :func:`counts_text` counts a family's verdicts, and :class:`Note` /
:func:`notes` are a chapter's rule-triggered sentences (a predicate on the claims and numbers tables and a fixed
sentence), so a chapter needs no function per outcome.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Iterable

import pandas as pd

from .inference import Interval, count_verdicts

_COUNT_WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine"}


def count_word(k: int) -> str:
    """``2`` -> ``"two"`` (1..9 in words, larger numbers as digits)."""
    return _COUNT_WORDS.get(int(k), str(int(k)))


def join(parts: list[str]) -> str:
    """``["a", "b", "c"]`` -> ``"a, b and c"``; one part as it is. Raises ``ValueError`` on an empty list."""
    if not parts:
        raise ValueError("join: nothing to join")
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def fmt_level(t: float) -> str:
    """A grid level as the page prints it (``0.0025``, ``1``: ``:g``)."""
    return f"{t:g}"


def verdict_md(claim) -> str:
    """A claim's verdict in bold Markdown (``claim``: a claims-table row or :class:`~bnstudy.study.inference.Claim`)."""
    return f"**{claim.verdict}**"


def signed(x: float, digits: int = 3) -> str:
    """A difference as the book prints it: its sign always shown (``+0.207``, ``-0.021``), and a value that rounds
    to zero at ``digits`` as ``0.000`` (never ``-0.000``, which a float a hair below zero would print)."""
    x = float(x)
    return f"{0.0:.{digits}f}" if round(x, digits) == 0 else f"{x:+.{digits}f}"


def claim_text(claim, digits: int = 3, clip: tuple | None = None) -> str:
    """A claims-table row in words: ``"-0.210 (-0.250 to -0.170; **routed head lower**)"``, or without interval
    ends ``"-0.210 (**too few seeds**)"``; every number signed (:func:`signed`). ``clip``: ``(low, high)`` the
    printed ends are cut to. Raises ``ValueError`` unless ``clip`` is ``None`` or ``(low, high)`` with low <= high."""
    iv = Interval(float(claim.estimate), float(claim.low), float(claim.high), int(claim.n))
    if clip is not None:
        if not (len(clip) == 2 and clip[0] <= clip[1]):
            raise ValueError(f"claim_text: clip must be (low, high) with low <= high, got {clip!r}")
        iv = iv.clipped(*clip)
    if math.isnan(iv.low):
        return f"{signed(iv.mean, digits)} ({verdict_md(claim)})"
    return f"{signed(iv.mean, digits)} ({signed(iv.low, digits)} to {signed(iv.high, digits)}; {verdict_md(claim)})"


#: The phrase each counted kind takes in :func:`counts_text` (singular, plural); ``{margin}`` and ``{reference}``
#: are filled in.
COUNT_PHRASES = {
    "equivalent": ("is **equivalent within ±{margin:g}** of {reference}", "are **equivalent within ±{margin:g}** of "
                                                                          "{reference}"),
    "lower": ("shows {subject} below {reference} (a direction shown)",
              "show {subject} below {reference} (a direction shown)"),
    "higher": ("shows {subject} above {it}", "show {subject} above {it}"),
    "not decided": ("is **not decided**", "are **not decided**"),
    "too few seeds": ("has **too few seeds**", "have **too few seeds**"),
    "exact": ("is **exact, checked ==**", "are **exact, checked ==**"),
    "not exact": ("is **not exact**", "are **not exact**"),
}


def counts_text(claims: pd.DataFrame, noun: str, subject: str, reference: str, margin: float,
                alpha: float = 0.05) -> str:
    """A family's claims counted by :func:`bnstudy.study.inference.count_verdicts`, the kinds that occur in
    :data:`COUNT_PHRASES` order: ``"275 of the 288 router cells are **equivalent within ±0.02** of the oracle and 13
    are **not decided**"`` (``noun``: ``"router cells"``; ``subject`` / ``reference``: the two sides)."""
    counts = count_verdicts(claims, alpha) if len(claims) else {}
    # "above it" only where the reference was named just before (after a "below the oracle" count)
    fill = dict(margin=margin, reference=reference, subject=subject,
                it="it" if counts.get("lower", 0) else reference)
    named = [(counts.get(kind, 0), words[0 if counts.get(kind, 0) == 1 else 1].format(**fill))
             for kind, words in COUNT_PHRASES.items() if counts.get(kind, 0)]
    if not named:
        return f"none of the {len(claims)} {noun} can be counted" if len(claims) else f"there are no {noun}"
    (lead_n, lead_w), rest = named[0], [f"{n} {w}" for n, w in named[1:]]
    lead = f"{lead_n} of the {len(claims)} {noun} {lead_w}"
    return lead + (" and " + rest[0] if len(rest) == 1 else ", " + join(rest) if rest else "")


@dataclasses.dataclass(frozen=True)
class Note:
    """A rule-triggered sentence: ``text`` is said under ``key`` where ``when(claims, numbers)`` is true (exactly one
    note of a key must hold); ``fill(claims, numbers)`` gives ``text``'s ``str.format`` fields."""

    key: str
    when: Callable[[pd.DataFrame, pd.DataFrame], bool]
    text: str
    fill: Callable[[pd.DataFrame, pd.DataFrame], dict] | None = None


def notes(rules: Iterable[Note], claims: pd.DataFrame, numbers: pd.DataFrame) -> dict[str, str]:
    """``{key: text}`` of the notes whose rule holds, one per key. Raises ``ValueError`` naming the key if no
    note or more than one note of a key holds (the rules of a key must cover every outcome exactly once)."""
    out: dict[str, list[str]] = {}
    for r in rules:
        out.setdefault(r.key, [])
        if r.when(claims, numbers):
            out[r.key].append(r.text.format(**r.fill(claims, numbers)) if r.fill else r.text)
    bad = {k: len(v) for k, v in out.items() if len(v) != 1}
    if bad:
        raise ValueError(f"notes: each key needs exactly one note that holds; holding: {bad}")
    return {k: v[0] for k, v in out.items()}


def claim(claims: pd.DataFrame, key: str):
    """The row of ``claims`` with ``key`` (a namedtuple-like Series). Raises ``KeyError`` naming the key."""
    hit = claims[claims["key"] == key]
    if not len(hit):
        raise KeyError(f"claim: no {key!r} in the claims table")
    return hit.iloc[0]
