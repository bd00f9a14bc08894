"""What a chapter run will cost, said before it trains (issue 37), from the data release's recorded times.

The release (``release/manifest.json`` and ``release/units/NN_name.jsonl.gz``) records, per chapter, every unit
(one run of one config) its full-profile tables were made of, the chapter's wall time and its worker count, and,
in most units' rows, the unit's own wall time (``wall_s``; a stage-1 source: ``stage1_wall_s``). From these:

* :func:`release_costs`: a chapter's recorded units, seeds, wall time and workers, and the CPU seconds one unit of
  each namespace took (the mean of the recorded ``wall_s``; namespaces whose rows record none share what is left
  of the chapter's CPU time, ``wall_s x workers``, equally per unit);
* :func:`chapter_estimate`: before the kernel starts (``bnstudy chapter``), the runs and time a chapter run at a
  profile and seed count should take, scaled from the release by seed count and workers;
* :func:`phase_line`: before each sweep trains (:func:`bnstudy.study.sweep.run_sweep`), the runs it computes, the
  runs the cache already holds and the time the release's per-unit costs give for them.

The scaling is a guide, not a promise: a chapter's quick profile also shortens its sweeps (fewer steps and levels),
so the full profile's time scaled by seeds is an upper bound for it; the machine and the load on it change the rest.
"""

from __future__ import annotations

import functools
import gzip
import json
from pathlib import Path

#: The data release this module reads (the same folder as :data:`bnstudy.study.manifest.RELEASE_DIR`).
RELEASE_DIR = Path(__file__).resolve().parents[2] / "release"
#: Environment variable carrying the run count :func:`chapter_estimate` expects to the kernel, so that the one
#: progress display of a chapter run (:func:`bnstudy.study.sweep.run_sweep`) can show the whole run's total.
EXPECTED_RUNS_ENV = "BNSTUDY_EXPECTED_RUNS"


def duration(seconds: float) -> str:
    """``"42 s"``, ``"7 min"``, ``"2 h 05 min"``: a time to read at a glance (``seconds`` >= 0)."""
    s = max(0.0, float(seconds))
    if s < 90:
        return f"{s:.0f} s"
    if s < 3600:
        return f"{s / 60:.0f} min"
    h, m = divmod(round(s / 60), 60)
    return f"{h} h {m:02d} min"


@functools.lru_cache(maxsize=None)
def release_costs(stem: str, release_dir: str | None = None) -> dict | None:
    """The release's record of chapter ``stem`` (``"01_freeze_modes"``): ``{"units", "seeds", "wall_s",
    "workers", "profile", "per_unit_s": {namespace: CPU seconds per unit}, "units_of": {namespace: count}}``;
    ``None`` when the release lacks the chapter or its units file (a chapter not released yet). Seconds are wall
    seconds of one worker process (a unit runs on one); ``wall_s`` is ``None`` where the manifest records no run
    time, and a namespace's ``per_unit_s`` ``None`` where neither its rows nor the chapter's time give one."""
    folder = Path(release_dir) if release_dir else RELEASE_DIR
    manifest_path = folder / "manifest.json"
    if not manifest_path.is_file():
        return None
    manifest = json.loads(manifest_path.read_text())
    chapter = next((c for c in manifest.get("chapters", {}).values() if c.get("notebook") == stem), None)
    units = manifest.get("units", {}).get(stem)
    if chapter is None or units is None or not (folder / units["file"]).is_file():
        return None
    recorded: dict[str, list[float]] = {}
    unrecorded: dict[str, int] = {}
    with gzip.open(folder / units["file"], "rt") as f:
        for line in f:
            if not line.strip():
                continue
            doc = json.loads(line)
            ns, row = doc["namespace"], doc["row"]
            w = row.get("wall_s", row.get("stage1_wall_s"))
            if isinstance(w, (int, float)):
                recorded.setdefault(ns, []).append(float(w))
            else:
                unrecorded[ns] = unrecorded.get(ns, 0) + 1
    workers = int(chapter.get("workers") or 1)
    # a chapter computed with reuse_units ran only its new units; the reused ones cost their earlier run's time;
    # a chapter whose manifest records neither (run_wall_s null) has no recorded time: None, never 0 s
    parts = [chapter.get(k) for k in ("run_wall_s", "reused_run_wall_s") if isinstance(chapter.get(k), (int, float))]
    wall = float(sum(parts)) if parts else None
    per_unit = {ns: sum(v) / len(v) for ns, v in recorded.items()}
    n_left = sum(unrecorded.values())
    left = None if wall is None else wall * workers - sum(sum(v) for v in recorded.values())
    for ns in unrecorded:  # what the recorded units leave of the chapter's time, shared; unknown if nothing is left
        per_unit.setdefault(ns, left / n_left if left is not None and left > 0 and n_left else None)
    counts = {ns: len(v) for ns, v in recorded.items()}
    for ns, n in unrecorded.items():
        counts[ns] = counts.get(ns, 0) + n
    seeds = chapter.get("seeds")
    return dict(units=int(units["units"]), seeds=len(seeds) if isinstance(seeds, list) else int(seeds or 0),
                wall_s=wall, workers=workers, profile=chapter.get("profile", "full"), per_unit_s=per_unit,
                units_of=counts)


def chapter_estimate(stem: str, profile: str, seeds: int, workers: int, release_dir=None) -> tuple[str, int | None]:
    """The line ``bnstudy chapter`` prints before the kernel starts, and the run count it expects (``None``
    without a record): chapter ``stem`` at ``profile`` with ``seeds`` seeds on ``workers`` worker processes, scaled
    from the release's full-profile run (units and time by ``seeds`` / the release's seeds, time by the release's
    workers / ``workers``)."""
    rec = release_costs(stem, str(release_dir) if release_dir else None)
    if rec is None or not rec["seeds"]:
        return (f"{stem} is not in the data release, so there is no recorded time to scale; each phase says how "
                f"many runs it computes before it trains", None)
    scale = seeds / rec["seeds"]
    runs = max(1, round(rec["units"] * scale))
    if rec["wall_s"] is None:
        return (f"{stem} at the {profile} profile with {seeds} seed{'s' if seeds != 1 else ''}: about {runs:,} runs "
                f"(the release's {rec['profile']} run: {rec['units']:,} runs at {rec['seeds']} seeds, scaled by "
                f"seeds; the release recorded no run time for this chapter, so no time is estimated); runs already "
                f"in the cache are not recomputed, and each phase says how many before it trains", runs)
    wall = rec["wall_s"] * scale * rec["workers"] / max(1, workers)
    basis = (f"the release's {rec['profile']} run: {rec['units']:,} runs at {rec['seeds']} seeds in "
             f"{duration(rec['wall_s'])} on {rec['workers']} worker{'s' if rec['workers'] != 1 else ''}, scaled by "
             f"seeds and workers")
    if profile == rec["profile"]:
        text = f"about {runs:,} runs, expected about {duration(wall)} on {workers} worker{'s' if workers != 1 else ''}"
    else:
        text = f"at most about {runs:,} runs and {duration(wall)} on {workers} worker{'s' if workers != 1 else ''}"
        basis += f"; the {profile} profile also shortens its sweeps"
    return (f"{stem} at the {profile} profile with {seeds} seed{'s' if seeds != 1 else ''}: {text} ({basis}); "
            f"runs already in the cache are not recomputed, and each phase says how many before it trains", runs)


@functools.lru_cache(maxsize=None)
def namespace_cost(namespace: str, release_dir: str | None = None) -> float | None:
    """CPU seconds one unit of sweep ``namespace`` took in the release (``ch04_heads``: chapter 4's record;
    ``source``, shared by the chapters: the mean over every chapter that recorded it); ``None`` if unrecorded."""
    folder = Path(release_dir) if release_dir else RELEASE_DIR
    manifest_path = folder / "manifest.json"
    if not manifest_path.is_file():
        return None
    stems = list(json.loads(manifest_path.read_text()).get("units", {}))
    if namespace.startswith("ch") and namespace[2:4].isdigit():
        stems = [s for s in stems if s[:2] == namespace[2:4]]
    costs = [(rec["per_unit_s"][namespace], rec["units_of"][namespace]) for rec in
             (release_costs(s, release_dir) for s in stems)
             if rec and rec["per_unit_s"].get(namespace) is not None]
    n = sum(c for _, c in costs)
    return sum(s * c for s, c in costs) / n if n else None


def phase_line(phase: int, namespace: str, to_compute: int, cached: int, workers: int, cache_root) -> str:
    """What a sweep says before it trains: ``phase 2 (ch01_head_sweep): 18 runs to compute, 0 in the cache;
    expected about 3 min on 2 workers (the release's recorded time per run); cache /path``."""
    cost = namespace_cost(namespace)
    parallel = max(1, min(workers, to_compute))
    when = (f"expected about {duration(cost * to_compute / parallel)} on {parallel} worker"
            f"{'s' if parallel != 1 else ''} (the release's recorded time per run)" if cost is not None
            else "no recorded time for these runs")
    return (f"phase {phase} ({namespace}): {to_compute:,} run{'s' if to_compute != 1 else ''} to compute, "
            f"{cached:,} in the cache; {when}; cache {cache_root}")
