"""Chapter 3, what is claimed: the cost and the benefit of drifting statistics against shift strength.

Within a seed every mode and shift starts from the same backbone, head-B initialisation and task-B batches, so the
effects are paired differences per seed (:func:`paired_effects`), with ``pinned = "backbone_eval"``::

    cost    = task_a_after(pinned) - task_a_after(train_mode)
    benefit = task_b(train_mode)   - task_b(pinned),    net = benefit - cost

Every interval, test and verdict comes from :mod:`bnstudy.study.inference`. The rows -> :func:`claims` (one claims
table), :func:`findings` (one numbers table), the page's sentences (:func:`page_texts`, :data:`NOTES`) and the tidy
tables the figures and display tables draw.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ...inference import Claim, Family, Interval, Question, ask, bootstrap_distribution, bootstrap_interval, \
    claims_table, count_verdicts, decide, holm, number, numbers_table, percentile_interval, rank_correlation, \
    t_interval, two_sided_p
from ...words import Note, claim, claim_text, counts_text, join, notes
from ...config import check_choice
from .run import CH1_STEPS, EXTRA_LINES, GRID_MODES, LINE_SPEC, LINES, PINNED_MODES, POINT_COLS, REFERENCE_SHIFT, \
    SHIFT_TYPES

#: Tie thresholds of the crossover's sensitivity table (accuracy fraction, or share of room in the normalized view).
TIE_THRESHOLDS = (0.0, 0.005, 0.01, 0.02)
#: The mismatch candidates compared on predicting a held-out shift type's cost: name -> results column.
CANDIDATES = {"KL": "mismatch_kl", "mean shift": "mismatch_mean_shift", "log variance ratio": "mismatch_log_var_ratio",
              "Wasserstein": "mismatch_wasserstein", "KL (train pass)": "mismatch_kl_train"}
#: What identifies a run apart from its mode: the keys paired comparisons match on.
PAIR_KEYS = ("seed", *POINT_COLS, "steps")
EFFECTS = ("cost", "benefit", "net")


# --- analysis: paired effects, lines, crossover -------------------------------------------------------------------

def paired_effects(df: pd.DataFrame, pinned: str = "backbone_eval") -> pd.DataFrame:
    """One row per point (:data:`PAIR_KEYS`) with a ``train_mode`` and a ``pinned`` run: ``cost``, ``benefit``,
    ``net`` (accuracy fractions), the accuracies behind them and the ``train_mode`` row's mode-free columns
    (mismatch, line flags). Raises ``ValueError`` if ``pinned`` is not a pinned mode, no pair exists, or a run is
    repeated."""
    check_choice("pinned", pinned, PINNED_MODES)
    keys = [k for k in PAIR_KEYS if k in df.columns]
    dup = df[df["mode"].isin(["train_mode", pinned])].duplicated([*keys, "mode"])
    if dup.any():  # a repeated run would pair twice (or pick one silently): each point's runs once
        raise ValueError(f"paired_effects: {int(dup.sum())} repeated ({', '.join(keys)}, mode) rows; give each run once")
    tm = df[df["mode"] == "train_mode"].set_index(keys)
    pn = df[df["mode"] == pinned].set_index(keys)
    both = tm.index.intersection(pn.index)
    if len(both) == 0:
        raise ValueError(f"paired_effects needs train_mode and {pinned} runs at the same (seed, brightness, contrast)")
    tm, pn = tm.loc[both], pn.loc[both]
    shared = [c for c in tm.columns if c.startswith(("mismatch_", "on_", "s_")) or
              c in ("both_strength", "in_grid", "task_a_before", "part", "n_classes")]
    return tm[shared].assign(task_a_after_train_mode=tm["task_a_after"], task_a_after_pinned=pn["task_a_after"],
                             task_b_train_mode=tm["task_b"], task_b_pinned=pn["task_b"],
                             cost=pn["task_a_after"] - tm["task_a_after"], benefit=tm["task_b"] - pn["task_b"],
                             net=lambda d: d["benefit"] - d["cost"], pinned=pinned).reset_index()


def strength_of(effects: pd.DataFrame, line: str) -> pd.Series:
    """The strength of each row on ``line`` (any of :data:`LINES`; NaN off the line)."""
    check_choice("shift_type", line, LINES)
    if f"s_{line}" not in effects:  # rows from before the line was designed: none on it
        return pd.Series(np.nan, index=effects.index, dtype=float)
    return effects[f"s_{line}"].astype(float)


def line_matrix(effects: pd.DataFrame, shift_type: str, column: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(strengths (L,), seeds (S,), values (S, L))`` of ``column`` along a line. Raises ``ValueError`` if a seed
    lacks a level (the bootstrap needs complete, paired rows)."""
    sub = effects.assign(strength=strength_of(effects, shift_type)).dropna(subset=["strength"])
    wide = sub.pivot_table(index="seed", columns="strength", values=column, aggfunc="first")
    if wide.isna().any().any():
        raise ValueError(f"line {shift_type!r}: some seeds lack some levels of {column!r}")
    return wide.columns.to_numpy(float), wide.index.to_numpy(), wide.to_numpy(float)


def first_crossing(strength, cost_mean, benefit_mean, min_effect: float = 0.01) -> float:
    """The weakest strength where the mean ``benefit - cost`` changes sign (linear interpolation between the two
    resolved levels that bracket it); NaN if it never does. Levels where both ``|cost|`` and ``|benefit|`` are below
    ``min_effect``, or both exactly 0, are ties and are skipped."""
    x = np.asarray(strength, float)
    c, b = np.asarray(cost_mean, float), np.asarray(benefit_mean, float)
    keep = ((np.abs(c) >= min_effect) | (np.abs(b) >= min_effect)) & ((c != 0) | (b != 0))
    x, d = x[keep], (b - c)[keep]
    for i in range(len(d) - 1):
        if d[i] == 0:
            return float(x[i])
        if d[i] * d[i + 1] < 0:
            return float(x[i] + (x[i + 1] - x[i]) * d[i] / (d[i] - d[i + 1]))
    return float(x[-1]) if len(d) and d[-1] == 0 else math.nan


def crossover(strength, cost, benefit, n_boot: int = 2000, seed: int = 0, confidence: float = 0.95,
              min_effect: float = 0.01) -> dict:
    """The crossover of the cost and benefit curves (``strength (L,)`` increasing; ``cost``, ``benefit``: ``(S, L)``
    per-seed effects): ``estimate`` (:func:`first_crossing` of the mean curves); over ``n_boot`` resamples of whole
    seeds, ``ci_low`` / ``ci_high`` (among the resamples that cross), ``q_low`` / ``q_high`` (a resample that does not
    cross counts as ``+inf``) and ``p_cross``; ``dominant`` (the higher mean curve at the strongest level),
    ``first_resolved`` (the weakest strength where either mean reaches ``min_effect``). Raises ``ValueError`` for
    mismatched shapes, under 2 seeds or levels, ``n_boot < 1``, a bad ``confidence`` or a non-increasing strength."""
    x = np.asarray(strength, float)
    c, b = np.asarray(cost, float), np.asarray(benefit, float)
    if c.ndim != 2 or c.shape != b.shape or c.shape[1] != len(x):
        raise ValueError(f"cost and benefit must both be (seeds, levels) with levels = len(strength) = {len(x)}; "
                         f"got {c.shape} and {b.shape}")
    if c.shape[0] < 2 or len(x) < 2:
        raise ValueError(f"crossover needs at least 2 seeds and 2 levels, got {c.shape}")
    if not isinstance(n_boot, int) or n_boot < 1:
        raise ValueError(f"n_boot must be a positive integer, got {n_boot!r}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    if np.any(np.diff(x) <= 0):
        raise ValueError("strength must be strictly increasing")
    cm, bm = c.mean(0), b.mean(0)
    boots = bootstrap_distribution(c.shape[0], lambda i: first_crossing(x, c[i].mean(0), b[i].mean(0), min_effect),
                                    n_boot, seed)
    crossed = boots[~np.isnan(boots)]
    lo, hi = percentile_interval(crossed, confidence)
    qlo, qhi = percentile_interval(np.where(np.isnan(boots), np.inf, boots), confidence, method="inverted_cdf")
    resolved = x[(np.abs(cm) >= min_effect) | (np.abs(bm) >= min_effect)]
    return dict(estimate=first_crossing(x, cm, bm, min_effect), ci_low=lo, ci_high=hi, q_low=qlo, q_high=qhi,
                p_cross=float(len(crossed) / n_boot), n_boot=n_boot, dominant="cost" if cm[-1] >= bm[-1] else "benefit",
                first_resolved=float(resolved[0]) if len(resolved) else math.nan, min_effect=min_effect)


def mode_effects(df: pd.DataFrame) -> pd.DataFrame:
    """Per run with a ``backbone_eval`` run at its point: ``task_a_change = task_a_after - task_a_before`` and
    ``task_b_gain`` (``task_b`` minus the ``backbone_eval`` run's)."""
    keys = [k for k in PAIR_KEYS if k in df.columns]
    ref = df[df["mode"] == "backbone_eval"].set_index(keys)["task_b"].rename("task_b_reference")
    out = df.join(ref, on=keys, how="inner")
    out["task_a_change"] = out["task_a_after"] - out["task_a_before"]
    out["task_b_gain"] = out["task_b"] - out["task_b_reference"]
    return out


# --- tidy tables behind the figures --------------------------------------------------------------------------------

def _ci_long(df: pd.DataFrame, by: list, metrics) -> pd.DataFrame:
    recs = [dict(zip(by, key if isinstance(key, tuple) else (key,)), metric=m, mean=iv.mean, ci_low=iv.low,
                 ci_high=iv.high, n_seeds=iv.n)
            for key, g in df.groupby(by, sort=True) for m in metrics for iv in [t_interval(g[m])]]
    return pd.DataFrame(recs, columns=[*by, "metric", "mean", "ci_low", "ci_high", "n_seeds"])


def _main(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["part"] == "main"] if "part" in df.columns else df


def _affine(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of the original design: task B's own classes, no corruption."""
    return df[((df["task_b_classes"] == "new") & (df["corruption"] == "none")).to_numpy()]


def _noshift(eff: pd.DataFrame) -> np.ndarray:
    """Rows at their family's no-shift point (no corruption, brightness 0, contrast 1)."""
    return ((eff["brightness"] == 0) & (eff["contrast"] == 1) & (eff["corruption"] == "none")).to_numpy()


def _present_lines(eff: pd.DataFrame) -> list:
    return [t for t in LINES if f"on_{t}" in eff and eff[f"on_{t}"].astype(bool).any()]  # absent: older rows


def _shifted_levels(eff: pd.DataFrame):
    """``(line, strength, rows)`` for every level of every line present but the family's no-shift point."""
    shifted = ~_noshift(eff)
    for t in _present_lines(eff):
        st = strength_of(eff, t).where(shifted)
        for x in sorted(st.dropna().unique()):
            yield t, float(x), eff[st == x]


def _budget_levels(df: pd.DataFrame) -> list:
    """The ``both``-line strengths of the budget check (empty without one)."""
    return sorted(df.loc[df["part"] == "budget", "both_strength"].dropna().unique()) if "part" in df.columns else []


def seed_points(df: pd.DataFrame) -> pd.DataFrame:
    """Each seed's cost and benefit at every shifted level (Fig. 1's strip), long: ``line, strength, seed, metric,
    value``."""
    parts = [g.assign(line=t, strength=x).melt(id_vars=["line", "strength", "seed"], value_vars=["cost", "benefit"],
                                               var_name="metric", value_name="value")
             for t, x, g in _shifted_levels(paired_effects(_main(df)))]
    if not parts:
        return pd.DataFrame(columns=["line", "strength", "seed", "metric", "value"])
    return pd.concat(parts, ignore_index=True).sort_values(["line", "strength", "metric", "seed"], ignore_index=True)


def budget_table(df: pd.DataFrame) -> pd.DataFrame:
    """Cost, benefit and net at the budget check's strengths per stage-2 step count: ``t, steps, metric, mean,
    ci_low, ci_high, n_seeds`` (empty without a budget check)."""
    levels = _budget_levels(df)
    if not levels:
        return pd.DataFrame(columns=["t", "steps", "metric", "mean", "ci_low", "ci_high", "n_seeds"])
    bud = paired_effects(df[df["both_strength"].isin(levels)])
    return _ci_long(bud.rename(columns={"both_strength": "t"}), ["t", "steps"], EFFECTS)


def grid_table(df: pd.DataFrame) -> pd.DataFrame:
    """Cost, benefit and net on the brightness x contrast grid, long like :func:`budget_table`."""
    return _ci_long(_grid_effects(df), ["brightness", "contrast"], EFFECTS)


def condition_kind(effects: pd.DataFrame) -> np.ndarray:
    """Which line each row's shift illustrates: the first of :data:`LINES` it lies on; ``"no shift"`` (task B's own
    classes) or ``"no shift, same classes"`` at a family's no-shift point; else ``"grid only"``."""
    kind = np.full(len(effects), "grid only", dtype=object)
    for t in reversed(_present_lines(effects)):
        kind = np.where(strength_of(effects, t).notna().to_numpy(), t, kind)
    same, noshift = (effects["task_b_classes"] == "same").to_numpy(), _noshift(effects)
    return np.where(noshift & same, "no shift, same classes", np.where(noshift, "no shift", kind))


def condition_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per shift: the :data:`POINT_COLS`, ``kind`` (:func:`condition_kind`), the ``on_<line>`` flags, and the
    mean and 95% interval (``<col>``, ``<col>_lo``, ``<col>_hi``; Student's t over seeds) of every mismatch candidate,
    ``cost`` and ``benefit``."""
    eff = paired_effects(_main(df)).pipe(lambda e: e.assign(kind=condition_kind(e)))
    keys = [k for k in POINT_COLS if k in eff.columns]
    cols = [c for c in (*CANDIDATES.values(), "cost", "benefit") if c in eff.columns]
    return pd.DataFrame([dict(zip(keys, key), kind=g["kind"].iloc[0],
                              **{f"on_{t}": bool(g[f"on_{t}"].iloc[0]) for t in LINES if f"on_{t}" in g.columns},
                              **{col + e: v for col in cols for e, v in zip(("", "_lo", "_hi"), t_interval(g[col]))})
                         for key, g in eff.groupby(keys, sort=True)])


def scatter_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per mode and line shift: task-A change and task-B gain over ``backbone_eval``, long like :func:`grid_table`."""
    return _ci_long(mode_effects(_on_lines(df)), ["mode", "brightness", "contrast"], ("task_a_change", "task_b_gain"))


# --- per-level effects, multiplicity, equivalence, the normalized view (issue 10) ---------------------------------

#: The page's direction words (:func:`bnstudy.study.inference.decide`), each the sign of *condition minus reference*:
#: the net and the no-shift benefit; a longer minus a shorter budget; the grid's corner cost minus a part's.
NET_WORDS = dict(higher="train mode higher", lower="train mode lower")
BUDGET_WORDS = dict(higher="longer budget higher", lower="longer budget lower")
COMPOUND_WORDS = dict(higher="combined shift costs more", lower="combined shift costs less")
DIRECTIONS: tuple[str, ...] = tuple(w for d in (NET_WORDS, BUDGET_WORDS, COMPOUND_WORDS) for w in d.values())
#: The verdict kinds (:data:`bnstudy.study.inference.VERDICT_KINDS`) the per-level tables count, in the page's order.
KINDS = ("lower", "higher", "equivalent", "not decided", "too few seeds")
#: Views of the per-level effects: name -> (cost, benefit, net) columns of :func:`normalized_effects`. ``raw``:
#: accuracy; ``normalized``: shares of each task's room above chance; ``vs no shift``: accuracy, the benefit counted
#: above its value at the family's no-shift point (an offset gained without any shift is not adaptation).
VIEWS = {"raw": ("cost", "benefit", "net"), "normalized": ("cost_n", "benefit_n", "net_n"),
         "vs no shift": ("cost", "benefit_0", "net_0")}
#: Equivalence margins at which the page counts the verdicts (the TOST margin is a choice; the counts show it).
MARGINS = (0.01, 0.02, 0.03)
#: Lines that share their shifts (twins): a leave-one-type-out fit holds a line out together with its twin.
TWINS = {"both": ("both", "same_both"), "same_both": ("both", "same_both"), "noise": ("noise", "same_noise"),
         "same_noise": ("noise", "same_noise")}
#: How to compute each mismatch candidate with :func:`bnstudy.statistics_mismatch`: name -> (measure, mode).
CANDIDATE_CALLS = {"KL": ("kl", "eval"), "mean shift": ("mean_shift", "eval"),
                   "log variance ratio": ("log_var_ratio", "eval"), "Wasserstein": ("wasserstein", "eval"),
                   "KL (train pass)": ("kl", "train")}


def normalized_effects(eff: pd.DataFrame, chance: float) -> pd.DataFrame:
    """``eff`` (:func:`paired_effects`) with, per seed, ``room_a = task_a_before - chance``, ``room_b``
    (``train_mode``'s task-B accuracy minus chance at the no-shift point of the seed and task-B family; NaN where a
    room is not positive), ``cost_n = cost / room_a``, ``benefit_n = benefit / room_b``, ``net_n``,
    ``benefit_noshift`` (the benefit at that no-shift point), ``benefit_0 = benefit - benefit_noshift`` and ``net_0 =
    benefit_0 - cost``. Raises ``ValueError`` if a family has no no-shift point."""
    out = eff.copy()
    at0 = out[_noshift(out)].groupby(["seed", "task_b_classes"])
    idx = pd.MultiIndex.from_arrays([out["seed"], out["task_b_classes"]])
    if not idx.isin(at0["task_b_train_mode"].first().index).all():
        raise ValueError("normalized_effects needs the no-shift point of every seed and task-B family")
    out["room_a"] = (out["task_a_before"] - chance).where(lambda r: r > 0)
    out["room_b"] = (at0["task_b_train_mode"].first() - chance).reindex(idx).to_numpy()
    out["room_b"] = out["room_b"].where(out["room_b"] > 0)
    out["cost_n"] = out["cost"] / out["room_a"]
    out["benefit_n"] = out["benefit"] / out["room_b"]
    out["net_n"] = out["benefit_n"] - out["cost_n"]
    out["benefit_noshift"] = at0["benefit"].first().reindex(idx).to_numpy()
    out["benefit_0"] = out["benefit"] - out["benefit_noshift"]
    out["net_0"] = out["benefit_0"] - out["cost"]
    return out


def _chance(df: pd.DataFrame) -> float:
    return 1 / int(df["n_classes"].iloc[0]) if "n_classes" in df.columns else 0.1


def _normalized(df: pd.DataFrame) -> pd.DataFrame:
    return normalized_effects(paired_effects(_main(df)), _chance(df))


def breakeven_interval(cost, benefit, n_boot: int = 2000, seed: int = 0, confidence: float = 0.95) -> tuple:
    """Uncorrected seed-bootstrap percentile interval ``(low, high)`` of the break-even rate ``mean(benefit) /
    mean(cost)`` (cost and benefit resampled together; a resample with a mean cost <= 0 has an unbounded rate).
    ``(nan, nan)`` where there is no interval (fewer than 2 seeds) or its upper end is unbounded. Raises
    ``ValueError`` for unequal lengths, ``n_boot < 1`` or ``confidence`` outside (0, 1)."""
    c, b = np.asarray(cost, float), np.asarray(benefit, float)
    if c.shape != b.shape or c.ndim != 1:
        raise ValueError(f"cost and benefit must be 1-D of equal length, got {c.shape} and {b.shape}")
    if not isinstance(n_boot, (int, np.integer)) or n_boot < 1:
        raise ValueError(f"n_boot must be a positive integer, got {n_boot!r}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    rate = lambda c, b: float(np.mean(b)) / float(np.mean(c)) if float(np.mean(c)) > 0 else math.inf  # noqa: E731
    iv = bootstrap_interval((c, b), rate, confidence, int(n_boot), seed)
    if not (np.isfinite(iv.low) and np.isfinite(iv.high)):
        return math.nan, math.nan
    return float(iv.low), float(iv.high)


def rate_reading(rate: float, low: float, high: float, kind: str) -> str:
    """A break-even rate as the per-level table prints it: ``"n/a"``, ``"<rate> [<low>, <high>]"`` or ``"<rate>
    (point estimate only)"``; a rate above 1 whose accuracy verdict (``kind``) shows no direction gets ``", net: no
    direction shown"``, so that it does not read as drifting statistics paying at a 1:1 exchange."""
    if not np.isfinite(rate):
        return "n/a"
    out = f"{rate:.2f} [{low:.2f}, {high:.2f}]" if np.isfinite(low) and np.isfinite(high) else \
        f"{rate:.2f} (point estimate only)"
    return out + (", net: no direction shown" if rate > 1 and kind in ("equivalent", "not decided", "too few seeds")
                  else "")


#: The columns of :func:`level_table`.
LEVEL_COLUMNS = ["line", "family", "strength", "view", "metric", "mean", "ci_low", "ci_high", "n_seeds", "m_tests", "p",
                 "tost_p", "kind", "verdict", "breakeven_rate", "breakeven_low", "breakeven_high"]


def level_table(df: pd.DataFrame, alpha: float = 0.05, margin: float = 0.02, n_boot: int = 2000) -> pd.DataFrame:
    """Per line, shifted level and view (:data:`VIEWS`), long (:data:`LEVEL_COLUMNS`): mean cost, benefit and net with
    family intervals (Bonferroni over the ``m_tests`` levels), the net's ``p``, TOST ``tost_p`` at ``margin`` and
    :func:`~bnstudy.study.inference.decide`'s ``kind`` and ``verdict``; in the raw view where the cost's family
    interval excludes 0, ``breakeven_rate`` (mean benefit over mean cost: how many task-B points one task-A point must
    be worth for drifting not to pay) and its :func:`breakeven_interval` (``n_boot``, seed 0)."""
    groups = list(_shifted_levels(_normalized(df)))
    fam = Family(max(len(groups), 1), alpha)
    recs = []
    for t, x, g in groups:
        rate, r_lo, r_hi = math.nan, math.nan, math.nan
        if t_interval(g["cost"], fam.confidence).low > 0:
            rate = float(g["benefit"].mean() / g["cost"].mean())
            if np.isfinite(rate):
                pair = g[["cost", "benefit"]].dropna()
                r_lo, r_hi = breakeven_interval(pair["cost"], pair["benefit"], n_boot, seed=0)
        for view, cols in VIEWS.items():
            c = decide(g[cols[2]], margin=margin, family=fam, **NET_WORDS)
            raw = [rate, r_lo, r_hi] if view == "raw" else [math.nan] * 3
            for metric, col in zip(EFFECTS, cols):
                iv = t_interval(g[col], fam.confidence)
                recs.append([t, LINE_SPEC[t][0], x, view, metric, iv.mean, iv.low, iv.high, iv.n, fam.m, c.p,
                             c.p_equivalence, c.kind, c.verdict, *raw])
    return pd.DataFrame(recs, columns=LEVEL_COLUMNS)


def _strength_key(x: float) -> str:
    """A strength as a glue-key part: ``1`` -> ``"1"``, ``0.0625`` -> ``"0_0625"``."""
    return f"{x:g}".replace(".", "_").replace("-", "m")


def _vs(view: str) -> str:
    return view.replace(" ", "_")


def level_claims(levels: pd.DataFrame, margin: float) -> pd.DataFrame:
    """The per-level verdicts of :func:`level_table` (its ``net`` rows), one family per view; key
    ``<view>_<line>_<strength>`` (e.g. ``vs_no_shift_both_1``)."""
    net = levels[levels["metric"] == "net"]
    parts = [_table_claims(v.rename(columns={"m_tests": "m"}), [f"{_vs(view)}_{t}_{_strength_key(x)}"
                                                                for t, x in zip(v["line"], v["strength"])], margin)
             for view in VIEWS for v in [net[net["view"] == view]] if len(v)]
    return pd.concat(parts, ignore_index=True) if parts else claims_table([])


def view_claims(claims: pd.DataFrame, view: str) -> pd.DataFrame:
    """The per-level claims of one view (keys ``<view>_<line>_<strength>``, not the aliases), one family."""
    return claims[claims["key"].astype(str).str.startswith(tuple(f"{_vs(view)}_{t}_" for t in LINES)).astype(bool)]


VIEW_LABELS = {"raw": "accuracy", "normalized": "share of room", "vs no shift": "benefit above no-shift"}


def holm_extra_resolved(df: pd.DataFrame, alpha: float = 0.05) -> dict:
    """Per view, how many levels Holm's step-down on the net's two-sided p resolves that the page's Bonferroni
    family leaves without a direction (p >= ``alpha / m``): the sensitivity of that choice."""
    groups = [g for _, _, g in _shifted_levels(_normalized(df))]
    m = max(len(groups), 1)
    ps = {_vs(view): np.array([two_sided_p(g[cols[2]]) for g in groups], float) for view, cols in VIEWS.items()}
    return {v: int(np.sum((holm(p) < alpha) & ~(p < alpha / m))) for v, p in ps.items()}


def verdict_table(levels: pd.DataFrame) -> pd.DataFrame:
    """The page's per-level table (display cells) from :func:`level_table`: per line and strength the net with its
    family interval and verdict in each view (:data:`VIEW_LABELS`) and the break-even rate (:func:`rate_reading`)."""
    net = levels[levels["metric"] == "net"]
    rows = []
    for (t, x), g in net.groupby(["line", "strength"], sort=False):
        r = {"line": t, "strength": f"{x:g}"}
        for view, label in VIEW_LABELS.items():
            for _, v in g[g["view"] == view].iloc[:1].iterrows():
                r[f"benefit - cost ({label})"] = f"{v['mean']:+.3f} [{v['ci_low']:+.3f}, {v['ci_high']:+.3f}]"
                r[f"verdict ({label})"] = v["verdict"]
        raw = g[g["view"] == "raw"].iloc[0]
        r["break-even rate [95%]"] = rate_reading(raw["breakeven_rate"], raw["breakeven_low"], raw["breakeven_high"],
                                                  raw["kind"])
        rows.append(r)
    return pd.DataFrame(rows).set_index(["line", "strength"])


def margin_counts(df: pd.DataFrame, margins=MARGINS, alpha: float = 0.05) -> pd.DataFrame:
    """Per view and equivalence margin, how many levels count as each of :data:`KINDS` (:func:`level_table` at that
    margin), long: ``view, margin, kind, n``. Raises ``ValueError`` for a margin that is not positive."""
    recs = []
    for mg in margins:
        if not mg > 0:
            raise ValueError(f"margins must be > 0, got {mg!r}")
        cl = level_claims(level_table(df, alpha, float(mg)), float(mg))
        for view in VIEWS:
            cnt = count_verdicts(view_claims(cl, view), alpha)
            recs += [(view, float(mg), k, int(cnt[k])) for k in KINDS]
    return pd.DataFrame(recs, columns=["view", "margin", "kind", "n"])


def margin_display(mc: pd.DataFrame) -> pd.DataFrame:
    """The page's margin table (display cells): rows view x margin, columns the verdicts, cells counts of levels."""
    out = mc.pivot_table(index=["view", "margin"], columns="kind", values="n", aggfunc="first", sort=False)
    labels = {**NET_WORDS, "equivalent": "equivalent within \u00b1margin", "not decided": "not decided",
              "too few seeds": "too few seeds"}
    return out[[k for k in KINDS if k in out.columns]].rename(columns=labels)


#: The columns of :func:`threshold_table` after ``line, view, threshold`` (:func:`crossover`'s entries).
CROSS_COLUMNS = ["estimate", "ci_low", "ci_high", "q_low", "q_high", "p_cross"]


def threshold_table(df: pd.DataFrame, thresholds=TIE_THRESHOLDS, n_boot: int = 2000) -> pd.DataFrame:
    """How the crossover moves with the tie threshold: per line, view and threshold, :func:`crossover`'s
    :data:`CROSS_COLUMNS` (bootstrap seed 0). Long."""
    eff = _normalized(df)
    recs = []
    for t in _present_lines(eff):
        for view, (cc, bc, _n) in VIEWS.items():
            sub = eff.dropna(subset=[cc, bc])
            x, _, c = line_matrix(sub, t, cc)
            _, _, b = line_matrix(sub, t, bc)
            if len(x) >= 2 and c.shape[0] >= 2:
                recs += [[t, view, float(thr)] + [cr[k] for k in CROSS_COLUMNS] for thr in thresholds
                         for cr in [crossover(x, c, b, n_boot=n_boot, seed=0, min_effect=float(thr))]]
    return pd.DataFrame(recs, columns=["line", "view", "threshold", *CROSS_COLUMNS])


def _loc(v: float) -> str:
    return "none" if not np.isfinite(v) else f"{v:.3g}"


#: The cell :func:`threshold_display` prints at threshold 0 of the ``vs no shift`` view (an artefact of the view).
ARTEFACT_CELL = "n/a (by construction)"


def threshold_display(th: pd.DataFrame) -> pd.DataFrame:
    """The page's sensitivity table (display cells): rows line x view, columns the tie thresholds; a cell is the
    crossover of the mean curves (``none``: they do not cross), its unconditional 95% bootstrap interval and the
    share of resamples that cross."""
    th = th.assign(cell=[f"{_loc(e)} [{_loc(lo)}, {_loc(hi)}] ({p:.0%})"
                         for e, lo, hi, p in zip(th["estimate"], th["q_low"], th["q_high"], th["p_cross"])])
    # In the "vs no shift" view the net at no shift is -cost(no shift) by construction, so at threshold 0 every line
    # "crosses" just after no shift as soon as its first level's mean is negative: no information, blanked.
    th.loc[(th["view"] == "vs no shift") & (th["threshold"] == 0), "cell"] = ARTEFACT_CELL
    out = th.pivot_table(index=["line", "view"], columns="threshold", values="cell", aggfunc="first", sort=False)
    out.columns = [f"tie < {c:g}" for c in out.columns]
    return out


# --- which mismatch measure predicts the cost of a shift type it has not seen (issue 10) ----------------------------

def isotonic_predict(x_train, y_train, x_new) -> np.ndarray:
    """A non-decreasing least-squares step function of ``x_train`` fitted to ``y_train`` (pool adjacent violators,
    ``scipy.optimize.isotonic_regression``; ties in ``x`` averaged first), read at ``x_new`` by linear interpolation,
    constant beyond the ends."""
    from scipy.optimize import isotonic_regression
    x, y = np.asarray(x_train, float), np.asarray(y_train, float)
    ux, inv = np.unique(x, return_inverse=True)
    w = np.bincount(inv).astype(float)
    fit = isotonic_regression(np.bincount(inv, weights=y) / w, weights=w, increasing=True).x
    return np.interp(np.asarray(x_new, float), ux, fit)


def loo_errors(x, y, kinds, held_out_types, twins: dict | None = None) -> dict:
    """Leave one shift type out: per type of ``held_out_types``, the mean absolute error on its points of
    :func:`isotonic_predict` fitted on the other kinds' points, its ``twins`` (:data:`TWINS`) held out with it."""
    x, y, kinds = np.asarray(x, float), np.asarray(y, float), np.asarray(kinds)
    out = {}
    for t in held_out_types:
        test = kinds == t
        train = ~np.isin(kinds, list((twins or {}).get(t, (t,))) + [t])
        if test.any() and train.sum() >= 2:
            out[t] = float(np.abs(isotonic_predict(x[train], y[train], x[test]) - y[test]).mean())
    return out


def mismatch_selection(df: pd.DataFrame, candidates: dict = CANDIDATES, n_boot: int = 1000, seed: int = 0,
                       confidence: float = 0.95, twins: dict | None = TWINS) -> dict:
    """Mismatch candidates compared on predicting the cost of a held-out shift type: a candidate's score is the mean
    over the lines of :func:`loo_errors` on the shifts' seed means (grid-only shifts left out; lower is better). The
    winner (lowest score) is kept fixed over ``n_boot`` resamples of whole seeds, which give percentile intervals of
    every score, rank correlation with the cost and score minus the winner's (``beaten`` where it lies above 0).
    Returns ``candidates`` (name -> those entries and ``per_type``), ``winner``, ``types``, ``n_conditions``,
    ``n_boot``. Raises ``ValueError`` with fewer than 2 held-out types or 2 seeds."""
    eff = paired_effects(_main(df)).pipe(lambda e: e.assign(kind=condition_kind(e)))
    keys = [k for k in POINT_COLS if k in eff.columns]
    piv = {c: eff.pivot_table(index="seed", columns=keys, values=c, aggfunc="first")
           for c in (*candidates.values(), "cost")}
    kinds = eff.groupby(keys)["kind"].first().reindex(piv["cost"].columns).to_numpy()
    V = {c: p.dropna().to_numpy(float) for c, p in piv.items()}
    n_seeds = V["cost"].shape[0]
    types = [k for k in dict.fromkeys(kinds) if k in LINES]
    use = np.isin(kinds, [*types, "no shift", "no shift, same classes"])
    if len(types) < 2 or n_seeds < 2:
        raise ValueError(f"mismatch_selection needs >= 2 shift types and 2 seeds, got {types} and {n_seeds}")

    def scores(idx):
        means = {c: V[c][idx].mean(0) for c in V}
        out = {}
        for name, col in candidates.items():
            e = loo_errors(means[col][use], means["cost"][use], kinds[use], types, twins)
            out[name] = (float(np.mean(list(e.values()))), rank_correlation(means[col], means["cost"])[0], e)
        return out

    names = list(candidates)
    point = scores(np.arange(n_seeds))
    winner = min(point, key=lambda k: point[k][0])
    # every candidate's score and rho on the same resamples of whole seeds: rows 0..K-1 scores, K..2K-1 rhos
    dist = bootstrap_distribution(n_seeds, lambda i: np.array([v for sc in [scores(i)] for k in (0, 1)
                                                                for v in (sc[n][k] for n in names)]), n_boot, seed)
    K, wi = len(names), names.index(winner)
    res = {}
    for j, name in enumerate(names):
        s_lo, s_hi = percentile_interval(dist[j], confidence)
        r_lo, r_hi = percentile_interval(dist[K + j], confidence)
        lo, hi = percentile_interval(dist[j] - dist[wi], confidence)
        res[name] = dict(score=point[name][0], score_lo=s_lo, score_hi=s_hi, rho=point[name][1],
                         rho_lo=r_lo, rho_hi=r_hi, diff=point[name][0] - point[winner][0], diff_lo=lo,
                         diff_hi=hi, beaten="yes" if lo > 0 else "no", per_type=point[name][2])
    return dict(candidates=res, winner=winner, types=types, n_conditions=int(use.sum()), n_boot=n_boot)


def selection_table(sel: dict) -> pd.DataFrame:
    """:func:`mismatch_selection` tidy: ``candidate, held_out, error`` (``held_out = "mean"``: the score, with the
    score's, the rank correlation's and the difference from the winner's intervals)."""
    recs = []
    for name, r in sel["candidates"].items():
        recs += [dict(candidate=name, held_out=t, error=e) for t, e in r["per_type"].items()]
        recs.append(dict(candidate=name, held_out="mean", error=r["score"], error_lo=r["score_lo"],
                         error_hi=r["score_hi"], rho=r["rho"], rho_lo=r["rho_lo"], rho_hi=r["rho_hi"],
                         diff_from_winner_lo=r["diff_lo"], diff_from_winner_hi=r["diff_hi"]))
    return pd.DataFrame(recs)


def equal_measure_spread(conditions: pd.DataFrame, column: str) -> dict:
    """The largest gap in cost between two lines at one value of the mismatch ``column``: each line's cost read as a
    function of the measure by linear interpolation (log scale) between its conditions, over the range both lines
    cover. Returns ``value, line_low, cost_low, line_high, cost_high`` (NaN / ``"none"`` if no two lines overlap)."""
    best = dict(value=math.nan, line_low="none", cost_low=math.nan, line_high="none", cost_high=math.nan)
    curves = {}
    for t in LINES:
        g = conditions[conditions[f"on_{t}"].astype(bool)].sort_values(column) if f"on_{t}" in conditions else ()
        if len(g) >= 2 and (g[column] > 0).all():
            curves[t] = (np.log(g[column].to_numpy(float)), g["cost"].to_numpy(float))
    gap, names = -1.0, list(curves)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            lo, hi = max(curves[a][0][0], curves[b][0][0]), min(curves[a][0][-1], curves[b][0][-1])
            if hi <= lo:
                continue
            grid = np.linspace(lo, hi, 64)
            ca, cb = np.interp(grid, *curves[a]), np.interp(grid, *curves[b])
            j = int(np.argmax(np.abs(ca - cb)))
            if abs(ca[j] - cb[j]) > gap:
                gap = abs(ca[j] - cb[j])
                (l1, c1), (l2, c2) = sorted([(a, ca[j]), (b, cb[j])], key=lambda z: z[1])
                best = dict(value=float(np.exp(grid[j])), line_low=l1, cost_low=float(c1), line_high=l2,
                            cost_high=float(c2))
    return best


# --- the training budget at every budget point (issue 10) -----------------------------------------------------------

def budget_points(df: pd.DataFrame) -> pd.DataFrame:
    """Every point of the budget check, long ``t, steps, mode, metric, mean, ci_low, ci_high, n_seeds``: per ``t``,
    stage-2 ``steps`` and mode the task-B accuracy, and (``mode = "paired"``) :func:`budget_table`'s effects."""
    cols = ["t", "steps", "mode", "metric", "mean", "ci_low", "ci_high", "n_seeds"]
    levels = _budget_levels(df)
    if not levels:
        return pd.DataFrame(columns=cols)
    sub = df[df["both_strength"].isin(levels)].rename(columns={"both_strength": "t"})
    acc = _ci_long(sub[sub["mode"].isin(GRID_MODES)], ["t", "steps", "mode"], ("task_b",))
    return pd.concat([acc, budget_table(df).assign(mode="paired")], ignore_index=True)[cols]


#: The columns of :func:`budget_net_table` and :func:`convergence_table` (the latter without ``tost_p``).
VERDICT_COLUMNS = ["mean", "ci_low", "ci_high", "n_seeds", "m", "p", "tost_p", "kind", "verdict"]


def _verdict_rows(rows: list, keys: list, alpha: float, margin: float | None, words: dict) -> pd.DataFrame:
    """``rows`` of ``(*key values, per-seed differences)`` decided as one family, columns ``keys`` +
    :data:`VERDICT_COLUMNS`."""
    fam = Family(max(len(rows), 1), alpha)
    recs = [[*key, c.estimate, c.low, c.high, c.n, fam.m, c.p, c.p_equivalence, c.kind, c.verdict]
            for *key, d in rows for c in [decide(d, margin=margin, family=fam, **words)]]
    return pd.DataFrame(recs, columns=[*keys, *VERDICT_COLUMNS])


def budget_net_table(df: pd.DataFrame, margin: float = 0.02, alpha: float = 0.05) -> pd.DataFrame:
    """The net at every budget point (``t``, ``steps``) with its verdict, the points one family, TOST at ``margin``.
    Columns ``t, steps`` + :data:`VERDICT_COLUMNS`; empty without a budget check."""
    levels = _budget_levels(df)
    rows = [(float(t), int(st), g["net"]) for (t, st), g in
            paired_effects(df[df["both_strength"].isin(levels)]).groupby(["both_strength", "steps"], sort=True)] \
        if levels else []
    return _verdict_rows(rows, ["t", "steps"], alpha, margin, NET_WORDS)


def convergence_table(df: pd.DataFrame, alpha: float = 0.05) -> pd.DataFrame:
    """Has each head stopped improving? Per budget ``t`` and mode (:data:`GRID_MODES`), the paired change of task-B
    accuracy from the second-longest to the longest budget, and of the benefit (``mode = "benefit"``), one family in
    :data:`BUDGET_WORDS` (``"longer budget higher"``: still improving). Columns ``t, mode, steps_from, steps_to`` +
    :data:`VERDICT_COLUMNS` but ``tost_p``."""
    rows = []
    for t in _budget_levels(df):
        sub = df[df["both_strength"] == t]
        steps = sorted(sub["steps"].unique())
        if len(steps) < 2:
            continue
        s0, s1 = steps[-2], steps[-1]
        for mode in GRID_MODES:
            w = sub[sub["mode"] == mode].pivot_table(index="seed", columns="steps", values="task_b", aggfunc="first")
            rows.append((float(t), mode, int(s0), int(s1), w[s1] - w[s0]))
        e = paired_effects(sub).pivot_table(index="seed", columns="steps", values="benefit", aggfunc="first")
        rows.append((float(t), "benefit", int(s0), int(s1), e[s1] - e[s0]))
    return _verdict_rows(rows, ["t", "mode", "steps_from", "steps_to"], alpha, None, BUDGET_WORDS).drop(
        columns="tost_p")


def _num(x: float, d: int) -> str:
    """``x`` to ``d`` decimals, without a negative zero ("-0.000" reads as "0.000")."""
    c = f"{x:.{d}f}"
    return c[1:] if c.startswith("-") and float(c) == 0 else c


def _display(table: pd.DataFrame, index: dict, mean: str, d: int, middle: dict, tail: dict) -> pd.DataFrame:
    """A verdict table's display cells: the ``index`` columns, ``middle``, the ``mean`` and the family interval to
    ``d`` decimals, then ``tail``."""
    m = int(table["m"].iloc[0]) if len(table) else 1
    out = pd.DataFrame({**index, **middle, mean: [_num(v, d) for v in table["mean"]],
                        f"interval ({Family(m).confidence:.2%}, m = {m})":
                            [f"{_num(lo, d)} to {_num(hi, d)}" for lo, hi in zip(table["ci_low"], table["ci_high"])],
                        **tail})
    return out.set_index(list(index))


def budget_net_display(bn: pd.DataFrame) -> pd.DataFrame:
    """The page's budget-net table (display cells) from :func:`budget_net_table`: rows ``t`` x ``stage-2 steps``."""
    p_cell = lambda p: "n/a" if not np.isfinite(p) else ("<0.0001" if p < 1e-4 else f"{p:.4f}")  # noqa: E731
    return _display(bn, {"t": [f"{t:g}" for t in bn["t"]], "stage-2 steps": [f"{int(s):,}" for s in bn["steps"]]},
                    "net (mean)", 4,
                    {}, {"seeds": [f"{int(n)}" for n in bn["n_seeds"]],
                         "TOST p": [p_cell(float(p)) for p in bn["tost_p"]], "verdict": list(bn["verdict"])})


def convergence_display(cv: pd.DataFrame) -> pd.DataFrame:
    """The page's convergence table (display cells) from :func:`convergence_table`: rows ``t`` x head."""
    return _display(cv, {"t": [f"{t:g}" for t in cv["t"]], "head": list(cv["mode"])}, "change (mean)", 3,
                    {"budgets (steps)": [f"{int(a):,} to {int(b):,}" for a, b in zip(cv["steps_from"], cv["steps_to"])]},
                    {"verdict": list(cv["verdict"])})


def selection_display(selection: pd.DataFrame) -> pd.DataFrame:
    """The page's selection table from :func:`selection_table`: rows candidate (in :data:`CANDIDATES` order),
    columns the held-out lines and then ``score (mean)``, errors to 3 decimals."""
    w = selection.pivot(index="candidate", columns="held_out", values="error")
    held = [h for h in dict.fromkeys(selection["held_out"]) if h != "mean"]
    order = [c for c in CANDIDATES if c in w.index] + [c for c in w.index if c not in CANDIDATES]
    return (w.reindex(index=order, columns=held + (["mean"] if "mean" in w.columns else [])).round(3)
            .rename(columns={"mean": "score (mean)"}).rename_axis(index="candidate", columns="held-out line"))


# --- the claims: every verdict the page prints, one claims table (bnstudy.study.inference) --------------------------

#: The page's comparisons that fit :func:`bnstudy.study.inference.ask`, one family (m = 1): ``noshift_benefit``, task
#: B's accuracy under ``train_mode`` minus ``backbone_eval`` at the no-shift point of the original design; and the
#: identity ``sep_task_a`` (a check, not a finding): on the lines, ``separate_stats`` changes task A by exactly 0.
QUESTIONS = (
    Question("noshift_benefit", "train_mode", "backbone_eval", value="task_b", by="mode",
             at=dict(brightness=0.0, contrast=1.0), table="affine", words="train mode"),
    Question("sep_task_a", value="task_a_change", at=dict(mode="separate_stats"), table="lines", exact=0.0),
)


def _on_lines(df: pd.DataFrame) -> pd.DataFrame:
    """The original design's runs on the three affine lines (:func:`_affine` of the main sweep)."""
    main = _affine(_main(df))
    return main[main[["on_brightness", "on_contrast", "on_both"]].any(axis=1)]


def _grid_effects(df: pd.DataFrame) -> pd.DataFrame:
    """The paired effects at the grid's cells (the original design's main sweep)."""
    eff = paired_effects(_affine(_main(df)))
    return eff[eff["in_grid"].astype(bool)]


def _table_claims(table: pd.DataFrame, keys, margin: float = math.nan) -> pd.DataFrame:
    """The rows of a verdict table (:data:`VERDICT_COLUMNS`, ``tost_p`` optional) as one family's claims table."""
    if not len(table):
        return claims_table([])
    conf = Family(int(table["m"].iloc[0])).confidence
    return claims_table(Claim(key=k, estimate=float(r["mean"]), low=float(r["ci_low"]), high=float(r["ci_high"]),
                              n=int(r["n_seeds"]), p=float(r["p"]), p_equivalence=float(r.get("tost_p", math.nan)),
                              margin=float(margin), confidence=conf, kind=r["kind"], verdict=r["verdict"])
                        for k, (_, r) in zip(keys, table.iterrows()))


def _alias(claims: pd.DataFrame, key: str, alias: str) -> pd.DataFrame:
    """The row ``key`` of a claims table again under ``alias`` (a name the prose can cite whatever the levels)."""
    return claims[claims["key"] == key].assign(key=alias)


def _budget_changes(df: pd.DataFrame, bn: pd.DataFrame) -> dict:
    """Per budget strength ``t`` with two budgets or more (``bn``: :func:`budget_net_table`): the per-seed benefit at
    the longest minus the shortest budget."""
    changes = {}
    if len(bn):
        for t, g in paired_effects(df[df["both_strength"].isin(bn["t"].unique())]).groupby("both_strength"):
            w = g.pivot(index="seed", columns="steps", values="benefit")
            if w.shape[1] >= 2:
                changes[float(t)] = w[w.columns.max()] - w[w.columns.min()]
    return changes


def claims(df: pd.DataFrame, n_boot: int = 2000, tie_margin: float = 0.02, alpha: float = 0.05) -> pd.DataFrame:
    """Every verdict chapter 3 prints, one claims table (glued as ``ch03_<key>_<column>``), each family with its own
    Holm column: :data:`QUESTIONS`; the per-level claims (:func:`level_claims`, TOST at ``tie_margin``) and their
    aliases ``weakest_<view>_<line>`` and ``at_t1_<line>_<view>``; ``budget_net_<t>_s<steps>``
    (:func:`budget_net_table`), ``budget_change_<t>`` (:func:`_budget_changes`; alias ``budget_change_strongest``),
    ``grid_compound`` / ``grid_compound_max`` (the grid corner's cost minus the brightness offset's alone / minus the
    larger part's, per seed) and ``convergence_<t>_<mode>`` (alias ``convergence_weakest_<mode>``). Raises
    ``ValueError`` on a duplicate key."""
    lines = _on_lines(df).assign(task_a_change=lambda d: d["task_a_after"] - d["task_a_before"])
    keys = [k for k in PAIR_KEYS if k in lines.columns]
    lines = lines[lines.set_index(keys).index.isin(lines[lines["mode"] == "backbone_eval"].set_index(keys).index)]
    parts = [ask(dict(affine=_affine(_main(df)), lines=lines), QUESTIONS, alpha)]
    lv = level_table(df, alpha, tie_margin, n_boot)
    levels, net = level_claims(lv, tie_margin), lv[lv["metric"] == "net"]
    pairs = [(f"{_vs(v)}_{t}_{_strength_key(g['strength'].min())}", f"weakest_{_vs(v)}_{t}")
             for v in VIEWS for t, g in net[net["view"] == v].groupby("line", sort=False)]
    pairs += [(f"{_vs(v)}_{t}_{_strength_key(g['strength'].iloc[0])}", f"at_t1_{t}_{_vs(v)}")
              for t in ("both", "same_both") for v in VIEWS
              for g in [net[(net["line"] == t) & np.isclose(net["strength"], 1.0) & (net["view"] == v)]] if len(g)]
    parts += [levels, *(_alias(levels, k, a) for k, a in pairs)]
    bn = budget_net_table(df, tie_margin, alpha)
    parts.append(_table_claims(bn, [f"budget_net_{_strength_key(t)}_s{int(st)}" for t, st in zip(bn["t"], bn["steps"])],
                               tie_margin))
    changes = _budget_changes(df, bn)
    if len(bn):
        fam = Family(max(len(changes), 1), alpha)
        bc = claims_table(decide(d, f"budget_change_{_strength_key(t)}", family=fam, **BUDGET_WORDS)
                          for t, d in changes.items())
        parts += [bc, _alias(bc, f"budget_change_{_strength_key(max(changes))}", "budget_change_strongest")
                  if changes else bc.iloc[:0]]
    grid = _grid_effects(df)
    if len(grid):
        bmax, cmax = grid["brightness"].max(), grid["contrast"].max()
        cw = grid.pivot_table(index="seed", columns=["brightness", "contrast"], values="cost", aggfunc="first")
        if (bmax, cmax) in cw.columns and (bmax, 1.0) in cw.columns:
            comp = [("grid_compound", cw[(bmax, cmax)] - cw[(bmax, 1.0)])]
            if (0.0, cmax) in cw.columns:
                comp.append(("grid_compound_max", cw[(bmax, cmax)] - np.maximum(cw[(bmax, 1.0)], cw[(0.0, cmax)])))
            fam = Family(len(comp), alpha)
            parts.append(claims_table(decide(d, k, family=fam, **COMPOUND_WORDS) for k, d in comp))
    cv = convergence_table(df)
    keys = [f"convergence_{_strength_key(t)}_{m}" for t, m in zip(cv["t"], cv["mode"])]
    conv = _table_claims(cv, keys)
    parts += [conv, *(_alias(conv, k, f"convergence_weakest_{m}") for k, t, m in zip(keys, cv["t"], cv["mode"])
                      if t == cv["t"].min())]
    out = pd.concat([c for c in parts if len(c)], ignore_index=True)
    if out["key"].duplicated().any():
        raise ValueError(f"claims: duplicate keys {sorted(out.loc[out['key'].duplicated(), 'key'])}")
    return out


# --- the numbers: every descriptive number the prose cites, one flat table (bnstudy.study.inference.numbers_table) ---

def _family_counts(samples, alpha: float = 0.05) -> tuple[int, int]:
    """``(n_lower, n_higher)``: how many of ``samples`` (per-seed differences, one family of ``m = len(samples)``)
    show a direction below or above zero by their Bonferroni family interval (the book's one verdict per claim)."""
    samples = list(samples)
    fam = Family(max(len(samples), 1), alpha)
    c = count_verdicts(claims_table([decide(v, key=str(i), family=fam) for i, v in enumerate(samples)]))
    return int(c["lower"]), int(c["higher"])


def task_a_difference(cost: Interval) -> Interval:
    """Task A's ``train_mode - backbone_eval`` (the page's sign) from a cost interval: the same interval, negated."""
    return Interval(-cost.mean, -cost.high, -cost.low, cost.n, cost.confidence)


def _budget_grid_findings(df: pd.DataFrame) -> tuple[dict, dict]:
    """``(numbers, task_a)`` of the budget check at its largest strength ``budget_t`` (its shortest and longest
    stage-2 step counts ``budget_s_lo`` / ``budget_s_hi``, the benefit and task A's difference at each) and of the
    grid (its cells, largest net, corner ``(grid_bmax, grid_cmax)`` and the cost there and at its two parts)."""
    out, task_a = dict(budget_t=math.nan, budget_s_lo=math.nan, budget_s_hi=math.nan), {}
    bt = budget_table(df)
    if not bt.empty:
        t, ends = float(bt["t"].max()), {"lo": int(bt["steps"].min()), "hi": int(bt["steps"].max())}
        B = bt.set_index(["t", "steps", "metric"])
        iv = lambda m, n: Interval(*B.loc[(t, n, m), ["mean", "ci_low", "ci_high"]].astype(float),  # noqa: E731
                                   int(B.loc[(t, n, m), "n_seeds"]))
        out = dict(budget_t=t, budget_s_lo=ends["lo"], budget_s_hi=ends["hi"],
                   budget={f"benefit_{e}": iv("benefit", n) for e, n in ends.items()})
        task_a = {f"budget_{e}": task_a_difference(iv("cost", n)) for e, n in ends.items()}
    grid = dict(n_cells=0, net_max=math.nan, bmax=math.nan, cmax=math.nan, cost_corner=math.nan,
                cost_bonly=math.nan, cost_conly=math.nan)
    if df["in_grid"].astype(bool).any():
        gt = grid_table(df)
        wide = {m: gt[gt["metric"] == m].set_index(["brightness", "contrast"])["mean"] for m in ("net", "cost")}
        bmax, cmax = float(gt["brightness"].max()), float(gt["contrast"].max())
        grid = dict(n_cells=len(wide["net"]), net_max=float(wide["net"].max()), bmax=bmax, cmax=cmax,
                    cost_corner=float(wide["cost"].loc[(bmax, cmax)]),
                    cost_bonly=float(wide["cost"].get((bmax, 1.0), math.nan)),
                    cost_conly=float(wide["cost"].get((0.0, cmax), math.nan)))
    task_a |= {f"grid_{k}": -grid[f"cost_{k}"] for k in ("corner", "bonly", "conly")}
    return out | {f"grid_{k}": v for k, v in grid.items()}, task_a


def _groups(pc: pd.DataFrame, col: str, min_effect: float, name: str) -> dict:
    """The largest ``col`` among the shifts whose cost stayed below ``min_effect`` (95%) and the smallest among those
    whose cost exceeded it (``safe_max_<name>`` / ``harm_min_<name>``, NaN where a group is empty), and whether the
    two groups ``overlap``."""
    safe, harm = pc[pc["cost_hi"] < min_effect][col], pc[pc["cost_lo"] > min_effect][col]
    return {f"safe_max_{name}": float(safe.max()) if len(safe) else math.nan,
            f"harm_min_{name}": float(harm.min()) if len(harm) else math.nan,
            "overlap": "overlap" if len(safe) and len(harm) and harm.min() < safe.max() else "do not overlap"}


def _level_findings(df: pd.DataFrame, lv: pd.DataFrame, claims: pd.DataFrame, alpha: float, margin: float,
                    n_boot: int, min_effect: float) -> dict:
    """The per-level numbers: verdicts counted, crossings, rooms above chance, the same-class family and the extra
    lines' strongest levels, and the numbers the full-profile referee asked for (margins, budgets, break-even rates)."""
    n_kind = {k: {view: int(count_verdicts(view_claims(claims, view))[k]) for view in VIEWS} for k in KINDS}
    raw = lv[(lv["metric"] == "net") & (lv["view"] == "raw")]  # the raw view's levels counted per line
    rc = view_claims(claims, "raw")
    line_of = dict(zip([f"raw_{t}_{_strength_key(x)}" for t, x in zip(raw["line"], raw["strength"])], raw["line"]))
    counts = {t: {k: int(cnt[k]) for k in KINDS} | {"levels": cnt["m"]} for t in dict.fromkeys(raw["line"])
              for cnt in [count_verdicts(rc[rc["key"].map(line_of).eq(t)])]}
    g = lv[(lv["line"] == "both") & np.isclose(lv["strength"], 1.0) & (lv["view"] == "raw")].set_index("metric")
    at_t1 = {m: Interval(*g.loc[m, ["mean", "ci_low", "ci_high"]].astype(float), int(g.loc[m, "n_seeds"]),
                         Family(int(g.loc[m, "m_tests"])).confidence) for m in ("cost", "benefit")} if len(g) else {}
    th = threshold_table(df, TIE_THRESHOLDS, n_boot)
    tl = {view: {f"thr{thr:g}": join(list(hit)) if len(hit) else "none" for thr in TIE_THRESHOLDS
                 for hit in [th.loc[(th["view"] == view) & (th["threshold"] == thr) & th["estimate"].notna(), "line"]]}
          for view in VIEWS}
    eff = _normalized(df)
    room_b = {f: float(g.groupby("seed")["room_b"].first().mean()) for f, g in eff.groupby(eff["task_b_classes"])}
    room_a = float(eff.groupby("seed")["room_a"].first().mean())
    ends = lambda g: dict(cost=t_interval(g["cost"]), benefit=t_interval(g["benefit"]),  # noqa: E731
                          taskb_train=float(g["task_b_train_mode"].mean()),
                          taskb_pinned=float(g["task_b_pinned"].mean()))
    family, extra, present = {}, {}, _present_lines(eff)
    if "same_both" in present:
        st = strength_of(eff, "same_both")
        g1 = eff[np.isclose(st, 1.0)] if np.isclose(st, 1.0).any() else eff[st == st.max()]
        family = dict(t=float(g1["s_same_both"].iloc[0]), **ends(g1))
    for t in EXTRA_LINES:
        if t in present and t != "same_both":
            st = strength_of(eff, t)
            extra[t] = dict(max_strength=float(st.max()), **ends(eff[st == st.max()]))
    rate = room_b.get("new", math.nan) / room_a if room_a > 0 else math.nan  # the sweep's exchange rate
    out = dict(alpha=alpha, tie_margin=margin, m_tests=int(lv["m_tests"].iloc[0]) if len(lv) else 0,
               counts=dict(raw=counts), at_t1=dict(both_raw=at_t1) if at_t1 else {}, n_lower=n_kind["lower"],
               n_higher=n_kind["higher"], n_equivalent=n_kind["equivalent"], n_not_decided=n_kind["not decided"],
               n_too_few=n_kind["too few seeds"], threshold_lines=tl, room_a=room_a, room_b=room_b,
               exchange_rate=rate, family=family, extra=extra)
    mc = margin_counts(df, MARGINS, alpha)
    margins = {view: {f"m{mg:g}": {k: int(n) for k, n in zip(g["kind"], g["n"])}
                      for mg, g in mc[mc["view"] == view].groupby("margin")} for view in VIEWS}
    net = lv[lv["metric"] == "net"]
    level = Family(int(net["m_tests"].iloc[0])).level if len(net) else alpha
    # a direction shown whose TOST also puts it inside the margin: shown, and smaller than the margin
    n_within = {view: int((net["view"].eq(view) & net["kind"].isin(["lower", "higher"])
                           & (net["tost_p"] < level)).sum()) for view in VIEWS}
    th = threshold_table(df, (min_effect,), n_boot)  # at the page's tie threshold
    cross_page = {view: {r["line"]: f"{_loc(r['estimate'])} [{_loc(r['q_low'])}, {_loc(r['q_high'])}], "
                                    f"{r['p_cross']:.0%} of resamples cross"
                         for _, r in th[th["view"] == view].iterrows()} for view in VIEWS}
    bn = budget_net_table(df, margin, alpha)
    b_t_min, room_long, room_steps, ben_sum = math.nan, math.nan, math.nan, []
    if len(bn):
        b_t_min = float(bn["t"].min())
        bud = paired_effects(df[df["both_strength"].isin(bn["t"].unique())])
        ben_sum = [f"t = {t:g}: {claim_text(claim(claims, f'budget_change_{_strength_key(t)}'))}"
                   for t in _budget_changes(df, bn)]
        room_steps = float(bud["steps"].max())
        g = bud[(bud["both_strength"] == b_t_min) & (bud["steps"] == bud["steps"].max())]
        room_long = float(g["task_b_train_mode"].mean()) - _chance(df)
    grid = _grid_effects(df)
    shifted = grid[~_noshift(grid)]
    n_neg, _ = _family_counts(g["net"] for _, g in shifted.groupby(["brightness", "contrast"]))
    aff = paired_effects(_affine(_main(df)))
    t1 = aff.loc[np.isclose(aff["both_strength"], 1.0), "task_a_after_train_mode"]
    # Levels whose break-even rate lies between the sweep's exchange rate and the longest budget's: the sign of their
    # normalized mean net differs between the two rates (benefit / cost > rate <=> normalized net > 0).
    rate_long = room_long / room_a if room_a > 0 else math.nan
    lo_r, hi_r = sorted([rate, rate_long]) if np.isfinite(rate) and np.isfinite(rate_long) else (math.nan, math.nan)
    be = net[(net["view"] == "raw") & net["breakeven_rate"].between(lo_r, hi_r)]
    nv = net[net["view"] == "normalized"].set_index(["line", "strength"])["verdict"]
    dep = [f"{r['line']} {r['strength']:g} ({nv.get((r['line'], r['strength']), 'n/a')})" for _, r in be.iterrows()]
    n_eval = int(df["n_eval"].iloc[0])
    p_b = float(_main(df).loc[lambda d: d["mode"] == "train_mode", "task_b"].mean())
    b_n0 = eff[_noshift(eff) & (eff["task_b_classes"] == "new").to_numpy()]["benefit_n"]
    flips = sum(int(g.sort_values("steps")["kind"].iloc[0] != g.sort_values("steps")["kind"].iloc[-1])
                for _, g in bn.groupby("t"))
    longest = [(t, f"budget_net_{_strength_key(t)}_s{int(g['steps'].max())}") for t, g in bn.groupby("t")]
    net_sum = [f"t = {t:g}: {claim_text(claim(claims, key), 4)}" for t, key in longest]
    return out | dict(**rate_findings(lv), holm_extra_resolved=holm_extra_resolved(df, alpha),
                      budget_dependent_levels=join(dep) if dep else "none", n_budget_dependent=len(dep),
                      t1_taska_train_mean=float(t1.mean()) if len(t1) else math.nan,
                      n_eval=n_eval, eval_se=math.sqrt(p_b * (1 - p_b) / n_eval),
                      benefit_n_noshift=float(b_n0.mean()) if len(b_n0) else math.nan, budget_net_n_flips=flips,
                      budget_net_m=len(bn), budget_change_m=len(ben_sum),
                      budget_net_summary="; ".join(net_sum) if net_sum else "not measured",
                      budget_benefit_summary="; ".join(ben_sum) if ben_sum else "not measured",
                      margin_counts=margins, n_within_margin=n_within, cross_page=cross_page,
                      budget_t_min=b_t_min, room_b_long=room_long, room_b_long_t=b_t_min,
                      room_b_long_steps=room_steps, exchange_rate_long=rate_long,
                      grid_n_shifted=int(shifted.groupby(["brightness", "contrast"]).ngroups),
                      grid_n_net_negative_shifted=n_neg,
                      t1_taska_train_seed_min=float(t1.min()) if len(t1) else math.nan,
                      t1_taska_train_seed_max=float(t1.max()) if len(t1) else math.nan)


def _boot_rho(eff: pd.DataFrame, keys: list, a: str, b: str, n_boot: int, seed: int = 0) -> dict:
    """Spearman correlation of the condition means of ``a`` and ``b`` with a seeded percentile bootstrap interval
    over whole seeds."""
    A = eff.pivot_table(index="seed", columns=keys, values=a, aggfunc="first").dropna()
    B = eff.pivot_table(index="seed", columns=keys, values=b, aggfunc="first").reindex_like(A)
    A, B = A.to_numpy(float), B.to_numpy(float)
    iv = bootstrap_interval((np.arange(len(A), dtype=float),),
                            lambda i: rank_correlation(A[i.astype(int)].mean(0), B[i.astype(int)].mean(0))[0],
                            n_resamples=n_boot, seed=seed)
    return dict(rho=iv.mean, lo=iv.low, hi=iv.high)


def _mismatch_findings(df: pd.DataFrame, n_boot: int, min_effect: float) -> dict:
    """The rank correlations, the ``safe`` / ``harm`` groups around ``min_effect`` and the candidates' selection
    (:func:`mismatch_selection`, ``n_boot`` resamples)."""
    pc = condition_table(df)
    kl = _groups(pc, "mismatch_kl", min_effect, "kl")
    cands = {k: v for k, v in CANDIDATES.items() if v in df.columns}
    sel = mismatch_selection(df, cands, n_boot=n_boot, seed=0)
    # Intervals on the other correlations the page cites (seeds resampled as in mismatch_selection).
    rho = {name: dict(rho=r["rho"], lo=r["rho_lo"], hi=r["rho_hi"]) for name, r in sel["candidates"].items()}
    eff = paired_effects(_main(df))
    keys = [k for k in POINT_COLS if k in eff.columns]
    for name, (a, b) in {"kl_benefit": ("mismatch_kl", "benefit"),
                         "kl_eval_train": ("mismatch_kl", "mismatch_kl_train")}.items():
        if a in eff.columns and b in eff.columns:
            rho[name] = _boot_rho(eff, keys, a, b, n_boot)
    for t in _present_lines(eff):
        rho[f"kl_cost_{t}"] = _boot_rho(eff[eff[f"on_{t}"].astype(bool)], keys, "mismatch_kl", "cost", n_boot)
    w = sel["winner"]
    per = sel["candidates"][w]["per_type"]
    ns = pc[pc["kind"].astype(str).str.startswith("no shift")][cands[w]]
    tied = [n for n, r in sel["candidates"].items() if n == w or r["beaten"] != "yes"]
    beaten = [n for n in sel["candidates"] if n not in tied]
    measure, mode = CANDIDATE_CALLS.get(w, ("kl", "eval"))
    groups = _groups(pc, cands[w], min_effect, "w")
    return dict(n_conditions=len(pc), rho_cost=rank_correlation(pc["mismatch_kl"], pc["cost"])[0],
                noshift_kl=float(pc[pc.kind == "no shift"]["mismatch_kl"].mean()),
                safe_max_kl=kl["safe_max_kl"], harm_min_kl=kl["harm_min_kl"],
                indistinct=join(tied), beaten=join(beaten) if beaten else "none",
                winner_call=f'`statistics_mismatch(backbone, batches, measure="{measure}", network_mode="{mode}")`',
                rho=rho, selection=dict(sel["candidates"]), winner=w, n_beaten=len(beaten),
                winner_worst_type=max(per, key=per.get), winner_worst_error=max(per.values()),
                winner_best_type=min(per, key=per.get), winner_best_error=min(per.values()),
                winner_noshift=float(ns.mean()) if len(ns) else math.nan,
                winner_safe_max=groups["safe_max_w"], winner_harm_min=groups["harm_min_w"],
                winner_threshold_clean=groups["overlap"], kl_spread=equal_measure_spread(pc, "mismatch_kl"),
                winner_spread=equal_measure_spread(pc, cands[w]),
                n_other_candidates=len(cands) - 1)


def rate_findings(levels: pd.DataFrame) -> dict:
    """What the raw view's break-even rates (:func:`level_table`) support: ``rate_n`` levels with a rate,
    ``rate_n_point_only`` of them without an interval, ``rate_n_above_1`` above 1, ``rate_n_above_1_ci`` of those
    whose interval lies above 1 and ``rate_n_above_1_paid`` whose verdict is ``"train mode higher"`` (only a resolved
    net shows drifting paying at a 1:1 exchange); ``rate_above_1_levels`` (``"line strength: rate [low, high],
    verdict"``; ``"none"``)."""
    r = levels[(levels["metric"] == "net") & (levels["view"] == "raw")]
    r = r[np.isfinite(r["breakeven_rate"].astype(float))]
    above = r[r["breakeven_rate"] > 1]
    items = [f"{x['line']} {x['strength']:g}: " + rate_reading(x["breakeven_rate"], x["breakeven_low"],
                                                               x["breakeven_high"], "").rstrip() + f", {x['verdict']}"
             for _, x in above.iterrows()]
    return dict(rate_n=len(r), rate_n_point_only=int((~np.isfinite(r["breakeven_low"].astype(float))).sum()),
                rate_n_above_1=len(above), rate_n_above_1_ci=int((above["breakeven_low"] > 1).sum()),
                rate_n_above_1_paid=int((above["kind"] == "higher").sum()),
                rate_above_1_levels="; ".join(items) if items else "none")


def findings(df: pd.DataFrame, n_boot: int = 2000, min_effect: float = 0.01, tie_margin: float = 0.02,
             alpha: float = 0.05, n_boot_select: int = 500, claims_: pd.DataFrame | None = None) -> pd.DataFrame:
    """Chapter 3's numbers table (:func:`bnstudy.study.inference.numbers_table`, glued as ``ch03_<key>``; accuracies
    as fractions; NaN where the sweep lacks what a number needs) from :func:`run`'s rows (the three lines, with
    ``train_mode``, ``backbone_eval`` and ``separate_stats`` on them: else ``ValueError``). ``task_a_*``: task A as the
    page prints it, ``train_mode - backbone_eval`` (the negated cost, cut to [-1, 1]). ``claims_``: :func:`claims` of
    ``df`` if already computed."""
    main = _affine(_main(df))
    for t in SHIFT_TYPES:
        if main[f"on_{t}"].sum() == 0:
            raise ValueError(f"findings needs all three lines; the {t} line has no runs")
    missing = {"train_mode", "backbone_eval", "separate_stats"} - set(main["mode"])
    if missing:
        raise ValueError(f"findings needs the modes {sorted(missing)} on the lines")
    C = claims(df, n_boot, tie_margin, alpha) if claims_ is None else claims_
    eff = paired_effects(main)
    cost, benefit = {}, {}
    for t in SHIFT_TYPES:
        cost[f"{t}_max"], benefit[f"{t}_max"] = (t_interval(line_matrix(eff, t, m)[2][:, -1]) for m in EFFECTS[:2])
    ns, at1 = eff[_noshift(eff)], eff[np.isclose(eff["both_strength"], 1.0)]
    for name, d in (("cost", cost), ("benefit", benefit)):
        d["noshift"], d["t1"] = t_interval(ns[name]), t_interval(at1[name])

    pb = main.pivot_table(index=["seed", "brightness", "contrast"], columns="mode", values="task_b")
    pinned = pb[[m for m in PINNED_MODES if m in pb.columns]].dropna()
    on_line = _on_lines(df)
    cond = on_line.groupby(["brightness", "contrast", "mode"])[["task_b", "task_a_after"]].mean().reset_index()
    noshift = cond[(cond.brightness == 0) & (cond.contrast == 1)].set_index("mode")
    by_mode = {m: cond[cond["mode"] == m] for m in ("train_mode", "backbone_eval")}

    me = mode_effects(on_line)
    sep = me[me["mode"] == "separate_stats"].set_index(["seed", "brightness", "contrast"])
    tmm = me[me["mode"] == "train_mode"].set_index(["seed", "brightness", "contrast"])
    tm_net = me[me["mode"] == "train_mode"].assign(net=lambda d: d["task_b_gain"] + d["task_a_change"])
    scat = [g["net"] for _, g in tm_net.groupby(["brightness", "contrast"])]
    scat_below, scat_above = _family_counts(scat)  # the scatter's points: one family

    lv = level_table(df, alpha, tie_margin, n_boot)
    level_f = _level_findings(df, lv, C, alpha, tie_margin, n_boot, min_effect)
    bud_f, task_a_bg = _budget_grid_findings(df)
    heads = convergence_table(df).query("mode in @GRID_MODES")
    task_a = {k: task_a_difference(v) for k, v in cost.items()}  # the page's sign: train_mode - backbone_eval
    if level_f["at_t1"]:
        task_a["t1_family"] = task_a_difference(level_f["at_t1"]["both_raw"]["cost"])
    if level_f["family"]:
        task_a["family"] = task_a_difference(level_f["family"]["cost"])
    task_a |= {f"extra_{t}": task_a_difference(e["cost"]) for t, e in level_f["extra"].items()}
    task_a |= task_a_bg
    return numbers_table(dict(
        n_seeds=int(df["seed"].nunique()), n_runs=len(df), steps=int(main["steps"].iloc[0]), ch1_steps=CH1_STEPS,
        chance=1 / int(df["n_classes"].iloc[0]), ref_brightness=REFERENCE_SHIFT[0], ref_contrast=REFERENCE_SHIFT[1],
        min_effect=min_effect, n_boot=n_boot,
        max_pinned_diff=float((pinned["backbone_eval"] - pinned["all_eval"]).abs().max())
        if pinned.shape[1] == 2 and len(pinned) else math.nan,
        cost=cost, benefit=benefit, task_a=task_a,
        taskb_train_min=float(by_mode["train_mode"]["task_b"].min()),
        taskb_train_max=float(by_mode["train_mode"]["task_b"].max()),
        taskb_pinned_noshift=float(noshift.loc["backbone_eval", "task_b"]) if "backbone_eval" in noshift.index else math.nan,
        taskb_pinned_min=float(by_mode["backbone_eval"]["task_b"].min()),
        taska_train_min=float(by_mode["train_mode"]["task_a_after"].min()),
        taska_before_mean=float(main["task_a_before"].mean()),
        **bud_f,
        scatter_n_points=len(scat), scatter_n_below=scat_below, scatter_n_above=scat_above,
        sep_vs_train_max_b_diff=float((sep["task_b"] - tmm.loc[sep.index, "task_b"]).abs().max()),
        worker_min=float(df["wall_s"].sum()) / 60 if "wall_s" in df.columns else math.nan,
        **level_f, **_mismatch_findings(df, n_boot_select, min_effect),
        n_heads_improving=int((heads["kind"] == "higher").sum()), n_heads_checked=len(heads),
        tie_margin_images=int(round(tie_margin * level_f["n_eval"])),
    ), bounds=lambda key: (-1.0, 1.0) if key == "task_a" else (-math.inf, math.inf))


# --- the page: the sentences the numbers choose (issue 33: bnstudy.study.words) --------------------------------------

#: Every lead says which head recipe its verdict rests on (issue 35).
SEED_PROTOCOL = "On the seed's protocol (one head rate for both paths, not tuned per path), "
_KL = "A statistics mismatch measured before any training (KL, eval pass) "


# Levels whose net the raw view prints as ``train mode higher`` (paid) and ``train mode lower`` (lost).
_paid, _lost = (lambda f: number(f, "n_higher_raw")), (lambda f: number(f, "n_lower_raw"))


def _both_groups(f: pd.DataFrame) -> bool:
    return bool(np.isfinite(number(f, "winner_safe_max")) and np.isfinite(number(f, "winner_harm_min")))


def _groups_fill(c: pd.DataFrame, f: pd.DataFrame) -> dict:
    return dict(lo=number(f, "winner_safe_max"), hi=number(f, "winner_harm_min"), e=number(f, "min_effect"),
                winner=number(f, "winner"))


def _crossings_differ(c: pd.DataFrame, f: pd.DataFrame) -> bool:
    """Whether the lines whose mean curves cross in accuracy points differ between the tie thresholds of the table."""
    return len({number(f, "threshold_lines_raw_thr" + f"{t:g}".replace(".", "_")) for t in TIE_THRESHOLDS}) > 1


#: The page's rule-triggered sentences (:class:`bnstudy.study.words.Note`, glued as ``ch03_<key>``), each a rule on the
#: numbers table; ``lead`` is the answer's plain first sentence (issue 37), read off the raw view's printed verdicts.
NOTES = (
    Note("lead", lambda c, f: not _paid(f) and _lost(f) > 0,
         "**No.** " + SEED_PROTOCOL + "at no shift tested was a net gain shown for drifting statistics (the new "
         "task's gain against the old one's cost): keep them pinned."),
    Note("lead", lambda c, f: not _paid(f) and not _lost(f),
         "**Not shown either way.** " + SEED_PROTOCOL + "no shift tested showed drifting statistics paying or losing: "
         "keep them pinned unless your shift is measured."),
    Note("lead", lambda c, f: _paid(f) > 0 and not _lost(f),
         "**Yes, at some shifts.** " + SEED_PROTOCOL + "drifting statistics paid at some shifts and lost at none: "
         "measure your shift's statistics mismatch first."),
    Note("lead", lambda c, f: _paid(f) > 0 and _lost(f) > 0,
         "**It depends on the shift.** " + SEED_PROTOCOL + "drifting statistics paid at some shifts and lost at "
         "others: measure your shift's statistics mismatch first."),
    Note("favour", lambda c, f: _paid(f) + number(f, "n_higher_vs_no_shift") == 0,
         "no shift in the sweep was shown to favour drifting statistics"),
    Note("favour", lambda c, f: _paid(f) + number(f, "n_higher_vs_no_shift") > 0,
         "drifting statistics were shown to pay at {n} level-views",
         lambda c, f: dict(n=_paid(f) + number(f, "n_higher_vs_no_shift"))),
    Note("threshold_sentence", lambda c, f: not _both_groups(f),
         "The sweep has shifts on only one side of a task-A loss of {e:g}, so it cannot say whether one value of the "
         "{winner} separates harmless shifts from harmful ones.", _groups_fill),
    Note("threshold_sentence", lambda c, f: _both_groups(f) and number(f, "winner_threshold_clean") == "overlap",
         "No value of it separates harmless shifts from harmful ones: shifts whose task-A loss stayed below {e:g} "
         "with 95% confidence reached values up to {lo:.3g}, while shifts whose loss exceeded it started at {hi:.3g}.",
         _groups_fill),
    Note("threshold_sentence", lambda c, f: _both_groups(f) and number(f, "winner_threshold_clean") != "overlap",
         "On these shifts a value of the {winner} between {lo:.3g} and {hi:.3g} separates those whose task-A loss "
         "stayed below {e:g} with 95% confidence from those whose loss exceeded it; that this holds for other shifts "
         "is not tested.", _groups_fill),
    Note("mismatch_rank", lambda c, f: number(f, "rho_kl_lo") > 0, _KL + "ranks the shifts by task A's loss"),
    Note("mismatch_rank", lambda c, f: number(f, "rho_kl_hi") < 0, _KL + "ranks the shifts against task A's loss"),
    Note("mismatch_rank", lambda c, f: not (number(f, "rho_kl_lo") > 0 or number(f, "rho_kl_hi") < 0),
         _KL + "was not shown to rank the shifts by task A's loss"),
    Note("rate_above_1_reading", lambda c, f: number(f, "rate_n_above_1") == 0, "no break-even rate lies above 1"),
    Note("rate_above_1_reading", lambda c, f: number(f, "rate_n_above_1") > 0 and number(f, "rate_n_above_1_paid") == 0,
         "at none of them does the net show a direction in favour of drifting statistics, so none shows that "
         "drifting pays even at a 1:1 exchange"),
    Note("rate_above_1_reading", lambda c, f: number(f, "rate_n_above_1_paid") > 0,
         "at {n} of them the net shows a direction in favour of drifting statistics",
         lambda c, f: dict(n=number(f, "rate_n_above_1_paid"))),
    Note("threshold_dependence", _crossings_differ, "So which lines cross depends on the tie threshold"),
    Note("threshold_dependence", lambda c, f: not _crossings_differ(c, f),
         "So which lines cross is the same at every tie threshold of the table"),
)


def page_texts(C: pd.DataFrame, F: pd.DataFrame) -> dict:
    """Every sentence and word the page's Markdown glues by name (``ch03_<name>``): the :data:`NOTES` that hold on
    ``F``, the per-level verdicts counted, the verdict words the prose names and the margins and tie thresholds as
    lists. Raises ``ValueError`` if a note's rules do not pick exactly one sentence."""
    def count(view):
        return counts_text(view_claims(C, view), "shifted levels", "the sum", "zero", number(F, "tie_margin"))
    return dict(notes(NOTES, C, F), counts_sentence=count("raw"), normalized_counts=count("normalized"),
                word_lower=f"**{NET_WORDS['lower']}**", word_higher=f"**{NET_WORDS['higher']}**",
                word_not_decided="**not decided**", word_not_decided_plain="not decided",
                margins_text=join([f"{m:g}" for m in MARGINS]),
                thresholds_text=join([f"{t:g}" for t in TIE_THRESHOLDS]))
