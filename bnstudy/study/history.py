"""The data release's history (issue 37): each release keeps its claims table, and a book page lists, release to
release, which claims and verdicts changed and why.

A release's claims table (``release/claims/<version>.csv``, columns :data:`COLUMNS`) holds every claim its pages
print, read back from the executed notebooks (:func:`claims_of_chapters`); ``<version>.json`` beside it records the
chapters' code fingerprints, commits, seeds and times, and the last verification. :func:`record` writes them (the
release's ``compute`` and ``verify --record`` call it); :func:`page` makes ``book/history.md`` (``make history``).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pandas as pd

from .manifest import RELEASE_DIR, read_manifest

__all__ = ["COLUMNS", "claims_of_chapters", "record", "entries", "changes", "page", "CLAIMS_DIR", "PAGE"]

#: The columns of a release's claims table: the chapter (``"04"``), then a claims table's (``bnstudy.study.pages.CLAIM_FIELDS``).
COLUMNS = ("chapter", "key", "estimate", "low", "high", "n", "p", "p_adjusted", "p_equivalence", "verdict")
CLAIMS_DIR = "claims"
PAGE = Path(__file__).resolve().parents[2] / "book" / "history.md"


def _plain(md: str) -> str:
    """A glued verdict's words: ``**separate\\_stats higher**`` -> ``separate_stats higher``."""
    return re.sub(r"\\([_*\\`])", r"\1", str(md).strip().strip("*").strip())


def claims_of_chapters(chapters_dir, allow_empty: bool = False) -> pd.DataFrame:
    """Every claim the executed chapters in ``chapters_dir`` (``NN-name.ipynb``) glue, as a table with
    :data:`COLUMNS`, sorted by chapter and key. A claim is a key ``chNN_<key>`` glued with every field of
    :data:`bnstudy.study.pages.CLAIM_FIELDS`. Raises ``ValueError`` if the folder holds no executed chapter, or
    no claim unless ``allow_empty``."""
    from .book import glued_values
    from .pages import CLAIM_FIELDS

    values = glued_values(chapters_dir)
    if not values:
        raise ValueError(f"history: no glued values in {chapters_dir} (executed chapters are NN-name.ipynb)")
    rows = []
    for name in sorted(values):
        m = re.match(r"^ch(\d+)_(.+)_verdict$", name)
        if not m or not all(f"ch{m.group(1)}_{m.group(2)}_{f}" in values for f in CLAIM_FIELDS):
            continue
        row = dict(chapter=f"{int(m.group(1)):02d}", key=m.group(2))
        for f in CLAIM_FIELDS:
            v = values[f"ch{m.group(1)}_{m.group(2)}_{f}"]
            row[f] = _plain(v) if f == "verdict" else pd.to_numeric(v, errors="coerce")
        rows.append(row)
    if not rows and not allow_empty:
        raise ValueError(f"history: the chapters in {chapters_dir} glue no claims")
    return pd.DataFrame(rows, columns=list(COLUMNS)).sort_values(["chapter", "key"], ignore_index=True)


def _entry_meta(manifest: dict) -> dict:
    rel = manifest.get("release") or {}
    return dict(version=rel.get("version"), date=rel.get("date"), git_commit=rel.get("git_commit"),
                code_fingerprint=rel.get("code_fingerprint"), verified=rel.get("verified"),
                chapters={c: dict(code_fingerprint=r.get("code_fingerprint"), git_commit=r.get("git_commit"),
                                  seeds=r.get("seeds"), computed=r.get("computed"), notebook=r.get("notebook"))
                          for c, r in sorted((manifest.get("chapters") or {}).items())})


def entries(release_dir=RELEASE_DIR) -> list[tuple[dict, pd.DataFrame]]:
    """The history, oldest first: ``(meta, claims)`` per recorded release (``claims/<version>.json`` and ``.csv``)."""
    folder = Path(release_dir) / CLAIMS_DIR
    out = []
    for meta_path in sorted(folder.glob("*.json")):
        csv = meta_path.with_suffix(".csv")
        if csv.is_file():
            out.append((json.loads(meta_path.read_text()),
                        pd.read_csv(csv, dtype={"chapter": str, "key": str, "verdict": str})))
    return out


def record(release_dir=RELEASE_DIR, chapters_dir=None, chapters=None) -> Path:
    """Write the current release's entry: ``claims/<version>.json`` and, given executed ``chapters_dir``,
    ``claims/<version>.csv`` with the claims of ``chapters`` (``["04"]``; default all) replacing theirs in the latest
    earlier entry. Returns the CSV's path. Raises ``ValueError`` if the manifest has no release version, or if no
    claims table exists for it yet and ``chapters_dir`` is not given."""
    from .sweep import atomic_write_bytes

    release_dir = Path(release_dir)
    manifest = read_manifest(release_dir)
    version = (manifest.get("release") or {}).get("version")
    if not version:
        raise ValueError(f"history: {release_dir / 'manifest.json'} names no release version")
    folder = release_dir / CLAIMS_DIR
    csv = folder / f"{version}.csv"
    if chapters_dir is not None:
        new = claims_of_chapters(chapters_dir, allow_empty=chapters is not None)
        if chapters is not None:
            new = new[new["chapter"].isin([f"{int(c):02d}" for c in chapters])]
        previous = csv if csv.is_file() else next((folder / f"{m['version']}.csv" for m, _ in reversed(entries(release_dir))
                                                   if m["version"] != version), None)
        if previous is not None and previous.is_file():
            old = pd.read_csv(previous, dtype={"chapter": str, "key": str, "verdict": str})
            new = pd.concat([old[~old["chapter"].isin(set(new["chapter"]))], new], ignore_index=True)
        new = new.sort_values(["chapter", "key"], ignore_index=True)[list(COLUMNS)]
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(csv, new.to_csv(index=False).encode())
    elif not csv.is_file():
        raise ValueError(f"history: no claims table {csv} for release {version} yet; give the executed chapters "
                         f"(chapters_dir) to record one")
    atomic_write_bytes(folder / f"{version}.json",
                       (json.dumps(_entry_meta(manifest), indent=2, sort_keys=True) + "\n").encode())
    return csv


def changes(before: pd.DataFrame, after: pd.DataFrame) -> pd.DataFrame:
    """The claims whose verdict changed, appeared or went between two claims tables: columns ``chapter, key,
    verdict_before, verdict_after, estimate_before, estimate_after`` (a missing side is empty)."""
    m = before.merge(after, on=["chapter", "key"], how="outer", suffixes=("_before", "_after"))
    changed = m["verdict_before"].fillna("") != m["verdict_after"].fillna("")
    return m.loc[changed, ["chapter", "key", "verdict_before", "verdict_after", "estimate_before",
                           "estimate_after"]].reset_index(drop=True)


def _summary(claims: pd.DataFrame) -> str:
    lines = ["| chapter | claims | verdicts |", "| --- | --- | --- |"]
    for ch, g in claims.groupby("chapter", sort=True):
        counts = g["verdict"].value_counts()
        words = ", ".join(f"{n} *{v}*" for v, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
        lines.append(f"| {int(ch)} | {len(g)} | {words} |")
    return "\n".join(lines)


def _why(prev: dict, cur: dict) -> str:
    out = []
    for ch, rec in cur.get("chapters", {}).items():
        old = (prev.get("chapters") or {}).get(ch)
        if old is None:
            out.append(f"chapter {int(ch)} added (code {rec.get('code_fingerprint')}, seeds {_seeds(rec.get('seeds'))})")
        elif old.get("computed") != rec.get("computed"):
            diff = [f"code {old.get('code_fingerprint')} -> {rec.get('code_fingerprint')}"
                    if old.get("code_fingerprint") != rec.get("code_fingerprint") else
                    f"code unchanged ({rec.get('code_fingerprint')})"]
            if old.get("seeds") != rec.get("seeds"):
                diff.append(f"seeds {_seeds(old.get('seeds'))} -> {_seeds(rec.get('seeds'))}")
            out.append(f"chapter {int(ch)} recomputed ({'; '.join(diff)})")
    return "; ".join(out) or "no chapter recomputed (a verification or a change of the claims' code)"


def _seeds(seeds) -> str:
    if not seeds:
        return "none"
    s = list(seeds)
    return f"{s[0]}-{s[-1]}" if s == list(range(s[0], s[-1] + 1)) and len(s) > 2 else ", ".join(map(str, s))


def _how(v: dict | None, chapter: str) -> str | None:
    if not v:
        return None
    for key in ("exact", "statistical", "unchecked"):
        if chapter in (v.get(key) or ()):
            return key
    return "absent"


def _chapters_table(meta: dict) -> str:
    """Per chapter: when and by which git commit its rows were computed, its seeds, and how the last verification
    found it."""
    from .report import verification_words

    v = meta.get("verified")
    lines = ["| chapter | computed | git commit | seeds | verification |", "| --- | --- | --- | --- | --- |"]
    for ch, rec in sorted((meta.get("chapters") or {}).items()):
        how = _how(v, ch)
        words = "never verified by recomputation" if v is None else verification_words(how)
        lines.append(f"| {int(ch)} | {str(rec.get('computed') or '')[:10]} | {str(rec.get('git_commit'))[:10]} | "
                     f"{_seeds(rec.get('seeds'))} | {words.replace('==', '`==`')} |")
    return "\n".join(lines)


HEADER = """# Release history

<!-- made by `make history` (python -m bnstudy.study.history page) from release/claims/; do not edit -->

The published book is built from a data release (`release/`), which changes only when chapters are recomputed
(`make release CHAPTERS=...`). Each release keeps its claims table, `release/claims/<version>.csv`: one row per
claim the release's pages print (estimate, interval, p-values and verdict, in the [glossary](glossary.md)'s
words), beside `<version>.json`, what the release was computed with (each chapter's code fingerprint, git commit,
seeds and computation time) and its last verification. This page lists, release to release, which claims and
verdicts changed and why.
"""

FOOTER = """
## How a new entry is made

`make release CHAPTERS=03,04` recomputes chapters into `release/` and records the new release's claims table: the
recomputed chapters' claims read from their executed pages, the other chapters' carried over from the previous
entry. `make verify-release RECORD=1` records the verification in the entry. `make history` then rewrites this
page: a new section per release, naming each claim whose verdict changed (before and after, with the estimates),
the chapters recomputed and why (the code fingerprint and seeds before and after).
"""


def page(release_dir=RELEASE_DIR) -> str:
    """The Markdown of ``book/history.md``: per release, newest first, its code and verification and what changed
    since the previous entry (the first: its claims summary). Raises ``ValueError`` if no release is recorded."""
    from .report import verified_text

    hist = entries(release_dir)
    if not hist:
        raise ValueError(f"history: no recorded release in {Path(release_dir) / CLAIMS_DIR}")
    parts = [HEADER]
    for i in range(len(hist) - 1, -1, -1):
        meta, claims = hist[i]
        parts.append(f"\n## Release {meta['version']}\n\n")
        parts.append(f"Computed chapter by chapter, each by the git commit in the table below (the chapter's "
                     f"*Ran with* line names the same one); {verified_text(meta.get('verified'))}. "
                     f"{len(claims)} claims in {claims['chapter'].nunique()} chapters.\n\n"
                     + _chapters_table(meta) + "\n\n")
        if i == 0:
            parts.append("The first recorded release: its claims, per chapter (each verdict word as the chapter "
                         "prints it):\n\n" + _summary(claims) + "\n")
            continue
        prev_meta, prev_claims = hist[i - 1]
        parts.append(f"Since {prev_meta['version']}: {_why(prev_meta, meta)}.\n\n")
        ch = changes(prev_claims, claims)
        if ch.empty:
            parts.append("No claim's verdict changed.\n")
        else:
            lines = ["| chapter | claim | verdict before | verdict after | estimate before | estimate after |",
                     "| --- | --- | --- | --- | --- | --- |"]
            for r in ch.itertuples(index=False):
                est = [f"{x:+.3f}" if x == x else "" for x in (r.estimate_before, r.estimate_after)]
                lines.append(f"| {int(r.chapter)} | `{r.key}` | {r.verdict_before if isinstance(r.verdict_before, str) else '(new)'} "
                             f"| {r.verdict_after if isinstance(r.verdict_after, str) else '(gone)'} | {est[0]} | {est[1]} |")
            parts.append("\n".join(lines) + "\n")
    parts.append(FOOTER)
    return "".join(parts)


def main(argv=None) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="python -m bnstudy.study.history", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="record the release's claims table from executed release chapters")
    r.add_argument("--chapters-dir", required=True, help="executed chapters (NN-name.ipynb) of the release book")
    r.add_argument("--release-dir", default=str(RELEASE_DIR))
    p = sub.add_parser("page", help="write the history page")
    p.add_argument("--release-dir", default=str(RELEASE_DIR))
    p.add_argument("--out", default=str(PAGE), help="the page to write (default book/history.md)")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "record":
            print(f"[bnstudy.study.history] wrote {record(args.release_dir, args.chapters_dir)}")
        else:
            Path(args.out).write_text(page(args.release_dir))
            print(f"[bnstudy.study.history] wrote {args.out}")
    except ValueError as e:
        print(f"[bnstudy.study.history] error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
