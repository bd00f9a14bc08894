"""Chapter 1, what is claimed: per part of the page a claims table (``*_claims``, column ``family``) and a numbers
table (``*_findings``); :func:`chapter` joins them, keys prefixed by part (``opt_primary``), for the notes
(:data:`NOTES`) and :func:`glue_page`. One sign everywhere, *condition minus reference*: ``train_mode -
backbone_eval``, on the head sweep's paths ``batch_stats - pinned``."""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
from scipy import special as spx

from ...report import p_text  # chapter 1's p-values print as the other pages' do
from ...inference import EXACT, TOO_FEW, Family, Interval, Question, _slug, ask, claims_table, count_verdicts, \
    decide, number, numbers_table, one_sided_p, paired_differences, t_interval
from ...config import check_float
from ...modes import MODE_NAMES
from ...words import Note, claim, claim_text, join, verdict_md
from .run import DRIFT_TARGET_BATCHES, ENGINE_TARGET_BATCHES, FLOOR_WEIGHT, PATHS, PROFILES, REF_VARIANTS, \
    STD_SUFFIX, floor_steps

#: The weight left on the old running statistics that counts as "gone" in the prose.
GONE = 1e-3
METRICS = ("task_a_before", "task_a_after", "task_b", "max_param_change", "max_buffer_change",
           "max_old_logit_change")
ACCURACIES = METRICS[:3]
#: Finding 2's "about chance": task A after ``train_mode`` within ``(CHANCE_FACTOR - 1) * chance`` of chance (an
#: equivalence margin; the factor was set by trial while the project was built).
CHANCE_FACTOR = 1.5
#: Finding 3's primary test (fixed in revision, before the full profile ran): the reference's gap at ``Config.steps``,
#: reported and confirmation seeds pooled, against +-PRIMARY_MARGIN.
PRIMARY_MARGIN = 0.03
ALPHA = 0.05
#: Finding 2's buffer criteria (fixed in revision): a running_mean moves by more than MEAN_SHIFT_SD of task A's
#: running SDs, a running_var by more than a factor VAR_FACTOR either way.
MEAN_SHIFT_SD, VAR_FACTOR = 1.0, 2.0
#: The primary test's seeds the quick profile had shown before its margin was fixed; the others are confirmatory.
QUICK_SEEN_SEEDS = (*range(PROFILES["quick"]["seeds"]), *PROFILES["quick"]["confirm_seeds"])
PINNED, POOLED = ("backbone_eval", "all_eval"), ("report", "confirm")

#: Direction words (higher, lower) per quantity: train_mode - backbone_eval; task A after train_mode - chance; task A
#: after - before; accuracy at the last checkpoint - the one before; gap at the last checkpoint - at the first; plain
#: heads' gap - standardized heads'; a running mean's largest shift - MEAN_SHIFT_SD; a variance's |log ratio| - log 2.
TRAIN_HIGHER, TRAIN_LOWER = TRAIN_WORDS = ("train mode higher", "train mode lower")
ABOVE_CHANCE, BELOW_CHANCE = CHANCE_WORDS = ("above chance", "below chance")
A_HIGHER, A_LOWER = A_WORDS = ("task A higher after", "task A lower after")
LAST_HIGHER, LAST_LOWER = LAST_WORDS = ("higher at the last checkpoint", "lower at the last checkpoint")
GAP_LARGER, GAP_SMALLER = GAP_WORDS = ("gap larger at more steps", "gap smaller at more steps")
STD_SMALLER, STD_LARGER = STD_WORDS = ("smaller with standardized features", "larger with standardized features")
SEED_LARGER, SEED_SMALLER = SEED_WORDS = ("larger on the seed's protocol", "smaller on the seed's protocol")
SHIFT_ABOVE, SHIFT_BELOW = SHIFT_WORDS = (f"above {MEAN_SHIFT_SD:g} SD", f"below {MEAN_SHIFT_SD:g} SD")
VAR_ABOVE, VAR_BELOW = VAR_WORDS = (f"above a factor {VAR_FACTOR:g}", f"below a factor {VAR_FACTOR:g}")
#: Every direction word this chapter's verdicts use (:func:`bnstudy.study.inference.is_verdict`'s ``directions``).
DIRECTIONS: tuple[str, ...] = (*TRAIN_WORDS, *CHANCE_WORDS, *A_WORDS, *LAST_WORDS, *GAP_WORDS, *STD_WORDS,
                               *SHIFT_WORDS, *VAR_WORDS, *SEED_WORDS)
TRAIN = "train mode"  # ask's words for a gap batch_stats - pinned: "train mode higher" / "train mode lower"


def steps_until(momentum: float, weight: float = GONE) -> int:
    """The first step ``t`` at which ``(1 - momentum) ** t`` falls below ``weight``. Raises ``ValueError`` unless
    ``0 < momentum <= 1`` and ``0 < weight < 1``."""
    check_float("momentum", momentum, 0.0, 1.0, low_open=True)
    check_float("weight", weight, 0.0, 1.0, low_open=True)
    return 1 if momentum == 1.0 else math.floor(math.log(weight) / math.log(1 - momentum)) + 1


def _decided(family: str, comparisons) -> pd.DataFrame:
    """A family's claims from ``[(key, per-seed values, (higher, lower) words, margin or None)]``: comparisons with
    their own direction words, which :func:`bnstudy.study.inference.ask` cannot say."""
    fam = Family(max(len(comparisons), 1))
    return claims_table([decide(v, k, margin=m, family=fam, higher=w[0], lower=w[1]) for k, v, w, m in comparisons],
                        family=family)


def family(claims: pd.DataFrame, name: str) -> pd.DataFrame:
    """The rows of one family of a claims table."""
    return claims[claims["family"] == name]


def _series(s: pd.Series) -> dict:
    out = dict(s.items())
    if len(s) and pd.api.types.is_numeric_dtype(s):
        out.update(min=float(s.min()), max=float(s.max()))
    return out


def _bands(name: str, ivs: dict) -> dict:
    """``{key: Interval}`` as the series ``<name>``, ``<name>_low`` and ``<name>_high`` (each with min, max)."""
    return {f"{name}{a}": _series(pd.Series({k: getattr(iv, s) for k, iv in ivs.items()}, dtype=float))
            for a, s in (("", "mean"), ("_low", "low"), ("_high", "high"))}


_SHOWN = ["n", "mean", "ci_low", "ci_high", "confidence", "p", "p_holm", "verdict"]


def _with_claims(rows: list[dict], claims: pd.DataFrame, cols: list, with_claims: bool):
    """A display table: ``rows`` (dicts with a ``key``) with their claims' :data:`_SHOWN` columns, columns ``cols``;
    ``with_claims``: ``(table, claims)``."""
    c = claims.set_index("key").reindex([r["key"] for r in rows])
    out = pd.DataFrame(rows)
    for col, src in zip(_SHOWN, ("n", "estimate", "low", "high", "confidence", "p", "p_adjusted", "verdict")):
        out[col] = c[src].to_numpy() if len(c) else []
    return (out.reindex(columns=cols), claims) if with_claims else out.reindex(columns=cols)


def bounded_interval(values, n_eval: int | None = None, confidence: float = 0.95, logit_centre: bool = False) -> Interval:
    """Mean of accuracies ``values`` with a Student-t interval on the logit scale (values clipped to ``0.5 / n_eval``
    from 0 and 1, default ``n_eval`` 1000), so it stays inside (0, 1); with ``logit_centre`` the mean is ``expit`` of
    the mean logit. Raises ``ValueError`` for an empty input or values outside [0, 1]."""
    v = np.asarray(values, dtype=float)
    if v.size == 0 or (v < 0).any() or (v > 1).any():
        raise ValueError(f"bounded_interval needs accuracies in [0, 1], got {v.tolist()}")
    eps = 0.5 / (n_eval or 1000)
    iv = t_interval(spx.logit(np.clip(v, eps, 1 - eps)), confidence)
    centre = float(spx.expit(iv.mean)) if logit_centre else float(v.mean())
    return Interval(centre, float(spx.expit(iv.low)), float(spx.expit(iv.high)), int(v.size))


def _mode_intervals(df: pd.DataFrame, logit_centre: bool = False) -> dict:
    n_eval = int(df["n_eval"].iloc[0]) if "n_eval" in df.columns else None
    return {c: {m: bounded_interval(g[c], n_eval, logit_centre=logit_centre) if c in ACCURACIES else t_interval(g[c])
                for m, g in df.groupby("mode", sort=False)} for c in METRICS}


def accuracy_summary(df: pd.DataFrame, logit_centre: bool = False) -> pd.DataFrame:
    """:data:`METRICS` per mode (:func:`_mode_intervals`) as a long table ``mode, metric, mean, ci_low, ci_high,
    n_seeds``."""
    return pd.DataFrame([dict(mode=m, metric=c, mean=iv.mean, ci_low=iv.low, ci_high=iv.high, n_seeds=iv.n)
                         for c, by in _mode_intervals(df, logit_centre).items() for m, iv in by.items()])


# --- the main run: finding 2's claims, the checks of the code, the numbers ----------------------------------------

#: The identities of the code (exact checks), on every seed of the main run: every weight unchanged, the pinned modes'
#: task A after == before, ``separate_stats``' old logits unchanged and its task B == ``train_mode``'s, ``all_eval``
#: == ``backbone_eval`` on task B.
CHECKS = (
    Question("c_weights_unchanged", value="max_param_change", table="rows", exact=0.0),
    Question("c_pinned_keep_a", value="task_a_kept", at=dict(mode=PINNED), table="rows", exact=0.0),
    Question("c_separate_exact", value="max_old_logit_change", at=dict(mode="separate_stats"), table="rows",
             exact=0.0),
    Question("c_separate_matches_b", "separate_stats", "train_mode", value="task_b", by="mode", table="rows",
             exact=0.0),
    Question("c_pinned_equal_b", "all_eval", "backbone_eval", value="task_b", by="mode", table="rows", exact=0.0),
)


def _main_parts(df: pd.DataFrame):
    missing = set(MODE_NAMES) - set(df["mode"])
    if missing:
        raise ValueError(f"findings needs all four modes; missing {sorted(missing)}")
    chance = 1 / int(df["n_classes"].iloc[0])
    piv = {c: df.pivot(index="seed", columns="mode", values=c) for c in ("task_a_after", "task_a_before")}
    after = piv["task_a_after"]["train_mode"]
    return chance, CHANCE_FACTOR * chance, after, after - piv["task_a_before"]["train_mode"]


def claims(df: pd.DataFrame) -> pd.DataFrame:
    """The main run's claims (all four modes needed, else ``ValueError``): family ``f2`` (``task_a_chance``, task A
    after ``train_mode`` minus chance; ``task_a_change``, after - before), then :data:`CHECKS` (family ``checks``)."""
    chance, limit, after, change = _main_parts(df)
    return pd.concat([
        _decided("f2", [("task_a_chance", after - chance, CHANCE_WORDS, limit - chance),
                        ("task_a_change", change, A_WORDS, None)]),
        ask(dict(rows=df.assign(task_a_kept=df["task_a_after"] - df["task_a_before"])), CHECKS, ALPHA, family="checks"),
    ], ignore_index=True)


def findings(df: pd.DataFrame) -> pd.DataFrame:
    """The main run's numbers (all four modes needed, else ``ValueError``): ``<metric>_<mode>``, task A after
    ``train_mode`` per seed and its change, their summaries, and task B ``train_mode - backbone_eval`` (``gap_b``)."""
    chance, limit, after, change = _main_parts(df)
    m = float(df["momentum"].iloc[0])
    n_eval = int(df["n_eval"].iloc[0]) if "n_eval" in df.columns else None
    gap_b = t_interval(paired_differences(df, "task_b", "mode", "train_mode", "backbone_eval"))
    seed = lambda v: f"seed{v}"  # noqa: E731
    return numbers_table(dict(
        n_seeds=int(df["seed"].nunique()), chance=chance, chance_limit=limit, chance_margin=limit - chance,
        f2_m=Family(2).m, momentum=m, steps_gone=steps_until(m), **_mode_intervals(df),
        task_a_after_tm=_series(after.rename(seed)), task_a_after_tm_median=float(after.median()),
        task_a_after_tm_ci=bounded_interval(after, n_eval), task_a_change=_series(change.rename(seed)),
        n_task_a_lower=int((change < 0).sum()),
        n_near_chance=int((after <= limit).sum()), task_a_above_chance_p=one_sided_p(after, "greater", null=chance),
        task_a_after_tm_logit_centre=bounded_interval(after, n_eval, logit_centre=True).mean,
        gap_b={"backbone_eval": gap_b}, gap_b_confidence=gap_b.confidence,
    ), bounds=lambda key: (-math.inf, math.inf) if key in METRICS else (-1, 1))


# --- the drift figure: the weight left on task A's running_mean against (1 - m)^t ----------------------------------

def noise_floor(drift: pd.DataFrame, momentum: float, steps: int) -> pd.Series:
    """Per layer, the RMS of the measured weight at recorded steps where ``(1 - m)^t`` is below 1e-4 (the moving
    average's own noise). Raises ``ValueError`` if no recorded step up to ``steps`` has one."""
    fs = floor_steps(momentum, steps)
    if not fs:
        raise ValueError(f"no recorded step up to steps={steps} has (1 - momentum)^t < {FLOOR_WEIGHT}")
    return drift[drift.step.isin(fs)].groupby("layer")["weight"].apply(lambda v: float(np.sqrt(np.mean(v ** 2))))


def drift_findings(drift: pd.DataFrame, momentum: float, steps: int) -> pd.DataFrame:
    """The drift figure's numbers (raises as :func:`noise_floor`): ``floor_<layer>``; ``last_step``, the last
    recorded step whose prediction is above every floor; the weights at step 12 and there against ``(1 - m)^t``."""
    floor = noise_floor(drift, momentum, steps)
    fs = floor_steps(momentum, steps)
    last = max(s for s in sorted(drift.step.unique()) if (1 - momentum) ** s > floor.max())
    at = lambda t, name: _bands(name, {layer: t_interval(g["weight"])  # noqa: E731
                                       for layer, g in drift[drift.step == t].groupby("layer")})
    w12 = at(12, "weight_12")
    return numbers_table(dict(
        floor=_series(floor), floor_first_step=min(fs), floor_last_step=max(fs), **w12, theory_12=(1 - momentum) ** 12,
        last_step=int(last), theory_last=(1 - momentum) ** last, **at(last, "weight_last"),
        excess_12=_series(pd.Series({k: v for k, v in w12["weight_12"].items() if k not in ("min", "max")})
                          - (1 - momentum) ** 12)))


# --- the head sweep's analysis: chosen learning rates, paired gaps, finding 3's tests (issue 10) -------------------

def _tuning_rows(sweep: pd.DataFrame) -> pd.DataFrame:
    return sweep[(sweep["role"] == "tune") & (sweep["split"] == "validation") & (sweep["optimizer"] != "reference")]


def gap_table(chosen: pd.DataFrame, step: int) -> pd.DataFrame:
    """Paired gaps ``seed, role, optimizer, gap`` (``batch_stats - pinned``) at ``step``, the reference at its own."""
    recs = []
    for (role, o), g in chosen.groupby(["role", "optimizer"]):
        st = step if o != "reference" else g["step"].min()
        piv = g[g["step"] == st].pivot(index="seed", columns="path", values="accuracy")
        recs += [dict(seed=s, role=role, optimizer=o, gap=float(v)) for s, v in (piv["batch_stats"] - piv["pinned"]).items()]
    return pd.DataFrame(recs, columns=["seed", "role", "optimizer", "gap"])


def choose_lrs(sweep: pd.DataFrame, step: int) -> dict:
    """Learning rate per ``(optimizer, path)``: the best mean *validation* accuracy over the tuning seeds at ``step``
    (never a test set, never a reported seed; ties to the smaller rate). Raises ``ValueError`` if there are none."""
    t = _tuning_rows(sweep)
    t = t[t["step"] == step]
    if t.empty:
        raise ValueError(f"choose_lrs: no tuning-seed validation rows at step {step}")
    mean = t.groupby(["optimizer", "path", "lr"])["accuracy"].mean().reset_index()
    mean = mean.sort_values(["optimizer", "path", "accuracy", "lr"], ascending=[True, True, False, True])
    return {(o, p): float(g["lr"].iloc[0]) for (o, p), g in mean.groupby(["optimizer", "path"])}


def chosen_table(sweep: pd.DataFrame, lrs: dict) -> pd.DataFrame:
    """Test-set rows of the chosen heads and the primary reference fit, reported and confirmation seeds."""
    (l2, n), ref = REF_VARIANTS[0], sweep["optimizer"] == "reference"
    t = sweep[~ref | ((sweep["l2"] == l2) & (sweep["n_fit"] == n))] if "l2" in sweep.columns else sweep
    t = t[(t["split"] == "test") & (t["role"] != "tune")]
    keep = t.apply(lambda r: r["optimizer"] == "reference" or lrs.get((r["optimizer"], r["path"])) == r["lr"], axis=1)
    return t[keep].drop(columns=[c for c in ("split", "l2", "n_fit") if c in t.columns]).reset_index(drop=True)


def lr_table(sweep: pd.DataFrame, step: int | None = None) -> pd.DataFrame:
    """What was tried: validation accuracy per tuning seed (at ``step``, or at every checkpoint)."""
    t = _tuning_rows(sweep)
    t = t if step is None else t[t["step"] == step]
    return t[["seed", "path", "optimizer", "lr", "step", "accuracy"]].reset_index(drop=True)


def lr_choice_table(sweep: pd.DataFrame) -> pd.DataFrame:
    """The rate :func:`choose_lrs` picks at each checkpoint and its ``position`` in the grid."""
    t = _tuning_rows(sweep)
    grid = t.groupby("optimizer")["lr"].agg(["min", "max"])
    recs = [dict(optimizer=o, path=p, step=int(step), lr=lr, position="lowest" if lr == grid.loc[o, "min"] else
                 "highest" if lr == grid.loc[o, "max"] else "interior")
            for step in sorted(t["step"].unique()) for (o, p), lr in choose_lrs(sweep, step).items()]
    return pd.DataFrame(recs, columns=["optimizer", "path", "step", "lr", "position"])


def _path_gap(t: pd.DataFrame, optimizer: str, roles, step: int) -> pd.Series:
    s = t[(t["optimizer"] == optimizer) & (t["role"].isin(roles)) & (t["step"] == step)]
    piv = s.pivot(index="seed", columns="path", values="accuracy")
    return piv["batch_stats"] - piv["pinned"]


def _chosen(sweep: pd.DataFrame, main_step: int, optimizers=None):
    """The checkpoints (``ValueError`` unless ``main_step`` is one of >= 2), the rates chosen at ``main_step``, the
    chosen heads' table and the plain optimizers run on both paths."""
    rows = sweep[sweep["optimizer"].isin(optimizers)] if optimizers else sweep[sweep["optimizer"] != "reference"]
    steps = sorted(rows["step"].unique())
    if main_step not in steps or len(steps) < 2:
        raise ValueError(f"main_step must be among >= 2 checkpoints, got {main_step} in {steps}")
    lrs = choose_lrs(sweep, main_step)
    return steps, lrs, chosen_table(sweep, lrs), [o for o in ("sgd", "adam") if (o, "pinned") in lrs]


#: Finding 3's exploratory tests, one family: the main run's ``train_mode - backbone_eval`` (table ``main``, when
#: given), then per optimizer and checkpoint the pooled seeds' gap.
EXPLORE = (
    Question("explore_main", "train_mode", "backbone_eval", value="task_b", by="mode", table="main", words=TRAIN),
    Question("explore_{optimizer}_{step}", "batch_stats", "pinned", by="path", each=("optimizer", "step"),
             at=dict(role=POOLED), table="chosen", words=TRAIN),
)
#: The reference test on the pooled seeds (``primary``, pre-specified) and on those the quick profile had not shown
#: (``unseen``), each a family of one; its sensitivity fits, one family (``sens_l2_<l2>_n<n_fit>``).
PRIMARY = Question("primary", "batch_stats", "pinned", by="path", table="reference", margin=PRIMARY_MARGIN, words=TRAIN)
UNSEEN = Question("unseen", "batch_stats", "pinned", by="path", table="unseen", margin=PRIMARY_MARGIN, words=TRAIN)
SENSITIVITY = Question("sens_{fit}", "batch_stats", "pinned", by="path", each=("fit",), table="fits",
                       margin=PRIMARY_MARGIN, words=TRAIN)


def exploratory_tests(sweep: pd.DataFrame, main_step: int, main: pd.DataFrame | None = None,
                      with_claims: bool = False):
    """Finding 3's exploratory tests, one family (:data:`EXPLORE`; rates chosen at ``main_step``), as a table
    (``with_claims``: ``(table, claims table)``)."""
    _, lrs, t, opts = _chosen(sweep, main_step)
    rows = [] if main is None else [dict(key="explore_main", test="main", optimizer=str(main["optimizer"].iloc[0]),
                                         lr=float(main["lr"].iloc[0]),
                                         step=int(main["steps"].iloc[0]) if "steps" in main.columns else main_step)]
    for o in opts:
        lr = lrs[(o, "pinned")] if lrs[(o, "pinned")] == lrs[(o, "batch_stats")] else math.nan
        rows += [dict(key=f"explore_{o}_{int(s)}", test=f"{o}_{int(s)}", optimizer=o, lr=lr, step=int(s))
                 for s in sorted(t[t["optimizer"] == o]["step"].unique())]
    claims = ask(dict(main=main, chosen=t[t["optimizer"].isin(opts)]), EXPLORE if main is not None else EXPLORE[1:],
                 ALPHA, family="explore")
    return _with_claims(rows, claims, ["test", "optimizer", "lr", "step", *_SHOWN], with_claims)


def reference_sensitivity(sweep: pd.DataFrame, with_claims: bool = False):
    """The reference gap for every ``(l2, n_fit)`` fit, one family (:data:`SENSITIVITY`), as a table
    (``with_claims``: ``(table, claims table)``)."""
    t = sweep[(sweep["optimizer"] == "reference") & (sweep["split"] == "test") & sweep["role"].isin(POOLED)]
    t = t.assign(fit=[f"l2_{l2:.0e}_n{int(n)}".replace("-", "_") for l2, n in zip(t["l2"], t["n_fit"])])
    rows = []
    for (l2, n, fit), g in t.groupby(["l2", "n_fit", "fit"], sort=False):
        piv = g.pivot(index="seed", columns="path", values="accuracy")
        rows.append(dict(key=f"sens_{fit}", l2=float(l2), n_fit=int(n),
                         acc_batch_stats=float(piv["batch_stats"].mean()), acc_pinned=float(piv["pinned"].mean())))
    claims = ask(dict(fits=t), [SENSITIVITY], ALPHA, family="sens")
    return _with_claims(rows, claims, ["key", "l2", "n_fit", "n", "acc_batch_stats", "acc_pinned", *_SHOWN[1:]],
                        with_claims)


def _reference(sweep: pd.DataFrame, main_step: int):
    steps, lrs, t, _ = _chosen(sweep, main_step)
    ref = t[t["optimizer"] == "reference"]
    if ref.empty:
        raise ValueError("optimizer_findings needs the primary reference's rows (optimizer='reference')")
    ref_step = int(ref["step"].min())
    return steps, lrs, t, ref_step, ref[ref["role"].isin(POOLED) & (ref["step"] == ref_step)]


#: Fig. 1.5's columns and the claims (keys of the page's claims table) whose intervals and verdicts it draws.
GAP_FIGURE_CLAIMS = {"sgd": "opt_explore_at_main_sgd", "adam": "opt_explore_at_main_adam", "sgd-std": "tune_std_sgd",
                     "adam-std": "tune_std_adam", "reference": "opt_primary"}


def gap_figure_claims(claims: pd.DataFrame) -> dict:
    """``{column: claim row}`` of :data:`GAP_FIGURE_CLAIMS` found in ``claims``."""
    keys = set(claims["key"])
    return {o: claims[claims["key"] == k].iloc[0] for o, k in GAP_FIGURE_CLAIMS.items() if k in keys}


def optimizer_claims(sweep: pd.DataFrame, main_step: int, main: pd.DataFrame | None = None,
                     seen_seeds=QUICK_SEEN_SEEDS) -> pd.DataFrame:
    """Finding 3's claims: families ``primary``, ``unseen`` (on the seeds not in ``seen_seeds``), ``explore``,
    ``sens``, ``gain`` (from the second-to-last to the last checkpoint), ``explore_at_main`` and ``vs_seed``. Raises
    ``ValueError`` if ``main_step`` is not one of >= 2 checkpoints or the sweep has no primary reference rows."""
    steps, lrs, t, _, ref = _reference(sweep, main_step)
    _, explore = exploratory_tests(sweep, main_step, main, with_claims=True)
    pooled = t[t["role"].isin(POOLED)]
    gains = []
    for o in [o for o in ("sgd", "adam") if (o, "pinned") in lrs]:
        for p in PATHS:
            piv = pooled[(pooled["optimizer"] == o) & (pooled["path"] == p)].pivot(index="seed", columns="step",
                                                                                 values="accuracy")
            gains.append((f"gain_{o}_{p}", piv[steps[-1]] - piv[steps[-2]], LAST_WORDS, None))
    at_main = explore[explore["key"].str.fullmatch(rf"explore_(sgd|adam)_{main_step}")].assign(
        family="explore_at_main", key=lambda c: c["key"].str.replace(f"_{main_step}", "", regex=False).str.replace(
            "explore_", "explore_at_main_", regex=False))
    return pd.concat([
        ask(dict(reference=ref), [PRIMARY], ALPHA, family="primary"),
        ask(dict(unseen=ref[~ref["seed"].isin(list(seen_seeds))]), [UNSEEN], ALPHA, family="unseen"),
        explore, reference_sensitivity(sweep, with_claims=True)[1], _decided("gain", gains), at_main,
        _seed_minus_controlled(t, main, main_step)],
        ignore_index=True)


def _seed_minus_controlled(chosen: pd.DataFrame, main: pd.DataFrame | None, main_step: int) -> pd.DataFrame:
    """Family ``vs_seed`` (issue 35): the main run's gap (one rate) minus its optimizer's controlled gap at
    ``main_step`` (each path at its own rate), paired on the seeds both ran; empty where either is missing."""
    o = None if main is None else str(main["optimizer"].iloc[0])
    ctl = chosen[(chosen["optimizer"] == o) & (chosen["step"] == main_step) & chosen["role"].isin(POOLED)]
    if main is None or ctl.empty:
        return claims_table([], family="vs_seed")
    m = main.pivot(index="seed", columns="mode", values="task_b")
    c = ctl.pivot(index="seed", columns="path", values="accuracy")
    d = ((m["train_mode"] - m["backbone_eval"]) - (c["batch_stats"] - c["pinned"])).dropna()
    return _decided("vs_seed", [("seed_minus_controlled", d, SEED_WORDS, None)])


def explore_label(keys, main_step: int) -> str:
    """What the exploratory tests of ``keys`` are, in words (issue 35: a count over them is never unlabelled): how
    many on the seed's protocol, at ``main_step`` (rates tuned there) and at other budgets."""
    steps = [int(m.group(1)) for k in keys if (m := re.search(r"explore_(?:sgd|adam)_(\d+)$", str(k)))]
    n_seed = sum(bool(re.search(r"(^|_)explore_main$", str(k))) for k in keys)
    n_at, n_other = sum(s == main_step for s in steps), sum(s != main_step for s in steps)
    parts = ([f"{n_seed} on the seed's protocol, one rate not tuned per path"] if n_seed else []) + (
        [f"{n_at} after {main_step:,} steps, each path at its own tuned rate"] if n_at else []) + (
        [f"{n_other} at rates chosen for {main_step:,} steps and used at other budgets"] if n_other else [])
    return "; ".join(parts)


def optimizer_findings(sweep: pd.DataFrame, main_step: int, reference_grads=None, main: pd.DataFrame | None = None,
                       seen_seeds=QUICK_SEEN_SEEDS, claims: pd.DataFrame | None = None) -> pd.DataFrame:
    """Finding 3's numbers (``claims``: :func:`optimizer_claims`, if computed): the reference gap, the exploratory
    tests' counts (printed verdicts), the chosen rates, accuracies, the sensitivity fits' agreement,
    ``reference_converged`` and ``engine_check`` (largest |sweep - main run| on task B; NaN without ``main``)."""
    claims = optimizer_claims(sweep, main_step, main, seen_seeds) if claims is None else claims
    steps, lrs, t, ref_step, _ = _reference(sweep, main_step)
    g = _path_gap(t, "reference", POOLED, ref_step)
    refs = t[t["optimizer"] == "reference"]["role"]
    sets = {role: _path_gap(t, "reference", (role,), ref_step) for role in POOLED if (refs == role).any()}
    opts = [o for o in ("sgd", "adam") if (o, "pinned") in lrs]
    pooled = t[t["role"].isin(POOLED)]
    acc = {f"{o}_{p}": float(pooled[(pooled["optimizer"] == o) & (pooled["path"] == p) & (
        pooled["step"] == (ref_step if o == "reference" else main_step))]["accuracy"].mean())
        for o in opts + ["reference"] for p in PATHS}
    choice = lr_choice_table(sweep)
    at_main = choice[choice["step"] == main_step].set_index(["optimizer", "path"])
    sens = reference_sensitivity(sweep)
    primary = claim(claims, "primary")
    check = math.nan
    if main is not None:
        o, lr = str(main["optimizer"].iloc[0]), float(main["lr"].iloc[0])
        s = sweep[(sweep["role"] == "report") & (sweep["split"] == "test") & (sweep["step"] == main_step)
                  & (sweep["optimizer"] == o) & (sweep["lr"] == lr)]
        diffs = [abs(float(r["accuracy"]) - float(main[(main["seed"] == r["seed"]) & (main["mode"] == m)]["task_b"].iloc[0]))
                 for _, r in s.iterrows() for m in PATHS[r["path"]] if r["seed"] in set(main["seed"])]
        check = max(diffs) if diffs else math.nan
    u = g[~g.index.isin(list(seen_seeds))]
    explore, gain = family(claims, "explore"), family(claims, "gain")
    counts = count_verdicts(explore, ALPHA)  # the book's one counts rule: the printed verdicts
    n, k, j = counts["m"], counts["higher"], counts["lower"]
    said = (f"train mode higher in all {n} tests" if n and k == n else f"train mode lower in all {n} tests"
            if n and j == n else f"train mode higher in {k} of {n} tests" + (f", lower in {j}" if j else ""))
    label = explore_label(explore["key"], main_step)
    tuned = explore[explore["key"] != "explore_main"]["estimate"]
    first = lambda c: float(c["confidence"].iloc[0]) if len(c) else math.nan  # noqa: E731
    return numbers_table(dict(
        main_step=int(main_step), last_step=int(steps[-1]), prev_step=int(steps[-2]), margin=PRIMARY_MARGIN,
        primary=t_interval(g), primary_ci90=t_interval(g, 1 - 2 * ALPHA), ref_sets={r: t_interval(v) for r, v in sets.items()},
        ref_sets_kind={r: f"95% interval over {len(v)} seeds" for r, v in sets.items()},
        n_explore=len(explore), n_explore_resolved=int(counts["higher"] + counts["lower"]),
        explore_confidence=first(explore), lr={f"{o}_{p}": v for (o, p), v in lrs.items()},
        lr_position={f"{o}_{p}": str(r["position"]) for (o, p), r in at_main.iterrows()},
        lr_changes={f"{o}_{p}": "yes" if c["lr"].nunique() > 1 else "no"
                    for (o, p), c in choice.groupby(["optimizer", "path"])},
        acc=acc, gain_confidence=Family(max(len(gain), 1)).confidence,
        sens_min=float(sens["mean"].min()), sens_max=float(sens["mean"].max()), sens_n=len(sens),
        sens_n_agree=int((sens["verdict"] == primary.verdict).sum()),
        sens_dissent="; ".join(f"L2 {r['l2']:.0e} with {int(r['n_fit']):,} samples: {r['verdict']}"
                               for _, r in sens.iterrows() if r["verdict"] != primary.verdict) or "none",
        sens_confidence=first(sens), primary_p_tost_text=p_text(primary.p_equivalence), seen_n=int(len(g) - len(u)),
        unseen_ci90=t_interval(u, 1 - 2 * ALPHA), gain_n=len(gain),
        gain_n_higher=count_verdicts(gain, ALPHA)["higher"] if len(gain) else 0,
        trained_reading=f"{said} ({label})" if label else said, explore_label=label,
        trained_min=float(tuned.min()) if len(tuned) else math.nan,
        trained_max=float(tuned.max()) if len(tuned) else math.nan,
        reference_converged=bool(all(v < 1e-5 for v in ([] if reference_grads is None else list(reference_grads)))),
        engine_check=float(check),
    ), bounds=lambda key: (-1, 1))


# --- the running statistics' change on normalised scales (finding 2) -----------------------------------------------

def _largest_per_seed(buffers: pd.DataFrame, who: str) -> pd.DataFrame:
    """Per seed the largest ``mean_shift_sd`` and ``log_var_ratio`` over layers (a layer's NaN leaves the seed out);
    ``ValueError`` for an empty table or a repeated ``(seed, layer)`` row (the largest would hide it)."""
    if buffers.empty:
        raise ValueError("buffer_findings needs a non-empty buffer table (see buffer_table)")
    dup = buffers.duplicated(["seed", "layer"])
    if dup.any():
        raise ValueError(f"{who}: {int(dup.sum())} repeated (seed, layer) rows, e.g. "
                         f"{buffers.loc[dup, ['seed', 'layer']].iloc[0].to_dict()}; give each seed's layer once")
    return buffers.groupby("seed")[["mean_shift_sd", "log_var_ratio"]].max(skipna=False)


def buffer_claims(buffers: pd.DataFrame) -> pd.DataFrame:
    """Finding 2's buffer criteria, one family ``criteria``: ``shift_<layer>`` and ``var_<layer>`` per layer and
    ``shift_most`` / ``var_most`` on each seed's largest. Raises as :func:`_largest_per_seed`."""
    per_seed = _largest_per_seed(buffers, "buffer_claims")
    parts = [(_slug(layer), _largest_per_seed(g, "buffer_claims")) for layer, g in buffers.groupby("layer")]
    return _decided("criteria", [c for key, p in parts + [("most", per_seed)] for c in (
        (f"shift_{key}", p["mean_shift_sd"] - MEAN_SHIFT_SD, SHIFT_WORDS, None),
        (f"var_{key}", p["log_var_ratio"] - math.log(VAR_FACTOR), VAR_WORDS, None))])


def buffer_findings(buffers: pd.DataFrame, main: pd.DataFrame | None = None, contrast: float | None = None
                    ) -> pd.DataFrame:
    """How far ``train_mode``'s running statistics moved (raises as :func:`_largest_per_seed`), per seed and per
    layer; ``engine_check``: the largest relative difference from the engine's raw changes (NaN without ``main``)."""
    per_seed = _largest_per_seed(buffers, "buffer_findings")
    check = math.nan
    if main is not None:
        tm = main[main["mode"] == "train_mode"].set_index("seed")
        rel = [abs(float(r[ours]) - e) / max(abs(e), 1e-12) for _, r in buffers.iterrows() if r["seed"] in tm.index
               for ours, theirs in (("mean_abs", "drift_mean_l"), ("var_abs", "drift_var_l"))
               for e in [float(tm.loc[r["seed"], f"{theirs}{int(r['layer'].split()[-1]) - 1}"])]]
        check = max(rel) if rel else math.nan
        if contrast is None and "contrast" in main.columns:
            contrast = float(main["contrast"].iloc[0])
    ls = t_interval(per_seed["log_var_ratio"])
    by = buffers.groupby("layer")["mean_shift_sd"].mean()
    return numbers_table(dict(
        mean_shift=t_interval(per_seed["mean_shift_sd"]), mean_shift_min=float(per_seed["mean_shift_sd"].min()),
        log_var=ls, var_factor=float(math.exp(ls.mean)),
        mean_shift_by_layer=_series(by),
        deeper_share=float(by.iloc[1:].max() / by.iloc[0]) if len(by) > 1 and by.iloc[0] > 0 else math.nan,
        log_var_by_layer=_series(buffers.groupby("layer")["log_var_ratio"].mean()), engine_check=float(check),
        contrast_log_var=float(math.log(contrast ** 2)) if contrast else math.nan,
        m=Family(2 * buffers["layer"].nunique() + 2).m, sd_criterion=MEAN_SHIFT_SD, var_criterion=VAR_FACTOR))


# --- numerical noise: the same runs at another torch thread count (issue 10) ---------------------------------------

#: The main run's gap ``train_mode - backbone_eval`` (table ``main``), no margin, a family of one.
MAIN_GAP = Question("main_gap", "train_mode", "backbone_eval", value="task_b", by="mode", table="main", words=TRAIN)


def _threads(tc: pd.DataFrame, main: pd.DataFrame | None, main_threads: int):
    ths = sorted(tc["threads"].unique())
    if len(ths) != 2 or main_threads not in ths:
        raise ValueError(f"thread_findings needs exactly two thread counts including main_threads={main_threads}, "
                         f"got {ths}")
    other = [t for t in ths if t != main_threads][0]
    a, b = (tc[tc["threads"] == t].set_index(["seed", "mode"]).sort_index() for t in (main_threads, other))
    gap = lambda x: x["task_b"].xs("train_mode", level="mode") - x["task_b"].xs("backbone_eval", level="mode")  # noqa: E731
    mg = pd.Series(dtype=float) if main is None else paired_differences(main, "task_b", "mode", "train_mode",
                                                                        "backbone_eval")
    return a, b, gap(a), gap(b), mg


def thread_claims(tc: pd.DataFrame, main: pd.DataFrame | None = None, main_threads: int = 1) -> pd.DataFrame:
    """The main run's gap (family ``main_gap``) and the same with the checked seeds' gaps at the other thread count
    (``swapped_gap``). Raises ``ValueError`` unless there are two thread counts, one of them ``main_threads``."""
    _, _, _, gb, mg = _threads(tc, main, main_threads)
    sw, common = mg.copy(), gb.index.intersection(mg.index)
    sw.loc[common] = gb.loc[common]  # the checked seeds' gaps at the other thread count
    empty = pd.DataFrame(columns=["seed", "mode", "task_b"])
    return pd.concat([ask(dict(main=empty if main is None else main), [MAIN_GAP], ALPHA, family="main_gap"),
                      _decided("swapped_gap", [("swapped_gap", sw, TRAIN_WORDS, None)])], ignore_index=True)


def thread_findings(tc: pd.DataFrame, main: pd.DataFrame | None = None, main_threads: int = 1) -> pd.DataFrame:
    """Run-to-run variation between two torch thread counts (raises as :func:`thread_claims`) over distinct runs
    (``separate_stats`` repeats ``train_mode``, ``all_eval`` ``backbone_eval``), against the main run's gap SD."""
    a, b, ga, gb, mg = _threads(tc, main, main_threads)
    distinct = a.index.get_level_values("mode").isin(["train_mode", "backbone_eval"])
    d_b = (a["task_b"] - b["task_b"]).abs()[distinct]
    d_a = (a["task_a_after"] - b["task_a_after"]).abs()[a.index.get_level_values("mode") == "train_mode"]
    sd = float(mg.std(ddof=1)) if len(mg) > 1 else math.nan
    dmax = float((gb - ga).abs().max())
    return numbers_table(dict(
        n_seeds=int(len(ga)), n_runs=int(distinct.sum()), n_differ=int((d_b > 0).sum()), max_diff_b=float(d_b.max()),
        mean_diff_b=float(d_b.mean()), max_diff_a=float(d_a.max()),
        gap_diff=_series((gb - ga).rename(lambda s: f"seed{s}")), gap_diff_largest=dmax, gap_seed_sd=sd,
        main_gap_confidence=Family(1).confidence, diff_over_sd=dmax / sd if sd and not math.isnan(sd) else math.nan))


# --- the drift check against a precise target (referee item 3) ---------------------------------------------------

def drift_check(drift: pd.DataFrame, momentum: float, last_step: int, engine: pd.DataFrame | None = None,
                n_batches: int = DRIFT_TARGET_BATCHES, n_batches_engine: int = ENGINE_TARGET_BATCHES) -> pd.DataFrame:
    """The drift check from :func:`~.run.sweep_drift_table` (targets ``engine`` and ``precise``, each row once, else
    ``ValueError``): the replay against ``engine`` (the main run's :func:`~.run.drift_table`; NaN without), the
    engine target's bias at step 12, and how many 95% intervals on the precise target hold ``(1 - m)^t`` up to
    ``last_step``."""
    if not {"engine", "precise"} <= set(drift["target"]):
        raise ValueError(f"drift_check needs targets 'engine' and 'precise', got {sorted(set(drift['target']))}")
    dup = drift.duplicated(["seed", "layer", "step", "target"])
    if dup.any():  # pivot_table would average them into one value
        raise ValueError(f"drift_check: {int(dup.sum())} repeated (seed, layer, step, target) rows, e.g. "
                         f"{drift.loc[dup, ['seed', 'layer', 'step', 'target']].iloc[0].to_dict()}; give each once")
    piv = drift.pivot_table(index=["seed", "layer", "step"], columns="target", values="weight")
    at12 = piv.xs(12, level="step")
    bias = {l: t_interval(g["engine"] - g["precise"]) for l, g in at12.groupby(level="layer")}
    rep = math.nan
    if engine is not None:
        eng = engine.set_index(["seed", "layer", "step"])["weight"]
        common = piv.index.intersection(eng.index)
        if len(common):
            rep = float((piv.loc[common, "engine"] - eng.loc[common]).abs().max())
    pr = drift[(drift["target"] == "precise") & (drift["step"] >= 1) & (drift["step"] <= last_step)]
    cells = [(layer, int(t), iv, (1 - momentum) ** t, (iv.high - iv.low) / 2)
             for (layer, t), g in pr.groupby(["layer", "step"]) for iv in [t_interval(g["weight"])]]
    inside = [c for c in cells if c[2].low <= c[3] <= c[2].high]
    best = max([(0.0, "", 0)] + [(abs(iv.mean - th), layer, t) for layer, t, iv, th, _ in cells], key=lambda b: b[0])
    b12 = pd.Series({l: iv.mean for l, iv in bias.items()})
    exc12 = at12.groupby(level="layer")["engine"].mean() - (1 - momentum) ** 12
    return numbers_table(dict(
        n_batches=int(n_batches), n_batches_engine=int(n_batches_engine), engine_reproduced=rep,
        **_bands("bias_engine_12", bias),
        remaining_bias=float(b12.abs().max() * n_batches_engine / n_batches), n_intervals=len(cells),
        n_inside=len(inside), residual_max=float(best[0]), residual_max_layer=best[1], residual_max_step=best[2],
        halfwidth_max=float(max([0.0] + [c[4] for c in cells])),
        misses="; ".join(f"{layer} at step {t} (mean residual {iv.mean - th:+.4f}, half-width {hw:.4f})"
                         for layer, t, iv, th, hw in cells if (layer, t) not in {c[:2] for c in inside}) or "none",
        n_expected_misses=0.05 * len(cells), engine_excess_12=_series(exc12), bias_share_12=_series(b12 / exc12)))


# --- tuning, budget and feature scale: what explains the trained heads' gap (referee items 6 and 8) ----------------

#: Each a family: the gap with each path's rate chosen on the pooled *test* sets (table ``oracle``, robustness only);
#: the standardized heads' gap at the main step (``std_main``, margin :data:`PRIMARY_MARGIN`) and at every checkpoint.
ORACLE = Question("oracle_{optimizer}_{step}", "batch_stats", "pinned", by="path", each=("optimizer", "step"),
                  table="oracle", words=TRAIN)
STD = Question("std_{base}", "batch_stats", "pinned", by="path", each=("base",), table="std_main",
               margin=PRIMARY_MARGIN, words=TRAIN)
STD_AT = Question("std_{base}_{step}", "batch_stats", "pinned", by="path", each=("base", "step"), table="std",
                  words=TRAIN)


def oracle_gaps(sweep: pd.DataFrame, with_claims: bool = False):
    """The gap with each path's rate chosen on the pooled seeds' *test* sets (a robustness check that favours each
    path), one family (:data:`ORACLE`), as a table (``with_claims``: ``(table, claims table)``)."""
    t = sweep[(sweep["split"] == "test") & sweep["role"].isin(POOLED) & sweep["optimizer"].isin(["sgd", "adam"])]
    rows, chosen = [], []
    for (o, step), g in t.groupby(["optimizer", "step"]):
        best = {p: float(h.groupby("lr")["accuracy"].mean().sort_index().idxmax()) for p, h in g.groupby("path")}
        if set(best) != set(PATHS):
            continue
        chosen += [g[(g["path"] == p) & (g["lr"] == lr)] for p, lr in best.items()]
        rows.append(dict(key=f"oracle_{o}_{int(step)}", optimizer=o, step=int(step), lr_batch_stats=best["batch_stats"],
                         lr_pinned=best["pinned"]))
    claims = (ask(dict(oracle=pd.concat(chosen)), [ORACLE], ALPHA, family="oracle") if rows
              else claims_table([], family="oracle"))
    return _with_claims(rows, claims, ["key", "optimizer", "step", "lr_batch_stats", "lr_pinned", *_SHOWN], with_claims)


def _opt_name(o: str) -> str:
    return "SGD" if o == "sgd" else "Adam"


def tuning_claims(sweep: pd.DataFrame, main_step: int) -> pd.DataFrame:
    """What the trained heads' gap depends on, families ``narrow`` (first to last checkpoint), ``std``,
    ``reduction`` (plain - standardized gap), ``std_at``, ``oracle`` and ``oracle_at_main``. Raises ``ValueError`` if
    ``main_step`` is not one of >= 2 checkpoints."""
    steps, lrs, t, opts = _chosen(sweep, main_step, ["sgd", "adam"])
    std_opts = [o for o in opts if (o + STD_SUFFIX, "pinned") in lrs]
    _, orc = oracle_gaps(sweep, with_claims=True)
    at_main = {f"oracle_{o}_{main_step}": f"oracle_at_main_{o}" for o in ("sgd", "adam")}
    gap = lambda o, s: _path_gap(t, o, POOLED, s)  # noqa: E731
    std = t[t["optimizer"].isin([o + STD_SUFFIX for o in std_opts]) & t["role"].isin(POOLED)]
    std = std.assign(base=std["optimizer"].str.removesuffix(STD_SUFFIX))
    return pd.concat([
        _decided("narrow", [(f"narrow_{o}", gap(o, steps[-1]) - gap(o, steps[0]), GAP_WORDS, None) for o in opts]),
        ask(dict(std_main=std[std["step"] == main_step]), [STD], ALPHA, family="std"),
        _decided("reduction", [(f"reduction_{o}", gap(o, main_step) - gap(o + STD_SUFFIX, main_step), STD_WORDS, None)
                               for o in std_opts]),
        ask(dict(std=std), [STD_AT], ALPHA, family="std_at"), orc,
        orc[orc["key"].isin(list(at_main))].assign(family="oracle_at_main", key=lambda c: c["key"].map(at_main))],
        ignore_index=True)


def tuning_findings(sweep: pd.DataFrame, main_step: int, claims: pd.DataFrame | None = None) -> pd.DataFrame:
    """The numbers of :func:`tuning_claims`' analysis (``claims``: it, if computed): the oracle rows, the gap at the
    first and last checkpoint, the standardized heads (``std_...``) and the reduction's share of the plain gap."""
    steps, lrs, t, opts = _chosen(sweep, main_step, ["sgd", "adam"])
    claims = tuning_claims(sweep, main_step) if claims is None else claims
    orc, narrow = family(claims, "oracle"), family(claims, "narrow")
    red, std_at_claims = family(claims, "reduction"), family(claims, "std_at")
    gap_at = {f"{o}_{s}": t_interval(_path_gap(t, o, POOLED, s)) for o in opts for s in steps}
    at = t[t["role"].isin(POOLED) & (t["step"] == main_step)]
    acc = lambda name, p: at[(at["optimizer"] == name) & (at["path"] == p)].set_index("seed")["accuracy"]  # noqa: E731
    cells = [(f"{o}_{p}", o + STD_SUFFIX, o, p) for o in opts if (o + STD_SUFFIX, "pinned") in lrs for p in PATHS]
    iv = lambda r: Interval(float(r.estimate), float(r.low), float(r.high), int(r.n), float(r.confidence))  # noqa: E731
    std_at = {r.key.removeprefix("std_"): iv(r) for r in std_at_claims.itertuples()}
    reduction = {r.key.removeprefix("reduction_"): iv(r) for r in red.itertuples()}
    plain = {o: gap_at[f"{o}_{main_step}"] for o in reduction}
    share = lambda end: {o: getattr(reduction[o], end) / plain[o].mean if plain[o].mean else math.nan  # noqa: E731
                         for o in reduction}
    first = lambda c: float(c["confidence"].iloc[0]) if len(c) else math.nan  # noqa: E731
    return numbers_table(dict(
        main_step=int(main_step), first_step=int(steps[0]), last_step=int(steps[-1]),
        oracle_min=float(orc["estimate"].min()), oracle_max=float(orc["estimate"].max()), oracle_n=len(orc),
        oracle_n_above=count_verdicts(orc, ALPHA)["higher"], oracle_confidence=first(orc),
        gap_first={o: gap_at[f"{o}_{steps[0]}"] for o in opts}, gap_last={o: gap_at[f"{o}_{steps[-1]}"] for o in opts},
        narrowing_p_holm_text={r.key.removeprefix("narrow_"): p_text(r.p_adjusted) for r in narrow.itertuples()},
        std_gap_at=std_at, std_at_confidence=first(std_at_claims),
        std_gap_min=float(min((iv.mean for iv in std_at.values()), default=math.nan)),
        std_gap_max=float(max((iv.mean for iv in std_at.values()), default=math.nan)),
        std_n_above=count_verdicts(std_at_claims, ALPHA)["higher"] if len(std_at_claims) else 0, std_n=len(std_at),
        std_n_positive=sum(iv.mean > 0 for iv in std_at.values()),
        std_acc={k: float(acc(so, p).mean()) for k, so, _, p in cells},
        std_gain={k: t_interval(acc(so, p) - acc(o, p)) for k, so, o, p in cells},
        std_share=share("mean"), std_share_low=share("low"), std_plain_gap=plain,
    ), bounds=lambda key: (-1, 1))


# --- the page: one claims table, one numbers table (keys prefixed by part), one glue call --------------------------

#: Claims families that are differences of two gaps: printed inside [-2, 2], twice a difference of accuracies.
DIFFERENCE_OF_GAPS = ("tune_narrow", "tune_reduction")


def chapter(parts: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``{part: (claims or None, numbers or None)}`` as one claims table and one numbers table, keys and families
    prefixed ``<part>_`` (part ``""``: as they are)."""
    pre = lambda part: f"{part}_" if part else ""  # noqa: E731
    return (pd.concat([c.assign(key=pre(k) + c["key"], family=pre(k) + c["family"])
                       for k, (c, _) in parts.items() if c is not None and len(c)], ignore_index=True),
            pd.concat([n.assign(key=pre(k) + n["key"]) for k, (_, n) in parts.items() if n is not None and len(n)],
                      ignore_index=True))


def _printed(claims: pd.DataFrame) -> pd.DataFrame:
    """The claims with interval ends cut for printing: a difference of accuracies to [-1, 1], a difference of two
    gaps (:data:`DIFFERENCE_OF_GAPS`) to [-2, 2], the buffers' criteria (part ``buf``) not at all."""
    out = claims.copy()
    c = np.where(out["family"].isin(DIFFERENCE_OF_GAPS), 2.0, 1.0)
    for end in ("low", "high"):
        out[end] = out[end].where(out["family"].str.startswith("buf_"), out[end].astype(float).clip(-c, c))
    return out


def glue_page(prefix: str, claims: pd.DataFrame, numbers: pd.DataFrame, words: dict) -> None:
    """Glue the chapter's tables (interval ends cut by :func:`_printed`) and ``words`` in one call."""
    from ...pages import glue_chapter
    glue_chapter(prefix, _printed(claims), numbers, words=words)


# --- the seed article's numbers beside this chapter's (referee item 9) ---------------------------------------------

#: Seed article 001's numbers (3 seeds, linear head, 800 steps), as it states them; fractions 0..1, logits, units.
ARTICLE = dict(task_a_after_tm=0.104, max_logit_change=39.0, buffer_units=4.0, task_b_tm=0.43,
               task_b_pinned_low=0.21, task_b_pinned_high=0.26, pinned_a=0.256, pinned_b=0.206)


def seed_article_table(main: pd.DataFrame, buffers: pd.DataFrame, claims: pd.DataFrame, numbers: pd.DataFrame
                       ) -> pd.DataFrame:
    """The seed article's claims (:data:`ARTICLE`) beside this chapter's (:func:`chapter`'s tables): ``claim, seed
    article, this chapter, status``."""
    a = ARTICLE
    piv = main.pivot(index="seed", columns="mode", values="task_b")
    logit = main[main["mode"] == "train_mode"]["max_old_logit_change"]
    after = _main_parts(main)[2]
    raw_mean, raw_var = float(buffers["mean_abs"].max()), float(buffers["var_abs"].max())
    pinned = piv[["backbone_eval", "all_eval"]].mean()
    n = lambda key: number(numbers, key)  # noqa: E731
    v = lambda key: claim(claims, key).verdict  # noqa: E731
    ok = lambda key: v(key) == EXACT  # noqa: E731
    chance_v, change_v = v("task_a_chance"), v("task_a_change")
    main_v = v("opt_explore_main") if (claims["key"] == "opt_explore_main").any() else "not run"
    near, n_seeds, limit = n("n_near_chance"), n("n_seeds"), n("chance_limit")
    rows = [
        ("every weight unchanged (all modes)", "largest change 0", f"largest change 0: {v('c_weights_unchanged')}",
         "reproduced (check)" if ok("c_weights_unchanged") else "differs"),
        ("task A after `train_mode`", f"{a['task_a_after_tm']:.3f} (chance)",
         f"{after.mean():.3f} mean, {after.min():.3f} to {after.max():.3f}; against chance: {chance_v}; "
         f"{near} of {n_seeds} seeds at or below {limit:.2f}",
         "reproduced" if chance_v.startswith("equivalent") else
         f"differs: {change_v} in the paired comparison, at most {limit:.2f} in {near} of "
         f"{n_seeds} seeds" if change_v == A_LOWER else "differs"),
        ("largest old-head logit change (`train_mode`)", f"up to {a['max_logit_change']:.0f}",
         f"{logit.mean():.1f} mean over seeds, at most {logit.max():.1f}",
         "reproduced, smaller" if 0 < logit.max() < a["max_logit_change"] else
         "reproduced" if logit.max() >= a["max_logit_change"] else "differs"),
        ("running statistics moved (`train_mode`, raw units)", f"up to {a['buffer_units']:g} units",
         f"running_mean up to {raw_mean:.1f}, running_var up to {raw_var:.0f}",
         "reproduced (they move; sizes depend on the data's scale)" if raw_mean > 0 else "differs"),
        ("task B, `train_mode` against the pinned modes (main run: the seed's protocol, one rate not tuned per path)",
         f"{a['task_b_tm']:.2f} against {a['task_b_pinned_low']:.2f} to {a['task_b_pinned_high']:.2f}",
         f"{piv['train_mode'].mean():.3f} against "
         f"{f'{pinned.min():.3f} (both)' if pinned.min() == pinned.max() else f'{pinned.min():.3f} to {pinned.max():.3f}'}; "
         f"difference: {main_v} (exploratory family)",
         (("reproduced, smaller" if claim(claims, "opt_explore_main").estimate < a["task_b_tm"] - a["task_b_pinned_high"]
           else "reproduced") if main_v == TRAIN_HIGHER else f"differs: {main_v}")),
        controlled_article_row(main, claims),
        ("the two pinned modes on task B", f"{a['pinned_a']:.3f} against {a['pinned_b']:.3f} (\"run-to-run noise\")",
         f"equal in every seed: {v('c_pinned_equal_b')}",
         "identity of the code (the article's runs were not paired)" if ok("c_pinned_equal_b") else "differs"),
        ("`separate_stats`: task A logits unchanged, task B as `train_mode`", "exactly 0; 0.43 as `train_mode`",
         f"logits unchanged: {v('c_separate_exact')}; equal to `train_mode`: {v('c_separate_matches_b')}",
         "reproduced (checks)" if ok("c_separate_exact") and ok("c_separate_matches_b") else "differs"),
    ]
    return pd.DataFrame(rows, columns=["claim", "seed article", "this chapter", "status"]).map(
        lambda v: v.replace("`", "").replace("**", "") if isinstance(v, str) else v)  # an HTML table: no Markdown


def controlled_article_row(main: pd.DataFrame, claims: pd.DataFrame) -> tuple:
    """Table 1.6's task-B row under the controlled comparison (issue 35): the article's difference (one rate) beside
    the main run's optimizer with each path at its own tuned rate (``opt_explore_at_main_<optimizer>``)."""
    a = ARTICLE
    low, high = a["task_b_tm"] - a["task_b_pinned_high"], a["task_b_tm"] - a["task_b_pinned_low"]
    label = "task B, each path at its own tuned rate (controlled)"
    article = f"{low:.2f} to {high:.2f} (one rate for both)"
    o = str(main["optimizer"].iloc[0]) if "optimizer" in main.columns else "sgd"
    if not _has(claims, f"opt_explore_at_main_{o}"):
        return label, article, "not run", "not run"
    c = claim(claims, f"opt_explore_at_main_{o}")
    status = (("reproduced, smaller" if c.estimate < low else "reproduced") if c.verdict == TRAIN_HIGHER
              else f"differs: {c.verdict}")
    return (label, article, f"{_opt_name(o)} {claim_text(c, clip=(-1.0, 1.0))}".replace("**", ""),
            f"{status} ({_opt_name(o)}, the seed's optimizer)")


def article_counts(table: pd.DataFrame) -> pd.DataFrame:
    """How many rows of :func:`seed_article_table` have each status."""
    st = table["status"].str.startswith
    smaller = int(st("reproduced, smaller").sum())
    return numbers_table(dict(n=len(table), reproduced=int(st("reproduced").sum()) - smaller, smaller=smaller,
                              differs=int(st("differs").sum()), identity=int(st("identity").sum())))


# --- the page's words (issue 33): what the findings choose is a rule-triggered note (:data:`NOTES`) ----------------

def _kind(claims: pd.DataFrame, key: str) -> str:
    return str(claim(claims, key).kind)


def _has(claims: pd.DataFrame, key: str) -> bool:
    return bool(len(claims)) and bool((claims["key"] == key).any())


def _exact(*keys):
    return lambda c, n: all(_kind(c, k) == "exact" for k in keys)


def _not(rule):
    return lambda c, n: not rule(c, n)


def _verdicts(*keys):
    return lambda c, n: {k: claim(c, k).verdict for k in keys}


def _other_logits(c, n) -> float:
    """The other modes' largest old-logit change (means over seeds; 0 when every old-head logit is unchanged)."""
    return max(number(n, f"max_old_logit_change_{m}").mean for m in MODE_NAMES if m != "train_mode")


def _moved(c, n) -> bool:
    """Finding 2: the most-moved running mean or the most-changed running variance is shown beyond its criterion."""
    return "higher" in (_kind(c, "buf_shift_most"), _kind(c, "buf_var_most"))


#: The controlled comparison's optimizers (issue 35), in the page's order (claims ``opt_explore_at_main_<o>``).
CONTROLLED = ("sgd", "adam")


def _controlled(c, n=None) -> bool:
    return all(_has(c, f"opt_explore_at_main_{o}") for o in CONTROLLED)


def _shown(c) -> list:
    return [o for o in CONTROLLED
            if _has(c, f"opt_explore_at_main_{o}") and _kind(c, f"opt_explore_at_main_{o}") in ("higher", "lower")]


def _primary_is(*kinds, shown=None):
    """The reference test's verdict is of one of ``kinds`` (with ``shown``: a controlled comparison shows a
    direction, or not)."""
    return lambda c, n: _kind(c, "opt_primary") in kinds and (shown is None or bool(_shown(c)) == shown)


def _reference_fill(c, n) -> dict:
    return dict(margin=number(n, "opt_margin"), shown=join([_opt_name(o) for o in _shown(c)]) if _shown(c) else "")


_EQUIVALENT_TEXT = (", so the pinned features allow a converged linear classifier within ±{margin:.2f} of what the "
                    "drifting ones do")


def _controlled_fill(c, n) -> dict:
    said = lambda k: claim_text(claim(c, k), clip=(-1.0, 1.0)) if _has(c, k) else ""  # noqa: E731
    return dict(step=number(n, "opt_main_step"), conf=claim(c, "opt_explore_at_main_sgd").confidence,
                m=len(family(c, "opt_explore")), lr_b=number(n, "opt_lr_sgd_batch_stats"),
                lr_p=number(n, "opt_lr_sgd_pinned"), sgd=said("opt_explore_at_main_sgd"),
                adam=said("opt_explore_at_main_adam"), main=said("opt_explore_main"))


_CONTROLLED_TEXT = ("With each path at its own learning rate, tuned on separate seeds, a head after {step:,.0f} steps "
                    "scores on task B, drifting minus pinned statistics ({conf:.1%} intervals, family of {m:.0f}), "
                    "{sgd} with SGD (rates {lr_b:g} drifting, {lr_p:g} pinned) and {adam} with Adam")


def _threads_same(c, n=None) -> bool | None:
    if _has(c, "threads_main_gap") and _has(c, "threads_swapped_gap"):
        return claim(c, "threads_main_gap").verdict == claim(c, "threads_swapped_gap").verdict
    return None


def _unseen_fill(c, n) -> dict:
    u, ci90 = claim(c, "opt_unseen"), number(n, "opt_unseen_ci90")
    return dict(n=u.n, estimate=u.estimate, low=u.low, high=u.high, lo90=ci90.low, hi90=ci90.high,
                p=p_text(u.p_equivalence), verdict=u.verdict, seen=number(n, "opt_seen_n"),
                all=claim(c, "opt_primary").n)


def _oracle(c, n) -> tuple:
    return int(number(n, "tune_oracle_n_above")), int(number(n, "tune_oracle_n"))


def _std(c, n) -> tuple:
    red = family(c, "tune_reduction")
    opt = lambda k: k.removeprefix("tune_reduction_")  # noqa: E731
    return ([opt(k) for k, v in zip(red["key"], red["verdict"]) if v == STD_SMALLER],
            [opt(k) for k, v in zip(red["key"], red["verdict"]) if v != STD_SMALLER])


def _std_fill(c, n) -> dict:
    shown, missing = _std(c, n)
    fill = dict(missing=join([_opt_name(o) for o in missing]) if missing else "",
                above=number(n, "tune_std_n_above"), n=number(n, "tune_std_n"))
    if shown and missing:  # the shown reduction's size (the two optimizers: one of each)
        r, o = claim(c, f"tune_reduction_{shown[0]}"), shown[0]
        fill.update(shown=_opt_name(o), est=r.estimate, lo=r.low, hi=r.high,
                    share=r.estimate / (number(n, f"tune_std_plain_gap_{o}").mean or math.nan))
    return fill


def _std_most(c, n) -> bool:
    return all(r.estimate >= 0.5 * number(n, f"tune_std_plain_gap_{r.key.removeprefix('tune_reduction_')}").mean
               for r in family(c, "tune_reduction").itertuples())


def _std_when(shown: bool | None, missing: bool | None, most: bool | None = None, above: bool | None = None):
    """A rule on the reductions (``None``: either): some shown, some not, every one at least half its plain gap
    (``most``), train mode still shown higher at some checkpoint (``above``)."""
    def rule(c, n):
        s, m = _std(c, n)
        return (bool(s or m) and (shown is None or bool(s) == shown) and (missing is None or bool(m) == missing)
                and (most is None or _std_most(c, n) == most)
                and (above is None or (number(n, "tune_std_n_above") > 0) == above))
    return rule


_STD_REST = {True: "a smaller gap remains, train mode higher at {above:.0f} of {n:.0f} checkpoints",
             False: "what remains is not shown to differ from zero at any checkpoint"}

#: The page's rule-triggered sentences (exactly one of each key holds), read from the chapter's tables (:func:`chapter`)
#: and glued as ``ch01_<key>``.
NOTES = (
    Note("lead", lambda c, n: _moved(c, n) and _kind(c, "task_a_change") == "lower",
         "**No.** With gradients off, BatchNorm's statistics still move and the old task falls: pin the "
         "backbone in eval mode."),
    Note("lead", lambda c, n: _moved(c, n) and _kind(c, "task_a_change") != "lower",
         "**Not entirely.** With gradients off, BatchNorm's running statistics still move, though the old task is "
         "not shown to fall: pin the backbone in eval mode."),
    Note("lead", lambda c, n: not _moved(c, n),
         "**In this run, yes.** The running statistics are not shown to move beyond the chapter's criteria; "
         "pinning the backbone in eval mode makes sure."),
    Note("say_weights", _exact("c_weights_unchanged"),
         "No weight changed in any mode (**{c_weights_unchanged}**, a check of the code, below).",
         _verdicts("c_weights_unchanged")),
    Note("say_weights", _not(_exact("c_weights_unchanged")),
         "Some weight changed although gradients were off (largest {largest:.3g}) (**{verdict}**, a check of the code, "
         "below).", lambda c, n: dict(largest=claim(c, "c_weights_unchanged").estimate,
                                     verdict=claim(c, "c_weights_unchanged").verdict)),
    Note("say_logits", lambda c, n: _other_logits(c, n) == 0,
         "in the other three modes every old-head logit is unchanged (largest change exactly 0)"),
    Note("say_logits", lambda c, n: _other_logits(c, n) != 0,
         "in the other three modes the largest old-head logit change is {worst:.3g} on average over seeds",
         lambda c, n: dict(worst=_other_logits(c, n))),
    Note("separate", _exact("c_separate_matches_b", "c_separate_exact"),
         "`separate_stats`, which gives task B its own copy of the statistics, has both: `train_mode`'s task-B accuracy "
         "(**{c_separate_matches_b}**) and task A's logits unchanged (**{c_separate_exact}**).",
         _verdicts("c_separate_matches_b", "c_separate_exact")),
    Note("separate", _not(_exact("c_separate_matches_b", "c_separate_exact")),
         "`separate_stats` does not reproduce `train_mode` on task B (**{c_separate_matches_b}**) or does not keep task "
         "A's logits (**{c_separate_exact}**) in this run: a bug.",
         _verdicts("c_separate_matches_b", "c_separate_exact")),
    Note("reference_reading", _primary_is("equivalent", shown=False), _EQUIVALENT_TEXT, _reference_fill),
    Note("reference_reading", _primary_is("equivalent", shown=True),
         _EQUIVALENT_TEXT + "; where a trained head shows a difference ({shown}), it lies in how easily a head uses "
         "the features, not in what they allow", _reference_fill),
    Note("reference_reading", _primary_is("higher"),
         ", so the drifting features allow more even to a converged linear classifier"),
    Note("reference_reading", _primary_is("lower"),
         ", so the pinned features allow more to a converged linear classifier"),
    Note("reference_reading", _not(_primary_is("equivalent", "higher", "lower")),
         ", so what the two kinds of features allow is not decided with these seeds"),
    Note("say_controlled", lambda c, n: _controlled(c) and _has(c, "opt_explore_main"),
         _CONTROLLED_TEXT + "; the seed's protocol (one rate, not tuned per path; the same family) gives {main}.",
         _controlled_fill),
    Note("say_controlled", lambda c, n: _controlled(c) and not _has(c, "opt_explore_main"), _CONTROLLED_TEXT + ".",
         _controlled_fill),
    Note("say_controlled", _not(_controlled),
         "The controlled comparison (each path at its own tuned rate) was not run."),
    Note("say_threads", lambda c, n: _threads_same(c) is True,
         "its verdict is **{threads_main_gap}** either way: the thread count alone did not change it",
         _verdicts("threads_main_gap")),
    Note("say_threads", lambda c, n: _threads_same(c) is False,
         "its verdict from **{threads_main_gap}** to **{threads_swapped_gap}**: the thread count alone changed it",
         _verdicts("threads_main_gap", "threads_swapped_gap")),
    Note("say_threads", lambda c, n: _threads_same(c) is None, "no thread check was run"),
    Note("opt_unseen_text", lambda c, n: claim(c, "opt_unseen").verdict == TOO_FEW,
         "This profile cannot show that part: {seen:.0f} of its {all:.0f} seeds are ones the quick profile had shown, "
         "so the confirmatory part of the test needs the full profile.", _unseen_fill),
    Note("opt_unseen_text", lambda c, n: claim(c, "opt_unseen").verdict != TOO_FEW,
         "On the {n:.0f} seeds the quick profile did not have, the difference is {estimate:.3f} (95% interval "
         "{low:.3f} to {high:.3f}; 90% interval {lo90:.3f} to {hi90:.3f}; TOST p {p}), verdict: **{verdict}**; this is "
         "the confirmatory part of the test.", _unseen_fill),
    Note("tune_oracle_reading", lambda c, n: 0 < _oracle(c, n)[0] == _oracle(c, n)[1],
         "Even a learning rate tuned per path on the test data leaves the pinned path behind at every checkpoint, so "
         "the trained heads' gap is not an artifact of the learning-rate choice"),
    Note("tune_oracle_reading", lambda c, n: _oracle(c, n)[0] == 0,
         "With the learning rate tuned per path on the test data no difference is shown, so tuning could account for "
         "the trained heads' gap"),
    Note("tune_oracle_reading", lambda c, n: 0 < _oracle(c, n)[0] < _oracle(c, n)[1],
         "With the learning rate tuned per path on the test data the pinned path stays behind in {k} of {n} "
         "optimizer-checkpoint pairs, so tuning explains at most a part of the trained heads' gap",
         lambda c, n: dict(zip("kn", _oracle(c, n)))),
    Note("tune_std_reading", lambda c, n: not len(family(c, "tune_reduction")), "not run"),
    Note("tune_std_reading", _std_when(shown=True, missing=True),
         "standardizing the features is shown to shrink the gap for {shown} by {est:.3f} ({lo:.3f} to {hi:.3f}; on "
         "average {share:.0%} of its plain gap), and not shown to shrink it for {missing}: feature conditioning "
         "explains part of the gap for {shown} and is not shown to explain it for {missing}", _std_fill),
    Note("tune_std_reading", _std_when(shown=False, missing=True),
         "standardizing the features is not shown to shrink the gap for {missing}: feature conditioning is not shown "
         "to explain it", _std_fill),
    *(Note("tune_std_reading", _std_when(shown=True, missing=False, most=True, above=above),
           "standardizing the features removes most of the gap on average, but by the reductions' intervals possibly "
           f"less; {rest}. Feature conditioning, which standardization improves more on the pinned path, most likely "
           "explains most of the trained heads' gap, not all of it", _std_fill) for above, rest in _STD_REST.items()),
    *(Note("tune_std_reading", _std_when(shown=True, missing=False, most=False, above=above),
           f"standardizing the features removes part of the gap; {rest}. Feature conditioning explains part of the "
           "trained heads' gap", _std_fill) for above, rest in _STD_REST.items()),
)


# --- the reproduction's sizes against the seed article's: an ablation (issue 35) ----------------------------------

def _cells(ab: pd.DataFrame):
    for (n, k), g in ab.groupby(["noise", "stage1_steps"], sort=True):
        yield (n, k), *(g[g["mode"] == m].set_index("seed") for m in ("train_mode", "backbone_eval"))


def _is_book(cell, book) -> bool:
    return book is not None and (float(cell[0]), int(cell[1])) == (float(book[0]), int(book[1]))


def ablation_claims(ab: pd.DataFrame, book: tuple | None = None) -> pd.DataFrame:
    """One family (``ablation``) over every cell but ``book`` (the main run's, whose claims are its own):
    ``abl_chance_n<noise>_s<steps>`` (as ``task_a_chance``) and ``abl_taskb_...`` (task B ``train_mode - pinned``)."""
    if not len(ab):
        return claims_table([], family="ablation")
    chance = 1 / int(ab["n_classes"].iloc[0])
    comps = []
    for (n, k), tm, pin in _cells(ab):
        if not _is_book((n, k), book):
            comps.append((f"abl_chance_n{n:g}_s{k}", tm["task_a_after"] - chance, CHANCE_WORDS,
                          (CHANCE_FACTOR - 1) * chance))
            comps.append((f"abl_taskb_n{n:g}_s{k}", (tm["task_b"] - pin["task_b"]).dropna(), TRAIN_WORDS, None))
    return _decided("ablation", comps)


def _cell_claim(claims_: pd.DataFrame, cell, book: tuple | None, book_claim, what: str = "chance"):
    """Cell ``(noise, steps)``'s ``what`` claim (``chance`` or ``taskb``): the main run's ``book_claim`` at ``book``."""
    return book_claim if _is_book(cell, book) else claim(claims_, f"abl_{what}_n{cell[0]:g}_s{cell[1]}")


def ablation_table(ab: pd.DataFrame, claims_: pd.DataFrame, book: tuple | None = None,
                   book_claim=None, book_b_claim=None) -> pd.DataFrame:
    """Per ablation cell task A, the old logits' change and task B with their claims (``claims_``:
    :func:`ablation_claims`; at ``book`` the main run's ``book_claim`` and ``book_b_claim``)."""
    limit = CHANCE_FACTOR * (1 / int(ab["n_classes"].iloc[0]))
    rows = []
    for (n, k), tm, _ in _cells(ab):
        before, after = bounded_interval(tm["task_a_before"]), bounded_interval(tm["task_a_after"])
        logit = tm["max_old_logit_change"]
        rows.append({"pixel noise": f"{n:g}", "stage-1 steps": f"{k:,}", "task A before": f"{before.mean:.3f}",
                     "task A after, train mode": f"{after.mean:.3f} ({after.low:.3f} to {after.high:.3f})",
                     f"seeds ≤ {limit:.2f}": f"{int((tm['task_a_after'] <= limit + 1e-12).sum())} of {len(tm)}",
                     "about chance?": verdict_md(_cell_claim(claims_, (n, k), book, book_claim)),
                     "old logits moved, median (largest)": f"{logit.median():.1f} ({logit.max():.1f})",
                     "task B train mode - pinned": claim_text(_cell_claim(claims_, (n, k), book, book_b_claim, "taskb"),
                                                              clip=(-1, 1))})
    return pd.DataFrame(rows).set_index(["pixel noise", "stage-1 steps"]).map(
        lambda v: v.replace("**", ""))  # an HTML table: no Markdown


def ablation_sentence(ab: pd.DataFrame, claims_: pd.DataFrame, noise: float, book: tuple | None = None,
                      book_claim=None, book_b_claim=None) -> str:
    """What the ablation says about the sizes, against the book's cell (``noise``) and the seed article's."""
    if not len(ab):
        return "The ablation was not run here (its `ablation` parameter is off)."
    stats = {c: (float(tm["task_a_after"].mean()), float(tm["max_old_logit_change"].max())) for c, tm, _ in _cells(ab)}
    low = min(stats, key=lambda c: stats[c][0])
    own = min(stats, key=lambda c: (abs(c[0] - noise), c[1]))  # the book's cell, as the prose names it
    chance_cells = [c for c in stats if _cell_claim(claims_, c, book, book_claim).kind == "equivalent"]
    cell = lambda c: f"pixel noise {c[0]:g} and {c[1]:,} stage-1 steps"  # noqa: E731
    said = (f"Task A in `train_mode` has its lowest mean (not tested against the other cells) with {cell(low)}: "
            f"{stats[low][0]:.3f}, the old head's logits moving by up to {stats[low][1]:.1f}, against "
            f"{stats[own][0]:.3f} and {stats[own][1]:.1f} with the book's {cell(own)} and "
            f"{ARTICLE['task_a_after_tm']:.3f} and {ARTICLE['max_logit_change']:.0f} in the seed article. ")
    largest = max(v[1] for v in stats.values())
    task_b = ""
    if book is None or book_b_claim is not None:
        b = {c: _cell_claim(claims_, c, book, book_b_claim, "taskb") for c in stats}
        up = [c for c in stats if b[c].kind == "higher"]
        rest = [cell(c) + " (" + b[c].verdict + (", its estimate negative" if b[c].estimate < 0 and b[c].kind not in (
            "lower", "higher") else "") + ")" for c in sorted(set(stats) - set(up))]
        task_b = (" Task B's gain from drifting statistics under the seed's protocol (train mode minus pinned) depends"
                  " on these settings too: " + (f"it is shown with {join([cell(c) for c in sorted(up)])}" if up else
                                                "it is shown in no cell")
                  + (f" and not with {join(rest)}" if rest else "") + ".")
    noises, lengths = sorted({c[0] for c in stats}), sorted({c[1] for c in stats})
    span = (f"pixel noise from {noises[0]:g} to {noises[-1]:g} and stage-1 training from {lengths[0]:,} to "
            f"{lengths[-1]:,} steps")
    if not chance_cells:
        return said + ("In no cell is task A shown to be about chance (equivalence within the chapter's margin)"
                       + (f", and no cell's logits move by more than {largest:.1f}: {span} do not bring the "
                          "reproduction to the seed article's sizes; shift strength, which the article does not "
                          "report either and chapter 3 varies, was not part of this ablation."
                          if largest < ARTICLE["max_logit_change"] else ".") + task_b)
    return said + ("Task A is shown to be about chance (equivalence within the chapter's margin) with "
                   + join([cell(c) for c in sorted(chance_cells)]) + f", in {len(chance_cells)} of {len(stats)} cells."
                   + task_b)
