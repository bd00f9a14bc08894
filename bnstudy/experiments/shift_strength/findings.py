"""Chapter 3, what is claimed: the cost and the benefit of drifting statistics against shift strength.

Within a seed every mode and shift starts from the same trained backbone, head-B
initialisation and task-B batch stream (:mod:`.run`), so effects are paired differences per seed
(:func:`paired_effects`)::

    cost    = task_a_after(pinned) - task_a_after(train_mode)
    benefit = task_b(train_mode)   - task_b(pinned)

with ``pinned = "backbone_eval"``, so that ``net = benefit - cost`` is the sum over both tasks of
``accuracy(train_mode) - accuracy(backbone_eval)``: condition minus reference, the book's one sign. Every
interval, test and verdict comes from :mod:`bnstudy.inference` (the book's one vocabulary, :data:`DIRECTIONS`).
Issue 10's analysis: per-level verdicts (Bonferroni family intervals and TOST at the family level,
:func:`level_table`), the crossover against the tie threshold (:func:`threshold_table`), each
effect over its task's room above chance (:func:`normalized_effects`), mismatch candidates compared on a
held-out shift type (:func:`mismatch_selection`) and the heads' convergence (:func:`convergence_table`).
The results table of :func:`bnstudy.experiments.shift_strength.run.run` ->
:func:`claims` (every verdict, one claims table), :func:`findings` (every number the prose cites, one numbers
table) and the tidy figure tables :func:`line_table`, :func:`budget_table`, :func:`grid_table`, :func:`condition_table`,
:func:`scatter_table`.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ...inference import Claim, Family, Interval, Question, ask, bootstrap_distribution, bootstrap_interval, \
    claims_table, count_verdicts, decide, holm, number, numbers_table, percentile_interval, rank_correlation, \
    t_interval, two_sided_p
from ...words import Note, claim, join, notes
from ...config import check_choice
from ...modes import MODE_NAMES
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
    """One row per point (:data:`PAIR_KEYS`) with a ``train_mode`` and a ``pinned`` run: ``cost =
    task_a_after(pinned) - task_a_after(train_mode)``, ``benefit = task_b(train_mode) - task_b(pinned)``, ``net =
    benefit - cost`` (accuracy fractions), the accuracies behind them and the ``train_mode`` row's columns that do
    not depend on the mode (mismatch, line flags). Raises ``ValueError`` if ``pinned`` is not a pinned mode, no
    pair exists, or a run is repeated."""
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
    out = tm[shared].copy()
    out["task_a_after_train_mode"], out["task_a_after_pinned"] = tm["task_a_after"], pn["task_a_after"]
    out["task_b_train_mode"], out["task_b_pinned"] = tm["task_b"], pn["task_b"]
    out["cost"] = pn["task_a_after"] - tm["task_a_after"]
    out["benefit"] = tm["task_b"] - pn["task_b"]
    out["net"] = out["benefit"] - out["cost"]
    out["pinned"] = pinned
    return out.reset_index()


def strength_of(effects: pd.DataFrame, line: str) -> pd.Series:
    """The strength of each row on ``line`` (any of :data:`LINES`; NaN off the line)."""
    check_choice("shift_type", line, LINES)
    return effects[f"s_{line}"].astype(float)


def line_matrix(effects: pd.DataFrame, shift_type: str, column: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(strengths (L,), seeds (S,), values (S, L))`` of ``column`` along a line, seeds as rows.

    Raises ``ValueError`` if a seed lacks a level (the bootstrap needs complete, paired rows).
    """
    s = strength_of(effects, shift_type)
    sub = effects.assign(strength=s).dropna(subset=["strength"])
    wide = sub.pivot_table(index="seed", columns="strength", values=column, aggfunc="first")
    if wide.isna().any().any():
        raise ValueError(f"line {shift_type!r}: some seeds lack some levels of {column!r}")
    return wide.columns.to_numpy(float), wide.index.to_numpy(), wide.to_numpy(float)


def first_crossing(strength, cost_mean, benefit_mean, min_effect: float = 0.01) -> float:
    """The weakest strength where the mean ``benefit - cost`` changes sign (linear interpolation between the two
    resolved levels that bracket it); NaN if it never does. Levels where both ``|cost|`` and ``|benefit|`` are below
    ``min_effect`` (accuracy fraction), or both exactly 0, are ties and are skipped."""
    x = np.asarray(strength, float)
    c, b = np.asarray(cost_mean, float), np.asarray(benefit_mean, float)
    keep = ((np.abs(c) >= min_effect) | (np.abs(b) >= min_effect)) & ((c != 0) | (b != 0))  # exact zeros: a tie
    x, d = x[keep], (b - c)[keep]
    for i in range(len(d) - 1):
        if d[i] == 0:
            return float(x[i])
        if d[i] * d[i + 1] < 0:
            return float(x[i] + (x[i + 1] - x[i]) * d[i] / (d[i] - d[i + 1]))
    if len(d) and d[-1] == 0:
        return float(x[-1])
    return math.nan


def crossover(strength, cost, benefit, n_boot: int = 2000, seed: int = 0, confidence: float = 0.95,
              min_effect: float = 0.01) -> dict:
    """The crossover of the cost and benefit curves (``strength (L,)`` increasing; ``cost``, ``benefit``: ``(S, L)``
    per-seed paired effects): ``estimate`` (:func:`first_crossing` of the mean curves); resampling whole seeds
    ``n_boot`` times (:func:`bnstudy.inference.bootstrap_distribution`, seed ``seed``), ``ci_low`` / ``ci_high``
    (percentile interval among the resamples that cross: conditional on crossing), ``q_low`` / ``q_high`` (the
    unconditional one, a resample that does not cross counted at ``+inf``) and ``p_cross`` (share that crosses);
    ``dominant`` (the higher mean curve at the strongest level), ``first_resolved`` (the weakest strength where
    either mean reaches ``min_effect``), ``n_boot``, ``min_effect``. Raises ``ValueError`` for mismatched shapes,
    fewer than 2 seeds or levels, ``n_boot < 1``, ``confidence`` outside (0, 1) or a non-increasing strength."""
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


def mode_effects(df: pd.DataFrame, reference: str = "backbone_eval") -> pd.DataFrame:
    """Per run with a ``reference`` run at its point: ``task_a_change = task_a_after - task_a_before`` and
    ``task_b_gain`` (``task_b`` minus the reference's). Raises ``ValueError`` for an unknown ``reference`` mode."""
    check_choice("reference", reference, MODE_NAMES)
    keys = [k for k in PAIR_KEYS if k in df.columns]
    ref = df[df["mode"] == reference].set_index(keys)["task_b"].rename("task_b_reference")
    out = df.join(ref, on=keys, how="inner")
    out["task_a_change"] = out["task_a_after"] - out["task_a_before"]
    out["task_b_gain"] = out["task_b"] - out["task_b_reference"]
    return out


# --- tidy tables behind the figures --------------------------------------------------------------------------------

def _ci_long(df: pd.DataFrame, by: list, metrics) -> pd.DataFrame:
    recs = []
    for key, g in df.groupby(by, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        for m in metrics:
            iv = t_interval(g[m])
            recs.append(dict(zip(by, key), metric=m, mean=iv.mean, ci_low=iv.low, ci_high=iv.high, n_seeds=iv.n))
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
    return [t for t in LINES if eff[f"on_{t}"].astype(bool).any()]


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
    """Each seed's cost and benefit at every shifted level (the points behind :func:`level_table`'s raw means, Fig. 1's
    strip), long: ``line, strength, seed, metric, value`` (accuracy fractions)."""
    parts = [g.assign(line=t, strength=x).melt(id_vars=["line", "strength", "seed"], value_vars=["cost", "benefit"],
                                               var_name="metric", value_name="value")
             for t, x, g in _shifted_levels(paired_effects(_main(df)))]
    if not parts:
        return pd.DataFrame(columns=["line", "strength", "seed", "metric", "value"])
    return pd.concat(parts, ignore_index=True).sort_values(["line", "strength", "metric", "seed"], ignore_index=True)


def line_table(df: pd.DataFrame) -> pd.DataFrame:
    """Cost, benefit and net along each line: ``shift, strength, metric, mean, ci_low, ci_high, n_seeds``
    (95% Student-t intervals over seeds of the per-seed paired effects; the sweep's own steps only)."""
    eff = paired_effects(_main(df))
    parts = [_ci_long(eff.assign(shift=t, strength=strength_of(eff, t)).dropna(subset=["strength"]),
                      ["shift", "strength"], EFFECTS) for t in _present_lines(eff)]
    return pd.concat(parts, ignore_index=True)


def budget_table(df: pd.DataFrame) -> pd.DataFrame:
    """Cost, benefit and net at the budget check's strengths per stage-2 step count: ``t, steps, metric, mean,
    ci_low, ci_high, n_seeds`` (empty without a budget check)."""
    levels = _budget_levels(df)
    if not levels:
        return pd.DataFrame(columns=["t", "steps", "metric", "mean", "ci_low", "ci_high", "n_seeds"])
    bud = paired_effects(df[df["both_strength"].isin(levels)])
    return _ci_long(bud.rename(columns={"both_strength": "t"}), ["t", "steps"], EFFECTS)


def grid_table(df: pd.DataFrame) -> pd.DataFrame:
    """Cost, benefit and net on the brightness x contrast grid: ``brightness, contrast, metric, mean, ci_low,
    ci_high, n_seeds``."""
    eff = paired_effects(_affine(_main(df)))
    return _ci_long(eff[eff["in_grid"].astype(bool)], ["brightness", "contrast"], EFFECTS)


def condition_kind(effects: pd.DataFrame) -> np.ndarray:
    """Which line each row's shift illustrates: the first of :data:`LINES` it lies on; ``"no shift"`` (task B's own
    classes) or ``"no shift, same classes"`` at a family's no-shift point; else ``"grid only"``."""
    kind = np.full(len(effects), "grid only", dtype=object)
    for t in reversed(_present_lines(effects)):
        kind = np.where(strength_of(effects, t).notna().to_numpy(), t, kind)
    same, noshift = (effects["task_b_classes"] == "same").to_numpy(), _noshift(effects)
    return np.where(noshift & same, "no shift, same classes", np.where(noshift, "no shift", kind))


def condition_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per shift of the sweep: the :data:`POINT_COLS`, ``kind`` (:func:`condition_kind`), the ``on_<line>``
    flags, and mean and 95% interval (``<col>``, ``<col>_lo``, ``<col>_hi``; Student's t over seeds) of every
    mismatch candidate (:data:`CANDIDATES`), ``cost`` and ``benefit``."""
    eff = paired_effects(_main(df))
    eff = eff.assign(kind=condition_kind(eff))
    keys = [k for k in POINT_COLS if k in eff.columns]
    cols = [c for c in (*CANDIDATES.values(), "cost", "benefit") if c in eff.columns]
    recs = []
    for key, g in eff.groupby(keys, sort=True):
        r = dict(zip(keys, key), kind=g["kind"].iloc[0],
                 **{f"on_{t}": bool(g[f"on_{t}"].iloc[0]) for t in LINES if f"on_{t}" in g.columns})
        for col in cols:
            r[col], r[col + "_lo"], r[col + "_hi"] = t_interval(g[col])
        recs.append(r)
    return pd.DataFrame(recs)


def scatter_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per mode and line shift: task-A change and task-B gain over ``backbone_eval``, long:
    ``mode, brightness, contrast, metric, mean, ci_low, ci_high, n_seeds``."""
    me = mode_effects(_affine(_main(df)))
    me = me[me[["on_brightness", "on_contrast", "on_both"]].any(axis=1)]
    return _ci_long(me, ["mode", "brightness", "contrast"], ("task_a_change", "task_b_gain"))


def _wide(long: pd.DataFrame, by: list, metric: str) -> pd.DataFrame:
    return long[long["metric"] == metric].set_index(by)[["mean", "ci_low", "ci_high"]]


# --- issue 10: per-level effects, multiplicity, equivalence, the normalized view -------------------------------------

#: The page's direction words (:func:`bnstudy.inference.decide`), each the sign of *condition minus reference*: the
#: net (``train_mode - backbone_eval`` over both tasks) and the no-shift benefit; a longer minus a shorter budget; the
#: grid's corner cost minus a part's.
NET_WORDS = dict(higher="train mode higher", lower="train mode lower")
BUDGET_WORDS = dict(higher="longer budget higher", lower="longer budget lower")
COMPOUND_WORDS = dict(higher="combined shift costs more", lower="combined shift costs less")
DIRECTIONS: tuple[str, ...] = tuple(w for d in (NET_WORDS, BUDGET_WORDS, COMPOUND_WORDS) for w in d.values())
#: The verdict kinds (:data:`bnstudy.inference.VERDICT_KINDS`) the per-level tables count, in the page's order.
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
    """``eff`` (:func:`paired_effects`) with, per seed, ``room_a = task_a_before - chance``, ``room_b`` (``train_mode``'s
    task-B accuracy minus chance at the no-shift point of the seed and task-B family; NaN where a room is not
    positive), ``cost_n = cost / room_a``, ``benefit_n = benefit / room_b``, ``net_n = benefit_n - cost_n``,
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


def breakeven_interval(cost, benefit, n_boot: int = 2000, seed: int = 0, confidence: float = 0.95) -> tuple:
    """Uncorrected seed-bootstrap percentile interval ``(low, high)`` of the break-even rate ``mean(benefit) /
    mean(cost)`` (:func:`bnstudy.inference.bootstrap_interval`, cost and benefit resampled together; a resample
    with a mean cost <= 0 has an unbounded rate). ``(nan, nan)`` (a point estimate only) where there is no interval
    (fewer than 2 seeds) or its upper end is unbounded. Raises ``ValueError`` for unequal lengths, ``n_boot < 1`` or
    ``confidence`` outside (0, 1)."""
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
    """How :func:`verdict_table` prints a break-even rate: ``"n/a"`` (no rate), ``"<rate> [<low>, <high>]"``, or
    ``"<rate> (point estimate only)"`` where :func:`breakeven_interval` gives none; a rate above 1 at a level
    whose accuracy verdict's kind (``kind``, :data:`bnstudy.inference.VERDICT_KINDS`) shows no direction gets
    ``", net: no direction shown"``, so that it does not read as drifting statistics paying at a 1:1 exchange."""
    if not np.isfinite(rate):
        return "n/a"
    out = f"{rate:.2f} [{low:.2f}, {high:.2f}]" if np.isfinite(low) and np.isfinite(high) else \
        f"{rate:.2f} (point estimate only)"
    return out + (", net: no direction shown" if rate > 1 and kind in ("equivalent", "not decided", "too few seeds")
                  else "")


def level_table(df: pd.DataFrame, alpha: float = 0.05, margin: float = 0.02, n_boot: int = 2000) -> pd.DataFrame:
    """Per line and shifted level (:func:`_shifted_levels`) and view (:data:`VIEWS`), long (:data:`LEVEL_COLUMNS`):
    mean cost, benefit and net with family intervals (a :class:`~bnstudy.inference.Family` of the ``m_tests``
    levels: Bonferroni at ``1 - alpha/m``), the net's ``p``, TOST ``tost_p`` at ``margin`` and
    :func:`~bnstudy.inference.decide`'s ``kind`` and ``verdict`` (:data:`NET_WORDS`); in the raw view where the
    cost's family interval excludes 0, ``breakeven_rate`` (mean benefit over mean cost: how many task-B points one
    task-A point must be worth for drifting not to pay) and its :func:`breakeven_interval` (``n_boot``, seed 0)."""
    groups = list(_shifted_levels(normalized_effects(paired_effects(_main(df)), _chance(df))))
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


#: The columns of :func:`level_table`.
LEVEL_COLUMNS = ["line", "family", "strength", "view", "metric", "mean", "ci_low", "ci_high", "n_seeds", "m_tests", "p",
                 "tost_p", "kind", "verdict", "breakeven_rate", "breakeven_low", "breakeven_high"]


def _strength_key(x: float) -> str:
    """A strength as a glue-key part: ``1`` -> ``"1"``, ``0.0625`` -> ``"0_0625"``."""
    return f"{x:g}".replace(".", "_").replace("-", "m")


def level_claims(levels: pd.DataFrame, margin: float) -> pd.DataFrame:
    """The per-level verdicts of :func:`level_table` (its ``net`` rows), one claims table per view (its own Holm
    column), concatenated; key ``<view>_<line>_<strength>`` (e.g. ``vs_no_shift_both_1``)."""
    net = levels[levels["metric"] == "net"]
    parts = [_table_claims(v.rename(columns={"m_tests": "m"}), [f"{_vs(view)}_{t}_{_strength_key(x)}"
                                                                for t, x in zip(v["line"], v["strength"])], margin)
             for view in VIEWS for v in [net[net["view"] == view]] if len(v)]
    return pd.concat(parts, ignore_index=True) if parts else claims_table([])


def _vs(view: str) -> str:
    return view.replace(" ", "_")


def view_claims(claims: pd.DataFrame, view: str) -> pd.DataFrame:
    """The per-level claims of one view (keys ``<view>_<line>_<strength>``, not the aliases), one Holm family."""
    keys = [f"{_vs(view)}_{t}_" for t in LINES]
    other = [f"{_vs(w)}_" for w in VIEWS if w != view and _vs(w).startswith(_vs(view))]
    sel = claims["key"].map(lambda k: any(k.startswith(p) for p in keys) and not any(k.startswith(o) for o in other))
    return claims[sel.astype(bool)]


VIEW_LABELS = {"raw": "accuracy", "normalized": "share of room", "vs no shift": "benefit above no-shift"}


def holm_extra_resolved(df: pd.DataFrame, alpha: float = 0.05) -> dict:
    """Per view, how many levels Holm's step-down (:func:`bnstudy.inference.holm` of the net's two-sided p) resolves
    that the page's Bonferroni family leaves without a direction (p >= ``alpha / m``): the sensitivity of that
    choice."""
    groups = [g for _, _, g in _shifted_levels(normalized_effects(paired_effects(_main(df)), _chance(df)))]
    m = max(len(groups), 1)
    out = {}
    for view, cols in VIEWS.items():
        p = np.array([two_sided_p(g[cols[2]]) for g in groups], float)
        out[_vs(view)] = int(np.sum((holm(p) < alpha) & ~(p < alpha / m)))
    return out


def verdict_table(levels: pd.DataFrame) -> pd.DataFrame:
    """The page's per-level table (display cells) from :func:`level_table`: one row per line and strength, the net
    effect with its corrected interval and the verdict in each view (:data:`VIEW_LABELS`), and the break-even
    exchange rate with its seed-bootstrap interval (:func:`rate_reading`; ``n/a`` where the cost's corrected
    interval contains 0)."""
    net = levels[levels["metric"] == "net"]
    rows = []
    for (t, x), g in net.groupby(["line", "strength"], sort=False):
        r = {"line": t, "strength": f"{x:g}"}
        for view, label in VIEW_LABELS.items():
            if not (g["view"] == view).any():
                continue
            v = g[g["view"] == view].iloc[0]
            r[f"benefit - cost ({label})"] = f"{v['mean']:+.3f} [{v['ci_low']:+.3f}, {v['ci_high']:+.3f}]"
            r[f"verdict ({label})"] = v["verdict"]
        raw = g[g["view"] == "raw"].iloc[0]
        r["break-even rate [95%]"] = rate_reading(raw["breakeven_rate"], raw.get("breakeven_low", math.nan),
                                                  raw.get("breakeven_high", math.nan), raw["kind"])
        rows.append(r)
    return pd.DataFrame(rows).set_index(["line", "strength"])


#: How :func:`margin_display` heads each verdict kind's column (the margin varies by row).
KIND_LABELS = {"lower": NET_WORDS["lower"], "higher": NET_WORDS["higher"], "equivalent": "equivalent within \u00b1margin",
               "not decided": "not decided", "too few seeds": "too few seeds"}


def margin_counts(df: pd.DataFrame, margins=MARGINS, alpha: float = 0.05) -> pd.DataFrame:
    """How the verdict counts move with the equivalence margin: per view (:data:`VIEWS`) and margin, the number of
    levels with each verdict kind of :data:`KINDS` (:func:`level_table` at that margin, counted by
    :func:`bnstudy.inference.count_verdicts`: directions by Holm within the view; only ``equivalent`` and
    ``not decided`` can move, a direction does not depend on the margin). Long: ``view, margin, kind, n``.
    Raises ``ValueError`` for a margin that is not positive."""
    recs = []
    for mg in margins:
        if not mg > 0:
            raise ValueError(f"margins must be > 0, got {mg!r}")
        cl = level_claims(level_table(df, alpha, float(mg)), float(mg))
        for view in VIEWS:
            cnt = count_verdicts(view_claims(cl, view), alpha)  # the book's counts rule: Holm for directions
            for k in KINDS:
                recs.append(dict(view=view, margin=float(mg), kind=k, n=int(cnt[k])))
    return pd.DataFrame(recs, columns=["view", "margin", "kind", "n"])


def margin_display(mc: pd.DataFrame) -> pd.DataFrame:
    """The page's margin table (display cells): rows view x margin, columns the verdicts (:data:`KIND_LABELS`),
    cells counts of levels."""
    out = mc.pivot_table(index=["view", "margin"], columns="kind", values="n", aggfunc="first", sort=False)
    out = out[[k for k in KINDS if k in out.columns]]
    return out.rename(columns=KIND_LABELS)


def threshold_table(df: pd.DataFrame, thresholds=TIE_THRESHOLDS, n_boot: int = 2000) -> pd.DataFrame:
    """How the crossover answer moves with the tie threshold: per line, view (:data:`VIEWS`) and threshold,
    :func:`crossover`'s ``estimate, ci_low, ci_high`` (conditional on crossing), ``q_low, q_high`` (unconditional,
    ``inf`` = no crossing) and ``p_cross`` (bootstrap seed 0). Long table."""
    eff = normalized_effects(paired_effects(_main(df)), _chance(df))
    recs = []
    for t in _present_lines(eff):
        for view, (cc, bc, _n) in VIEWS.items():
            sub = eff.dropna(subset=[cc, bc])
            x, _, c = line_matrix(sub, t, cc)
            _, _, b = line_matrix(sub, t, bc)
            if len(x) < 2 or c.shape[0] < 2:
                continue
            for thr in thresholds:
                cr = crossover(x, c, b, n_boot=n_boot, seed=0, min_effect=float(thr))
                recs.append(dict(line=t, view=view, threshold=float(thr), estimate=cr["estimate"], ci_low=cr["ci_low"],
                                 ci_high=cr["ci_high"], q_low=cr["q_low"], q_high=cr["q_high"], p_cross=cr["p_cross"]))
    return pd.DataFrame(recs, columns=["line", "view", "threshold", "estimate", "ci_low", "ci_high", "q_low", "q_high",
                                       "p_cross"])


def _loc(v: float) -> str:
    return "none" if not np.isfinite(v) else f"{v:.3g}"


def threshold_display(th: pd.DataFrame) -> pd.DataFrame:
    """The page's sensitivity table (display cells): rows line x view, columns the tie thresholds; a cell is the
    crossover strength of the mean curves (``none`` if they do not cross), the unconditional 95% bootstrap interval
    of the crossing location in brackets (``none`` = a resample that does not cross, counted at +inf), and the share
    of resamples that cross."""
    th = th.assign(cell=[f"{_loc(e)} [{_loc(lo)}, {_loc(hi)}] ({p:.0%})"
                         for e, lo, hi, p in zip(th["estimate"], th["q_low"], th["q_high"], th["p_cross"])])
    # In the "vs no shift" view the net at no shift is -cost(no shift) by construction, so at threshold 0 every line
    # "crosses" just after no shift as soon as its first level's mean is negative: no information, blanked.
    art = (th["view"] == "vs no shift") & (th["threshold"] == 0)
    th.loc[art, "cell"] = ARTEFACT_CELL
    out = th.pivot_table(index=["line", "view"], columns="threshold", values="cell", aggfunc="first", sort=False)
    out.columns = [f"tie < {c:g}" for c in out.columns]
    return out


#: The cell :func:`threshold_display` prints at threshold 0 of the ``vs no shift`` view (an artefact of the view).
ARTEFACT_CELL = "n/a (by construction)"


# --- issue 10: which mismatch measure predicts the cost of a shift type it has not seen -------------------------

def isotonic_predict(x_train, y_train, x_new) -> np.ndarray:
    """Fit a non-decreasing step function of ``x_train`` to ``y_train`` (least squares, pool adjacent violators:
    ``scipy.optimize.isotonic_regression``) and read it at ``x_new`` by linear interpolation between the fitted
    points, constant beyond the ends. Ties in ``x`` are averaged first."""
    from scipy.optimize import isotonic_regression
    x, y = np.asarray(x_train, float), np.asarray(y_train, float)
    ux, inv = np.unique(x, return_inverse=True)
    w = np.bincount(inv).astype(float)
    ym = np.bincount(inv, weights=y) / w
    fit = isotonic_regression(ym, weights=w, increasing=True).x
    return np.interp(np.asarray(x_new, float), ux, fit)


def loo_errors(x, y, kinds, held_out_types, twins: dict | None = None) -> dict:
    """Leave one shift type out: for each type in ``held_out_types``, fit :func:`isotonic_predict` on the points
    of every other kind and return the mean absolute error on that type's points. ``x``, ``y``, ``kinds``: one
    entry per condition. ``twins`` (type -> kinds held out with it, e.g. :data:`TWINS`): lines that share their
    shifts are left out of the fit together, so that the held-out type's shifts are truly unseen."""
    x, y, kinds = np.asarray(x, float), np.asarray(y, float), np.asarray(kinds)
    twins = twins or {}
    out = {}
    for t in held_out_types:
        test = kinds == t
        train = ~np.isin(kinds, list(twins.get(t, (t,))) + [t])
        if test.any() and train.sum() >= 2:
            out[t] = float(np.abs(isotonic_predict(x[train], y[train], x[test]) - y[test]).mean())
    return out


def _spearman(a, b) -> float:
    """Spearman's rho (:func:`bnstudy.inference.rank_correlation`; NaN for fewer than 4 pairs or a constant input)."""
    return rank_correlation(a, b)[0]


def mismatch_selection(df: pd.DataFrame, candidates: dict = CANDIDATES, n_boot: int = 1000, seed: int = 0,
                       confidence: float = 0.95, twins: dict | None = TWINS) -> dict:
    """Compare mismatch candidates on predicting the cost of a held-out shift type, with bootstrap intervals.

    Conditions are the sweep's shifts except grid-only ones; a condition's value is the mean over seeds of its
    per-seed cost and candidate measure; the held-out types are the :func:`condition_kind` lines (not the
    no-shift points). Score of a candidate: the mean over held-out types of :func:`loo_errors` (accuracy
    fraction; lower is better), twin lines (``twins``, default :data:`TWINS`) held out together. The winner has the lowest score on the data. Intervals: ``n_boot`` resamples of
    whole seeds (:func:`bnstudy.inference.bootstrap_distribution`, seed ``seed``), percentile, for every score, every Spearman correlation of a
    candidate with the cost (over all shifts, grid included) and the score difference of each candidate from
    the winner (``beaten``: its interval lies above 0).

    Returns ``candidates`` (name -> dict(score, score_lo, score_hi, rho, rho_lo, rho_hi, diff, diff_lo, diff_hi,
    beaten, per_type)), ``winner``, ``types``, ``n_conditions``, ``n_boot``. The winner is chosen on the same data
    and kept fixed in the bootstrap (a winner's curse): read it with the ``diff`` intervals, not alone.
    Raises ``ValueError`` if fewer than 2 held-out types or 2 seeds exist.
    """
    eff = paired_effects(_main(df))
    eff = eff.assign(kind=condition_kind(eff))
    keys = [k for k in POINT_COLS if k in eff.columns]
    cols = [c for c in candidates.values()]
    piv = {c: eff.pivot_table(index="seed", columns=keys, values=c, aggfunc="first") for c in (*cols, "cost")}
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
            out[name] = (float(np.mean(list(e.values()))), _spearman(means[col], means["cost"]), e)
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
    """Tidy table of :func:`mismatch_selection`: ``candidate, held_out, error`` (``held_out = "mean"`` is the
    score) plus the score's and the rank correlation's intervals on the ``mean`` rows."""
    recs = []
    for name, r in sel["candidates"].items():
        for t, e in r["per_type"].items():
            recs.append(dict(candidate=name, held_out=t, error=e))
        recs.append(dict(candidate=name, held_out="mean", error=r["score"], error_lo=r["score_lo"],
                         error_hi=r["score_hi"], rho=r["rho"], rho_lo=r["rho_lo"], rho_hi=r["rho_hi"],
                         diff_from_winner_lo=r["diff_lo"], diff_from_winner_hi=r["diff_hi"]))
    return pd.DataFrame(recs)


def equal_measure_spread(conditions: pd.DataFrame, column: str) -> dict:
    """The largest gap in cost between two lines at the same value of the mismatch ``column``.

    Each line's cost is read as a function of the measure by linear interpolation (log scale) between its
    conditions, its family's no-shift point included; for every pair of lines, over the range of the measure both
    cover, the value where their costs differ most. Returns ``value, line_low, cost_low, line_high, cost_high``
    (NaN / ``"none"`` if no two lines overlap)."""
    best = dict(value=math.nan, line_low="none", cost_low=math.nan, line_high="none", cost_high=math.nan)
    curves = {}
    for t in LINES:
        if f"on_{t}" not in conditions.columns:
            continue
        g = conditions[conditions[f"on_{t}"].astype(bool)].sort_values(column)
        if len(g) >= 2 and (g[column] > 0).all():
            curves[t] = (np.log(g[column].to_numpy(float)), g["cost"].to_numpy(float))
    gap = -1.0
    names = list(curves)
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


# --- issue 10: the training budget at every budget point -------------------------------------------------------------

def budget_points(df: pd.DataFrame) -> pd.DataFrame:
    """Every point of the budget check: per ``t`` (both line), stage-2 ``steps`` and ``mode``, the task-B accuracy,
    and per ``t`` and ``steps`` the cost and benefit: long ``t, steps, mode, metric, mean, ci_low, ci_high,
    n_seeds`` (``mode = "paired"`` for cost and benefit). Empty without a budget check."""
    cols = ["t", "steps", "mode", "metric", "mean", "ci_low", "ci_high", "n_seeds"]
    if "part" not in df.columns or not (df["part"] == "budget").any():
        return pd.DataFrame(columns=cols)
    levels = sorted(df.loc[df["part"] == "budget", "both_strength"].dropna().unique())
    sub = df[df["both_strength"].isin(levels)].rename(columns={"both_strength": "t"})
    acc = _ci_long(sub[sub["mode"].isin(GRID_MODES)], ["t", "steps", "mode"], ("task_b",))
    bud = budget_table(df).assign(mode="paired")
    return pd.concat([acc, bud], ignore_index=True)[cols]


def budget_net_table(df: pd.DataFrame, margin: float = 0.02, alpha: float = 0.05) -> pd.DataFrame:
    """The net effect (benefit - cost, ``train_mode - backbone_eval`` over both tasks) at every budget point with its
    verdict: per ``t`` (both line) and ``steps``, :func:`bnstudy.inference.decide` with the equivalence ``margin``,
    the points printed together being one :class:`~bnstudy.inference.Family` (``m`` = the number of points; family
    interval at ``1 - alpha/m``, TOST at ``alpha/m``). Columns ``t, steps, mean, ci_low, ci_high, n_seeds, m, p,
    tost_p, kind, verdict``; empty without a budget check."""
    cols = ["t", "steps", "mean", "ci_low", "ci_high", "n_seeds", "m", "p", "tost_p", "kind", "verdict"]
    if "part" not in df.columns or not (df["part"] == "budget").any():
        return pd.DataFrame(columns=cols)
    levels = sorted(df.loc[df["part"] == "budget", "both_strength"].dropna().unique())
    eff = paired_effects(df[df["both_strength"].isin(levels)])
    groups = list(eff.groupby(["both_strength", "steps"], sort=True))
    fam = Family(len(groups), alpha)
    recs = []
    for (t, st), g in groups:
        c = decide(g["net"], margin=margin, family=fam, **NET_WORDS)
        recs.append(dict(t=float(t), steps=int(st), mean=c.estimate, ci_low=c.low, ci_high=c.high, n_seeds=c.n,
                         m=fam.m, p=c.p, tost_p=c.p_equivalence, kind=c.kind, verdict=c.verdict))
    return pd.DataFrame(recs, columns=cols)


def convergence_table(df: pd.DataFrame, alpha: float = 0.05) -> pd.DataFrame:
    """Has each head stopped improving? Per budget ``t`` and mode (:data:`GRID_MODES`), the paired change of
    task-B accuracy from the second-longest to the longest budget (longer minus shorter, per seed), and the same
    change of the benefit (``mode = "benefit"``), each with :func:`bnstudy.inference.decide`'s verdict in
    :data:`BUDGET_WORDS` (``"longer budget higher"``: still improving), the rows being one family (``m`` rows,
    intervals at ``1 - alpha/m``). Columns ``t, mode, steps_from, steps_to, mean, ci_low, ci_high, n_seeds, m, p,
    kind, verdict``."""
    cols = ["t", "mode", "steps_from", "steps_to", "mean", "ci_low", "ci_high", "n_seeds", "m", "p", "kind", "verdict"]
    if "part" not in df.columns or not (df["part"] == "budget").any():
        return pd.DataFrame(columns=cols)
    levels = sorted(df.loc[df["part"] == "budget", "both_strength"].dropna().unique())
    rows = []
    for t in levels:
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
    fam = Family(max(len(rows), 1), alpha)
    recs = []
    for t, mode, s0, s1, d in rows:
        c = decide(d, family=fam, **BUDGET_WORDS)
        recs.append(dict(t=t, mode=mode, steps_from=s0, steps_to=s1, mean=c.estimate, ci_low=c.low, ci_high=c.high,
                         n_seeds=c.n, m=fam.m, p=c.p, kind=c.kind, verdict=c.verdict))
    return pd.DataFrame(recs, columns=cols)


def _num(x: float, d: int) -> str:
    """``x`` to ``d`` decimals, without a negative zero ("-0.000" reads as "0.000")."""
    c = f"{x:.{d}f}"
    return c[1:] if c.startswith("-") and float(c) == 0 else c


def _p_cell(p: float) -> str:
    return "n/a" if not np.isfinite(p) else ("<0.0001" if p < 1e-4 else f"{p:.4f}")


def _family_label(table: pd.DataFrame) -> str:
    """The column head of a family's intervals: ``"interval (1 - 0.05/m, m = 9)"``."""
    m = int(table["m"].iloc[0]) if len(table) else 1
    return f"interval ({Family(m).confidence:.2%}, m = {m})"


def budget_net_display(bn: pd.DataFrame) -> pd.DataFrame:
    """The page's budget-net table (display cells) from :func:`budget_net_table`: rows ``t`` x ``stage-2 steps``,
    columns mean, family interval (:func:`_family_label`), seeds, TOST p (``<0.0001`` below that) and verdict."""
    out = pd.DataFrame({"t": [f"{t:g}" for t in bn["t"]], "stage-2 steps": [f"{int(s):,}" for s in bn["steps"]],
                        "net (mean)": [_num(m, 4) for m in bn["mean"]],
                        _family_label(bn): [f"{_num(lo, 4)} to {_num(hi, 4)}" for lo, hi in zip(bn["ci_low"], bn["ci_high"])],
                        "seeds": [f"{int(n)}" for n in bn["n_seeds"]],
                        "TOST p": [_p_cell(float(p)) for p in bn["tost_p"]], "verdict": list(bn["verdict"])})
    return out.set_index(["t", "stage-2 steps"])


def convergence_display(cv: pd.DataFrame) -> pd.DataFrame:
    """The page's convergence table (display cells) from :func:`convergence_table`: rows ``t`` (as ``%g``, so
    0.0625 stays 0.0625) x head, columns the budgets compared, the change (mean, family interval) and verdict."""
    out = pd.DataFrame({"t": [f"{t:g}" for t in cv["t"]], "head": list(cv["mode"]),
                        "budgets (steps)": [f"{int(a):,} to {int(b):,}" for a, b in zip(cv["steps_from"], cv["steps_to"])],
                        "change (mean)": [_num(m, 3) for m in cv["mean"]],
                        _family_label(cv): [f"{_num(lo, 3)} to {_num(hi, 3)}" for lo, hi in zip(cv["ci_low"], cv["ci_high"])],
                        "verdict": list(cv["verdict"])})
    return out.set_index(["t", "head"])


def selection_display(selection: pd.DataFrame) -> pd.DataFrame:
    """The page's selection table from :func:`selection_table`: rows candidate (in :data:`CANDIDATES` order),
    columns the held-out lines in their stored order and then ``score (mean)``, errors to 3 decimals."""
    w = selection.pivot(index="candidate", columns="held_out", values="error")
    held = [h for h in dict.fromkeys(selection["held_out"]) if h != "mean"]
    order = [c for c in CANDIDATES if c in w.index] + [c for c in w.index if c not in CANDIDATES]
    out = w.reindex(index=order, columns=held + (["mean"] if "mean" in w.columns else [])).round(3)
    out = out.rename(columns={"mean": "score (mean)"})
    out.index.name, out.columns.name = "candidate", "held-out line"
    return out


# --- the claims: every verdict the page prints, one claims table (bnstudy.inference) ---------------------------------

#: The page's comparisons that fit :func:`bnstudy.inference.ask`, asked as one family of their own (m = 1):
#: ``noshift_benefit``, task B's accuracy under ``train_mode`` minus ``backbone_eval`` at the no-shift point of the
#: original design (per seed; words :data:`NET_WORDS`); and the identity ``sep_task_a`` (a check, not a finding):
#: on the lines, ``separate_stats`` changes task A by exactly 0 (``task_a_after - task_a_before == 0`` in every run).
QUESTIONS = (
    Question("noshift_benefit", "train_mode", "backbone_eval", value="task_b", by="mode",
             at=dict(brightness=0.0, contrast=1.0), table="affine", words="train mode"),
    Question("sep_task_a", value="task_a_change", at=dict(mode="separate_stats"), table="lines", exact=0.0),
)


def _on_lines(df: pd.DataFrame) -> pd.DataFrame:
    """The original design's runs on the three affine lines (:func:`_affine` of the main sweep)."""
    main = _affine(_main(df))
    return main[main[["on_brightness", "on_contrast", "on_both"]].any(axis=1)]


def _level_claims(lv: pd.DataFrame, margin: float) -> list[pd.DataFrame]:
    """The per-level claims (:func:`level_claims`) and the same claims under fixed keys: ``weakest_<view>_<line>``
    (each line's weakest shifted level) and ``at_t1_<line>_<view>`` (chapter 1's shift, t = 1, on ``both`` and
    ``same_both``)."""
    claims = level_claims(lv, margin)
    net = lv[lv["metric"] == "net"]
    aliases = []
    for view in VIEWS:
        vs = view.replace(" ", "_")
        for t, g in net[net["view"] == view].groupby("line", sort=False):
            x = float(g.sort_values("strength").iloc[0]["strength"])
            aliases.append(_alias(claims, f"{vs}_{t}_{_strength_key(x)}", f"weakest_{vs}_{t}"))
    for t in ("both", "same_both"):
        for view in VIEWS:
            g = net[(net["line"] == t) & np.isclose(net["strength"], 1.0) & (net["view"] == view)]
            if len(g):
                vs = view.replace(" ", "_")
                aliases.append(_alias(claims, f"{vs}_{t}_{_strength_key(float(g['strength'].iloc[0]))}",
                                      f"at_t1_{t}_{vs}"))
    return [claims, *aliases]


def _budget_changes(df: pd.DataFrame, bn: pd.DataFrame) -> dict:
    """Per budget strength ``t`` with two budgets or more: the per-seed benefit at the longest minus the shortest
    budget (``bn``: :func:`budget_net_table`)."""
    changes = {}
    if len(bn):
        bud = paired_effects(df[df["both_strength"].isin(bn["t"].unique())])
        for t, g in bud.groupby("both_strength"):
            w = g.pivot(index="seed", columns="steps", values="benefit")
            if w.shape[1] >= 2:
                changes[float(t)] = w[w.columns.max()] - w[w.columns.min()]
    return changes


def _family_claims(df: pd.DataFrame, margin: float, alpha: float) -> list[pd.DataFrame]:
    """The budget and grid claims, each list printed together one family (:class:`bnstudy.inference.Family`):
    ``budget_net_<t>_s<steps>`` (:func:`budget_net_table`), ``budget_change_<t>`` (:func:`_budget_changes`, alias
    ``budget_change_strongest`` at the strongest ``t``), ``grid_compound`` / ``grid_compound_max`` (the grid's corner
    cost minus the brightness offset's alone / minus the larger part's, per seed) and ``convergence_<t>_<mode>``
    (:func:`convergence_table`, alias ``convergence_weakest_<mode>``). Not :func:`bnstudy.inference.ask`: the
    budget and convergence verdicts are the rows of the display tables (read off them so the tables and the prose
    agree), and the grid's comparisons are of derived quantities (a corner minus the larger of two cells)."""
    bn = budget_net_table(df, margin, alpha)
    out = [_table_claims(bn, [f"budget_net_{_strength_key(t)}_s{int(st)}" for t, st in zip(bn["t"], bn["steps"])],
                         margin)]
    changes = _budget_changes(df, bn)
    if len(bn):
        fam = Family(max(len(changes), 1), alpha)  # the budget strengths' benefit changes: one family
        bc = claims_table(decide(d, f"budget_change_{_strength_key(t)}", family=fam, **BUDGET_WORDS)
                          for t, d in changes.items())
        out += [bc, _alias(bc, f"budget_change_{_strength_key(max(changes))}", "budget_change_strongest")
                if changes else bc.iloc[:0]]
    eff = paired_effects(_affine(_main(df)))
    grid = eff[eff["in_grid"].astype(bool)]
    if len(grid):
        bmax, cmax = grid["brightness"].max(), grid["contrast"].max()
        cw = grid.pivot_table(index="seed", columns=["brightness", "contrast"], values="cost", aggfunc="first")
        if (bmax, cmax) in cw.columns and (bmax, 1.0) in cw.columns:
            comp = [("grid_compound", cw[(bmax, cmax)] - cw[(bmax, 1.0)])]
            if (0.0, cmax) in cw.columns:
                comp.append(("grid_compound_max", cw[(bmax, cmax)] - np.maximum(cw[(bmax, 1.0)], cw[(0.0, cmax)])))
            fam = Family(len(comp), alpha)  # corner minus brightness alone, and minus the larger part: one family
            out.append(claims_table(decide(d, k, family=fam, **COMPOUND_WORDS) for k, d in comp))
    cv = convergence_table(df)
    keys = [f"convergence_{_strength_key(t)}_{m}" for t, m in zip(cv["t"], cv["mode"])]
    conv = _table_claims(cv, keys)
    out += [conv, *[_alias(conv, k, f"convergence_weakest_{m}") for k, t, m in zip(keys, cv["t"], cv["mode"])
                    if len(cv) and t == cv["t"].min()]]
    return out


def claims(df: pd.DataFrame, n_boot: int = 2000, tie_margin: float = 0.02, alpha: float = 0.05) -> pd.DataFrame:
    """Every verdict chapter 3 prints, as one claims table (:func:`bnstudy.inference.claims_table` rows; glued by key
    with :func:`bnstudy.pages.glue_chapter` as ``ch03_<key>_<column>``), each family with its own Holm column:

    * :data:`QUESTIONS` (``noshift_benefit``, ``sep_task_a``), by :func:`bnstudy.inference.ask`;
    * ``<view>_<line>_<strength>`` per level (:func:`level_claims`: the Bonferroni family of the ``m_tests`` levels of
      a view, TOST at ``tie_margin``; ``n_boot``: the break-even bootstrap of :func:`level_table`), and the same
      claims as ``weakest_<view>_<line>`` and ``at_t1_<line>_<view>`` (:func:`_level_claims`);
    * the budget, grid and convergence families (:func:`_family_claims`).

    Direction words: :data:`DIRECTIONS`. Raises ``ValueError`` on a duplicate key."""
    lines = _on_lines(df).assign(task_a_change=lambda d: d["task_a_after"] - d["task_a_before"])
    lines = lines[lines.set_index([k for k in PAIR_KEYS if k in lines.columns]).index.isin(
        lines[lines["mode"] == "backbone_eval"].set_index([k for k in PAIR_KEYS if k in lines.columns]).index)]
    parts = [ask(dict(affine=_affine(_main(df)), lines=lines), QUESTIONS, alpha)]
    parts += _level_claims(level_table(df, alpha, tie_margin, n_boot), tie_margin)
    parts += _family_claims(df, tie_margin, alpha)
    out = pd.concat([c for c in parts if len(c)], ignore_index=True)
    if out["key"].duplicated().any():
        raise ValueError(f"claims: duplicate keys {sorted(out.loc[out['key'].duplicated(), 'key'])}")
    return out


# --- the numbers: every descriptive number the prose cites, one flat table (bnstudy.inference.numbers_table) ---

def _iv(values) -> Interval:
    return t_interval(values)


def _holm_counts(samples, alpha: float = 0.05) -> tuple[int, int]:
    """``(n_lower, n_higher)``: how many of ``samples`` (each a set of per-seed differences, one comparison of a
    family) show a direction below or above zero by Holm's adjusted p below ``alpha`` (the book's rule for
    counts, :func:`bnstudy.inference.claims_table`)."""
    samples = list(samples)
    if not samples:
        return 0, 0
    ct = claims_table([decide(v, key=str(i)) for i, v in enumerate(samples)])
    sig = ct["p_adjusted"] < alpha
    return int((sig & (ct["estimate"] < 0)).sum()), int((sig & (ct["estimate"] > 0)).sum())


def _table_claims(table: pd.DataFrame, keys, margin: float = math.nan) -> pd.DataFrame:
    """The rows of a verdict table made by :func:`bnstudy.inference.decide` (columns ``mean, ci_low, ci_high,
    n_seeds, m, p, kind, verdict``, optionally ``tost_p``) as a claims table, one family, keyed by ``keys``."""
    if not len(table):
        return claims_table([])
    conf = Family(int(table["m"].iloc[0])).confidence
    return claims_table(Claim(key=k, estimate=float(r["mean"]), low=float(r["ci_low"]), high=float(r["ci_high"]),
                              n=int(r["n_seeds"]), p=float(r["p"]), p_equivalence=float(r.get("tost_p", math.nan)),
                              margin=float(margin), confidence=conf, kind=r["kind"], verdict=r["verdict"])
                        for k, (_, r) in zip(keys, table.iterrows()))


def _alias(claims: pd.DataFrame, key: str, alias: str) -> pd.DataFrame:
    """The row ``key`` of a claims table again under the key ``alias`` (a name the prose can cite whatever the
    sweep's levels; empty if there is no such row)."""
    return claims[claims["key"] == key].assign(key=alias)


def _budget_findings(df: pd.DataFrame) -> dict:
    bt = budget_table(df)
    if bt.empty:
        return dict(budget_t=math.nan, budget_s_lo=math.nan, budget_s_hi=math.nan, budget={})
    t, s_lo, s_hi = float(bt["t"].max()), int(bt["steps"].min()), int(bt["steps"].max())
    B = bt.set_index(["t", "steps", "metric"])
    iv = lambda n, m: Interval(*B.loc[(t, n, m), ["mean", "ci_low", "ci_high"]].astype(float), int(B.loc[(t, n, m), "n_seeds"]))
    tbw = df[df["both_strength"] == t].groupby(["steps", "mode"])["task_b"].mean().unstack()
    budget = {"cost_lo": iv(s_lo, "cost"), "cost_hi": iv(s_hi, "cost"), "benefit_lo": iv(s_lo, "benefit"),
              "benefit_hi": iv(s_hi, "benefit"),
              "taskb_train_lo": float(tbw.loc[s_lo, "train_mode"]), "taskb_train_hi": float(tbw.loc[s_hi, "train_mode"]),
              "taskb_pinned_lo": float(tbw.loc[s_lo, "backbone_eval"]),
              "taskb_pinned_hi": float(tbw.loc[s_hi, "backbone_eval"])}
    return dict(budget_t=t, budget_s_lo=s_lo, budget_s_hi=s_hi, budget=budget)


def _grid_findings(df: pd.DataFrame) -> dict:
    if not df["in_grid"].astype(bool).any():
        return dict(grid_n_cells=0, grid_n_net_negative=0, grid_n_net_positive=0, grid_net_max=math.nan,
                    grid_bmax=math.nan, grid_cmax=math.nan, grid_cost_corner=math.nan, grid_cost_bonly=math.nan,
                    grid_cost_conly=math.nan)
    gt = grid_table(df)
    net, cm = _wide(gt, ["brightness", "contrast"], "net"), _wide(gt, ["brightness", "contrast"], "cost")["mean"]
    bmax, cmax = float(gt["brightness"].max()), float(gt["contrast"].max())
    corner = float(cm.loc[(bmax, cmax)])
    bonly, conly = float(cm.get((bmax, 1.0), math.nan)), float(cm.get((0.0, cmax), math.nan))
    eff = paired_effects(_affine(_main(df)))
    cells = [g["net"] for _, g in eff[eff["in_grid"].astype(bool)].groupby(["brightness", "contrast"])]
    n_neg, n_pos = _holm_counts(cells)
    return dict(grid_n_cells=len(net), grid_n_net_negative=n_neg, grid_n_net_positive=n_pos,
                grid_net_max=float(net["mean"].max()),
                grid_bmax=bmax, grid_cmax=cmax, grid_cost_corner=corner, grid_cost_bonly=bonly, grid_cost_conly=conly)


def _mismatch_findings(df: pd.DataFrame, min_effect: float) -> dict:
    pc = condition_table(df)
    rho = _spearman
    safe = pc[pc["cost_hi"] < min_effect]["mismatch_kl"]
    harm = pc[pc["cost_lo"] > min_effect]["mismatch_kl"]
    overlap = len(safe) and len(harm) and harm.min() < safe.max()
    line_rho = [rho(g["mismatch_kl"], g["cost"]) for t in SHIFT_TYPES
                for g in [pc[pc[f"on_{t}"]]] if len(g) >= 2]
    both_pts = pc[pc.kind.isin(["both", "no shift"])].sort_values("mismatch_kl")
    bri = pc[(pc.kind == "brightness") & pc.mismatch_kl.between(both_pts.mismatch_kl.min(), both_pts.mismatch_kl.max())]
    gap = bri["cost"] - np.interp(np.log(bri["mismatch_kl"]), np.log(both_pts["mismatch_kl"]), both_pts["cost"])
    return dict(n_conditions=len(pc), rho_cost=rho(pc["mismatch_kl"], pc["cost"]),
                rho_benefit=rho(pc["mismatch_kl"], pc["benefit"]),
                rho_eval_train=rho(pc["mismatch_kl"], pc["mismatch_kl_train"]),
                rho_cost_line_min=min(line_rho) if line_rho else math.nan,
                noshift_kl=float(pc[pc.kind == "no shift"]["mismatch_kl"].mean()),
                safe_max_kl=float(safe.max()) if len(safe) else math.nan,
                harm_min_kl=float(harm.min()) if len(harm) else math.nan,
                threshold_clean="overlap" if overlap else "do not overlap",
                bright_vs_both_gap=float(gap.mean()) if len(gap) else math.nan, bright_vs_both_n=len(gap),
                bright_vs_both_word="more" if len(gap) and gap.mean() > 0 else "less")


def _level_findings(df: pd.DataFrame, lv: pd.DataFrame, claims: pd.DataFrame, alpha: float, margin: float,
                    n_boot: int) -> dict:
    net = lv[lv["metric"] == "net"]
    counts, n_kind = {}, {k: {} for k in KINDS}
    for view in VIEWS:
        v = net[net["view"] == view]
        vs = view.replace(" ", "_")
        # counts: Holm within the view for directions, the printed kind otherwise (inference.count_verdicts)
        vc = view_claims(claims, view)
        line_of = dict(zip(v.apply(lambda r: f"{vs}_{r['line']}_{_strength_key(r['strength'])}", axis=1), v["line"]))
        counts[view] = {t: {k: int(cnt[k]) for k in KINDS} | {"levels": cnt["m"]}
                        for t in dict.fromkeys(v["line"])
                        for cnt in [count_verdicts(vc[vc["key"].map(line_of).eq(t)])]}
        total = count_verdicts(vc)
        for k in KINDS:
            n_kind[k][view] = int(total[k])
    at_t1 = {}
    for t in ("both", "same_both"):
        for view in VIEWS:
            g = lv[(lv["line"] == t) & np.isclose(lv["strength"], 1.0) & (lv["view"] == view)].set_index("metric")
            if len(g):
                at_t1[f"{t}_{view}"] = {m: Interval(*g.loc[m, ["mean", "ci_low", "ci_high"]].astype(float),
                                                    int(g.loc[m, "n_seeds"]), float(Family(int(g.loc[m, "m_tests"]))
                                                                                    .confidence))
                                        for m in ("cost", "benefit", "net")} | {
                    "breakeven_rate": float(g.loc["net", "breakeven_rate"])}
    th = threshold_table(df, TIE_THRESHOLDS, n_boot)
    tl, tn = {}, {}
    for view in VIEWS:
        tl[view], tn[view] = {}, {}
        for thr in TIE_THRESHOLDS:
            g = th[(th["view"] == view) & (th["threshold"] == thr) & th["estimate"].notna()]
            key = f"thr{thr:g}"
            tl[view][key] = join(list(g["line"])) if len(g) else "none"
            tn[view][key] = len(g)
    eff = normalized_effects(paired_effects(_main(df)), _chance(df))
    fam = eff["task_b_classes"] if "task_b_classes" in eff.columns else pd.Series("new", index=eff.index)
    room_b = {f: float(g.groupby("seed")["room_b"].first().mean()) for f, g in eff.groupby(fam)}
    room_a = float(eff.groupby("seed")["room_a"].first().mean())
    family, extra = {}, {}
    if "same_both" in _present_lines(eff):
        st = strength_of(eff, "same_both")
        top = st.max()
        g1 = eff[np.isclose(st, 1.0)] if np.isclose(st, 1.0).any() else eff[st == top]
        family = dict(t=float(g1["s_same_both"].iloc[0]), cost=t_interval(g1["cost"]), benefit=t_interval(g1["benefit"]),
                      taskb_train=float(g1["task_b_train_mode"].mean()), taskb_pinned=float(g1["task_b_pinned"].mean()),
                      benefit_max=float(eff[st > 0].groupby(st[st > 0])["benefit"].mean().max()))
    for t in EXTRA_LINES:
        if t in _present_lines(eff) and t != "same_both":
            st = strength_of(eff, t)
            g = eff[st == st.max()]
            extra[t] = dict(max_strength=float(st.max()), cost=t_interval(g["cost"]), benefit=t_interval(g["benefit"]),
                            taskb_train=float(g["task_b_train_mode"].mean()),
                            taskb_pinned=float(g["task_b_pinned"].mean()))
    return dict(alpha=alpha, tie_margin=margin, m_tests=int(lv["m_tests"].iloc[0]) if len(lv) else 0, counts=counts,
                at_t1=at_t1, n_lower=n_kind["lower"], n_higher=n_kind["higher"], n_equivalent=n_kind["equivalent"],
                n_not_decided=n_kind["not decided"], n_too_few=n_kind["too few seeds"],
                threshold_lines=tl, threshold_n=tn, room_a=room_a, room_b=room_b,
                exchange_rate=room_b.get("new", math.nan) / room_a if room_a > 0 else math.nan,
                family=family, extra=extra)


def _selection_findings(df: pd.DataFrame, n_boot: int, min_effect: float) -> dict:
    cands = {k: v for k, v in CANDIDATES.items() if v in df.columns}
    sel = mismatch_selection(df, cands, n_boot=n_boot, seed=0)
    pc = condition_table(df)
    # Intervals on the other correlations the page cites (seeds resampled as in mismatch_selection).
    rho = {name: dict(rho=r["rho"], lo=r["rho_lo"], hi=r["rho_hi"]) for name, r in sel["candidates"].items()}
    extra_pairs = {"kl_benefit": ("mismatch_kl", "benefit"), "kl_eval_train": ("mismatch_kl", "mismatch_kl_train")}
    eff = paired_effects(_main(df))
    keys = [k for k in POINT_COLS if k in eff.columns]
    for name, (a, b) in extra_pairs.items():
        if a in eff.columns and b in eff.columns:
            rho[name] = _boot_rho(eff, keys, a, b, n_boot)
    for t in _present_lines(eff):
        on = eff[eff[f"on_{t}"].astype(bool)]
        rho[f"kl_cost_{t}"] = _boot_rho(on, keys, "mismatch_kl", "cost", n_boot)
    sel_flat = {name: {k: v for k, v in r.items()} for name, r in sel["candidates"].items()}
    w = sel["winner"]
    per = sel["candidates"][w]["per_type"]
    n_beaten = sum(r["beaten"] == "yes" for n, r in sel["candidates"].items() if n != w)
    col = cands[w]
    safe, harm = pc[pc["cost_hi"] < min_effect][col], pc[pc["cost_lo"] > min_effect][col]
    ns = pc[pc["kind"].astype(str).str.startswith("no shift")][col]
    tied = [n for n, r in sel["candidates"].items() if n == w or r["beaten"] != "yes"]
    beaten = [n for n in sel["candidates"] if n not in tied]
    measure, mode = CANDIDATE_CALLS.get(w, ("kl", "eval"))
    extra = dict(indistinct=join(tied), n_indistinct=len(tied), beaten=join(beaten) if beaten else "none",
                 winner_call=f'`statistics_mismatch(backbone, batches, measure="{measure}", network_mode="{mode}")`')
    return extra | dict(rho=rho, selection=sel_flat, winner=w, winner_is_kl="is" if w == "KL" else "is not",
                winner_clear="clearly" if n_beaten == len(cands) - 1 else "not clearly", n_beaten=n_beaten,
                n_candidates=len(cands), winner_worst_type=max(per, key=per.get), winner_worst_error=max(per.values()),
                winner_best_type=min(per, key=per.get), winner_best_error=min(per.values()),
                winner_noshift=float(ns.mean()) if len(ns) else math.nan,
                winner_safe_max=float(safe.max()) if len(safe) else math.nan,
                winner_harm_min=float(harm.min()) if len(harm) else math.nan,
                winner_threshold_clean="overlap" if len(safe) and len(harm) and harm.min() < safe.max() else "do not overlap",
                kl_spread=equal_measure_spread(pc, "mismatch_kl"),
                winner_spread=equal_measure_spread(pc, cands[sel["winner"]]))


def _boot_rho(eff: pd.DataFrame, keys: list, a: str, b: str, n_boot: int, seed: int = 0) -> dict:
    """Spearman correlation of condition means of ``a`` and ``b`` (:func:`_spearman`) with a seeded paired percentile
    bootstrap interval over whole seeds (:func:`bnstudy.inference.bootstrap_interval`)."""
    A = eff.pivot_table(index="seed", columns=keys, values=a, aggfunc="first").dropna()
    B = eff.pivot_table(index="seed", columns=keys, values=b, aggfunc="first").reindex_like(A)
    A, B = A.to_numpy(float), B.to_numpy(float)
    iv = bootstrap_interval((np.arange(len(A), dtype=float),),
                            lambda i: _spearman(A[i.astype(int)].mean(0), B[i.astype(int)].mean(0)),
                            n_resamples=n_boot, seed=seed)
    return dict(rho=iv.mean, lo=iv.low, hi=iv.high)


def _convergence_findings(df: pd.DataFrame) -> dict:
    heads = convergence_table(df).query("mode in @GRID_MODES")
    return dict(n_heads_improving=int((heads["kind"] == "higher").sum()), n_heads_checked=len(heads))


def rate_findings(levels: pd.DataFrame) -> dict:
    """What the break-even rates of :func:`level_table` (raw view) support, for the page: ``rate_n`` levels with a
    rate, ``rate_n_point_only`` of them without an interval, ``rate_n_above_1`` rates above 1 (mean benefit above
    mean cost), ``rate_n_above_1_ci`` of those whose interval lies above 1, ``rate_n_above_1_paid`` of those whose
    accuracy verdict is ``"train mode higher"``; ``rate_above_1_levels``: ``"line strength: rate [low, high],
    verdict"`` for each (``"none"``), and ``rate_above_1_reading``: whether they show drifting statistics paying at
    a 1:1 exchange, in words (only a resolved net does)."""
    r = levels[(levels["metric"] == "net") & (levels["view"] == "raw")]
    r = r[np.isfinite(r["breakeven_rate"].astype(float))]
    lo = r["breakeven_low"] if "breakeven_low" in r.columns else pd.Series(math.nan, index=r.index)
    above = r[r["breakeven_rate"] > 1]
    ci_above = int((lo.reindex(above.index) > 1).sum())
    paid = int((above["kind"] == "higher").sum())
    items = [f"{x['line']} {x['strength']:g}: " + rate_reading(x["breakeven_rate"], x.get("breakeven_low", math.nan),
                                                               x.get("breakeven_high", math.nan), "").rstrip()
             + f", {x['verdict']}" for _, x in above.iterrows()]
    if not len(above):
        reading = "no break-even rate lies above 1"
    elif paid == 0:
        reading = ("at none of them does the net show a direction in favour of drifting statistics, so none shows "
                   "that drifting pays even at a 1:1 exchange")
    else:
        reading = f"at {paid} of them the net shows a direction in favour of drifting statistics"
    return dict(rate_n=len(r), rate_n_point_only=int((~np.isfinite(lo.astype(float))).sum()),
                rate_n_above_1=len(above), rate_n_above_1_ci=ci_above, rate_n_above_1_paid=paid,
                rate_above_1_levels="; ".join(items) if items else "none", rate_above_1_reading=reading)


def _referee_findings(df: pd.DataFrame, lv: pd.DataFrame, claims: pd.DataFrame, alpha: float, margin: float,
                      n_boot: int, min_effect: float, room_a: float, rate: float = math.nan) -> dict:
    """The numbers the full-profile referee asked for (see :func:`findings`)."""
    mc = margin_counts(df, MARGINS, alpha)
    margins = {view: {f"m{mg:g}": {k: int(n) for k, n in zip(g["kind"], g["n"])}
                      for mg, g in mc[mc["view"] == view].groupby("margin")} for view in VIEWS}
    net = lv[lv["metric"] == "net"]
    level = Family(int(net["m_tests"].iloc[0])).level if len(net) else alpha
    # a direction shown whose TOST also puts it inside the margin: shown, and smaller than the margin
    n_within = {view: int((net["view"].eq(view) & net["kind"].isin(["lower", "higher"])
                           & (net["tost_p"] < level)).sum()) for view in VIEWS}
    th = threshold_table(df, (min_effect,), n_boot)
    cross_page = {view: {r["line"]: f"{_loc(r['estimate'])} [{_loc(r['q_low'])}, {_loc(r['q_high'])}], "
                                    f"{r['p_cross']:.0%} of resamples cross"
                         for _, r in th[th["view"] == view].iterrows()} for view in VIEWS}
    bn = budget_net_table(df, margin, alpha)
    b_t_min, room_long, room_t, room_steps = math.nan, math.nan, math.nan, math.nan
    ben_sum = []
    if len(bn):
        b_t_min = float(bn["t"].min())
        bud = paired_effects(df[df["both_strength"].isin(bn["t"].unique())])
        for t in _budget_changes(df, bn):
            r = claim(claims, f"budget_change_{_strength_key(t)}")
            ben_sum.append(f"t = {t:g}: {r.estimate:+.3f} [{r.low:+.3f}, {r.high:+.3f}], {r.verdict}")
        g = bud[(bud["both_strength"] == b_t_min) & (bud["steps"] == bud["steps"].max())]
        room_t, room_steps = b_t_min, float(bud["steps"].max())
        room_long = float(g["task_b_train_mode"].mean()) - _chance(df)
    eff = paired_effects(_affine(_main(df)))
    grid = eff[eff["in_grid"].astype(bool)]
    shifted = grid[~_noshift(grid)]
    n_neg, _ = _holm_counts(g["net"] for _, g in shifted.groupby(["brightness", "contrast"]))
    at1 = eff[np.isclose(eff["both_strength"], 1.0)]
    n_ben = sum(count_verdicts(view_claims(claims, view), alpha)["higher"] for view in ("raw", "vs no shift"))
    # Levels whose break-even rate lies between the sweep's exchange rate and the longest budget's: the sign of their
    # normalized mean net differs between the two rates (benefit / cost > rate <=> normalized net > 0).
    rate_long = room_long / room_a if room_a > 0 else math.nan
    lo_r, hi_r = sorted([rate, rate_long]) if np.isfinite(rate) and np.isfinite(rate_long) else (math.nan, math.nan)
    be = lv[(lv["metric"] == "net") & (lv["view"] == "raw") & lv["breakeven_rate"].between(lo_r, hi_r)]
    nv = lv[(lv["metric"] == "net") & (lv["view"] == "normalized")].set_index(["line", "strength"])["verdict"]
    dep = [f"{r['line']} {r['strength']:g} ({nv.get((r['line'], r['strength']), 'n/a')})" for _, r in be.iterrows()]
    favour = ("no shift in the sweep was shown to favour drifting statistics" if n_ben == 0 else
              f"drifting statistics were shown to pay at {n_ben} level-views")
    n_eval = int(df["n_eval"].iloc[0]) if "n_eval" in df.columns else 1000
    p_b = float(_main(df).loc[lambda d: d["mode"] == "train_mode", "task_b"].mean())
    ne = normalized_effects(paired_effects(_main(df)), _chance(df))
    fam_b = ne["task_b_classes"] if "task_b_classes" in ne.columns else pd.Series("new", index=ne.index)
    b_n0 = ne[_noshift(ne) & (fam_b == "new").to_numpy()]["benefit_n"]
    flips, net_sum = 0, []
    for t, g in bn.groupby("t"):
        g = g.sort_values("steps")
        flips += int(g["kind"].iloc[0] != g["kind"].iloc[-1])
        r = g.iloc[-1]
        net_sum.append(f"t = {t:g}: {r['mean']:+.4f} [{r['ci_low']:+.4f}, {r['ci_high']:+.4f}], {r['verdict']}")
    return dict(**rate_findings(lv), holm_extra_resolved=holm_extra_resolved(df, alpha),
                budget_dependent_levels=join(dep) if dep else "none", n_budget_dependent=len(dep),
                t1_taska_train_mean=float(at1["task_a_after_train_mode"].mean()) if len(at1) else math.nan,
                n_eval=n_eval, eval_se=math.sqrt(p_b * (1 - p_b) / n_eval), favour=favour,
                benefit_n_noshift=float(b_n0.mean()) if len(b_n0) else math.nan, budget_net_n_flips=flips,
                budget_net_word="does not change" if flips == 0 else "changes",
                budget_net_m=len(bn), budget_change_m=len(ben_sum),
                budget_net_summary="; ".join(net_sum) if net_sum else "not measured",
                budget_benefit_summary="; ".join(ben_sum) if ben_sum else "not measured",
                margin_counts=margins, n_within_margin=n_within, cross_page=cross_page,
                budget_t_min=b_t_min, room_b_long=room_long,
                room_b_long_t=room_t, room_b_long_steps=room_steps,
                exchange_rate_long=room_long / room_a if room_a > 0 else math.nan,
                grid_n_shifted=int(shifted.groupby(["brightness", "contrast"]).ngroups),
                grid_n_net_negative_shifted=n_neg,
                t1_taska_train_seed_min=float(at1["task_a_after_train_mode"].min()) if len(at1) else math.nan,
                t1_taska_train_seed_max=float(at1["task_a_after_train_mode"].max()) if len(at1) else math.nan)


def _check(df: pd.DataFrame) -> None:
    main = _affine(_main(df))
    for t in SHIFT_TYPES:
        if main[f"on_{t}"].sum() == 0:
            raise ValueError(f"findings needs all three lines; the {t} line has no runs")
    missing = {"train_mode", "backbone_eval", "separate_stats"} - set(main["mode"])
    if missing:
        raise ValueError(f"findings needs the modes {sorted(missing)} on the lines")


def findings(df: pd.DataFrame, n_boot: int = 2000, min_effect: float = 0.01, tie_margin: float = 0.02,
             alpha: float = 0.05, n_boot_select: int = 500, claims_: pd.DataFrame | None = None) -> pd.DataFrame:
    """Chapter 3's numbers table (:func:`bnstudy.inference.numbers_table`: every number its prose cites, accuracies
    and effects as fractions 0..1; read one with :func:`bnstudy.inference.number`, glued with
    :func:`bnstudy.pages.glue_chapter` as ``ch03_<key>``, intervals as ``ch03_<key>_mean`` / ``_ci_low`` /
    ``_ci_high``) from its results table (:func:`run`'s columns; all three lines with at least 2 levels and 2 seeds,
    and the modes ``train_mode``, ``backbone_eval``, ``separate_stats`` on the lines). NaN where the sweep lacks
    what a number needs.

    ``n_boot`` and ``min_effect``: the crossover's bootstrap resamples (seed 0) and tie tolerance; ``tie_margin`` and
    ``alpha``: the equivalence margin and level of the per-level verdicts (Bonferroni over the levels,
    :func:`level_table`); ``n_boot_select``: resamples of :func:`mismatch_selection`. ``claims_``: :func:`claims` of
    ``df`` at the same settings if already computed (else computed here); the counts are read off it.
    Raises ``ValueError`` if a line or one of those modes is missing.

    Rows (a dict flattens to ``<key>_<entry>``): ``cross_<line>_<k>``: :func:`crossover`'s result;
    ``curves_cross_<line>``: ``"cross"`` / ``"do not cross"``; ``crossing_lines`` (``"none"`` if none);
    ``lines_<line>_<k>``: levels and how many show the net below zero (``n_cost_wins``) or above (``n_benefit_wins``)
    by Holm over the line's levels. ``cost_*`` / ``benefit_*``: 95% intervals at ``noshift``, ``t1`` (chapter 1's
    shift) and ``<line>_max`` (the strongest level); ``task_a_*``: the page's task-A quantities as condition minus
    reference (``train_mode - backbone_eval``, the negated cost; intervals printed cut to [-1, 1]).
    ``budget_*``: the budget check at its largest strength ``budget_t`` between ``budget_s_lo`` and ``budget_s_hi``
    steps. Grid: ``grid_n_net_negative`` / ``_positive`` (Holm counts of cells). Mismatch: Spearman correlations,
    the ``safe`` (cost below ``min_effect`` with 95% confidence) and ``harm`` groups, ``threshold_clean``
    (``"do not overlap"`` / ``"overlap"``), ``bright_vs_both_word`` (``"more"`` / ``"less"``). ``n_lower`` /
    ``n_higher`` / ``n_equivalent`` / ``n_not_decided`` / ``n_too_few`` ``_<view>``: the per-level verdicts by kind
    (the book's counts rule on the claims).

    Referee rows: ``margin_counts_<view>_m<margin>_<kind>`` (:func:`margin_counts` at :data:`MARGINS`),
    ``n_within_margin_<view>`` (levels with a direction shown whose TOST also puts them inside the margin);
    ``cross_page_<view>_<line>``: the crossing at the page's threshold with its unconditional interval as text;
    ``room_b_long`` / ``exchange_rate_long``: task B's room and the exchange rate measured at the longest budget (at
    the weakest budget strength ``room_b_long_t``, the budget check having no no-shift point); ``grid_n_shifted`` and
    ``grid_n_net_negative_shifted`` (the grid without its no-shift cell, Holm count); ``t1_taska_train_seed_min/max``:
    the per-seed range of task A after ``train_mode`` at ``t = 1``; ``indistinct``: the mismatch candidates whose
    score is not distinguishable from the winner's (the winner included), ``beaten`` the others, ``winner_call`` the
    code that computes the winner. ``tie_margin_images`` (the margin in test images); ``n_other_candidates``;
    ``budget_dependent_levels`` (``"line strength (normalized verdict)"`` for the levels whose break-even rate lies
    between ``exchange_rate`` and ``exchange_rate_long``) and their number. Break-even rates (:func:`rate_findings`):
    ``rate_n``, ``rate_n_point_only``, ``rate_n_above_1``, ``rate_n_above_1_ci``, ``rate_n_above_1_paid``,
    ``rate_above_1_levels``, ``rate_above_1_reading``.
    """
    _check(df)
    C = claims(df, n_boot, tie_margin, alpha) if claims_ is None else claims_
    main = _affine(_main(df))
    eff = paired_effects(main)
    cross, lines, near, cost, benefit, nets = {}, {}, {}, {}, {}, []
    for t in SHIFT_TYPES:
        x, _, c = line_matrix(eff, t, "cost")
        _, _, b = line_matrix(eff, t, "benefit")
        cr = cross[t] = crossover(x, c, b, n_boot=n_boot, seed=0, min_effect=min_effect)
        n_lower, n_higher = _holm_counts((b - c)[:, j] for j in range(len(x)))  # a line's levels: one family
        lines[t] = dict(n_levels=len(x), min_strength=float(x[0]), max_strength=float(x[-1]),
                        n_cost_wins=n_lower, n_benefit_wins=n_higher)
        nets.append((b - c).mean(0))
        # Largest mean effects up to the first level beyond where crossing resamples cross.
        upto = x <= x[np.searchsorted(x, cr["ci_high"])] if cr["ci_high"] <= x[-1] else np.ones_like(x, bool)
        near[t] = dict(cost=float(c.mean(0)[upto].max()), benefit=float(b.mean(0)[upto].max()))
        cost[f"{t}_max"], benefit[f"{t}_max"] = t_interval(c[:, -1]), t_interval(b[:, -1])
    ns = eff[(eff.brightness == 0) & (eff.contrast == 1)]
    at1 = eff[np.isclose(eff["both_strength"], 1.0)]
    for name, d in (("cost", cost), ("benefit", benefit)):
        d["noshift"], d["t1"] = _iv(ns[name]), _iv(at1[name])
    crossing = [t for t in SHIFT_TYPES if not math.isnan(cross[t]["estimate"])]
    all_net = np.concatenate(nets)

    pb = main.pivot_table(index=["seed", "brightness", "contrast"], columns="mode", values="task_b")
    pinned = pb[[m for m in PINNED_MODES if m in pb.columns]].dropna()
    on_line = _on_lines(df)
    cond = on_line.groupby(["brightness", "contrast", "mode"])[["task_b", "task_a_after"]].mean().reset_index()
    noshift = cond[(cond.brightness == 0) & (cond.contrast == 1)].set_index("mode")

    me = mode_effects(on_line)
    sep = me[me["mode"] == "separate_stats"].set_index(["seed", "brightness", "contrast"])
    tmm = me[me["mode"] == "train_mode"].set_index(["seed", "brightness", "contrast"])
    sep_b = float((sep["task_b"] - tmm.loc[sep.index, "task_b"]).abs().max())
    tm_net = me[me["mode"] == "train_mode"].assign(net=lambda d: d["task_b_gain"] + d["task_a_change"])
    scat = [g["net"] for _, g in tm_net.groupby(["brightness", "contrast"])]
    scat_below, scat_above = _holm_counts(scat)  # the scatter's points: one family

    lv = level_table(df, alpha, tie_margin, n_boot)
    grid_f, level_f = _grid_findings(df), _level_findings(df, lv, C, alpha, tie_margin, n_boot)
    ref_f = _referee_findings(df, lv, C, alpha, tie_margin, n_boot, min_effect, level_f["room_a"],
                              level_f["exchange_rate"])
    conv_f, sel_f, bud_f = _convergence_findings(df), _selection_findings(df, n_boot_select, min_effect), \
        _budget_findings(df)
    task_a = {k: task_a_difference(v) for k, v in cost.items()}  # the page's sign: train_mode - backbone_eval
    task_a.update({"t1_family": task_a_difference(level_f["at_t1"]["both_raw"]["cost"])}
                  if level_f["at_t1"].get("both_raw") else {})
    task_a.update({"family": task_a_difference(level_f["family"]["cost"])} if level_f["family"] else {})
    task_a.update({f"extra_{t}": task_a_difference(e["cost"]) for t, e in level_f["extra"].items()})
    task_a.update({f"budget_{k[5:]}": task_a_difference(bud_f["budget"][k]) for k in ("cost_lo", "cost_hi")
                   if k in bud_f["budget"]})
    task_a.update({f"grid_{k}": -float(grid_f[f"grid_cost_{k}"]) for k in ("corner", "bonly", "conly")})
    return numbers_table(dict(
        n_seeds=int(df["seed"].nunique()), n_runs=len(df), steps=int(main["steps"].iloc[0]), ch1_steps=CH1_STEPS,
        chance=1 / int(df["n_classes"].iloc[0]), ref_brightness=REFERENCE_SHIFT[0], ref_contrast=REFERENCE_SHIFT[1],
        min_effect=min_effect, n_boot=n_boot,
        max_pinned_diff=float((pinned["backbone_eval"] - pinned["all_eval"]).abs().max())
        if pinned.shape[1] == 2 and len(pinned) else math.nan,
        cross=cross, curves_cross={t: "cross" if t in crossing else "do not cross" for t in SHIFT_TYPES},
        crossing_lines=" and ".join(crossing) if crossing else "none", any_crossover=bool(crossing),
        lines=lines, near=near, cost=cost, benefit=benefit, task_a=task_a,
        net_best=float(all_net.max()), net_worst=float(all_net.min()),
        taskb_train_min=float(cond[cond["mode"] == "train_mode"]["task_b"].min()),
        taskb_train_max=float(cond[cond["mode"] == "train_mode"]["task_b"].max()),
        taskb_pinned_noshift=float(noshift.loc["backbone_eval", "task_b"]) if "backbone_eval" in noshift.index else math.nan,
        taskb_pinned_min=float(cond[cond["mode"] == "backbone_eval"]["task_b"].min()),
        taska_train_min=float(cond[cond["mode"] == "train_mode"]["task_a_after"].min()),
        taska_before_mean=float(main["task_a_before"].mean()),
        **bud_f, **grid_f, **ref_f,
        scatter_n_points=len(scat), scatter_n_below=scat_below, scatter_n_above=scat_above,
        sep_vs_train_max_b_diff=sep_b,
        **_mismatch_findings(df, min_effect),
        worker_min=float(df["wall_s"].sum()) / 60 if "wall_s" in df.columns else math.nan,
        **level_f, **sel_f, **conv_f,
        tie_margin_images=int(round(tie_margin * ref_f["n_eval"])),
        n_other_candidates=len({k for k, v in CANDIDATES.items() if v in df.columns}) - 1,
    ), bounds=lambda key: (-1.0, 1.0) if key == "task_a" else (-math.inf, math.inf))


def _has(F: pd.DataFrame, key: str) -> bool:
    return bool((F["key"] == key).any())


def crossover_long(F: pd.DataFrame) -> pd.DataFrame:
    """The crossover numbers as a tidy table: ``shift, estimate, ci_low, ci_high, p_cross, first_resolved,
    dominant, n_cost_wins, n_benefit_wins``."""
    return pd.DataFrame([dict(shift=t, **{k: number(F, f"cross_{t}_{k}") for k in (
        "estimate", "ci_low", "ci_high", "p_cross", "first_resolved", "dominant")},
        n_cost_wins=number(F, f"lines_{t}_n_cost_wins"), n_benefit_wins=number(F, f"lines_{t}_n_benefit_wins"))
        for t in SHIFT_TYPES])


# --- the page: its answer and the sentences the numbers and claims choose (issue 25) ---------------------------------
# The page prints every task-A quantity as condition minus reference (train_mode minus backbone_eval, negative when
# train mode loses), the book's one sign (issue 24): the rows and the numbers keep ``cost = pinned - train_mode``; the
# ``task_a_*`` numbers and the functions below negate it for printing and drawing.

def _verdict(C: pd.DataFrame, key: str) -> str:
    """The printed verdict of claim ``key`` (``"not measured"`` if the sweep has no such claim)."""
    c = C[C["key"] == key] if len(C) else C
    return str(c["verdict"].iloc[0]) if len(c) else "not measured"


def _signed(x: float, d: int = 3) -> str:
    """``x`` with its sign, ``d`` decimals, no negative zero; ``"n/a"`` for NaN."""
    if not np.isfinite(x):
        return "n/a"
    c = f"{x:+.{d}f}"
    return c.replace("-", "+", 1) if float(c) == 0 else c


def _range(iv: Interval, low: float = -1.0, high: float = 1.0, d: int = 3) -> str:
    """``"-0.80 to -0.65"``: an interval's ends clipped to ``[low, high]`` (what the quantity allows)."""
    c = iv.clipped(low, high)
    if not (np.isfinite(c.low) and np.isfinite(c.high)):
        return "no interval"
    return f"{_signed(c.low, d)} to {_signed(c.high, d)}"


def task_a_difference(cost: Interval) -> Interval:
    """Task-A accuracy ``train_mode - backbone_eval`` from a cost interval (``backbone_eval - train_mode``): the
    same interval, negated (the page's sign, condition minus reference)."""
    return Interval(-cost.mean, -cost.high, -cost.low, cost.n, cost.confidence)


def level_counts(C: pd.DataFrame, view: str = "raw") -> dict:
    """The per-level verdicts of ``view`` (claims ``C``) counted by the book's rule
    (:func:`bnstudy.inference.count_verdicts`: directions by Holm over the view's levels, the printed kind
    otherwise): ``{kind: n}`` plus ``"m"``."""
    return count_verdicts(view_claims(C, view))


def counts_sentence(C: pd.DataFrame, F: pd.DataFrame, view: str = "raw") -> str:
    """The levels' count sentence (fixed wording, numbers and verdict words spliced in)."""
    n = level_counts(C, view)
    w = NET_WORDS
    return (f"Over the {n['m']} shifted levels of the {len(_lines_of(C))} lines, the sum of the two differences reads "
            f"**{w['higher']}** at {n['higher']}, **{w['lower']}** at {n['lower']}, "
            f"**equivalent within \u00b1{number(F, 'tie_margin'):g}** at {n['equivalent']} and **not decided** at "
            f"{n['not decided']} (Holm counts, the [glossary](../glossary.html)'s rule).")


def _lines_of(C: pd.DataFrame) -> list:
    keys = view_claims(C, "raw")["key"] if len(C) else pd.Series(dtype=str)
    return [t for t in LINES if keys.str.startswith(f"raw_{t}_").any()]


def _raw(c: pd.DataFrame, kind: str) -> int:
    return level_counts(c, "raw")[kind]


def _raw_fill(c: pd.DataFrame, f: pd.DataFrame) -> dict:
    n = level_counts(c, "raw")
    return dict(higher=n["higher"], lower=n["lower"], m=n["m"])


#: The page's sentences that choose between fixed outcomes (:class:`bnstudy.words.Note`: a rule on the claims ``c``
#: and numbers ``f``, exactly one per key holds): ``pays_sentence`` (whether any shift was shown to make drifting
#: statistics pay, by the raw view's Holm counts), ``takeaway_cost_benefit`` (the cost-and-benefit figure's takeaway,
#: by the same counts) and ``threshold_sentence`` (whether one value of the winning mismatch measure separates the
#: shifts whose task-A loss stayed below ``min_effect`` (95% upper bound) from those whose loss exceeded it).
NOTES = (
    Note("pays_sentence", lambda c, f: _raw(c, "higher") == 0 and _raw(c, "lower") > 0,
         "No shift tested was shown to make drifting statistics pay, even counting both tasks' points as equal."),
    Note("pays_sentence", lambda c, f: _raw(c, "higher") == 0 and _raw(c, "lower") == 0,
         "No shift tested was shown to make drifting statistics pay or lose, counting both tasks' points as equal."),
    Note("pays_sentence", lambda c, f: _raw(c, "higher") > 0 and _raw(c, "lower") == 0,
         "Drifting statistics were shown to pay at {higher} of the {m} levels and to lose at none, counting both "
         "tasks' points as equal.", _raw_fill),
    Note("pays_sentence", lambda c, f: _raw(c, "higher") > 0 and _raw(c, "lower") > 0,
         "Drifting statistics were shown to pay at {higher} levels and to lose at {lower}, counting both tasks' points "
         "as equal: which one you get depends on the shift.", _raw_fill),
    Note("takeaway_cost_benefit", lambda c, f: _raw(c, "lower") > _raw(c, "higher"),
         "Task A's loss outweighs task B's gain at {lower} of the {m} levels and falls short of it at {higher} (Holm).",
         _raw_fill),
    Note("takeaway_cost_benefit", lambda c, f: _raw(c, "higher") > _raw(c, "lower"),
         "Task B's gain outweighs task A's loss at {higher} of the {m} levels and falls short of it at {lower} (Holm).",
         _raw_fill),
    Note("takeaway_cost_benefit", lambda c, f: _raw(c, "higher") == _raw(c, "lower"),
         "Task B's gain and task A's loss are shown apart at equally many levels ({lower} each, of {m}).", _raw_fill),
    Note("threshold_sentence", lambda c, f: not _both_groups(f),
         "The sweep has shifts on only one side of a task-A loss of {e:g}, so it cannot say whether one value of the "
         "{winner} separates harmless shifts from harmful ones.", lambda c, f: _groups_fill(f)),
    Note("threshold_sentence", lambda c, f: _both_groups(f) and number(f, "winner_threshold_clean") == "overlap",
         "No value of it separates harmless shifts from harmful ones: shifts whose task-A loss stayed below {e:g} "
         "with 95% confidence reached values up to {lo:.3g}, while shifts whose loss exceeded it started at {hi:.3g}.",
         lambda c, f: _groups_fill(f)),
    Note("threshold_sentence", lambda c, f: _both_groups(f) and number(f, "winner_threshold_clean") != "overlap",
         "On these shifts a value of the {winner} between {lo:.3g} and {hi:.3g} separates those whose task-A loss "
         "stayed below {e:g} with 95% confidence from those whose loss exceeded it; that this holds for other shifts "
         "is not tested.", lambda c, f: _groups_fill(f)),
)


def _both_groups(f: pd.DataFrame) -> bool:
    return bool(np.isfinite(number(f, "winner_safe_max")) and np.isfinite(number(f, "winner_harm_min")))


def _groups_fill(f: pd.DataFrame) -> dict:
    return dict(lo=number(f, "winner_safe_max"), hi=number(f, "winner_harm_min"), e=number(f, "min_effect"),
                winner=number(f, "winner"))


def mismatch_sentence(F: pd.DataFrame) -> str:
    """What the KL mismatch measured before training says about task A's loss, chosen by its rank correlation's
    bootstrap interval (clipped to [-1, 1])."""
    nan = math.nan
    rho, lo, hi = (number(F, f"rho_kl_{k}") if _has(F, f"rho_kl_{k}") else nan for k in ("rho", "lo", "hi"))
    iv = Interval(rho, lo, hi, number(F, "n_seeds"))
    text = (f"Spearman {rho:.2f}, {_range(iv, d=2)}" if np.isfinite(rho) else "no rank correlation")
    if np.isfinite(lo) and lo > 0:
        head = "A statistics mismatch measured before any training (KL) ranks the shifts by task A's loss"
    elif np.isfinite(hi) and hi < 0:
        head = "A statistics mismatch measured before any training (KL) ranks the shifts against task A's loss"
    else:
        head = "A statistics mismatch measured before any training (KL) was not shown to rank the shifts by task A's loss"
    if number(F, "n_indistinct") > 1:
        tail = (f"on predicting an unseen kind of shift's loss the lowest error belongs to the {number(F, 'winner')}, "
                f"but the {number(F, 'indistinct')} are not distinguishable on this data")
    else:
        tail = (f"on predicting an unseen kind of shift's loss the {number(F, 'winner')} has the lowest error, "
                f"distinguishably from every other measure compared")
    return f"{head} ({text}); {tail}."


def answer(C: pd.DataFrame, F: pd.DataFrame) -> str:
    """The answer box's outcome sentences (Markdown, numbers ``F`` and verdicts ``C``; true for any data): chapter 1's
    shift, the count over levels, whether any level pays, the gentlest levels, the mismatch measure."""
    if _has(F, "at_t1_both_raw_cost"):
        a, b = task_a_difference(number(F, "at_t1_both_raw_cost")), number(F, "at_t1_both_raw_benefit")
        s1 = (f"At chapter 1's shift (t = 1) drifting statistics change task A's accuracy by {_signed(a.mean)} "
              f"({_range(a)}) and task B's by {_signed(b.mean)} ({_range(b)}), `train_mode` minus the pinned "
              f"`backbone_eval`; their sum reads **{_verdict(C, 'at_t1_both_raw')}**.")
    else:
        s1 = "The sweep has no point at chapter 1's shift."
    weak = [f"**{_verdict(C, f'weakest_raw_{t}')}** ({t})" for t in SHIFT_TYPES]
    s4 = "At the gentlest shift of the brightness, contrast and both lines the sum reads " + join(weak) + "."
    return " ".join([s1, counts_sentence(C, F), notes(NOTES, C, F)["pays_sentence"], s4, mismatch_sentence(F)])


def page_texts(C: pd.DataFrame, F: pd.DataFrame) -> dict:
    """Every sentence and word the page's Markdown glues by name (``ch03_<name>``), chosen by ``C`` and ``F``."""
    said = notes(NOTES, C, F)
    return dict(answer=answer(C, F), takeaway_cost_benefit=said["takeaway_cost_benefit"],
                counts_sentence=counts_sentence(C, F), threshold_sentence=said["threshold_sentence"],
                word_lower=f"**{NET_WORDS['lower']}**", word_higher=f"**{NET_WORDS['higher']}**",
                margins_text=join([f"{m:g}" for m in MARGINS]), thresholds_text=join([f"{t:g}" for t in TIE_THRESHOLDS]))
