"""Chapter 8, what is asked (issue 38), fixed before any full-profile row was computed: the questions as data, the
margin and the rule that picks each method's setting, run by :func:`bnstudy.study.inference.ask`.

Settings chosen by trying are chosen on the tuning seeds only (:func:`conditions`): for each stream, family,
strength and test batch, the prior ``N`` and TENT's rate with the highest mean accuracy over the tuning seeds'
domains; the reported seeds never inform a choice. Each grid is closed where its method has a limit that was run
(the prior's ``N = 0`` and ``N = inf``, TENT's rate ``0``), so a choice there is a finding (the method reduces to
another), not a truncated grid. Test-batch statistics are the prior ``N = 0``; DUA runs its published schedule;
routing and the oracle have nothing to tune. A choice at an open end of its grid is flagged (:func:`choices`), and
the page says so where it states a verdict that rests on it.

The grids were widened once, after a first full run (stop 50, not reported) chose the prior's ``N = 1`` or
``N = 256`` and TENT's ``1e-4`` or ``1e-1`` (ends of the first grids, ``N`` in 1-256 by factors of 4, rates
1e-4-1e-1) in 56% of the tuned cells; the questions, margin and families did not change.

Three families (Bonferroni within each, TOST at ±:data:`MARGIN`, the book's margin): ``gain`` (each method minus the
source statistics), ``mix`` (the tuned prior minus test-batch statistics) and ``route`` (per-sample routing minus the
best batch method, chosen on the tuning seeds per cell, on the mixed and class-sorted streams). Plus the mismatch
question: Spearman's rank correlation, over seeds, families, strengths and domains, of chapter 3's mismatch measured
before adapting and the gain of test-batch statistics at the largest test batch (:func:`mismatch_claim`).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ...inference import Question, ask, rank_correlation

#: Equivalence margin (accuracy, fraction): the book's, two points, the smallest difference we would act on.
MARGIN = 0.02
#: The conditions the analysis compares (one column ``condition``): the source statistics, test-batch statistics
#: (prior 0), the prior and TENT at their tuned settings, DUA, per-sample routing and the oracle bank.
CONDITIONS = ("source", "test_batch", "prior_tuned", "dua", "tent_tuned", "routed", "oracle")
#: The batch methods, among which the ``route`` family's reference is chosen per cell on the tuning seeds.
BATCH_METHODS = ("test_batch", "prior_tuned", "dua", "tent_tuned")
CELL = ("stream", "family", "strength", "test_batch")


def _means(rows: pd.DataFrame) -> pd.DataFrame:
    """Mean accuracy over a stream's domains, per seed, cell, method and setting."""
    runs = rows[rows["method"] != "mismatch"]
    keys = ["seed", *CELL, "method", "setting"]
    return runs.groupby(keys, dropna=False, sort=True)["accuracy"].mean().reset_index()


def _candidates(m: pd.DataFrame) -> pd.DataFrame:
    """Per-seed means ``m`` (:func:`_means`) of the tuned methods with each one's closed ends added as settings:
    the prior's ``N = inf`` is the source statistics exactly and its ``N = 0`` test-batch statistics (run at
    batches of two or more); TENT's rate ``0`` is test-batch statistics exactly (no step changes a parameter)."""
    src = m[m["method"] == "source"].assign(method="prior", setting=math.inf)
    tb = m[(m["method"] == "prior") & (m["setting"] == 0)]
    return pd.concat([m[m["method"].isin(["prior", "tent"])], src, tb.assign(method="tent")], ignore_index=True)


def choices(tuning: pd.DataFrame) -> pd.DataFrame:
    """Per cell and tuned method, the setting with the highest mean accuracy over the tuning seeds (ties: the
    smaller setting). ``prior`` chooses among its grid closed by its two limits (``N = 0``, test-batch statistics,
    where run; ``N = inf``, the source statistics); ``tent`` among its rates closed below by ``0`` (test-batch
    statistics). ``at_edge`` flags a choice at an open end, beyond which a wider grid could still do better: the
    prior's smallest ``N > 0`` where ``N = 0`` is not run (a test batch of one), TENT's largest rate. Columns: the
    cell, ``method``, ``setting``, ``accuracy`` (the tuning mean), ``at_edge``."""
    m = _candidates(_means(tuning))
    mean = m.groupby([*CELL, "method", "setting"], sort=True)["accuracy"].mean().reset_index()
    out = []
    for key, g in mean.groupby([*CELL, "method"], sort=True):
        best = g.sort_values(["accuracy", "setting"], ascending=[False, True]).iloc[0]
        grid = sorted(g["setting"])
        open_end = grid[-1] if key[-1] == "tent" else (grid[0] if grid[0] > 0 else None)
        out.append(dict(zip([*CELL, "method"], key), setting=best["setting"], accuracy=best["accuracy"],
                        at_edge=bool(best["setting"] == open_end and len(grid) > 1)))
    return pd.DataFrame(out)


def _named(m: pd.DataFrame, picks: pd.DataFrame) -> pd.DataFrame:
    """Per-seed means ``m`` (:func:`_means`) as conditions of :data:`CONDITIONS` (tuned settings from ``picks``)."""
    parts = [m[m["method"].isin(["source", "dua", "routed", "oracle"])].assign(condition=m["method"]),
             m[(m["method"] == "prior") & (m["setting"] == 0)].assign(condition="test_batch")]
    cand = _candidates(m)
    for method, name in (("prior", "prior_tuned"), ("tent", "tent_tuned")):
        chosen = picks[picks["method"] == method][[*CELL, "setting"]]
        parts.append(cand[cand["method"] == method].merge(chosen, on=[*CELL, "setting"]).assign(condition=name))
    return pd.concat(parts)[["seed", *CELL, "condition", "accuracy"]]


def conditions(rows: pd.DataFrame, tuning: pd.DataFrame) -> pd.DataFrame:
    """The reported seeds' mean accuracy per seed, cell and condition of :data:`CONDITIONS` (tuned settings from
    :func:`choices` of ``tuning``), plus ``best_batch``: in each cell, the batch method of :data:`BATCH_METHODS`
    with the highest mean over the tuning seeds. Columns: ``seed``, the cell, ``condition``, ``accuracy``."""
    picks = choices(tuning)
    out = _named(_means(rows), picks)
    tune = _named(_means(tuning), picks)
    best = tune[tune["condition"].isin(BATCH_METHODS)].groupby([*CELL, "condition"])["accuracy"].mean().reset_index()
    best = best.sort_values("accuracy", ascending=False, kind="stable").drop_duplicates(list(CELL))
    chosen_best = out.merge(best[[*CELL, "condition"]], on=[*CELL, "condition"]).assign(condition="best_batch")
    return pd.concat([out, chosen_best], ignore_index=True)


#: The questions, one family each (:func:`claims`). ``gain``: every batch method and routing against the source
#: statistics in every cell; ``mix``: the tuned prior against test-batch statistics (both need a batch of two or
#: more); ``route``: per-sample routing against the best batch method where batches mix domains or classes.
QUESTIONS = {
    "gain": (Question("gain_{condition}_{stream}_{family}_t{strength}_b{test_batch}",
                      condition=("test_batch", "prior_tuned", "dua", "tent_tuned", "routed"), reference="source",
                      each=CELL, margin=MARGIN, optional=True),),
    "mix": (Question("mix_{stream}_{family}_t{strength}_b{test_batch}", condition="prior_tuned",
                     reference="test_batch", each=CELL, margin=MARGIN, words="prior-weighted mix"),),
    "route": (Question("route_{stream}_{family}_t{strength}_b{test_batch}", condition="routed",
                       reference="best_batch", each=CELL, at=dict(stream=("mixed", "class_sorted")),
                       margin=MARGIN, words="routing", optional=True),),
}


def claims(rows: pd.DataFrame, tuning: pd.DataFrame) -> pd.DataFrame:
    """The claims table of the three families (column ``family``), from the reported rows and the tuning rows.
    ``gain`` asks, per test batch, only the conditions run there (test-batch statistics and TENT need a batch of
    two or more); ``mix`` asks batches of two or more."""
    table = conditions(rows, tuning)
    gain = QUESTIONS["gain"][0]
    per_batch = [Question(gain.key, condition=tuple(c for c in gain.condition if c in set(t["condition"])),
                          reference="source", each=CELL, margin=MARGIN, at=dict(test_batch=b))
                 for b, t in table.groupby("test_batch")]
    return pd.concat([ask(table, per_batch, family="gain"),
                      ask(table[table["test_batch"] > 1], QUESTIONS["mix"], family="mix"),
                      ask(table, QUESTIONS["route"], family="route")], ignore_index=True)


def mix_stops(claims_table: pd.DataFrame, stream: str, family: str, strength: float, batches) -> float:
    """The smallest test batch from which the tuned prior is no longer shown higher than test-batch statistics at
    that and every larger batch (``mix`` family), for one stream, family and strength; NaN when it is shown higher
    at the largest batch (it never stops), the smallest batch asked when it is never shown higher."""
    bs = sorted(b for b in batches if b > 1)
    higher = {b: claims_table.loc[claims_table["key"] == f"mix_{stream}_{family}_t{_num(strength)}_b{b}",
                                  "kind"].eq("higher").any() for b in bs}
    stop = math.nan
    for b in reversed(bs):
        if higher[b]:
            break
        stop = b
    return stop


def _num(v) -> str:
    return str(int(v)) if float(v).is_integer() else str(v)


def mismatch_claim(rows: pd.DataFrame, confidence: float = 0.95) -> dict:
    """Does chapter 3's mismatch, measured before adapting, predict the gain of test-batch statistics? Spearman's
    rho over (seed, family, strength, domain) of the source network's mismatch on the domain and test-batch
    statistics minus source at the largest test batch on the ``single`` stream, with its interval
    (:func:`bnstudy.study.inference.rank_correlation`) and the share of cells whose gain has the sign the mismatch
    predicts (positive where the mismatch is above its median). Returns ``{rho, low, high, p, n, sign_agreement}``."""
    single = rows[rows["stream"] == "single"]
    mis = single[single["method"] == "mismatch"][["seed", "family", "strength", "domain", "accuracy"]]
    mis = mis.rename(columns={"accuracy": "mismatch"})
    b = single["test_batch"].max()
    at = single[single["test_batch"] == b]
    tb = at[(at["method"] == "prior") & (at["setting"] == 0)][["seed", "family", "strength", "domain", "accuracy"]]
    src = at[at["method"] == "source"][["seed", "family", "strength", "domain", "accuracy"]]
    g = tb.merge(src, on=["seed", "family", "strength", "domain"], suffixes=("_tb", "_src")).merge(
        mis, on=["seed", "family", "strength", "domain"])
    g["gain"] = g["accuracy_tb"] - g["accuracy_src"]
    rho, iv, p = rank_correlation(g["mismatch"], g["gain"], confidence)
    predicted = np.where(g["mismatch"] > g["mismatch"].median(), 1, -1)
    agree = float(np.mean(np.sign(g["gain"]) == predicted)) if len(g) else math.nan
    return dict(rho=rho, low=iv.low, high=iv.high, p=p, n=len(g), sign_agreement=agree)
