"""Chapter 1, what is claimed: every number, verdict and sentence the page cites, from :mod:`.run`'s tables.

:func:`findings` (the main run: every number and verdict the chapter's prose cites), :func:`drift_findings` and
:func:`drift_check` (the drift figure), :func:`optimizer_findings` (finding 3: the head sweep), :func:`buffer_findings`,
:func:`thread_findings`, :func:`tuning_findings`, the seed article's table, and the page's answer and readings
(sentences chosen by the data). Finding 3's one primary test is the reference's pooled gap ``train_mode -
backbone_eval`` against the equivalence margin :data:`PRIMARY_MARGIN` (:func:`optimizer_findings`), every other
test of it is exploratory, one family (:func:`exploratory_tests`). Every interval, test and verdict comes from :mod:`bnstudy.inference`, in its one
vocabulary (direction words: :data:`DIRECTIONS`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import special as spx

from ...report import p_text  # noqa: F401  (chapter 1's p-values print as the other pages' do)
from ...inference import EXACT, Family, Interval, claims_table, count_verdicts, decide, exact_check, one_sided_p, \
    paired_differences, t_interval
from ...config import check_float
from ...modes import MODE_NAMES
from .run import DRIFT_TARGET_BATCHES, ENGINE_TARGET_BATCHES, FLOOR_WEIGHT, PATHS, PROFILES, REF_VARIANTS, \
    STD_SUFFIX, drift_table, floor_steps

#: The weight left on the old running statistics that counts as "gone" in the prose.
GONE = 1e-3
METRICS = ("task_a_before", "task_a_after", "task_b", "max_param_change", "max_buffer_change",
           "max_old_logit_change")
ACCURACIES = ("task_a_before", "task_a_after", "task_b")
#: Finding 2's "about chance": task A after ``train_mode`` within ``(CHANCE_FACTOR - 1) * chance`` of chance
#: (an equivalence margin, TOST; the factor was set by trial while the project was built).
CHANCE_FACTOR = 1.5
#: Finding 3's primary test (fixed in revision, before the full profile ran): the logistic-regression
#: reference's task-B difference ``train_mode - backbone_eval`` (path ``batch_stats - pinned``) at
#: ``Config.steps``, all reported and confirmation seeds pooled, against the equivalence margin
#: +-PRIMARY_MARGIN (accuracy, fraction), one comparison (:func:`bnstudy.inference.decide`).
PRIMARY_MARGIN = 0.03
ALPHA = 0.05
#: Buffer-change criteria of finding 2 (fixed in revision): a running_mean moves by more than MEAN_SHIFT_SD
#: of task A's running standard deviations, a running_var by more than a factor VAR_FACTOR either way.
MEAN_SHIFT_SD = 1.0
VAR_FACTOR = 2.0
#: Seeds of the primary reference test that the quick profile had shown before its design and margin were
#: fixed (reported seeds 0..2 and confirmation seeds 200, 201); the others are the unseen, confirmatory part.
QUICK_SEEN_SEEDS = (*range(PROFILES["quick"]["seeds"]), *PROFILES["quick"]["confirm_seeds"])


# TODO(inference): pages.glue_findings could glue claims-table fields itself (and claims_table hold several
# families); until then this helper glues a record whose ``*claims`` fields are claims tables, one family each.
def glue_record(prefix: str, record, clip: tuple | None = (-1, 1)) -> None:
    """Glue a findings record: its claims tables (fields named ``claims`` or ``*_claims``) by key (:func:`bnstudy.pages.glue_claims`, interval ends cut
    to ``clip``) and every other field as :func:`bnstudy.pages.glue_findings` would. Raises ``ValueError`` if
    two names clash (as ``glue_findings`` does)."""
    import dataclasses

    from ...pages import claims_items, glue_items
    items = []
    for f in dataclasses.fields(record):
        v = getattr(record, f.name)
        cut = clip if clip is None or f.name not in DIFFERENCE_OF_GAPS else tuple(2 * c for c in clip)
        if cut is not None:  # printed interval ends cut to what the quantity allows (a difference of differences: 2x)
            v = _clip_intervals(v, cut)
        items += (claims_items(prefix, v, cut) if f.name.endswith("claims")
                  else glue_items(f"{prefix}_{f.name}", v))
    names = [n for n, _ in items]
    if len(set(names)) != len(names):
        raise ValueError(f"glue_record: {type(record).__name__} glues these names twice: "
                         f"{sorted({n for n in names if names.count(n) > 1})}")
    from myst_nb import glue
    for name, v in items:
        glue(name, v, display=False)


#: Claims tables of the findings records that are differences of two gaps (a gap's change with the budget, the
#: reduction by standardizing): they lie in twice the range of one difference of accuracies.
DIFFERENCE_OF_GAPS = ("narrow_claims", "reduction_claims")


def _clip_intervals(v, clip: tuple):
    """``v`` with every :class:`~bnstudy.inference.Interval` in it (itself, or a dict's values) cut to ``clip``."""
    if isinstance(v, Interval):
        return v.clipped(*clip)
    if isinstance(v, dict):
        return {k: _clip_intervals(x, clip) for k, x in v.items()}
    return v


def steps_until(momentum: float, weight: float = GONE) -> int:
    """The first step ``t`` at which ``(1 - momentum) ** t`` falls below ``weight``.

    Raises ``ValueError`` unless ``0 < momentum <= 1`` and ``0 < weight < 1``.
    """
    check_float("momentum", momentum, 0.0, 1.0, low_open=True)
    check_float("weight", weight, 0.0, 1.0, low_open=True)
    if momentum == 1.0:
        return 1
    return math.floor(math.log(weight) / math.log(1 - momentum)) + 1


# --- the chapter's verdicts: every interval, test and verdict from bnstudy.inference -------------------------------
#
# One sign per quantity, *condition minus reference*: the reference of a freeze-mode comparison is the pinned
# backbone ``backbone_eval`` (on the head sweep's two feature paths: ``batch_stats - pinned``), so the cost of
# train mode is negative when train mode loses. The direction words below name that sign for each quantity.

#: train_mode - backbone_eval (task B; the reference test, the trained heads, the thread check).
TRAIN_HIGHER, TRAIN_LOWER = "train mode higher", "train mode lower"
#: task A after ``train_mode`` - chance.
ABOVE_CHANCE, BELOW_CHANCE = "above chance", "below chance"
#: task A after stage 2 - before (``train_mode``).
A_HIGHER, A_LOWER = "task A higher after", "task A lower after"
#: accuracy at the last checkpoint - at the one before (a head still gaining).
LAST_HIGHER, LAST_LOWER = "higher at the last checkpoint", "lower at the last checkpoint"
#: gap at the last checkpoint - gap at the first.
GAP_LARGER, GAP_SMALLER = "gap larger at more steps", "gap smaller at more steps"
#: plain heads' gap - standardized heads' gap.
STD_SMALLER, STD_LARGER = "smaller with standardized features", "larger with standardized features"
#: a running mean's largest shift - MEAN_SHIFT_SD (task-A SDs); a running variance's largest |log ratio| - log 2.
SHIFT_ABOVE, SHIFT_BELOW = f"above {MEAN_SHIFT_SD:g} SD", f"below {MEAN_SHIFT_SD:g} SD"
VAR_ABOVE, VAR_BELOW = f"above a factor {VAR_FACTOR:g}", f"below a factor {VAR_FACTOR:g}"
#: Every direction word this chapter's verdicts use (:func:`bnstudy.inference.is_verdict`'s ``directions``).
DIRECTIONS: tuple[str, ...] = (TRAIN_HIGHER, TRAIN_LOWER, ABOVE_CHANCE, BELOW_CHANCE, A_HIGHER, A_LOWER,
                               LAST_HIGHER, LAST_LOWER, GAP_LARGER, GAP_SMALLER, STD_SMALLER, STD_LARGER,
                               SHIFT_ABOVE, SHIFT_BELOW, VAR_ABOVE, VAR_BELOW)


def gap_claim(values, key: str = "", margin: float | None = PRIMARY_MARGIN, family: Family = Family()):
    """The verdict on per-seed task-B differences ``train_mode - backbone_eval`` (path ``batch_stats -
    pinned``): :func:`bnstudy.inference.decide` with the words ``"train mode higher"`` / ``"train mode
    lower"`` and, by default, the reference test's margin :data:`PRIMARY_MARGIN`."""
    return decide(values, key, margin=margin, family=family, higher=TRAIN_HIGHER, lower=TRAIN_LOWER)


def _verdicts(claims) -> pd.DataFrame:
    """A claims table (:func:`bnstudy.inference.claims_table`) of ``claims``."""
    return claims_table(list(claims))


def _family_table(rows: list[dict], values: list, higher: str = TRAIN_HIGHER, lower: str = TRAIN_LOWER,
                  margin: float | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``rows`` (dicts with a ``key``) with their claims (one family of ``len(rows)``): the rows as a table with
    ``n, mean, ci_low, ci_high, confidence, p, p_holm, verdict`` added, and the claims table."""
    family = Family(max(len(rows), 1))
    claims = _verdicts(decide(v, r["key"], margin=margin, family=family, higher=higher, lower=lower)
                       for r, v in zip(rows, values))
    out = pd.DataFrame(rows)
    for col, src in (("n", "n"), ("mean", "estimate"), ("ci_low", "low"), ("ci_high", "high"),
                     ("confidence", "confidence"), ("p", "p"), ("p_holm", "p_adjusted"), ("verdict", "verdict")):
        out[col] = claims[src].to_numpy() if len(claims) else []
    return out, claims


def _interval(r) -> Interval:
    return Interval(float(r.estimate), float(r.low), float(r.high), int(r.n), float(r.confidence))


def bounded_interval(values, n_eval: int | None = None, confidence: float = 0.95, logit_centre: bool = False) -> Interval:
    """Mean of accuracies ``values`` (0..1) with a Student-t interval computed on the logit scale.

    The interval stays inside (0, 1), unlike a t interval on the raw scale for accuracies near 0 or 1.
    Values are clipped to ``[0.5 / n_eval, 1 - 0.5 / n_eval]`` before the logit (``n_eval``: the size
    of the evaluation set; default 1000). ``mean`` is the plain mean of ``values``, or with ``logit_centre``
    the interval's own centre, ``expit`` of the mean logit.
    Raises ``ValueError`` for an empty input or values outside [0, 1].
    """
    v = np.asarray(values, dtype=float)
    if v.size == 0 or (v < 0).any() or (v > 1).any():
        raise ValueError(f"bounded_interval needs accuracies in [0, 1], got {v.tolist()}")
    eps = 0.5 / (n_eval or 1000)
    z = spx.logit(np.clip(v, eps, 1 - eps))
    iv = t_interval(z, confidence)
    centre = float(spx.expit(iv.mean)) if logit_centre else float(v.mean())
    return Interval(centre, float(spx.expit(iv.low)), float(spx.expit(iv.high)), int(v.size))


def accuracy_summary(df: pd.DataFrame, by: str = "mode", columns=METRICS, logit_centre: bool = False) -> pd.DataFrame:
    """Mean and 95% Student-t interval over seeds (:func:`bnstudy.inference.t_interval`) of ``columns`` per
    ``by`` (a long table ``by, metric, mean, ci_low, ci_high, n_seeds``), with :func:`bounded_interval` for the
    accuracy columns.

    ``logit_centre``: the accuracy rows' ``mean`` is the interval's own centre (``expit`` of the mean logit)
    instead of the plain mean, so that a table printing "mean [low, high]" pairs matching numbers.
    """
    out = pd.DataFrame([dict({by: k}, metric=c, mean=iv.mean, ci_low=iv.low, ci_high=iv.high, n_seeds=iv.n)
                        for k, g in df.groupby(by, sort=False) for c in columns for iv in [t_interval(g[c])]])
    n_eval = int(df["n_eval"].iloc[0]) if "n_eval" in df.columns else None
    for i, r in out.iterrows():
        if r["metric"] in ACCURACIES:
            iv = bounded_interval(df[df[by] == r[by]][r["metric"]], n_eval, logit_centre=logit_centre)
            out.loc[i, ["mean", "ci_low", "ci_high"]] = [iv.mean, iv.low, iv.high]
    return out


@dataclass(frozen=True)
class Findings:
    """Every number chapter 1's prose cites from the main run (accuracies are fractions 0..1); its verdicts are
    the claims table ``claims`` (:func:`bnstudy.inference.claims_table`, glued with
    :func:`bnstudy.pages.glue_claims`).

    ``summary``: per mode and metric, mean and 95% interval over seeds (accuracies: :func:`bounded_interval`).
    Measured: ``task_a_after_tm`` per seed (``train_mode``), its median, bounded interval, the paired change
    ``task_a_change`` per seed (after - before; glued with its min and max), ``n_near_chance`` seeds at most
    ``chance_limit`` (a count, seed by seed), ``task_a_above_chance_p`` the one-sided t test of task A after
    ``train_mode`` above chance, ``task_a_after_tm_logit_centre``: ``expit`` of the mean logit, the centre of
    ``task_a_after_tm_ci``'s interval (whose ``mean`` is the plain mean). ``gap_b``: paired ``task_b(train_mode)
    - task_b(pinned)`` per pinned mode (95% interval; the main run's test is among the exploratory ones,
    :func:`exploratory_tests`).

    ``claims`` (keys): finding 2, one family of ``f2_m`` = 2: ``task_a_chance`` (task A after ``train_mode``
    minus chance, equivalence margin ``chance_margin`` = ``(CHANCE_FACTOR - 1) * chance``: "about chance" is
    "equivalent within ±margin") and ``task_a_change`` (after - before). Checks of the code
    (:func:`bnstudy.inference.exact_check`, every seed): ``c_weights_unchanged`` (largest weight change == 0,
    every mode), ``c_pinned_keep_a`` (pinned modes' task A after == before), ``c_separate_exact``
    (``separate_stats``' old logits change == 0), ``c_separate_matches_b`` (``separate_stats`` == ``train_mode``
    on task B), ``c_pinned_equal_b`` (``all_eval`` == ``backbone_eval`` on task B).
    """

    n_seeds: int
    chance: float
    chance_limit: float
    chance_margin: float
    f2_m: int
    momentum: float
    steps_gone: int
    summary: pd.DataFrame
    task_a_after_tm: pd.Series
    task_a_after_tm_median: float
    task_a_after_tm_ci: Interval
    task_a_change: pd.Series
    n_near_chance: int
    task_a_above_chance_p: float
    task_a_after_tm_logit_centre: float
    gap_b: dict
    claims: pd.DataFrame


def findings(df: pd.DataFrame) -> Findings:
    """Chapter 1's findings from its main-run table (all four modes needed).

    Raises ``ValueError`` if a mode is missing.
    """
    missing = set(MODE_NAMES) - set(df["mode"])
    if missing:
        raise ValueError(f"findings needs all four modes; missing {sorted(missing)}")
    chance = 1 / int(df["n_classes"].iloc[0])
    limit = CHANCE_FACTOR * chance
    m = float(df["momentum"].iloc[0])
    n_eval = int(df["n_eval"].iloc[0]) if "n_eval" in df.columns else None
    piv = {c: df.pivot(index="seed", columns="mode", values=c) for c in METRICS}
    after = piv["task_a_after"]["train_mode"]
    change = after - piv["task_a_before"]["train_mode"]
    f2 = Family(2)
    centre = bounded_interval(after, n_eval, logit_centre=True).mean
    gaps = {p: t_interval(paired_differences(df, "task_b", "mode", "train_mode", p)) for p in ("backbone_eval", "all_eval")}
    tb = piv["task_b"]
    pinned = ("backbone_eval", "all_eval")
    claims = _verdicts([
        decide(after - chance, "task_a_chance", margin=limit - chance, family=f2, higher=ABOVE_CHANCE,
               lower=BELOW_CHANCE),
        decide(change, "task_a_change", family=f2, higher=A_HIGHER, lower=A_LOWER),
        exact_check(df["max_param_change"], key="c_weights_unchanged"),
        exact_check(np.concatenate([(piv["task_a_after"][p] - piv["task_a_before"][p]).to_numpy() for p in pinned]),
                    key="c_pinned_keep_a"),
        exact_check(piv["max_old_logit_change"]["separate_stats"], key="c_separate_exact"),
        exact_check(tb["separate_stats"] - tb["train_mode"], key="c_separate_matches_b"),
        exact_check(tb["all_eval"] - tb["backbone_eval"], key="c_pinned_equal_b"),
    ])
    return Findings(
        n_seeds=int(df["seed"].nunique()), chance=chance, chance_limit=limit, chance_margin=limit - chance,
        f2_m=f2.m, momentum=m, steps_gone=steps_until(m),
        summary=accuracy_summary(df), task_a_after_tm=after.rename(lambda s: f"seed{s}"),
        task_a_after_tm_median=float(after.median()), task_a_after_tm_ci=bounded_interval(after, n_eval),
        task_a_change=change.rename(lambda s: f"seed{s}"), n_near_chance=int((after <= limit).sum()),
        task_a_above_chance_p=one_sided_p(after, "greater", null=chance),
        task_a_after_tm_logit_centre=centre, gap_b=gaps, claims=claims)


def verdict_of(claims: pd.DataFrame, key: str) -> str:
    """The verdict text of claim ``key`` in a claims table (``KeyError`` naming the keys if absent)."""
    row = claims[claims["key"] == key]
    if row.empty:
        raise KeyError(f"no claim {key!r}; claims: {list(claims['key'])}")
    return str(row["verdict"].iloc[0])


@dataclass(frozen=True)
class DriftFindings:
    """The drift figure's numbers: weight left on task A's running_mean against ``(1 - m)^t``.

    ``floor`` per layer: RMS of the measured weight at recorded steps where the prediction is
    below 1e-4 (the moving average's own noise); ``last_step``: the last recorded step whose
    prediction is above every layer's floor. ``weight_12`` / ``weight_last`` per layer: the mean over
    seeds at step 12 / ``last_step``, with 95% Student-t bounds ``*_low`` / ``*_high`` (per layer) and
    ``*_low_min`` / ``*_high_max`` over layers. The agreement with ``(1 - m)^t`` is a check of the
    moving average's definition, but the measured weight is a statistical comparison: it depends on the
    projected batch means being unbiased and on the estimated target mean (an error there biases it upward).
    """

    floor: pd.Series
    floor_first_step: int
    floor_last_step: int
    weight_12: pd.Series
    weight_12_low: pd.Series
    weight_12_high: pd.Series
    theory_12: float
    last_step: int
    theory_last: float
    weight_last: pd.Series
    weight_last_low: pd.Series
    weight_last_high: pd.Series
    excess_12: pd.Series


def drift_findings(drift: pd.DataFrame, momentum: float, steps: int) -> DriftFindings:
    """Numbers for the drift figure from :func:`drift_table`'s output.

    ``excess_12``: per layer, mean weight minus ``(1 - m)^12``.
    Raises ``ValueError`` if no recorded step up to ``steps`` has ``(1 - momentum)^t < 1e-4``.
    """
    fs = floor_steps(momentum, steps)
    if not fs:
        raise ValueError(f"no recorded step up to steps={steps} has (1 - momentum)^t < {FLOOR_WEIGHT}")
    floor = drift[drift.step.isin(fs)].groupby("layer")["weight"].apply(lambda v: float(np.sqrt(np.mean(v ** 2))))
    above = [s for s in sorted(drift.step.unique()) if (1 - momentum) ** s > floor.max()]
    last = max(above)

    def at(t):
        ivs = {layer: t_interval(g["weight"]) for layer, g in drift[drift.step == t].groupby("layer")}
        return tuple(pd.Series({k: getattr(iv, a) for k, iv in ivs.items()}) for a in ("mean", "low", "high"))

    w12, lo12, hi12 = at(12)
    wl, lol, hil = at(last)
    return DriftFindings(floor=floor, floor_first_step=min(fs), floor_last_step=max(fs), weight_12=w12,
                         weight_12_low=lo12, weight_12_high=hi12, theory_12=(1 - momentum) ** 12,
                         last_step=int(last), theory_last=(1 - momentum) ** last, weight_last=wl,
                         weight_last_low=lol, weight_last_high=hil, excess_12=w12 - (1 - momentum) ** 12)


# --- the head sweep's analysis: chosen learning rates, paired gaps, finding 3's tests (issue 10) -------------------

def primary_reference(sweep: pd.DataFrame) -> pd.DataFrame:
    """``sweep`` with only the primary reference fit (``REF_VARIANTS[0]``) among the reference rows."""
    l2, n = REF_VARIANTS[0]
    ref = sweep["optimizer"] == "reference"
    keep = ~ref | ((sweep["l2"] == l2) & (sweep["n_fit"] == n)) if "l2" in sweep.columns else ~ref | ref
    return sweep[keep]


def gap_table(chosen: pd.DataFrame, step: int) -> pd.DataFrame:
    """Tidy paired gaps ``seed, role, optimizer, gap`` (``batch_stats - pinned`` test accuracy) at ``step``
    (the reference at its own single step)."""
    recs = []
    for (role, o), g in chosen.groupby(["role", "optimizer"]):
        st = step if o != "reference" else g["step"].min()
        piv = g[g["step"] == st].pivot(index="seed", columns="path", values="accuracy")
        recs += [dict(seed=s, role=role, optimizer=o, gap=float(v)) for s, v in (piv["batch_stats"] - piv["pinned"]).items()]
    return pd.DataFrame(recs, columns=["seed", "role", "optimizer", "gap"])


def choose_lrs(sweep: pd.DataFrame, step: int) -> dict:
    """Learning rate per ``(optimizer, path)``: the best mean *validation* accuracy over the tuning seeds at ``step``.

    Only rows with ``role == "tune"`` and ``split == "validation"`` are read (never a test set, never a
    reported seed). Ties go to the smaller learning rate. Raises ``ValueError`` if none are present.
    """
    t = sweep[(sweep["role"] == "tune") & (sweep["split"] == "validation") & (sweep["step"] == step)
              & (sweep["optimizer"] != "reference")]
    if t.empty:
        raise ValueError(f"choose_lrs: no tuning-seed validation rows at step {step}")
    mean = t.groupby(["optimizer", "path", "lr"])["accuracy"].mean().reset_index()
    mean = mean.sort_values(["optimizer", "path", "accuracy", "lr"], ascending=[True, True, False, True])
    return {(o, p): float(g["lr"].iloc[0]) for (o, p), g in mean.groupby(["optimizer", "path"])}


def chosen_table(sweep: pd.DataFrame, lrs: dict) -> pd.DataFrame:
    """Test-set rows of the chosen heads (and the primary reference), reported and confirmation seeds:
    ``seed, role, path, optimizer, lr, step, accuracy``."""
    t = primary_reference(sweep)
    t = t[(t["split"] == "test") & (t["role"] != "tune")]
    keep = t.apply(lambda r: r["optimizer"] == "reference" or lrs.get((r["optimizer"], r["path"])) == r["lr"], axis=1)
    return t[keep].drop(columns=[c for c in ("split", "l2", "n_fit") if c in t.columns]).reset_index(drop=True)


def lr_table(sweep: pd.DataFrame, step: int | None = None) -> pd.DataFrame:
    """What was tried: validation accuracy per tuning seed, ``seed, path, optimizer, lr, step, accuracy``
    (at ``step``, or at every checkpoint when ``None``)."""
    t = sweep[(sweep["role"] == "tune") & (sweep["split"] == "validation") & (sweep["optimizer"] != "reference")]
    if step is not None:
        t = t[t["step"] == step]
    return t[["seed", "path", "optimizer", "lr", "step", "accuracy"]].reset_index(drop=True)


def lr_choice_table(sweep: pd.DataFrame) -> pd.DataFrame:
    """The learning rate :func:`choose_lrs` picks when selecting at each checkpoint: ``optimizer, path, step,
    lr, position`` (``position``: ``lowest`` / ``highest`` of the grid, or ``interior``)."""
    t = sweep[(sweep["role"] == "tune") & (sweep["split"] == "validation") & (sweep["optimizer"] != "reference")]
    grid = t.groupby("optimizer")["lr"].agg(["min", "max"])
    recs = []
    for step in sorted(t["step"].unique()):
        for (o, p), lr in choose_lrs(sweep, step).items():
            pos = "lowest" if lr == grid.loc[o, "min"] else "highest" if lr == grid.loc[o, "max"] else "interior"
            recs.append(dict(optimizer=o, path=p, step=int(step), lr=lr, position=pos))
    return pd.DataFrame(recs, columns=["optimizer", "path", "step", "lr", "position"])


def _path_gap(t: pd.DataFrame, optimizer: str, roles, step: int) -> pd.Series:
    s = t[(t["optimizer"] == optimizer) & (t["role"].isin(roles)) & (t["step"] == step)]
    piv = s.pivot(index="seed", columns="path", values="accuracy")
    return piv["batch_stats"] - piv["pinned"]


POOLED = ("report", "confirm")


def _explore(sweep: pd.DataFrame, main_step: int, main: pd.DataFrame | None = None):
    """:func:`exploratory_tests`' table and its claims table (one family, keys ``explore_<test>``)."""
    lrs = choose_lrs(sweep, main_step)
    t = chosen_table(sweep, lrs)
    rows, values = [], []
    if main is not None:
        rows.append(dict(key="explore_main", test="main", optimizer=str(main["optimizer"].iloc[0]),
                         lr=float(main["lr"].iloc[0]),
                         step=int(main["steps"].iloc[0]) if "steps" in main.columns else main_step))
        values.append(paired_differences(main, "task_b", "mode", "train_mode", "backbone_eval"))
    for o in ("sgd", "adam"):
        if (o, "pinned") not in lrs:
            continue
        for s in sorted(t[t["optimizer"] == o]["step"].unique()):
            lr = lrs[(o, "pinned")] if lrs[(o, "pinned")] == lrs[(o, "batch_stats")] else math.nan
            rows.append(dict(key=f"explore_{o}_{int(s)}", test=f"{o}_{int(s)}", optimizer=o, lr=lr, step=int(s)))
            values.append(_path_gap(t, o, POOLED, s))
    cols = ["test", "optimizer", "lr", "step", "n", "mean", "ci_low", "ci_high", "confidence", "p", "p_holm", "verdict"]
    table, claims = _family_table(rows, values)
    return table.reindex(columns=cols), claims


def exploratory_tests(sweep: pd.DataFrame, main_step: int, main: pd.DataFrame | None = None) -> pd.DataFrame:
    """Every test of finding 3 other than the primary one, as one family (:class:`bnstudy.inference.Family`
    of all rows).

    Rows: the main run (``main``'s ``train_mode - backbone_eval``, its seeds), then per optimizer (learning
    rate chosen at ``main_step``) and checkpoint the pooled reported + confirmation seeds' gap. Columns
    ``test, optimizer, lr, step, n, mean, ci_low, ci_high, confidence, p, p_holm, verdict``: the family's
    Bonferroni interval (``confidence`` = 1 - 0.05/m), the two-sided t test of a zero gap and its Holm-adjusted
    p-value over the rows, and :func:`gap_claim`'s verdict (no margin: the trained heads' tests have none).
    """
    return _explore(sweep, main_step, main)[0]


def _sens_key(l2: float, n_fit: int) -> str:
    return f"sens_l2_{l2:.0e}_n{int(n_fit)}".replace("-", "_")


def _sensitivity(sweep: pd.DataFrame):
    """:func:`reference_sensitivity`'s table and its claims table (one family, keys ``sens_l2_<l2>_n<n_fit>``)."""
    t = sweep[(sweep["optimizer"] == "reference") & (sweep["split"] == "test") & sweep["role"].isin(POOLED)]
    rows, values = [], []
    for (l2, n), g in t.groupby(["l2", "n_fit"], sort=False):
        piv = g.pivot(index="seed", columns="path", values="accuracy")
        rows.append(dict(key=_sens_key(l2, n), l2=float(l2), n_fit=int(n), acc_batch_stats=float(piv["batch_stats"].mean()),
                         acc_pinned=float(piv["pinned"].mean())))
        values.append(piv["batch_stats"] - piv["pinned"])
    cols = ["key", "l2", "n_fit", "n", "acc_batch_stats", "acc_pinned", "mean", "ci_low", "ci_high", "confidence", "p",
            "p_holm", "verdict"]
    table, claims = _family_table(rows, values, margin=PRIMARY_MARGIN)
    return table.reindex(columns=cols), claims


def reference_sensitivity(sweep: pd.DataFrame) -> pd.DataFrame:
    """The reference gap for every ``(l2, n_fit)`` fit, pooled reported + confirmation seeds, the fits one family
    (:class:`bnstudy.inference.Family` of all fits; margin :data:`PRIMARY_MARGIN`): ``key, l2, n_fit, n,
    acc_batch_stats, acc_pinned, mean, ci_low, ci_high, confidence, p, p_holm, verdict`` (:func:`gap_claim`'s
    verdict; the interval is the family's)."""
    return _sensitivity(sweep)[0]


@dataclass(frozen=True)
class OptimizerFindings:
    """Finding 3 (task B): the primary test, then per head optimizer (accuracies 0..1; every gap is
    ``train_mode - backbone_eval``, on the sweep's paths ``batch_stats - pinned``).

    Claims tables (:func:`bnstudy.inference.claims_table`, each one family, glued by key):
    ``claims``: the primary (pre-specified) test, key ``primary``: the reference's paired gap at ``main_step``
    over all ``primary_n`` reported and confirmation seeds, one comparison with margin ``margin``
    (:func:`gap_claim`); ``unseen_claims``: the same test on the seeds not in ``seen_seeds`` (the quick
    profile's, seen before the design was fixed), key ``unseen``; ``explore_claims``: every row of
    :func:`exploratory_tests`, keys ``explore_<test>`` (``explore_main``, ``explore_<optimizer>_<step>``), one
    family of ``n_explore``; ``sens_claims``: the reference's sensitivity fits (:func:`reference_sensitivity`),
    keys ``sens_l2_<l2>_n<n_fit>``, one family of ``sens_n``; ``gain_claims``: per ``<optimizer>_<path>``
    (key ``gain_<optimizer>_<path>``) the paired gain from the second-to-last to the last checkpoint (pooled
    seeds), one family of ``gain_m``; ``explore_at_main_claims``: the rows of ``explore_claims`` at ``main_step``
    under the keys ``explore_at_main_<optimizer>`` (the same claims and adjusted p-values, for the prose).

    Numbers (the claims glue their own ``n`` and ``p``: ``primary_n``, ``primary_p``, ``unseen_n``): ``primary``
    (95% interval), ``primary_ci90`` (90%, the TOST's at one comparison; the TOST p is the claim's ``p_equivalence``); ``ref_sets``: the reference gap per seed set (``report`` / ``confirm``,
    95% interval; ``ref_sets_kind`` says with how many seeds). ``n_explore_resolved``: exploratory tests with
    a Holm-adjusted p below 0.05, ``trained_n_higher`` of them with ``train_mode`` higher, ``trained_reading``
    that count in words; ``explore_confidence``: the family intervals' confidence. Learning rates: ``lr``
    chosen at ``main_step`` per ``<optimizer>_<path>``, ``lr_position`` there (``interior`` / ``lowest`` /
    ``highest`` in the grid), ``lr_changes`` per ``<optimizer>_<path>``: ``"yes"`` when selecting at another
    checkpoint picks another rate. ``acc``: mean test accuracy, pooled seeds, per ``<optimizer>_<path>``
    (``reference`` too). ``gain_confidence``: the gains' family intervals' confidence. ``sens_min`` / ``sens_max``: the smallest
    and largest mean gap over the sensitivity fits; ``sens_n_agree`` fits with the primary verdict,
    ``sens_dissent`` the others in words (``"none"``). ``unseen_ci90`` (the 95% interval is the claim's), ``seen_n`` seeds seen, ``unseen_p_tost_text``; ``unseen_text`` / ``unseen_short``: that result as a sentence / a
    clause, or a sentence saying it is not available in this profile (never a NaN). ``primary_p_tost_text``:
    :func:`p_text` of the TOST p-value. ``trained_min`` / ``trained_max``: smallest / largest mean gap of the
    tuned-optimizer rows (not the main run). ``reference_converged``: every fit's gradient max-norm below
    1e-5. ``engine_check``: largest |sweep - engine| test accuracy at the main run's optimizer and lr (NaN when
    its lr is not in the grid).
    """

    main_step: int
    last_step: int
    prev_step: int
    margin: float
    primary: Interval
    primary_ci90: Interval
    ref_sets: dict
    ref_sets_kind: dict
    n_explore: int
    n_explore_resolved: int
    explore_confidence: float
    lr: dict
    lr_position: dict
    lr_changes: dict
    acc: dict
    gain_m: int
    gain_confidence: float
    sens_min: float
    sens_max: float
    sens_n: int
    sens_n_agree: int
    sens_dissent: str
    sens_confidence: float
    primary_p_tost_text: str
    unseen_ci90: Interval
    seen_n: int
    unseen_p_tost_text: str
    unseen_text: str
    unseen_short: str
    trained_n_higher: int
    trained_min: float
    trained_max: float
    trained_reading: str
    reference_converged: bool
    engine_check: float
    claims: pd.DataFrame
    unseen_claims: pd.DataFrame
    explore_claims: pd.DataFrame
    sens_claims: pd.DataFrame
    gain_claims: pd.DataFrame
    explore_at_main_claims: pd.DataFrame


def _unseen_text(u: pd.Series, n_all: int) -> str:
    """:attr:`OptimizerFindings.unseen_text`: the reference test on the unseen seeds ``u``, in one sentence."""
    c = gap_claim(u, "unseen")
    if c.verdict == "too few seeds":
        return (f"This profile cannot show that part: {n_all - len(u)} of its {n_all} seeds are ones the quick profile "
                f"had shown, so the confirmatory part of the test needs the full profile.")
    iv90 = t_interval(u, 1 - 2 * ALPHA)
    return (f"On the {len(u)} seeds the quick profile did not have, the difference is {c.estimate:.3f} (95% interval "
            f"{c.low:.3f} to {c.high:.3f}; 90% interval {iv90.low:.3f} to {iv90.high:.3f}; TOST p "
            f"{p_text(c.p_equivalence)}), verdict: {c.verdict}; this is the confirmatory part of the test.")


def _unseen_short(u: pd.Series) -> str:
    """:attr:`OptimizerFindings.unseen_short`: the unseen seeds' verdict as a clause."""
    c = gap_claim(u, "unseen")
    if c.verdict == "too few seeds":
        return "no confirmatory verdict in this profile (its seeds are all among those the design was fixed on)"
    return f"{c.verdict} on the {len(u)} seeds the quick profile had not shown when the test was designed"


def _trained_reading(counts: dict) -> str:
    """:attr:`OptimizerFindings.trained_reading`: the exploratory tests' counts (:func:`bnstudy.inference.count_verdicts`:
    a direction where Holm's adjusted p is below 0.05, else the printed verdict) in words: how many show train mode
    higher, and how many lower where any do."""
    n, k, j = counts["m"], counts["higher"], counts["lower"]
    if n and k == n:
        return f"train mode higher in all {n} tests"
    if n and j == n:
        return f"train mode lower in all {n} tests"
    return f"train mode higher in {k} of {n} tests" + (f", lower in {j}" if j else "")


def optimizer_findings(sweep: pd.DataFrame, main_step: int, reference_grads=None,
                       main: pd.DataFrame | None = None, seen_seeds=QUICK_SEEN_SEEDS) -> OptimizerFindings:
    """:class:`OptimizerFindings` from :func:`run_head_sweep`'s table.

    ``reference_grads``: the fits' gradient max-norms (``None``: not checked, reported as converged
    only if empty). ``main``: the engine's results table (the exploratory main-run test and
    ``engine_check``). Raises ``ValueError`` if ``main_step`` is not a checkpoint, fewer than two
    checkpoints exist, or the sweep has no primary reference rows.
    """
    steps = sorted(sweep[sweep["optimizer"] != "reference"]["step"].unique())
    if main_step not in steps or len(steps) < 2:
        raise ValueError(f"optimizer_findings needs main_step among >= 2 checkpoints, got {main_step} in {steps}")
    lrs = choose_lrs(sweep, main_step)
    t = chosen_table(sweep, lrs)
    ref = t[t["optimizer"] == "reference"]
    if ref.empty:
        raise ValueError("optimizer_findings needs the primary reference's rows (optimizer='reference')")
    ref_step = int(ref["step"].min())
    g = _path_gap(t, "reference", POOLED, ref_step)
    n = len(g)
    sets, kinds = {}, {}
    for role in POOLED:
        if (ref["role"] == role).any():
            v = _path_gap(t, "reference", (role,), ref_step)
            sets[role] = t_interval(v)
            kinds[role] = f"95% interval over {len(v)} seeds"
    _, explore = _explore(sweep, main_step, main)
    opts = [o for o in ("sgd", "adam") if (o, "pinned") in lrs]
    pooled = t[t["role"].isin(POOLED)]
    acc, gains = {}, {}
    for o in opts + ["reference"]:
        for p in PATHS:
            s = pooled[(pooled["optimizer"] == o) & (pooled["path"] == p)]
            acc[f"{o}_{p}"] = float(s[s["step"] == (ref_step if o == "reference" else main_step)]["accuracy"].mean())
            if o != "reference":
                piv = s.pivot(index="seed", columns="step", values="accuracy")
                gains[f"{o}_{p}"] = piv[steps[-1]] - piv[steps[-2]]
    gain_family = Family(max(len(gains), 1))
    gain_claims = _verdicts(decide(d, f"gain_{k}", family=gain_family, higher=LAST_HIGHER, lower=LAST_LOWER)
                            for k, d in gains.items())
    choice = lr_choice_table(sweep)
    at_main = choice[choice["step"] == main_step].set_index(["optimizer", "path"])
    changes = {f"{o}_{p}": "yes" if c["lr"].nunique() > 1 else "no" for (o, p), c in choice.groupby(["optimizer", "path"])}
    sens, sens_claims = _sensitivity(sweep)
    primary = gap_claim(g, "primary")
    check = math.nan
    if main is not None:
        o, lr = str(main["optimizer"].iloc[0]), float(main["lr"].iloc[0])
        s = sweep[(sweep["role"] == "report") & (sweep["split"] == "test") & (sweep["step"] == main_step)
                  & (sweep["optimizer"] == o) & (sweep["lr"] == lr)]
        if not s.empty:
            diffs = [abs(float(r["accuracy"]) - float(main[(main["seed"] == r["seed"]) & (main["mode"] == m)]["task_b"].iloc[0]))
                     for _, r in s.iterrows() for m in PATHS[r["path"]] if r["seed"] in set(main["seed"])]
            check = max(diffs) if diffs else math.nan
    grads = [] if reference_grads is None else list(reference_grads)
    u = g[~g.index.isin(list(seen_seeds))]
    dissent = [f"L2 {r['l2']:.0e} with {int(r['n_fit']):,} samples: {r['verdict']}" for _, r in sens.iterrows()
               if r["verdict"] != primary.verdict]
    counts = count_verdicts(explore, ALPHA)  # the book's one counts rule: Holm directions, printed kinds otherwise
    k_higher = counts["higher"]
    tuned = explore[explore["key"] != "explore_main"]
    return OptimizerFindings(
        main_step=int(main_step), last_step=int(steps[-1]), prev_step=int(steps[-2]), margin=PRIMARY_MARGIN,
        primary=t_interval(g), primary_ci90=t_interval(g, 1 - 2 * ALPHA),
        ref_sets=sets, ref_sets_kind=kinds,
        n_explore=len(explore), n_explore_resolved=int(counts["higher"] + counts["lower"]),
        explore_confidence=float(explore["confidence"].iloc[0]) if len(explore) else math.nan,
        lr={f"{o}_{p}": v for (o, p), v in lrs.items()},
        lr_position={f"{o}_{p}": str(r["position"]) for (o, p), r in at_main.iterrows()},
        lr_changes=changes, acc=acc,
        gain_m=gain_family.m,
        gain_confidence=gain_family.confidence,
        sens_min=float(sens["mean"].min()), sens_max=float(sens["mean"].max()), sens_n=len(sens),
        sens_n_agree=int((sens["verdict"] == primary.verdict).sum()), sens_dissent="; ".join(dissent) or "none",
        sens_confidence=float(sens["confidence"].iloc[0]) if len(sens) else math.nan,
        primary_p_tost_text=p_text(primary.p_equivalence),
        unseen_ci90=t_interval(u, 1 - 2 * ALPHA),
        seen_n=int(n - len(u)), unseen_p_tost_text=p_text(gap_claim(u).p_equivalence),
        unseen_text=_unseen_text(u, n), unseen_short=_unseen_short(u),
        trained_n_higher=k_higher, trained_reading=_trained_reading(counts),
        trained_min=float(tuned["estimate"].min()) if len(tuned) else math.nan,
        trained_max=float(tuned["estimate"].max()) if len(tuned) else math.nan,
        reference_converged=bool(all(g_ < 1e-5 for g_ in grads)), engine_check=float(check),
        claims=_verdicts([primary]), unseen_claims=_verdicts([gap_claim(u, "unseen")]), explore_claims=explore,
        sens_claims=sens_claims, gain_claims=gain_claims,
        explore_at_main_claims=explore[explore["key"].isin([f"explore_{o}_{main_step}" for o in opts])].assign(
            key=lambda c: c["key"].str.replace(f"_{main_step}", "", regex=False).str.replace("explore_", "explore_at_main_",
                                                                                            regex=False)))


# --- the running statistics' change on normalised scales (finding 2) -----------------------------------------------

@dataclass(frozen=True)
class BufferFindings:
    """How far ``train_mode``'s running statistics moved, on scales that do not depend on the layer's units.

    Per seed the largest value over layers and channels: ``mean_shift`` (running_mean change in task A's
    running standard deviations) and ``log_var`` (``|log(var1 / var0)|``), 95% intervals over seeds;
    ``var_factor`` = ``exp`` of ``log_var``'s mean (the factor by which the most-changed variance moved);
    ``mean_shift_min`` / ``log_var_min``: the smallest seed's value. ``mean_shift_by_layer`` /
    ``log_var_by_layer``: means over seeds per layer. ``engine_check``: largest relative difference between the
    sweep's raw changes and the engine's ``drift_mean_l<i>`` / ``drift_var_l<i>`` (NaN without the main table).
    ``contrast_log_var``: ``ln(contrast^2)``, the log-variance ratio a linear first layer inherits from task B's
    contrast gain (``contrast`` argument, else the main table's; NaN without).

    Finding 2's criteria as verdicts (:func:`bnstudy.inference.decide` on the per-seed value minus the
    criterion): ``claims``, one family of ``m`` (2 per layer, and 2 for the most-moved layer): keys ``shift_block_<i>`` (largest mean shift -
    :data:`MEAN_SHIFT_SD`; "above 1 SD" / "below 1 SD") and ``var_block_<i>`` (largest |log variance ratio| -
    ``log(VAR_FACTOR)``; "above a factor 2" / "below a factor 2"), and ``shift_most`` / ``var_most`` for the
    most-moved layer (each seed's largest over layers).
    """

    mean_shift: Interval
    mean_shift_min: float
    log_var: Interval
    log_var_min: float
    var_factor: float
    mean_shift_by_layer: pd.Series
    log_var_by_layer: pd.Series
    engine_check: float
    contrast_log_var: float
    m: int
    claims: pd.DataFrame


def buffer_claims(per_seed: pd.DataFrame, key: str, family: Family) -> list:
    """Finding 2's two criteria on ``per_seed`` (columns ``mean_shift_sd``, ``log_var_ratio``, one row per seed)
    as claims ``shift_<key>`` and ``var_<key>``."""
    return [decide(per_seed["mean_shift_sd"] - MEAN_SHIFT_SD, f"shift_{key}", family=family, higher=SHIFT_ABOVE,
                   lower=SHIFT_BELOW),
            decide(per_seed["log_var_ratio"] - math.log(VAR_FACTOR), f"var_{key}", family=family, higher=VAR_ABOVE,
                   lower=VAR_BELOW)]


def buffer_findings(buffers: pd.DataFrame, main: pd.DataFrame | None = None,
                    contrast: float | None = None) -> BufferFindings:
    """:class:`BufferFindings` from :func:`buffer_table`. Raises ``ValueError`` for an empty table."""
    if buffers.empty:
        raise ValueError("buffer_findings needs a non-empty buffer table (see buffer_table)")
    cols = ["mean_shift_sd", "log_var_ratio"]
    per_seed = buffers.groupby("seed")[cols].max()
    check = math.nan
    if main is not None:
        tm = main[main["mode"] == "train_mode"].set_index("seed")
        rel = []
        for _, r in buffers.iterrows():
            if r["seed"] in tm.index:
                i = int(r["layer"].split()[-1]) - 1
                for ours, theirs in (("mean_abs", f"drift_mean_l{i}"), ("var_abs", f"drift_var_l{i}")):
                    e = float(tm.loc[r["seed"], theirs])
                    rel.append(abs(float(r[ours]) - e) / max(abs(e), 1e-12))
        check = max(rel) if rel else math.nan
    layers = list(buffers.groupby("layer"))
    family = Family(2 * len(layers) + 2)
    claims = [c for layer, g in layers
              for c in buffer_claims(g.groupby("seed")[cols].max(), _slug(layer), family)]
    claims += buffer_claims(per_seed, "most", family)
    ls = t_interval(per_seed["log_var_ratio"])
    if contrast is None and main is not None and "contrast" in main.columns:
        contrast = float(main["contrast"].iloc[0])
    return BufferFindings(
        mean_shift=t_interval(per_seed["mean_shift_sd"]), mean_shift_min=float(per_seed["mean_shift_sd"].min()),
        log_var=ls, log_var_min=float(per_seed["log_var_ratio"].min()), var_factor=float(math.exp(ls.mean)),
        mean_shift_by_layer=buffers.groupby("layer")["mean_shift_sd"].mean(),
        log_var_by_layer=buffers.groupby("layer")["log_var_ratio"].mean(), engine_check=float(check),
        contrast_log_var=float(math.log(contrast ** 2)) if contrast else math.nan, m=family.m,
        claims=_verdicts(claims))


def _slug(v) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in str(v).lower()).strip("_")


# --- numerical noise: the same runs at another torch thread count (issue 10) ---------------------------------------

@dataclass(frozen=True)
class ThreadFindings:
    """Run-to-run variation between two torch thread counts (accuracies 0..1).

    Only distinct runs count: on task B ``separate_stats`` repeats ``train_mode`` and ``all_eval`` repeats
    ``backbone_eval`` (checks of the code), so ``n_runs`` is 2 per seed and thread count, and task A after
    stage 2 is compared for ``train_mode`` only (the other modes keep it exactly). ``n_differ``: distinct runs
    whose task B differs; ``max_diff_b`` / ``mean_diff_b``: largest and mean |change|; ``max_diff_a``: the
    same for task A. ``gap_diff``: per seed, the change of the gap ``train_mode - backbone_eval``
    (``<other> - <main>`` threads), ``gap_diff_largest`` its largest size. ``gap_seed_sd``: the main run's
    standard deviation of that gap over *all* its seeds (NaN without it); ``diff_over_sd`` the ratio.
    The main run's gap with 95% interval, and the same with the checked seeds' gaps taken from the other thread
    count, are claims: their estimates, intervals and verdicts (:func:`gap_claim`, no margin, each one
    comparison; ``claims`` key ``main_gap``, ``swapped_claims`` key ``swapped_gap``), which differ when the thread count alone changes the verdict.
    """

    n_seeds: int
    n_runs: int
    n_differ: int
    max_diff_b: float
    mean_diff_b: float
    max_diff_a: float
    gap_diff: pd.Series
    gap_diff_largest: float
    gap_seed_sd: float
    diff_over_sd: float
    claims: pd.DataFrame
    swapped_claims: pd.DataFrame


def thread_findings(tc: pd.DataFrame, main: pd.DataFrame | None = None, main_threads: int = 1) -> ThreadFindings:
    """:class:`ThreadFindings` from :func:`thread_check`'s table (two thread counts, ``main_threads`` being the
    main run's) and the main run's table ``main``. Raises ``ValueError`` unless there are exactly two thread
    counts, one of them ``main_threads``."""
    ths = sorted(tc["threads"].unique())
    if len(ths) != 2 or main_threads not in ths:
        raise ValueError(f"thread_findings needs exactly two thread counts including main_threads={main_threads}, "
                         f"got {ths}")
    other = [t for t in ths if t != main_threads][0]
    a, b = (tc[tc["threads"] == t].set_index(["seed", "mode"]).sort_index() for t in (main_threads, other))
    distinct = a.index.get_level_values("mode").isin(["train_mode", "backbone_eval"])
    d_b = (a["task_b"] - b["task_b"]).abs()[distinct]
    tm = a.index.get_level_values("mode") == "train_mode"
    d_a = (a["task_a_after"] - b["task_a_after"]).abs()[tm]
    gap = lambda x: x["task_b"].xs("train_mode", level="mode") - x["task_b"].xs("backbone_eval", level="mode")
    ga, gb = gap(a), gap(b)
    mg = sw = pd.Series(dtype=float)
    sd = math.nan
    if main is not None:
        mg = paired_differences(main, "task_b", "mode", "train_mode", "backbone_eval")
        sd = float(mg.std(ddof=1)) if len(mg) > 1 else math.nan
        sw = mg.copy()
        for s in gb.index:
            if s in sw.index:
                sw[s] = gb[s]
    claims = _verdicts([gap_claim(mg, "main_gap", margin=None)])
    swapped = _verdicts([gap_claim(sw, "swapped_gap", margin=None)])
    dmax = float((gb - ga).abs().max())
    return ThreadFindings(n_seeds=int(len(ga)), n_runs=int(distinct.sum()), n_differ=int((d_b > 0).sum()),
                          max_diff_b=float(d_b.max()), mean_diff_b=float(d_b.mean()), max_diff_a=float(d_a.max()),
                          gap_diff=(gb - ga).rename(lambda s: f"seed{s}"), gap_diff_largest=dmax, gap_seed_sd=sd,
                          diff_over_sd=dmax / sd if sd and not math.isnan(sd) else math.nan,
                          claims=claims,
                          swapped_claims=swapped)


# --- the drift check against a precise target (referee item 3) ---------------------------------------------------

@dataclass(frozen=True)
class DriftCheckFindings:
    """The drift check with task B's population mean estimated from many batches (:func:`sweep_drift_table`).

    ``n_batches`` / ``n_batches_engine``: precise-BN batches of the two targets. ``engine_reproduced``: largest
    |sweep weight on the engine's target - engine's ``drift_weight_l<i>``| over reported seeds, layers and steps
    (the sweep's ``batch_stats`` path repeats the engine's ``train_mode`` run; NaN without the main table).
    ``bias_engine_12``: per layer, the mean over seeds of (weight on the engine's target - weight on the precise
    target) at step 12, with 95% bounds ``*_low`` / ``*_high``: the bias the 20-batch target adds.
    ``remaining_bias``: the largest of those biases times ``n_batches_engine / n_batches`` (the estimation error's
    squared size, which the bias is proportional to, falls as 1 / batches): the bias expected to be left.
    ``n_intervals`` / ``n_inside``: (layer, recorded step) pairs with ``1 <= t <= last_step`` and how many of
    their 95% intervals (Student t over seeds) contain ``(1 - m)^t``. ``residual_max``: the largest |mean
    residual| (weight - ``(1 - m)^t``) over those pairs, at ``residual_max_layer`` / ``residual_max_step``, and
    ``halfwidth_max``: the largest 95% half-width among them (the seed-to-seed noise of the measurement).
    ``misses``: the intervals that do not contain the prediction, in words (layer, step, mean residual and
    half-width; ``"none"``), ``n_expected_misses``: ``n_intervals * 0.05``, the misses expected by chance at 95%.
    ``engine_excess_12``: per layer, mean weight on the engine's target minus ``(1 - m)^12`` at step 12 (the
    excess ``bias_engine_12`` is a part of), and ``bias_share_12`` the ratio of the two.
    """

    n_batches: int
    n_batches_engine: int
    engine_reproduced: float
    bias_engine_12: pd.Series
    bias_engine_12_low: pd.Series
    bias_engine_12_high: pd.Series
    remaining_bias: float
    n_intervals: int
    n_inside: int
    residual_max: float
    residual_max_layer: str
    residual_max_step: int
    halfwidth_max: float
    misses: str
    n_expected_misses: float
    engine_excess_12: pd.Series
    bias_share_12: pd.Series


def drift_check(drift: pd.DataFrame, momentum: float, last_step: int, main: pd.DataFrame | None = None,
                n_batches: int = DRIFT_TARGET_BATCHES, n_batches_engine: int = ENGINE_TARGET_BATCHES,
                engine: pd.DataFrame | None = None) -> DriftCheckFindings:
    """:class:`DriftCheckFindings` from :func:`sweep_drift_table` (both targets needed).

    ``last_step``: the last recorded step above the noise floor (:attr:`DriftFindings.last_step`).
    ``engine``: the engine's own drift measurement, :func:`drift_table` of the main run (a saved table's rows:
    the results table keeps no list columns); default: :func:`drift_table` of ``main`` when it has its list
    columns (``drift_steps``), else not compared (``engine_reproduced`` NaN).
    Raises ``ValueError`` unless both targets are present.
    """
    if not {"engine", "precise"} <= set(drift["target"]):
        raise ValueError(f"drift_check needs targets 'engine' and 'precise', got {sorted(set(drift['target']))}")
    piv = drift.pivot_table(index=["seed", "layer", "step"], columns="target", values="weight")
    at12 = piv.xs(12, level="step")
    bias = {l: t_interval(g["engine"] - g["precise"]) for l, g in at12.groupby(level="layer")}
    rep = math.nan
    if engine is None and main is not None and "drift_steps" in main.columns:
        engine = drift_table(main)
    if engine is not None:
        eng = engine.set_index(["seed", "layer", "step"])["weight"]
        common = piv.index.intersection(eng.index)
        if len(common):
            rep = float((piv.loc[common, "engine"] - eng.loc[common]).abs().max())
    pr = drift[(drift["target"] == "precise") & (drift["step"] >= 1) & (drift["step"] <= last_step)]
    n_in, n_iv, best = 0, 0, (0.0, "", 0)
    half, missed = 0.0, []
    for (layer, t), g in pr.groupby(["layer", "step"]):
        iv, th = t_interval(g["weight"]), (1 - momentum) ** t
        n_iv += 1
        n_in += int(iv.low <= th <= iv.high)
        if not iv.low <= th <= iv.high:
            missed.append(f"{layer} at step {int(t)} (mean residual {iv.mean - th:+.4f}, half-width "
                          f"{(iv.high - iv.low) / 2:.4f})")
        half = max(half, (iv.high - iv.low) / 2)
        if abs(iv.mean - th) > best[0]:
            best = (abs(iv.mean - th), layer, int(t))
    b12 = pd.Series({l: iv.mean for l, iv in bias.items()})
    exc12 = at12.groupby(level="layer")["engine"].mean() - (1 - momentum) ** 12
    return DriftCheckFindings(
        n_batches=int(n_batches), n_batches_engine=int(n_batches_engine), engine_reproduced=rep,
        bias_engine_12=b12, bias_engine_12_low=pd.Series({l: iv.low for l, iv in bias.items()}),
        bias_engine_12_high=pd.Series({l: iv.high for l, iv in bias.items()}),
        remaining_bias=float(b12.abs().max() * n_batches_engine / n_batches), n_intervals=n_iv, n_inside=n_in,
        residual_max=float(best[0]), residual_max_layer=best[1], residual_max_step=best[2], halfwidth_max=float(half),
        misses="; ".join(missed) or "none", n_expected_misses=0.05 * n_iv, engine_excess_12=exc12,
        bias_share_12=b12 / exc12)


# --- tuning, budget and feature scale: what explains the trained heads' gap (referee items 6 and 8) ----------------

def _oracle(sweep: pd.DataFrame):
    """:func:`oracle_gaps`' table and its claims table (one family, keys ``oracle_<optimizer>_<step>``)."""
    t = sweep[(sweep["split"] == "test") & sweep["role"].isin(POOLED) & sweep["optimizer"].isin(["sgd", "adam"])]
    rows, values = [], []
    for (o, step), g in t.groupby(["optimizer", "step"]):
        best = {p: float(h.groupby("lr")["accuracy"].mean().sort_index().idxmax()) for p, h in g.groupby("path")}
        if set(best) != set(PATHS):
            continue
        acc = {p: g[(g["path"] == p) & (g["lr"] == lr)].set_index("seed")["accuracy"] for p, lr in best.items()}
        rows.append(dict(key=f"oracle_{o}_{int(step)}", optimizer=o, step=int(step), lr_batch_stats=best["batch_stats"],
                         lr_pinned=best["pinned"]))
        values.append(acc["batch_stats"] - acc["pinned"])
    cols = ["key", "optimizer", "step", "lr_batch_stats", "lr_pinned", "n", "mean", "ci_low", "ci_high", "confidence",
            "p", "p_holm", "verdict"]
    if not rows:
        return pd.DataFrame(columns=cols), _verdicts([])
    table, claims = _family_table(rows, values)
    return table.reindex(columns=cols), claims


def oracle_gaps(sweep: pd.DataFrame) -> pd.DataFrame:
    """The gap with each path's learning rate chosen on the *test* sets of the reported and confirmation seeds.

    Uses test data to choose, so it is a robustness check only (it favours each path, the pinned one included),
    never a test. Per optimizer (``sgd``, ``adam``) and checkpoint: ``key, optimizer, step, lr_batch_stats,
    lr_pinned, n, mean, ci_low, ci_high, confidence, p, p_holm, verdict`` (paired gap ``batch_stats - pinned``;
    the rows one family: Bonferroni intervals, Holm-adjusted p-values, :func:`gap_claim` without a margin).
    """
    return _oracle(sweep)[0]


@dataclass(frozen=True)
class TuningFindings:
    """What the trained heads' gap depends on (accuracies 0..1; gaps ``batch_stats - pinned`` = ``train_mode -
    backbone_eval``, pooled seeds).

    *Oracle learning rate* (:func:`oracle_gaps`, robustness only): ``oracle_claims`` (keys
    ``oracle_<optimizer>_<step>``, one family of ``oracle_n``; family intervals at ``oracle_confidence``),
    ``oracle_min`` / ``oracle_max`` of the means, ``oracle_n_above`` rows with ``train_mode`` higher as
    :func:`bnstudy.inference.count_verdicts` counts them (Holm); ``oracle_at_main_claims``: its rows at
    ``main_step`` under the keys ``oracle_at_main_<optimizer>``; ``oracle_reading``: what that count means, in words.
    *Budget*: with the learning rate chosen on validation at ``main_step``, ``gap_at`` per
    ``<optimizer>_<step>`` (95% interval; ``gap_first`` / ``gap_last`` per optimizer at the first / last
    checkpoint). ``narrow_claims`` (keys ``narrow_<optimizer>``, one family of ``n_opt``): the paired change of
    the gap from ``first_step`` to ``last_step`` (negative: it narrows; "gap smaller at more steps" / "gap
    larger at more steps"), ``narrowing_p_holm_text`` (:func:`p_text` of the Holm
    p), ``n_narrows`` optimizers whose gap is smaller by Holm, ``narrow_reading``: those verdicts in words.
    *Feature scale*: the standardized heads (``<optimizer>-std``, learning rate chosen on validation at
    ``main_step``). ``std_claims`` (keys ``std_<optimizer>``, one family of ``std_m``): their gap at
    ``main_step`` with the reference test's margin (:func:`gap_claim`);
    ``reduction_claims`` (keys ``reduction_<optimizer>``, one family of ``std_m``): paired (plain gap -
    standardized gap); ``std_lr`` the chosen rates per ``<optimizer>_<path>``.
    ``std_at_claims`` (keys ``std_<optimizer>_<step>``, one family of ``std_n``): the standardized gap at every
    checkpoint, intervals ``std_gap_at`` (at ``std_at_confidence``), ``std_gap_min`` / ``std_gap_max`` of its
    means, ``std_n_above`` with ``train_mode`` higher by Holm and ``std_n_positive`` means above 0;
    ``std_acc``: the standardized heads' mean test accuracy per ``<optimizer>_<path>`` at ``main_step``,
    ``std_gain``: paired (standardized - plain) accuracy per ``<optimizer>_<path>`` there (95% interval);
    ``std_plain_gap``: the plain heads' gap per optimizer at ``main_step`` (the same as ``gap_at``'s);
    ``std_share`` / ``std_share_low``: the reduction's mean / lower bound as a fraction of the plain gap's
    mean. ``std_reading``: what the standardized heads show, in words (:func:`std_reading`; ``"not run"``
    without them).
    """

    main_step: int
    first_step: int
    last_step: int
    oracle_min: float
    oracle_max: float
    oracle_n: int
    oracle_n_above: int
    oracle_confidence: float
    oracle_reading: str
    gap_at: dict
    gap_first: dict
    gap_last: dict
    n_narrows: int
    n_opt: int
    narrow_reading: str
    narrowing_p_holm_text: dict
    std_m: int
    std_lr: dict
    std_reading: str
    std_gap_at: dict
    std_at_confidence: float
    std_gap_min: float
    std_gap_max: float
    std_n_above: int
    std_n_positive: int
    std_n: int
    std_acc: dict
    std_gain: dict
    std_share: dict
    std_share_low: dict
    std_plain_gap: dict
    narrow_claims: pd.DataFrame
    std_claims: pd.DataFrame
    reduction_claims: pd.DataFrame
    std_at_claims: pd.DataFrame
    oracle_claims: pd.DataFrame
    oracle_at_main_claims: pd.DataFrame


def _opt_name(o: str) -> str:
    return "SGD" if o == "sgd" else "Adam"


def _narrow_reading(verdicts: dict) -> str:
    """:attr:`TuningFindings.narrow_reading`: per optimizer the verdict on the gap's change with the budget."""
    parts = [f"{_opt_name(o)}: {v}" for o, v in verdicts.items()]
    return "; ".join(parts) if parts else "not run"


def engine_check_text(diff: float, digits: int = 3) -> str:
    """How the head sweep's heads at the main run's settings compare with the main run's task-B accuracy
    (``diff``: :attr:`OptimizerFindings.engine_check`), in words: ``"reproduce it exactly"`` at 0, else
    ``"differ from it by at most <diff>"``; ``"were not compared with it"`` for NaN."""
    if math.isnan(diff):
        return "were not compared with it"
    return "reproduce it exactly" if diff == 0 else f"differ from it by at most {diff:.{digits}g}"


def _oracle_reading(k: int, n: int) -> str:
    """:attr:`TuningFindings.oracle_reading`: ``k`` of ``n`` oracle rows with train mode higher, in words."""
    if n and k == n:
        return ("Even a learning rate tuned per path on the test data leaves the pinned path behind at every "
                "checkpoint, so the trained heads' gap is not an artifact of the learning-rate choice")
    if k == 0:
        return ("With the learning rate tuned per path on the test data no difference is shown, so tuning could "
                "account for the trained heads' gap")
    return (f"With the learning rate tuned per path on the test data the pinned path stays behind in {k} of {n} "
            f"optimizer-checkpoint pairs, so tuning explains at most a part of the trained heads' gap")


def std_reading(plain: dict, reductions: pd.DataFrame, n_above: int, n_residual: int) -> str:
    """The standardized heads' result in words, read from the reductions' verdicts, not from an equivalence.

    ``plain``: per optimizer the plain heads' gap (:class:`~bnstudy.inference.Interval`) at the main step;
    ``reductions``: the claims table of (plain - standardized gap), keys ``reduction_<optimizer>``;
    ``n_above`` of ``n_residual`` checkpoints where the standardized gap still shows ``train_mode`` higher.
    "Most of the gap" when every reduction is shown ("smaller with standardized features") and its mean is at
    least half the plain gap; "part of the gap" when every reduction is shown but not that large; otherwise not
    shown to shrink. ``"not run"`` without standardized heads.
    """
    if reductions.empty:
        return "not run"
    opt = lambda k: k.removeprefix("reduction_")  # noqa: E731
    missing = [opt(r.key) for r in reductions.itertuples() if r.verdict != STD_SMALLER]
    if missing:
        names = " and ".join(_opt_name(o) for o in missing)
        return (f"standardizing the features is not shown to shrink the gap for {names}: feature "
                "conditioning is not shown to explain it")
    most = all(r.estimate >= 0.5 * plain[opt(r.key)].mean for r in reductions.itertuples())
    rest = (f"a smaller gap remains, train mode higher at {n_above} of {n_residual} checkpoints" if n_above else
            "what remains is not shown to differ from zero at any checkpoint")
    if most:
        return ("standardizing the features removes most of the gap on average, but by the reductions' intervals "
                f"possibly less; {rest}. Feature conditioning, which standardization improves more on the pinned "
                "path, most likely explains most of the trained heads' gap, not all of it")
    return (f"standardizing the features removes part of the gap; {rest}. Feature conditioning explains part of "
            "the trained heads' gap")


def tuning_findings(sweep: pd.DataFrame, main_step: int) -> TuningFindings:
    """:class:`TuningFindings` from :func:`run_head_sweep`'s table. Raises ``ValueError`` if ``main_step`` is not a
    checkpoint of at least two."""
    steps = sorted(sweep[sweep["optimizer"].isin(["sgd", "adam"])]["step"].unique())
    if main_step not in steps or len(steps) < 2:
        raise ValueError(f"tuning_findings needs main_step among >= 2 checkpoints, got {main_step} in {steps}")
    orc, orc_claims = _oracle(sweep)
    orc_above = count_verdicts(orc_claims, ALPHA)["higher"]  # the book's one counts rule, on the claims table
    at_main = {f"oracle_{o}_{main_step}": f"oracle_at_main_{o}" for o in ("sgd", "adam")}
    lrs = choose_lrs(sweep, main_step)
    t = chosen_table(sweep, lrs)
    opts = [o for o in ("sgd", "adam") if (o, "pinned") in lrs]
    gap_at, changes = {}, {}
    for o in opts:
        per = {s: _path_gap(t, o, POOLED, s) for s in steps}
        gap_at.update({f"{o}_{s}": t_interval(v) for s, v in per.items()})
        changes[o] = per[steps[-1]] - per[steps[0]]
    fam = Family(max(len(opts), 1))
    narrow = _verdicts(decide(d, f"narrow_{o}", family=fam, higher=GAP_LARGER, lower=GAP_SMALLER)
                       for o, d in changes.items())
    std_opts = [o for o in opts if (o + STD_SUFFIX, "pinned") in lrs]
    sfam = Family(max(len(std_opts), 1))
    std_claims, red_claims, std_lr, std_acc, std_gain, std_at_rows, std_at_values = [], [], {}, {}, {}, [], []
    for o in std_opts:
        so = o + STD_SUFFIX
        g = _path_gap(t, so, POOLED, main_step)
        std_claims.append(gap_claim(g, f"std_{o}", family=sfam))
        red_claims.append(decide(_path_gap(t, o, POOLED, main_step) - g, f"reduction_{o}", family=sfam,
                                 higher=STD_SMALLER, lower=STD_LARGER))
        std_lr.update({f"{o}_{p}": lrs[(so, p)] for p in PATHS})
        for s in steps:
            std_at_rows.append(dict(key=f"std_{o}_{s}"))
            std_at_values.append(_path_gap(t, so, POOLED, s))
        at = t[t["role"].isin(POOLED) & (t["step"] == main_step)]
        for p in PATHS:
            acc = lambda name: at[(at["optimizer"] == name) & (at["path"] == p)].set_index("seed")["accuracy"]  # noqa: E731
            std_acc[f"{o}_{p}"] = float(acc(so).mean())
            std_gain[f"{o}_{p}"] = t_interval(acc(so) - acc(o))
    std_claims, red_claims = _verdicts(std_claims), _verdicts(red_claims)
    std_at_table, std_at_claims = _family_table(std_at_rows, std_at_values)
    std_at = {r.key.removeprefix("std_"): _interval(r) for r in std_at_claims.itertuples()}
    std_above = count_verdicts(std_at_claims, ALPHA)["higher"] if len(std_at_claims) else 0
    reduction = {r.key.removeprefix("reduction_"): _interval(r) for r in red_claims.itertuples()}
    plain = {o: gap_at[f"{o}_{main_step}"] for o in reduction}
    share = {o: reduction[o].mean / plain[o].mean if plain[o].mean else math.nan for o in reduction}
    share_low = {o: reduction[o].low / plain[o].mean if plain[o].mean else math.nan for o in reduction}
    return TuningFindings(
        main_step=int(main_step), first_step=int(steps[0]), last_step=int(steps[-1]),
        oracle_min=float(orc["mean"].min()), oracle_max=float(orc["mean"].max()), oracle_n=len(orc),
        oracle_n_above=orc_above, oracle_confidence=float(orc["confidence"].iloc[0]) if len(orc) else math.nan,
        oracle_reading=_oracle_reading(orc_above, len(orc)), gap_at=gap_at,
        gap_first={o: gap_at[f"{o}_{steps[0]}"] for o in opts}, gap_last={o: gap_at[f"{o}_{steps[-1]}"] for o in opts},
        n_narrows=count_verdicts(narrow, ALPHA)["lower"] if len(narrow) else 0, n_opt=len(opts),
        narrow_reading=_narrow_reading({r.key.removeprefix("narrow_"): r.verdict for r in narrow.itertuples()}),
        narrowing_p_holm_text={r.key.removeprefix("narrow_"): p_text(r.p_adjusted) for r in narrow.itertuples()},
        std_m=sfam.m, std_lr=std_lr,
        std_reading=std_reading(plain, red_claims, std_above, len(std_at)),
        std_gap_at=std_at,
        std_at_confidence=float(std_at_claims["confidence"].iloc[0]) if len(std_at_claims) else math.nan,
        std_gap_min=float(min((iv.mean for iv in std_at.values()), default=math.nan)),
        std_gap_max=float(max((iv.mean for iv in std_at.values()), default=math.nan)),
        std_n_above=std_above, std_n=len(std_at), std_n_positive=sum(iv.mean > 0 for iv in std_at.values()),
        std_acc=std_acc, std_gain=std_gain, std_share=share, std_share_low=share_low, std_plain_gap=plain,
        narrow_claims=narrow, std_claims=std_claims, reduction_claims=red_claims, std_at_claims=std_at_claims,
        oracle_claims=orc_claims,
        oracle_at_main_claims=orc_claims[orc_claims["key"].isin(list(at_main))].assign(
            key=lambda c: c["key"].map(at_main)))


# --- the seed article's numbers beside this chapter's (referee item 9) ---------------------------------------------

#: Seed article 001's numbers (3 seeds, linear head, 800 steps), as it states them; fractions 0..1, logits, units.
ARTICLE = dict(task_a_after_tm=0.104, max_logit_change=39.0, buffer_units=4.0, task_b_tm=0.43,
               task_b_pinned_low=0.21, task_b_pinned_high=0.26, pinned_a=0.256, pinned_b=0.206)


def seed_article_table(main: pd.DataFrame, f: Findings, o: OptimizerFindings, buffers: pd.DataFrame) -> pd.DataFrame:
    """The seed article's claims beside this chapter's measurements: ``claim, seed article, this chapter, status``.

    Every entry of ``this chapter`` and ``status`` is computed from ``main`` (the main run's table), ``f``
    (:func:`findings`), ``o`` (:func:`optimizer_findings`) and ``buffers`` (:func:`buffer_table`); the
    ``seed article`` column is :data:`ARTICLE`. ``status`` is ``reproduced``, ``reproduced, smaller``,
    ``differs`` (with what differs) or ``identity of the code`` where the article reports a measurement that
    is an equality of the code here.
    """
    a = ARTICLE
    piv = main.pivot(index="seed", columns="mode", values="task_b")
    tm = main[main["mode"] == "train_mode"]
    logit = tm["max_old_logit_change"]
    after = f.task_a_after_tm
    raw_mean, raw_var = float(buffers["mean_abs"].max()), float(buffers["var_abs"].max())
    pinned = piv[["backbone_eval", "all_eval"]].mean()
    v = lambda key: verdict_of(f.claims, key)  # noqa: E731
    ok = lambda key: v(key) == EXACT  # noqa: E731
    chance_v, change_v = v("task_a_chance"), v("task_a_change")
    main_v = verdict_of(o.explore_claims, "explore_main") if (o.explore_claims["key"] == "explore_main").any() \
        else "not run"
    rows = [
        ("every weight unchanged (all modes)", "largest change 0", f"largest change 0: {v('c_weights_unchanged')}",
         "reproduced (check)" if ok("c_weights_unchanged") else "differs"),
        ("task A after `train_mode`", f"{a['task_a_after_tm']:.3f} (chance)",
         f"{after.mean():.3f} mean, {after.min():.3f} to {after.max():.3f}; against chance: {chance_v}; "
         f"{f.n_near_chance} of {f.n_seeds} seeds at or below {f.chance_limit:.2f}",
         "reproduced" if chance_v.startswith("equivalent") else
         f"differs: {change_v} in the paired comparison, at most {f.chance_limit:.2f} in {f.n_near_chance} of "
         f"{f.n_seeds} seeds" if change_v == A_LOWER else "differs"),
        ("largest old-head logit change (`train_mode`)", f"up to {a['max_logit_change']:.0f}",
         f"{logit.mean():.1f} mean over seeds, at most {logit.max():.1f}",
         "reproduced, smaller" if 0 < logit.max() < a["max_logit_change"] else
         "reproduced" if logit.max() >= a["max_logit_change"] else "differs"),
        ("running statistics moved (`train_mode`, raw units)", f"up to {a['buffer_units']:g} units",
         f"running_mean up to {raw_mean:.1f}, running_var up to {raw_var:.0f}",
         "reproduced (they move; sizes depend on the data's scale)" if raw_mean > 0 else "differs"),
        ("task B, `train_mode` against the pinned modes (main run)",
         f"{a['task_b_tm']:.2f} against {a['task_b_pinned_low']:.2f} to {a['task_b_pinned_high']:.2f}",
         f"{piv['train_mode'].mean():.3f} against "
         f"{f'{pinned.min():.3f} (both)' if pinned.min() == pinned.max() else f'{pinned.min():.3f} to {pinned.max():.3f}'}; "
         f"difference: {main_v} (exploratory family)",
         "reproduced" if main_v == TRAIN_HIGHER else f"differs: {main_v}"),
        ("the two pinned modes on task B", f"{a['pinned_a']:.3f} against {a['pinned_b']:.3f} (\"run-to-run noise\")",
         f"equal in every seed: {v('c_pinned_equal_b')}",
         "identity of the code (the article's runs were not paired)" if ok("c_pinned_equal_b") else "differs"),
        ("`separate_stats`: task A logits unchanged, task B as `train_mode`", "exactly 0; 0.43 as `train_mode`",
         f"logits unchanged: {v('c_separate_exact')}; equal to `train_mode`: {v('c_separate_matches_b')}",
         "reproduced (checks)" if ok("c_separate_exact") and ok("c_separate_matches_b") else "differs"),
    ]
    return pd.DataFrame(rows, columns=["claim", "seed article", "this chapter", "status"])


@dataclass(frozen=True)
class ArticleCounts:
    """How many rows of :func:`seed_article_table` have each status: ``n`` rows, ``reproduced`` (status starting
    "reproduced" but not "reproduced, smaller"), ``smaller``, ``differs`` and ``identity``."""

    n: int
    reproduced: int
    smaller: int
    differs: int
    identity: int


def article_counts(table: pd.DataFrame) -> ArticleCounts:
    """:class:`ArticleCounts` of :func:`seed_article_table`'s ``status`` column."""
    st = table["status"]
    smaller = int(st.str.startswith("reproduced, smaller").sum())
    return ArticleCounts(n=len(table), reproduced=int(st.str.startswith("reproduced").sum()) - smaller, smaller=smaller,
                         differs=int(st.str.startswith("differs").sum()), identity=int(st.str.startswith("identity").sum()))


# --- the page's answer and the sentences its findings choose (issue 25: no typed outcome) ------------------------
#
# Every sentence of the page that states an outcome is built here from the findings, so that it is true for any
# data: numbers spliced into wording that holds whatever they are, or a whole sentence chosen by the verdicts.
# ``tests/test_freeze_modes.py`` flips each headline verdict on hand-made tables and checks that the text follows.

def _claim(claims: pd.DataFrame, key: str):
    """Row ``key`` of a claims table (``KeyError`` naming the keys if absent)."""
    row = claims[claims["key"] == key]
    if row.empty:
        raise KeyError(f"no claim {key!r}; claims: {list(claims['key'])}")
    return row.iloc[0]


def _bold(v: str) -> str:
    return f"**{v}**"


def _range(low: float, high: float, clip=(-1.0, 1.0), fmt: str = "+.3f") -> str:
    """``"low to high"`` cut to ``clip`` (what the quantity allows), ``"no interval"`` without ends."""
    iv = Interval(0.0, float(low), float(high), 2).clipped(*clip) if clip else Interval(0.0, float(low), float(high), 2)
    if math.isnan(iv.low) or math.isnan(iv.high):
        return "no interval"
    return f"{iv.low:{fmt}} to {iv.high:{fmt}}"


def _summary_mean(f: Findings, mode: str, metric: str) -> float:
    s = f.summary
    return float(s[(s["mode"] == mode) & (s["metric"] == metric)]["mean"].iloc[0])


def _kind(claims: pd.DataFrame, key: str) -> str:
    return str(_claim(claims, key)["kind"])


def weights_sentence(f: Findings, b: BufferFindings) -> str:
    """What switching off the gradients froze and what it did not: the weights' exact check and finding 2's
    buffer criteria for the most-moved layer (``shift_most`` / ``var_most``), chosen by their verdicts."""
    w = _claim(f.claims, "c_weights_unchanged")
    sh, va = _claim(b.claims, "shift_most"), _claim(b.claims, "var_most")
    stats = (f"the most-moved running mean shifts by {b.mean_shift.mean:.1f} of task A's standard deviations and the "
             f"most-changed running variance by a factor of {b.var_factor:.1f} (means over seeds; against the criteria "
             f"of {MEAN_SHIFT_SD:g} SD and a factor {VAR_FACTOR:g}: {_bold(sh['verdict'])} and {_bold(va['verdict'])})")
    moved = "higher" in (sh["kind"], va["kind"])
    if w["kind"] != "exact":
        return (f"Switching off the backbone's gradients did not keep every weight in this run (largest change "
                f"{w['estimate']:.3g}, {_bold(w['verdict'])}: a bug), and in `train_mode` {stats}.")
    if moved:
        return (f"Switching off the backbone's gradients does not freeze its BatchNorm layers: no weight moves "
                f"({_bold(w['verdict'])}), yet in `train_mode` {stats}.")
    return (f"Switching off the backbone's gradients keeps every weight ({_bold(w['verdict'])}), and in `train_mode` "
            f"the running statistics are not shown to move beyond the chapter's criteria: {stats}.")


def task_a_sentence(f: Findings) -> str:
    """What happens to the old task: ``train_mode``'s change (after - before) and its distance from chance,
    and whether the pinned modes and ``separate_stats`` keep task A exactly, chosen by the claims."""
    before, after = _summary_mean(f, "train_mode", "task_a_before"), _summary_mean(f, "train_mode", "task_a_after")
    ch_, ac = _claim(f.claims, "task_a_change"), _claim(f.claims, "task_a_chance")
    move = {"lower": "falls from", "higher": "rises from"}.get(ch_["kind"], "goes from")
    chance = (f"about chance ({f.chance:.2f}): {_bold(ac['verdict'])}" if ac["kind"] == "equivalent" else
              f"against chance ({f.chance:.2f}): {_bold(ac['verdict'])}")
    kept = [_claim(f.claims, k) for k in ("c_pinned_keep_a", "c_separate_exact")]
    both = all(k["kind"] == "exact" for k in kept)
    keep = ("the pinned modes and `separate_stats` keep task A exactly" if both
            else "the pinned modes and `separate_stats` do not keep task A exactly in this run (a bug)")
    checks = f"both {_bold(EXACT)}" if both else ", ".join(_bold(k["verdict"]) for k in kept)
    return (f"In `train_mode` the old head's task-A accuracy {move} {before:.3f} to {after:.3f} (after minus before: "
            f"{_bold(ch_['verdict'])}; {chance}), while {keep} ({checks}).")


def trained_heads_clause(o: OptimizerFindings) -> str:
    """The optimizer-trained heads' tests as counted (:func:`bnstudy.inference.count_verdicts`: Holm), a clause."""
    c = count_verdicts(o.explore_claims, ALPHA)
    n, k, j = c["m"], c["higher"], c["lower"]
    head = "a new head trained by an optimizer scores"
    if n and k == n:
        return f"{head} higher with drifting statistics than with pinned ones in all {n} tests"
    if n and j == n:
        return f"{head} lower with drifting statistics than with pinned ones in all {n} tests"
    if k or j:
        return (f"{head} higher with drifting statistics than with pinned ones in {k} of {n} tests"
                + (f" and lower in {j}" if j else ""))
    return f"no test of a new head trained by an optimizer shows a difference between drifting and pinned statistics ({n} tests)"


def reference_clause(o: OptimizerFindings) -> str:
    """The reference test (a logistic regression fitted to convergence), its verdict and what it means, chosen."""
    p = _claim(o.claims, "primary")
    head = (f"a logistic regression fitted to convergence on the same features finds {p['estimate']:+.3f} "
            f"({_range(p['low'], p['high'])}): {_bold(p['verdict'])}")
    return head + {
        "equivalent": ", so the pinned features allow a converged linear classifier as much as the drifting ones do",
        "higher": ", so the drifting features allow more even to a converged linear classifier",
        "lower": ", so the pinned features allow more to a converged linear classifier",
    }.get(p["kind"], ", so what the two kinds of features allow is not decided with these seeds")


def task_b_sentence(o: OptimizerFindings) -> str:
    """Task B: the trained heads' count and the reference test, in one sentence, with the reading of the two
    together chosen by both (the difference lies in how easily a trained head uses the features only when the
    trained heads show one and the reference finds the features equivalent)."""
    c = count_verdicts(o.explore_claims, ALPHA)
    tail = ("; the difference lies in how easily a trained head uses the features, not in what they allow"
            if (c["higher"] or c["lower"]) and _kind(o.claims, "primary") == "equivalent" else "")
    return f"On task B, {trained_heads_clause(o)}; {reference_clause(o)}{tail}."


def separate_sentence(f: Findings) -> str:
    """``separate_stats``: its two exact checks (task B as ``train_mode``, task A's logits unchanged), chosen."""
    m, e = _claim(f.claims, "c_separate_matches_b"), _claim(f.claims, "c_separate_exact")
    if m["kind"] == "exact" and e["kind"] == "exact":
        return ("`separate_stats`, which gives task B its own copy of the statistics, has both: `train_mode`'s "
                f"task-B accuracy ({_bold(m['verdict'])}) and task A's logits unchanged ({_bold(e['verdict'])}).")
    return (f"`separate_stats` does not reproduce `train_mode` on task B ({_bold(m['verdict'])}) or does not keep task "
            f"A's logits ({_bold(e['verdict'])}) in this run: a bug.")


def answer(f: Findings, o: OptimizerFindings, b: BufferFindings) -> str:
    """The answer box's outcome sentences (Markdown, glued as ``ch01_answer``): what switching off the gradients
    freezes, what happens to task A, what pinning does to task B, and what ``separate_stats`` gives; every
    outcome chosen by the findings."""
    return " ".join([weights_sentence(f, b), task_a_sentence(f), task_b_sentence(o), separate_sentence(f)])


def readings(f: Findings, o: OptimizerFindings, b: BufferFindings, t: TuningFindings | None = None) -> dict:
    """The page's other findings-chosen sentences, ``{key: Markdown}`` (glued as ``ch01_say_<key>``):

    ``weights`` (every weight unchanged, or not), ``deeper`` (the deeper blocks' largest mean shift against block
    1's), ``seeds`` (in how many seeds ``train_mode`` lost task A), ``logits`` (the other modes' largest
    old-logit change), ``trained`` (the trained heads' count), ``reference`` (the reference test's clause),
    ``budget`` (how many chosen heads are still shown to gain between the last two checkpoints; ``budget_caption``
    the same as a sentence), ``seeds_caption`` (:func:`task_a_sentence`), ``task_b`` (:func:`task_b_sentence`)."""
    w = _claim(f.claims, "c_weights_unchanged")
    out = {"weights": ("No weight changed in any mode" if w["kind"] == "exact" else
                       f"Some weight changed although gradients were off (largest {w['estimate']:.3g})")
           + f" ({_bold(w['verdict'])}, a check of the code, below)."}
    by = b.mean_shift_by_layer
    first, rest = (float(by.iloc[0]), by.iloc[1:]) if len(by) else (math.nan, by)
    out["deeper"] = (f"The deeper blocks' largest mean shift is {float(rest.max()) / first:.0%} of block 1's."
                     if len(rest) and first > 0 else "")
    lost = int((f.task_a_change < 0).sum())
    kept = all(_kind(f.claims, k) == "exact" for k in ("c_pinned_keep_a", "c_separate_exact"))
    out["seeds"] = ((f"in the two pinned modes and in `separate_stats` task A is exactly where it started "
                     f"({_bold(EXACT)}), while " if kept else
                     "in the pinned modes or `separate_stats` task A is not exactly where it started (a bug), and ")
                    + f"`train_mode` is lower after stage 2 than before in {lost} of {f.n_seeds} seeds")
    out["seeds_caption"] = task_a_sentence(f)
    others = [m for m in MODE_NAMES if m != "train_mode"]
    worst = max(_summary_mean(f, m, "max_old_logit_change") for m in others)
    out["logits"] = ("in the other three modes every old-head logit is unchanged (largest change exactly 0)"
                     if worst == 0 else f"in the other three modes the largest old-head logit change is {worst:.3g} "
                                        "on average over seeds")
    out["trained"] = trained_heads_clause(o)
    out["reference"] = reference_clause(o)
    g = o.gain_claims
    gaining = int((g["kind"] == "higher").sum()) if len(g) else 0
    out["budget"] = (f"{gaining} of {len(g)} chosen heads are still shown to gain between the last two checkpoints"
                     if len(g) else "no head was trained at two checkpoints")
    out["budget_caption"] = out["budget"][0].upper() + out["budget"][1:] + "."
    out["task_b"] = task_b_sentence(o)
    return out


def drift_sentence(n_inside: int, n_intervals: int, n_expected_misses: float) -> str:
    """The drift figure's takeaway (:class:`DriftCheckFindings`' counts): how many per-block, per-step 95% intervals
    contain the moving average's prediction ``(1 - m)^t``, against the misses expected by chance."""
    if not n_intervals:
        return "No recorded step was compared with the prediction."
    return (f"{n_inside} of {n_intervals} per-block, per-step 95% intervals contain the prediction (about "
            f"{n_expected_misses:.1f} misses expected by chance).")
