"""Chapter 7, what is claimed: the findings of :mod:`.run`'s results table.

``Config`` -> :func:`run` -> results table -> :func:`claims` (chapter 1's findings and chapter 3's conclusions
per network as a claims table of :mod:`bnstudy.study.inference`), :func:`condition_claims` (the per-condition claims;
:func:`cited`, those the prose cites) and :func:`findings` (the numbers table the prose cites) ->
:func:`verdict_table`, the answer box's sentences, and the tidy figure tables :func:`effects_table` and
:func:`condition_table`. Every interval, test and verdict comes from :mod:`bnstudy.study.inference`; every
difference is *condition minus reference*, the reference of freeze modes being ``backbone_eval``.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pandas as pd

from ...report import p_text
from ...inference import (Claim, Family, Interval, Question, ask, at_resolution, claims_table, count_one_sided,
                          count_verdicts, decide, exact_check, holm, number, numbers_table, one_sided_p,
                          paired_differences, rank_correlation, t_interval)
from ...modes import MODE_NAMES
from ...words import Note, claim, join, notes, verdict_md

#: The counts' and one-sided questions' level (Holm-adjusted p below it; the glossary's rule).
ALPHA = 0.05
#: Equivalence margin (accuracy, fraction) of task B's ``train_mode - backbone_eval``: "equivalent within
#: ±0.02" by TOST at the family's level (bnstudy.study.inference.decide).
TIE_MARGIN = 0.02
#: A condition is "safe" where its loss of task A is shown smaller than this (accuracy, fraction; chapter 3's
#: ``min_effect``), "harmful" where shown larger (Holm over the network's conditions).
MIN_EFFECT = 0.01
#: The other safe/harm margins the page reports chapter 3's threshold outcome at (``c2_margin_002`` / ``_003``).
MARGIN_SWEEP = (0.02, 0.03)

#: Readable names of the networks, corruptions and conditions for prose, tables and figures.
NETWORK_LABELS = {"small_cnn": "small CNN", "resnet18": "ResNet-18", "mobilenet_v3_small": "MobileNetV3-small"}
CORRUPTION_LABELS = {"none": "no corruption", "brightness": "brightness", "contrast": "contrast",
                     "gaussian_noise": "Gaussian noise", "blur": "blur", "inversion": "inversion"}


def network_label(name: str) -> str:
    """``"resnet18"`` -> ``"ResNet-18"`` (unknown names unchanged)."""
    return NETWORK_LABELS.get(name, name)


def _in_prose(name: str) -> str:
    """A network's name inside a sentence: "the small CNN", "ResNet-18"."""
    return ("the " if name == "small_cnn" else "") + network_label(name)


def condition_label(corruption: str, severity: int) -> str:
    """``("gaussian_noise", 5)`` -> ``"Gaussian noise at severity 5"``; ``("none", 0)`` -> ``"no corruption"``."""
    if corruption == "none":
        return "no corruption"
    return f"{CORRUPTION_LABELS.get(corruption, corruption)} at severity {int(severity)}"


# --- tidy tables ----------------------------------------------------------------------------------------------------
#
# One sign per quantity (the glossary): a difference is *condition minus reference*, and for freeze modes the
# reference is the pinned backbone ``backbone_eval``. So chapter 3's ``cost`` of drifting statistics is
# ``task_a(train_mode) - task_a(backbone_eval)`` (negative when train mode loses task A) and its ``benefit``
# ``task_b(train_mode) - task_b(backbone_eval)`` (positive when train mode gains task B).

_CELL = ["network", "corruption", "severity"]


def _pair(df: pd.DataFrame, value: str, condition: str, reference: str) -> pd.DataFrame:
    """Per (network, corruption, severity, seed): ``value[mode condition] - value[mode reference]`` as column
    ``diff`` (:func:`bnstudy.study.inference.paired_differences`, its one missing-data rule)."""
    parts = []
    for key, g in df.groupby(_CELL, sort=False):
        if not {condition, reference} <= set(g["mode"]):
            continue
        d = paired_differences(g, value, "mode", condition, reference).rename("diff").reset_index()
        parts.append(d.assign(**dict(zip(_CELL, key))))
    cols = _CELL + ["seed", "diff"]
    return pd.concat(parts)[cols].reset_index(drop=True) if parts else pd.DataFrame(columns=cols)


def effects(df: pd.DataFrame) -> pd.DataFrame:
    """Per (network, corruption, severity, seed): ``cost`` (task A, ``train_mode - backbone_eval``: negative when
    train mode loses), ``benefit`` (task B, ``train_mode - backbone_eval``), ``net = benefit + cost`` (both
    differences summed) and the condition's ``mismatch_kl``."""
    cost = _pair(df, "task_a_after", "train_mode", "backbone_eval").rename(columns={"diff": "cost"})
    ben = _pair(df, "task_b", "train_mode", "backbone_eval").rename(columns={"diff": "benefit"})
    keys = _CELL + ["seed"]
    out = cost.merge(ben, on=keys)
    out["net"] = out["benefit"] + out["cost"]
    mm = df.groupby(keys)["mismatch_kl"].first().reset_index()
    return out.merge(mm, on=keys)


def condition_family(df: pd.DataFrame, network: str) -> Family:
    """The family of a network's conditions (every condition of the network is one comparison of the figures and
    counts over conditions): ``Family(m)`` with ``m`` the number of its (corruption, severity) conditions."""
    d = df[df["network"] == network]
    return Family(int(d[["corruption", "severity"]].drop_duplicates().shape[0]))


def effects_table(df: pd.DataFrame) -> pd.DataFrame:
    """Tidy: ``network, corruption, severity, effect, mean, ci_low, ci_high, n_seeds, confidence`` (effect:
    cost/benefit/net); intervals are the network's condition family's (:func:`condition_family`)."""
    e = effects(df)
    recs = []
    for key, g in e.groupby(_CELL, sort=False):
        conf = condition_family(df, key[0]).confidence
        for eff in ("cost", "benefit", "net"):
            iv = t_interval(g[eff], conf)
            recs.append(dict(zip(_CELL, key), effect=eff, mean=iv.mean, ci_low=iv.low, ci_high=iv.high,
                             n_seeds=iv.n, confidence=conf))
    return pd.DataFrame(recs)


def condition_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per (network, corruption, severity): the mismatch over seeds (``mismatch_kl``: the **median**, robust to
    the few seeds whose KL explodes; ``mismatch_kl_q25``/``_q75``: its quartiles; ``mismatch_kl_mean``), the
    cost's mean and family interval (``cost_lo``/``cost_hi``, :func:`condition_family`) and the mean
    ``benefit``."""
    e = effects(df)
    recs = []
    for key, g in e.groupby(_CELL, sort=False):
        iv = t_interval(g["cost"], condition_family(df, key[0]).confidence)
        kl = g["mismatch_kl"]
        recs.append(dict(zip(_CELL, key), mismatch_kl=float(kl.median()),
                         mismatch_kl_q25=float(kl.quantile(0.25)), mismatch_kl_q75=float(kl.quantile(0.75)),
                         mismatch_kl_mean=float(kl.mean()), cost=iv.mean, cost_lo=iv.low, cost_hi=iv.high,
                         benefit=float(g["benefit"].mean())))
    return pd.DataFrame(recs)


def per_seed_rho(df: pd.DataFrame) -> pd.DataFrame:
    """Per (network, seed): Spearman's rho over the conditions of that seed's mismatch and cost
    (:func:`bnstudy.study.inference.rank_correlation`; NaN with fewer than 4 conditions or a constant column).

    A seed that lacks one of its network's conditions, or has a missing mismatch or cost in one, gets NaN (the
    paired analysis then leaves it out) rather than a rho over fewer conditions than the other seeds'; a repeated
    (network, seed, condition) row raises ``ValueError``."""
    e = effects(df)
    cell = [c for c in _CELL if c in e.columns and c != "network"]
    dup = e.duplicated(["network", "seed", *cell])
    if dup.any():
        raise ValueError(f"per_seed_rho: {int(dup.sum())} repeated (network, seed, {', '.join(cell)}) rows; "
                         f"give each run once")
    n_cond = e.groupby("network", sort=False)[cell].apply(lambda g: len(g.drop_duplicates())) if cell else None
    recs = []
    for (net, seed), g in e.groupby(["network", "seed"], sort=False):
        complete = g[["mismatch_kl", "cost"]].notna().all(axis=None) and (n_cond is None or len(g) == n_cond[net])
        recs.append(dict(network=net, seed=seed,
                         rho=rank_correlation(g["mismatch_kl"], g["cost"])[0] if complete else float("nan")))
    return pd.DataFrame(recs, columns=["network", "seed", "rho"])


def accuracy_table(df: pd.DataFrame, config_reference: tuple) -> pd.DataFrame:
    """Tidy, at the reference condition: ``network, mode, metric, mean, ci_low, ci_high, n_seeds`` (95% t
    intervals of mean accuracies, not comparisons)."""
    ref = df[(df.corruption == config_reference[0]) & (df.severity == config_reference[1])]
    recs = []
    for (net, mode), g in ref.groupby(["network", "mode"], sort=False):
        for metric in ("task_a_before", "task_a_after", "task_b"):
            iv = t_interval(g[metric])
            recs.append(dict(network=net, mode=mode, metric=metric, mean=iv.mean, ci_low=iv.low, ci_high=iv.high,
                             n_seeds=iv.n))
    return pd.DataFrame(recs)


# --- claims -----------------------------------------------------------------------------------------------------

#: Chance accuracy (five classes) and the "about chance" line: task A at most 1.5x chance.
CHANCE = 1 / 5
CHANCE_LINE = 1.5 * CHANCE
#: The direction words of this page's verdicts (bnstudy.study.inference.decide), each naming the direction of the
#: compared quantity: task B ``train_mode - backbone_eval``; task A of ``train_mode`` minus 1.5x chance; task A of
#: ``train_mode`` after stage 2 minus before; the per-seed rank correlation of mismatch with the cost
#: (``train_mode - backbone_eval`` on task A, so a negative rho means a larger mismatch, a larger loss); and the
#: cost minus ``-margin`` (the loss of task A smaller or larger than a margin).
DIRECTIONS = ("train mode higher", "train mode lower", "above 1.5x chance", "below 1.5x chance",
              "higher after stage 2", "lower after stage 2", "larger mismatch, smaller loss",
              "larger mismatch, larger loss", "loss smaller than the margin", "loss larger than the margin")
_WORDS = {"f3": DIRECTIONS[0:2], "f2": DIRECTIONS[2:4], "drop": DIRECTIONS[4:6], "c1": DIRECTIONS[6:8],
          "loss": DIRECTIONS[8:10]}
#: The questions asked at every condition of every network (one family per network and question).
QUESTIONS = ("f2", "drop", "f3") + tuple(f"loss_{m:g}" for m in (MIN_EFFECT,) + MARGIN_SWEEP)


def _off_line(values, line: float) -> np.ndarray:
    """``values - line`` at the accuracy resolution (accuracies are counts over 300 held-out images), by
    :func:`bnstudy.study.inference.at_resolution` (the book's float tolerance for grid quantities), so that 0.3 - 90/300
    is 0, not a float artefact that a zero-spread sample would call a direction."""
    return at_resolution(np.asarray(values, dtype=float) - line)


def _decide(question: str, values, key: str, family: Family) -> Claim:
    hi, lo = _WORDS["loss" if question.startswith("loss") else question]
    margin = TIE_MARGIN if question == "f3" else None
    return decide(values, key, margin=margin, family=family, higher=hi, lower=lo)


def _question_values(cell: pd.DataFrame, question: str) -> np.ndarray:
    """The per-seed values one question tests at one (network, condition) cell of the run table."""
    tm = cell[cell["mode"] == "train_mode"].set_index("seed")
    if question == "f2":
        return _off_line(tm["task_a_after"], CHANCE_LINE)
    if question == "drop":
        return _off_line(tm["task_a_after"] - tm["task_a_before"], 0.0)
    if question == "f3":
        return paired_differences(cell, "task_b", "mode", "train_mode", "backbone_eval").to_numpy()
    margin = float(question.split("_", 1)[1])
    cost = paired_differences(cell, "task_a_after", "mode", "train_mode", "backbone_eval")
    return _off_line(cost, -margin)


def condition_claims(df: pd.DataFrame) -> pd.DataFrame:
    """Every question of :data:`QUESTIONS` at every condition of every network: the claims tables
    (:func:`bnstudy.study.inference.claims_table`, one per network and question: its family is the network's
    conditions, :func:`condition_family`; ``p_adjusted`` is Holm over them) stacked, with ``network, question,
    corruption, severity`` in front and ``p_less_adjusted`` / ``p_greater_adjusted``: the one-sided t tests'
    p-values (:func:`bnstudy.study.inference.one_sided_p`, mean below / above 0), Holm over the same conditions. ``f2``: task A of ``train_mode`` minus 1.5x chance; ``drop``: its task A
    after minus before; ``f3``: task B ``train_mode - backbone_eval`` (equivalence within
    :data:`TIE_MARGIN`); ``loss_<m>``: the cost (task A, ``train_mode - backbone_eval``) minus ``-m``."""
    parts = []
    for net, d in df.groupby("network", sort=False):
        fam = condition_family(df, net)
        cells = list(d.groupby(["corruption", "severity"], sort=False))
        for q in QUESTIONS:
            vals = [_question_values(g, q) for _, g in cells]
            t = claims_table([_decide(q, v, f"{c}_{s}", fam) for ((c, s), _), v in zip(cells, vals)])
            for alt in ("less", "greater"):  # the one-sided questions' counts (Holm over the conditions)
                t[f"p_{alt}_adjusted"] = holm([one_sided_p(v, alt) for v in vals])
            t.insert(0, "severity", [int(s) for (_, s), _ in cells])
            t.insert(0, "corruption", [c for (c, _), _ in cells])
            t.insert(0, "question", q)
            t.insert(0, "network", net)
            parts.append(t)
    return pd.concat(parts, ignore_index=True)


def condition_verdicts(df: pd.DataFrame, claims: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per (network, corruption, severity): ``mismatch_kl`` (median over seeds), ``task_a_train_mode`` (mean),
    ``task_b_<mode>`` (mean task-B accuracy of each mode run there), and for each question of
    :data:`QUESTIONS` (:func:`condition_claims`) its ``<question>_estimate, _low, _high, _n, _p_adjusted,
    _p_less_adjusted, _p_greater_adjusted, _verdict``. ``claims``: :func:`condition_claims`' table, if already computed."""
    claims = condition_claims(df) if claims is None else claims
    base = []
    for key, g in df.groupby(_CELL, sort=False):
        rec = dict(zip(_CELL, key), mismatch_kl=float(g.groupby("seed")["mismatch_kl"].first().median()),
                   task_a_train_mode=float(g.loc[g["mode"] == "train_mode", "task_a_after"].mean()))
        rec.update({f"task_b_{m}": float(g.loc[g["mode"] == m, "task_b"].mean())
                    for m in MODE_NAMES if m in set(g["mode"])})
        base.append(rec)
    out = pd.DataFrame(base)
    fields = ("estimate", "low", "high", "n", "p_adjusted", "p_less_adjusted", "p_greater_adjusted", "verdict")
    for q in QUESTIONS:
        c = claims[claims["question"] == q][_CELL + list(fields)]
        out = out.merge(c.rename(columns={f: f"{q}_{f}" for f in fields}), on=_CELL, how="left")
    return out


def _threshold(c: pd.DataFrame) -> tuple[str, pd.Series, pd.Series]:
    """Chapter 3's threshold question on one network's ``loss_<m>`` claims (:func:`condition_claims`, with the
    conditions' ``mismatch_kl``): (outcome, safe conditions' mismatch, harmful ones'). Safe: the loss of task A
    shown smaller than the margin, harmful: shown larger (each a one-sided question: one-sided t tests, Holm over
    the conditions). Outcomes: "one value
    separates them" (every safe condition's median mismatch below every harmful one's), "no single value
    separates them", "no condition shown harmful", and without a safe condition "no condition shown safe", with
    "(a loss already without corruption)" or "(a loss already at the lowest mismatch)" when that condition is
    harmful. A description of the counts, not a verdict."""
    safe = c[c["p_greater_adjusted"] < ALPHA]["mismatch_kl"]
    harm = c[c["p_less_adjusted"] < ALPHA]["mismatch_kl"]
    harmful = lambda rows: bool(len(rows)) and bool((rows["p_less_adjusted"] < ALPHA).all())  # noqa: E731
    if not len(safe):
        if harmful(c[c["corruption"] == "none"]):
            return "no condition shown safe (a loss already without corruption)", safe, harm
        if harmful(c.loc[[c["mismatch_kl"].idxmin()]]):
            return "no condition shown safe (a loss already at the lowest mismatch)", safe, harm
        return "no condition shown safe", safe, harm
    if not len(harm):
        return "no condition shown harmful", safe, harm
    return ("one value separates them" if safe.max() < harm.min() else "no single value separates them"), safe, harm


def _ci_text(iv: Interval) -> str:
    return f"{iv.mean:.3f} ({iv.confidence:.1%} interval {iv.low:.3f} to {iv.high:.3f})"


#: The verdict table's rows: (claim key, kind, claim as the chapter states it). Kinds: "chapter 1 finding",
#: "chapter 3 conclusion" (one family of comparisons at the reference, the number ``m_reference``), "over
#: conditions" (counts, Holm over a network's conditions) and "check" (an identity of the code, checked with ==).
CLAIMS = (
    ("f2", "chapter 1 finding", "in train_mode task A falls to about chance: task A minus 1.5x chance"),
    ("drop", "chapter 1 finding", "in train_mode task A falls: task A after stage 2 minus before"),
    ("f3", "chapter 1 finding", "pinning costs task B: task B train_mode minus backbone_eval"),
    ("c1", "chapter 3 conclusion", "the mismatch ranks the cost: per-seed Spearman rho of mismatch and the "
                                   "task-A difference train_mode minus backbone_eval"),
    ("f2_conditions", "over conditions", "task A minus 1.5x chance, at each condition"),
    ("f3_conditions", "over conditions", "task B train_mode minus backbone_eval, at each condition"),
    ("c2", "over conditions", "one mismatch value separates conditions that lose task A by less than 0.01 from "
                              "those that lose more"),
    ("f1", "check", "every frozen weight stays exactly unchanged"),
    ("pinned_keep_a", "check", "pinned modes keep task A exactly"),
    ("separate_exact", "check", "separate_stats keeps task A's logits bit-identical"),
    ("c3", "check", "separate_stats = train_mode on task B (shared forward) and = pinned on task A"),
    ("all_eval", "check", "all_eval = backbone_eval (linear heads, no BatchNorm)"),
)
#: The claims compared at the reference (the family of the verdict table), in :data:`CLAIMS`' order.
REFERENCE_CLAIMS = ("f2", "drop", "f3", "c1")

#: The identities of the code that one question each states (:func:`bnstudy.study.inference.ask`, exact checks per
#: network, ``== 0`` in every run): ``f1``, every frozen weight unchanged; ``pinned_keep_a``, the pinned modes'
#: task A after stage 2 minus before; ``separate_exact``, ``separate_stats``' largest change of task A's logits.
#: (``c3`` and ``all_eval`` pool two quantities into one check, which one question cannot: :func:`claims`.)
CHECK_QUESTIONS = (
    Question("f1_{network}", value="max_param_change", each=("network",), exact=0.0),
    Question("pinned_keep_a_{network}", value="task_a_change", at=dict(mode=("backbone_eval", "all_eval")),
             each=("network",), exact=0.0),
    Question("separate_exact_{network}", value="max_old_logit_change", at=dict(mode="separate_stats"),
             each=("network",), exact=0.0),
)


def _checked(df: pd.DataFrame, reference: tuple) -> pd.DataFrame:
    """``df`` after the checks every claim and number of the page needs (raises ``ValueError`` naming what is
    missing): runs at ``reference`` with all four modes, and at least 2 seeds."""
    ref = df[(df.corruption == reference[0]) & (df.severity == reference[1])]
    if ref.empty:
        raise ValueError(f"findings: no runs at the reference condition {reference}")
    missing = set(MODE_NAMES) - set(ref["mode"])
    if missing:
        raise ValueError(f"findings needs all four modes at the reference condition; missing {sorted(missing)}")
    if df["seed"].nunique() < 2:
        raise ValueError("findings needs at least 2 seeds")
    return ref


def claims(df: pd.DataFrame, reference: tuple) -> pd.DataFrame:
    """The verdict table's comparisons and checks (:data:`CLAIMS`), one claims table glued as
    ``ch07_<claim>_<network>_<field>``. The comparisons at the reference, :data:`REFERENCE_CLAIMS` per network, are
    one family (Holm over them): ``f2`` task A of ``train_mode`` minus 1.5x chance, ``drop`` its task A after minus
    before stage 2, ``f3`` task B ``train_mode - backbone_eval`` (equivalence within :data:`TIE_MARGIN`), ``c1``
    the per-seed rank correlation of mismatch and cost (:func:`per_seed_rho`). They stay the chapter's own
    (:func:`_decide`): their direction words (:data:`DIRECTIONS`) are not ``"<words> higher"``, three are one-sample
    tests against a line at the accuracy resolution and ``c1`` reads a derived per-seed table, and the one family
    spans all four, so no :class:`bnstudy.study.inference.Question` asks them. Then the checks: :data:`CHECK_QUESTIONS`,
    ``c3`` (``separate_stats``' task A after minus before, and its task B minus ``train_mode``'s per cell and seed)
    and ``all_eval`` (``all_eval - backbone_eval`` on task A and on task B), each pooling two quantities into one
    check. Raises ``ValueError`` without all four modes at the reference or with fewer than 2 seeds."""
    ref = _checked(df, reference)
    nets = tuple(dict.fromkeys(df["network"]))
    fam = Family(len(REFERENCE_CLAIMS) * len(nets))
    seed_rho = per_seed_rho(df)
    comparisons, checks = [], []
    for n in nets:
        r, d = ref[ref.network == n], df[df.network == n]
        comparisons += [_decide(q, _question_values(r, q), f"{q}_{n}", fam) for q in ("f2", "drop", "f3")]
        comparisons.append(_decide("c1", seed_rho.loc[seed_rho.network == n, "rho"], f"c1_{n}", fam))
        sep = d[d["mode"] == "separate_stats"]
        ae = d[d["mode"].isin(["all_eval", "backbone_eval"])]
        checks += [
            exact_check(np.concatenate([(sep["task_a_after"] - sep["task_a_before"]).to_numpy(),
                                        _pair(d, "task_b", "separate_stats", "train_mode")["diff"].to_numpy()]),
                        key=f"c3_{n}"),
            exact_check(np.concatenate([_pair(ae, m, "all_eval", "backbone_eval")["diff"].to_numpy()
                                        for m in ("task_a_after", "task_b")]), key=f"all_eval_{n}")]
    asked = ask(df.assign(task_a_change=df["task_a_after"] - df["task_a_before"]), CHECK_QUESTIONS, ALPHA)
    return pd.concat([claims_table(comparisons + checks), asked], ignore_index=True)


def cited(df: pd.DataFrame, reference: tuple, conditions: pd.DataFrame | None = None) -> pd.DataFrame:
    """The rows of :func:`condition_claims` the prose cites, as a claims table glued like :func:`claims` (their
    ``p_adjusted`` is Holm over the network's conditions): task B ``train_mode - backbone_eval`` at the reference
    (``f3_reference_<network>``) and at the condition of largest median mismatch (``f3_most_severe_<network>``).
    ``conditions``: :func:`condition_claims` of ``df`` if already computed."""
    conditions = condition_claims(df) if conditions is None else conditions
    cond, parts = condition_table(df), []
    for n in dict.fromkeys(df["network"]):
        f3 = conditions[(conditions.network == n) & (conditions.question == "f3")]
        c = cond[cond.network == n].reset_index(drop=True)
        top = c.loc[c["mismatch_kl"].idxmax()]  # median mismatch over seeds
        parts += [f3[(f3.corruption == reference[0]) & (f3.severity == reference[1])].assign(key=f"f3_reference_{n}"),
                  f3[(f3.corruption == top["corruption"]) & (f3.severity == top["severity"])].assign(
                      key=f"f3_most_severe_{n}")]
    return pd.concat(parts, ignore_index=True)[list(claims_table([]).columns)]


#: Numbers that are accuracies (printed in [0, 1]; ``f2_lowest_bound`` is a bound on task A) and differences of
#: accuracies or rank correlations (printed in [-1, 1]); other numbers have no printed range.
ACCURACY_FIELDS = ("task_a_source", "task_a_train_mode", "task_a_before", "task_b_clean_pinned", "task_b_clean_train",
                   "f2_lowest_bound")
DIFFERENCE_FIELDS = ("task_b_ref_minus_clean_pinned", "cost_none", "rho_cost", "rho_cost_mean_kl")


def _bounds(key: str) -> tuple[float, float]:
    return (0.0, 1.0) if key in ACCURACY_FIELDS else (-1.0, 1.0) if key in DIFFERENCE_FIELDS else (-math.inf, math.inf)


def findings(df: pd.DataFrame, reference: tuple, conditions: pd.DataFrame | None = None) -> pd.DataFrame:
    """Chapter 7's numbers table (:func:`bnstudy.study.inference.numbers_table`) from :func:`run`'s table;
    ``reference``: the config's ``(corruption, severity)``; ``conditions``: :func:`condition_claims` of ``df`` if
    already computed. Read one with :func:`bnstudy.study.inference.number`; glued as ``ch07_<key>`` (:func:`glued`).
    Every verdict is in :func:`claims` and :func:`cited` instead. Raises ``ValueError`` as :func:`claims` does.

    Its rows: the numbers and descriptions chapter 7's prose cites beside its claims (keys ending in
    ``_<network>``: per network). Scalars: ``n_seeds``, ``chance``, ``networks`` (comma-separated),
    ``reference`` (the condition in words), ``n_conditions`` (per network: the size of each family over
    conditions), ``m_reference`` (the family of the verdict table's comparisons), ``f2_lowest_bound`` (the lowest
    lower bound of ``train_mode``'s task A over every condition and network, at the family level),
    ``inversion_sentence``, ``example_pair`` (:func:`_example_pair`). Per network: ``task_a_source`` (stage 1),
    ``task_a_train_mode``, ``task_a_before`` (at the reference; 95% t intervals of mean accuracies);
    ``task_b_clean_pinned`` / ``task_b_clean_train`` (task B without corruption, ``backbone_eval`` /
    ``train_mode``) and ``task_b_ref_minus_clean_pinned`` (``backbone_eval``'s task B at the reference minus
    without corruption, paired within seed; 95%); ``cost_none`` (the cost without corruption, at the condition
    family's level); ``most_severe`` (the condition of largest median mismatch: task B there is
    :func:`cited`'s ``f3_most_severe_<network>``). Counts over the ``n_conditions`` conditions (Holm-adjusted p
    below 0.05, :func:`condition_claims`): ``f2_n_below`` / ``f2_n_above`` (task A shown below / above 1.5x
    chance, one-sided tests), ``f2_n_neither``, ``f2_n_mean_at_chance`` (a mean at most 1.5x chance: a point
    estimate, no test), ``f2_n_drop`` (task A shown lower after stage 2, one-sided); ``f3_n_higher`` /
    ``f3_n_lower`` (task B, train mode shown higher / lower), ``f3_n_equivalent`` (the others whose verdict is
    equivalent within :data:`TIE_MARGIN`), ``f3_n_not_decided``.
    Chapter 3: ``rho_cost`` (Spearman's rho of the conditions' median mismatch and mean cost) and ``rho_p_text``
    (its two-sided p, Holm over networks, as printed); ``rho_cost_mean_kl`` (the same on seed-mean mismatches);
    ``rho_within_text`` (mean over corruptions of rho within a corruption: no corruption and its severities) and
    ``rho_across_text`` (rho over corruptions at the highest severity), "not computable" below 4 points;
    ``kl_max_over_median`` (the largest ratio of one seed's mismatch to its condition's median);
    ``inversion_monotone``, ``inversion_nonmonotone_seeds``; at the margin :data:`MIN_EFFECT`: ``n_safe``,
    ``n_harm``, ``n_neither``, ``safe_max_kl``, ``harm_min_kl``, ``c2_threshold_separates`` (:func:`_threshold`'s
    outcome), ``c2_phrase`` (it in a sentence), ``lowest_condition``; ``c2_margin_002`` / ``_003``: the outcome at
    the margins :data:`MARGIN_SWEEP`.
    """
    ref = _checked(df, reference)
    nets = tuple(dict.fromkeys(df["network"]))
    conds = condition_claims(df) if conditions is None else conditions
    cond = condition_table(df)
    out: dict = defaultdict(dict)  # per network: out[<number>][<network>]
    rho_p = {}
    for n in nets:
        r, d = ref[ref.network == n], df[df.network == n]
        tm = r[r["mode"] == "train_mode"]
        out["task_a_source"][n] = t_interval(d.groupby("seed")["source_task_a_accuracy"].first())
        out["task_a_train_mode"][n] = t_interval(tm["task_a_after"])
        out["task_a_before"][n] = t_interval(tm["task_a_before"])
        none = d[d.corruption == "none"]
        pin_none = none[none["mode"] == "backbone_eval"].set_index("seed")["task_b"]
        pin_ref = r[r["mode"] == "backbone_eval"].set_index("seed")["task_b"]
        out["task_b_clean_pinned"][n] = t_interval(pin_none)
        out["task_b_clean_train"][n] = t_interval(none[none["mode"] == "train_mode"]["task_b"])
        out["task_b_ref_minus_clean_pinned"][n] = t_interval((pin_ref - pin_none.reindex(pin_ref.index)).dropna())
        cc = conds[conds.network == n]
        by_q = {q: cc[cc.question == q].reset_index(drop=True) for q in QUESTIONS}
        c = cond[cond.network == n].reset_index(drop=True)
        kl_of = c[["corruption", "severity", "mismatch_kl"]]
        f2, f3 = by_q["f2"], by_q["f3"]
        # one-sided questions "below 0" / "above 0": the one-sided tests' Holm p over the conditions
        out["f2_n_below"][n] = count_one_sided(f2, "less", ALPHA)
        out["f2_n_above"][n] = count_one_sided(f2, "greater", ALPHA)
        out["f2_n_neither"][n] = len(f2) - out["f2_n_below"][n] - out["f2_n_above"][n]
        out["f2_n_mean_at_chance"][n] = int((f2["estimate"] <= 0).sum())
        out["f2_n_drop"][n] = count_one_sided(by_q["drop"], "less", ALPHA)
        counts = count_verdicts(f3, ALPHA)
        out["f3_n_higher"][n], out["f3_n_lower"][n] = counts["higher"], counts["lower"]
        out["f3_n_equivalent"][n] = counts["equivalent"]
        out["f3_n_not_decided"][n] = len(f3) - counts["higher"] - counts["lower"] - counts["equivalent"]
        top = c.loc[c["mismatch_kl"].idxmax()]  # median mismatch over seeds
        out["most_severe"][n] = condition_label(top["corruption"], top["severity"])
        loss = by_q[f"loss_{MIN_EFFECT:g}"]
        at_none = loss[loss.corruption == "none"]
        out["cost_none"][n] = (Interval(float(at_none["estimate"].iloc[0]) - MIN_EFFECT,
                                        float(at_none["low"].iloc[0]) - MIN_EFFECT,
                                        float(at_none["high"].iloc[0]) - MIN_EFFECT, int(at_none["n"].iloc[0]),
                                        float(at_none["confidence"].iloc[0]))
                               if len(at_none) else Interval(math.nan, math.nan, math.nan, 0))
        # chapter 3, over every condition of this network (condition mismatch: the median over seeds)
        kl = d.groupby(["corruption", "severity", "seed"])["mismatch_kl"].first()
        kl_med = kl.groupby(level=[0, 1]).median()
        out["kl_max_over_median"][n] = float((kl.groupby(level=[0, 1]).max() / kl_med).max())
        rho, _, p = rank_correlation(c["mismatch_kl"], c["cost"])
        out["rho_cost"][n], rho_p[n] = rho, p
        out["rho_cost_mean_kl"][n] = rank_correlation(c["mismatch_kl_mean"], c["cost"])[0]
        within = [rank_correlation(g["mismatch_kl"], g["cost"])[0]
                  for g in (pd.concat([c[c.corruption == "none"], c[c.corruption == k]])
                            for k in c.corruption.unique() if k != "none")]
        within = [v for v in within if not math.isnan(v)]
        top_sev = c[c.severity == c.severity.max()]
        for k, v in (("rho_within_text", float(np.mean(within)) if within else math.nan),
                     ("rho_across_text", rank_correlation(top_sev["mismatch_kl"], top_sev["cost"])[0])):
            out[k][n] = "not computable (fewer than 4 points)" if math.isnan(v) else f"{v:.2f}"
        inv = c[c.corruption == "inversion"].sort_values("severity")["mismatch_kl"]
        out["inversion_monotone"][n] = ("not run" if len(inv) < 2 else
                                        "yes" if bool(np.all(np.diff(inv.to_numpy()) > 0)) else "no")
        per_seed = d[d.corruption == "inversion"].groupby(["seed", "severity"])["mismatch_kl"].first().unstack()
        out["inversion_nonmonotone_seeds"][n] = (int((np.diff(per_seed.to_numpy(), axis=1) <= 0).any(axis=1).sum())
                                                 if per_seed.shape[1] >= 2 else 0)
        loss = loss.merge(kl_of, on=["corruption", "severity"])
        c2, safe, harm = _threshold(loss)
        out["n_safe"][n], out["n_harm"][n] = len(safe), len(harm)
        out["n_neither"][n] = len(c) - len(safe) - len(harm)
        out["safe_max_kl"][n] = float(safe.max()) if len(safe) else math.nan
        out["harm_min_kl"][n] = float(harm.min()) if len(harm) else math.nan
        out["c2_threshold_separates"][n] = c2
        low = c.loc[c["mismatch_kl"].idxmin()]
        out["lowest_condition"][n] = (f"{condition_label(low['corruption'], low['severity'])} (median mismatch "
                                      f"{low['mismatch_kl']:.3g}, task-A difference {low['cost']:.3f}, "
                                      f"{low['cost_lo']:.3f} to {low['cost_hi']:.3f})")
        out["c2_phrase"][n] = _c2_phrase(c2, safe, harm, loss, out["lowest_condition"][n], out["cost_none"][n])
        for k, m in zip(("c2_margin_002", "c2_margin_003"), MARGIN_SWEEP):
            out[k][n] = _threshold(by_q[f"loss_{m:g}"].merge(kl_of, on=["corruption", "severity"]))[0]
    adj = dict(zip(rho_p, holm(list(rho_p.values()))))
    out["rho_p_text"] = {n: p_text(adj[n]) for n in nets}
    n_seeds = int(df["seed"].nunique())
    return numbers_table(dict(
        n_seeds=n_seeds, chance=CHANCE, networks=", ".join(nets), reference=condition_label(*reference),
        n_conditions=int(df[["corruption", "severity"]].drop_duplicates().shape[0]),
        m_reference=len(REFERENCE_CLAIMS) * len(nets),
        f2_lowest_bound=float(conds[conds.question == "f2"]["low"].min()) + CHANCE_LINE,
        inversion_sentence=_inversion_sentence(out, nets, n_seeds), example_pair=_example_pair(cond), **out),
        bounds=_bounds)


def networks_of(numbers: pd.DataFrame) -> list[str]:
    """The networks of a numbers table (:func:`findings`), in run order."""
    return number(numbers, "networks").split(", ")


def _c2_phrase(outcome: str, safe, harm, loss: pd.DataFrame, lowest: str, cost_none: Interval) -> str:
    """Chapter 3's threshold outcome in a sentence (never NaN)."""
    if len(safe) and len(harm):
        return (f"conditions shown to lose less than the margin reach a median mismatch of {safe.max():.3g}, those "
                f"shown to lose more start at {harm.min():.3g}")
    if outcome.endswith("(a loss already at the lowest mismatch)"):
        return f"no condition was shown safe, and the condition of lowest mismatch, {lowest}, loses more"
    if outcome.endswith("(a loss already without corruption)"):
        return (f"the data show harm, not a lack of seeds: drifting statistics change task A by {_ci_text(cost_none)} "
                f"already without corruption, when task B is merely other clean digits, and the condition of lowest "
                f"mismatch is {lowest}")
    if not len(safe):
        open_ = loss[~(loss["p_less_adjusted"] < ALPHA) & (loss["estimate"] > 0)]
        k = len(open_)
        return (f"no condition was shown safe; {k} undecided condition{'s' if k != 1 else ''} "
                f"ha{'ve' if k != 1 else 's'} a mean loss smaller than the margin, and the condition of lowest "
                f"mismatch is {lowest}")
    return "no condition was shown harmful"


def _inversion_sentence(out: dict, nets: tuple, n_seeds: int) -> str:
    mono = {n: out["inversion_monotone"][n] for n in nets}
    if all(v == "not run" for v in mono.values()):
        return "inversion was not run at two or more severities"
    run_nets = [n for n in nets if mono[n] != "not run"]
    seeds_txt = join([f"{out['inversion_nonmonotone_seeds'][n]} of {n_seeds} seeds for {_in_prose(n)}"
                      for n in run_nets])
    no = [n for n in run_nets if mono[n] == "no"]
    if len(no) == len(run_nets):
        head = "the median mismatch of inversion does not rise monotonically with severity on any network"
    elif not no:
        head = "the median mismatch of inversion rises monotonically with severity on every network"
    else:
        head = (f"the median mismatch of inversion does not rise monotonically with severity for "
                f"{join([_in_prose(n) for n in no])}")
    return f"{head}, and it fails to rise in {seeds_txt}"


def _example_pair(cond: pd.DataFrame) -> str:
    """A sentence naming two conditions of different corruptions with about the same median mismatch (within
    25%) and the largest difference in cost, over every network; "" when there is no such pair."""
    best = None
    for n, c in cond[cond.corruption != "none"].groupby("network", sort=False):
        rows = list(c.itertuples())
        for i, x in enumerate(rows):
            for y in rows[i + 1:]:
                if x.corruption == y.corruption or x.mismatch_kl <= 0 or y.mismatch_kl <= 0:
                    continue
                if max(x.mismatch_kl, y.mismatch_kl) / min(x.mismatch_kl, y.mismatch_kl) > 1.25:
                    continue
                lo, hi = (x, y) if abs(x.cost) < abs(y.cost) else (y, x)
                if best is None or abs(hi.cost - lo.cost) > abs(best[2].cost - best[1].cost):
                    best = (n, lo, hi)
    if best is None:
        return ""
    n, lo, hi = best
    return (f"on {_in_prose(n)}, {condition_label(lo.corruption, lo.severity)} moves the statistics about as "
            f"much as {condition_label(hi.corruption, hi.severity)} (median mismatch {lo.mismatch_kl:.2f} against "
            f"{hi.mismatch_kl:.2f}) but changes task A by {lo.cost:.3f} ({lo.cost_lo:.3f} to {lo.cost_hi:.3f}) "
            f"against {hi.cost:.3f} ({hi.cost_lo:.3f} to {hi.cost_hi:.3f})")


#: Numbers that are sentences or numbers as text: glued as plain Markdown (:func:`glued`), not bold like verdict
#: words.
PLAIN_FIELDS = ("inversion_sentence", "example_pair", "c2_phrase", "lowest_condition", "rho_p_text",
                "rho_within_text", "rho_across_text", "c2_threshold_separates", "c2_margin_002", "c2_margin_003",
                "most_severe", "reference", "inversion_monotone")


def claim_intervals(claims: pd.DataFrame, claim: str) -> dict:
    """``{network: Interval}`` of one claim of :data:`REFERENCE_CLAIMS` (e.g. ``"c1"`` for the mismatch figure's
    titles), from :func:`claims`' table."""
    rows = claims[claims["key"].str.startswith(claim + "_")]
    return {k[len(claim) + 1:]: Interval(e, lo, hi, int(n), conf)
            for k, e, lo, hi, n, conf in zip(rows["key"], rows["estimate"], rows["low"], rows["high"], rows["n"],
                                             rows["confidence"])}


def verdict_table(claims: pd.DataFrame, numbers: pd.DataFrame) -> pd.DataFrame:
    """Tidy verdict table: ``kind, claim, network, verdict, value, ci_low, ci_high, detail`` (``verdict``: a
    claim's of :func:`claims`, "" for rows over conditions; ``detail``: the counts over conditions or the
    threshold outcome, from :func:`findings`' ``numbers``; kind "check": an identity of the code checked with
    ``==``, not a finding)."""
    c = claims.set_index("key")
    x = lambda key, n: number(numbers, f"{key}_{n}")  # noqa: E731
    k = number(numbers, "n_conditions")
    recs = []
    for key, kind, stated in CLAIMS:
        for n in networks_of(numbers):  # networks, in run order
            rec = dict(kind=kind, claim=stated, network=n, verdict="", value=math.nan, ci_low=math.nan,
                       ci_high=math.nan, detail="", key=key)
            if key == "f2_conditions":
                rec["detail"] = (f"below 1.5x chance at {x('f2_n_below', n)}, above at {x('f2_n_above', n)}, neither "
                                 f"at {x('f2_n_neither', n)} of {k}; lower after stage 2 at {x('f2_n_drop', n)}")
            elif key == "f3_conditions":
                rec["detail"] = (f"train mode higher at {x('f3_n_higher', n)}, lower at {x('f3_n_lower', n)}, "
                                 f"equivalent within ±{TIE_MARGIN:g} at {x('f3_n_equivalent', n)}, not decided at "
                                 f"{x('f3_n_not_decided', n)} of {k}")
            elif key == "c2":
                rec["detail"] = (f"{x('c2_threshold_separates', n)}: {x('n_safe', n)} shown to lose less, "
                                 f"{x('n_harm', n)} more, {x('n_neither', n)} neither")
            else:
                r = c.loc[f"{key}_{n}"]
                rec.update(verdict=r["verdict"], value=r["estimate"])
                if kind != "check":
                    rec.update(ci_low=r["low"], ci_high=r["high"])
            recs.append(rec)
    return pd.DataFrame(recs)[["kind", "claim", "network", "verdict", "value", "ci_low", "ci_high", "detail", "key"]]


def rows_from(provenance: dict) -> dict:
    """The record of analysed rows' origin for the run line and sidecars, from
    :func:`bnstudy.study.report.load_rows`' provenance: ``git_commit, written, sha256`` (first 12 hex digits)."""
    return dict(git_commit=provenance.get("git_commit"), written=provenance.get("written"),
                sha256=str(provenance.get("sha256"))[:12])


def origin_sentence(df: pd.DataFrame, profile: str, provenance: dict | None = None,
                    run_wall_s: float | None = None) -> str:
    """Markdown saying where the page's rows came from and what they cost.

    ``provenance``: :func:`bnstudy.study.report.load_rows`' (rows analysed again), or ``None`` (rows computed by this
    page's run, which took ``run_wall_s`` seconds of wall time, or ``None`` if not timed). ``df``'s ``wall_s``
    (each (network, seed) group's wall time spread over its rows) sum to the worker time.
    """
    worker_min = float(df["wall_s"].sum()) / 60
    units = f"the {len(df):,} runs' own times sum to {worker_min:.0f} worker-minutes"
    if provenance is None:
        wall = ("was not timed" if run_wall_s is None else
                f"took {run_wall_s / 60:.1f} minutes of wall time (runs found in the run cache are read, not "
                f"recomputed)")
        return f"The rows on this page were computed by this page's own run of the experiment, which {wall}; {units}."
    when = str(provenance.get("written") or "at an unrecorded time").replace("T", " ").replace("+00:00", " UTC")
    w = provenance.get("run_wall_s")
    wall = ("That run's wall time is not recorded in its sidecar" if w is None else
            f"That run took {float(w) / 60:.1f} minutes of wall time")
    return (f"The rows on this page were not computed for it: they are those of the {profile}-profile run at git "
            f"commit {provenance.get('git_commit', 'unknown')}, whose table was written {when} (sha256 "
            f"{str(provenance.get('sha256'))[:12]}, checked against its sidecar), analysed again at this page's "
            f"commit (the run line above). {wall}; {units}.")


#: The outcome of tests/test_audit_torchvision.py's all-models test per torchvision classification model
#: (issue 15's closing run: pytest -m torchvision_all plus the same ``audit_outcome`` from a script).
AUDIT_OUTCOMES = __import__("pathlib").Path(__file__).parent.with_name("torchvision_audit_outcomes.csv")


def audit_counts(path=AUDIT_OUTCOMES) -> dict:
    """Counts of the audit's outcomes over every torchvision classification model, read from ``path`` (CSV
    ``model, outcome``): ``models, caught, clean, failed, no_norm, not_run, run`` (ints). Raises ``ValueError``
    naming an outcome outside caught / clean / failed / no norm / not run (...)."""
    t = pd.read_csv(path)
    kind = t["outcome"].str.replace(r"^not run.*", "not run", regex=True)
    bad = set(kind) - {"caught", "clean", "failed", "no norm", "not run"}
    if bad:
        raise ValueError(f"audit_counts: unknown outcomes {sorted(bad)} in {path}")
    k = kind.value_counts()
    out = dict(models=len(t), caught=int(k.get("caught", 0)), clean=int(k.get("clean", 0)),
               failed=int(k.get("failed", 0)), no_norm=int(k.get("no norm", 0)), not_run=int(k.get("not run", 0)))
    out["run"] = out["caught"] + out["clean"] + out["failed"]
    return out


#: Readable names of torchvision models the page names (others are printed as torchvision spells them).
MODEL_LABELS = {"regnet_y_128gf": "RegNetY-128GF", "vit_h_14": "ViT-H/14"}


def severities_text(df: pd.DataFrame) -> str:
    """The corruption severities the rows ran (severity 0, no corruption, left out), as prose: "1, 3 and 5"."""
    vals = [str(int(v)) for v in sorted(set(df["severity"])) if v > 0]
    return join(vals) if vals else "none"


def audit_not_run_sentence(path=AUDIT_OUTCOMES) -> str:
    """Markdown naming the models of the outcomes file that were not run and why (the file's own words), or
    saying that every model with a norm layer was run."""
    t = pd.read_csv(path)
    nr = t[t["outcome"].str.startswith("not run")]
    if nr.empty:
        return "Every other model was run."
    items = [f"{MODEL_LABELS.get(m, m)} ({o.removeprefix('not run').strip().strip('()')})"
             for m, o in zip(nr["model"], nr["outcome"])]
    k = len(items)
    return f"{'One model was' if k == 1 else f'{k} models were'} not run: {'; '.join(items)}."


# --- printed ranges, the answer box and the figures' takeaways (issue 25) ------------------------------------------
# What a printed interval may span (Interval.clipped): the tests use the unclipped intervals.

#: Per reference claim, the range its quantity allows: task A minus 1.5x chance lies in [-0.3, 0.7], differences
#: of accuracies and rank correlations in [-1, 1] (also every other claim's).
CLIP = {"f2": (-CHANCE_LINE, 1 - CHANCE_LINE), "drop": (-1.0, 1.0), "f3": (-1.0, 1.0), "c1": (-1.0, 1.0)}


def printed_claims(claims: pd.DataFrame) -> pd.DataFrame:
    """A copy of a claims table with its interval ends cut to what each claim's quantity allows (:data:`CLIP`, by
    the key's first word; anything else [-1, 1]), for gluing; the claims keep the raw ones."""
    out = claims.copy()
    stem = out["key"].str.split("_").str[0]
    for col in ("low", "high"):
        out[col] = [v if v != v else min(max(float(v), CLIP.get(s, (-1.0, 1.0))[0]), CLIP.get(s, (-1.0, 1.0))[1])
                    for v, s in zip(out[col], stem)]
    return out


def _plain(key: str) -> bool:
    return any(key == f or key.startswith(f + "_") for f in PLAIN_FIELDS)


def glued(claims: pd.DataFrame, numbers: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """What :func:`bnstudy.study.pages.glue_chapter` glues for the page: ``(claims, numbers, words)``: the claims with
    printed ends (:func:`printed_claims`); the numbers table without its texts of :data:`PLAIN_FIELDS`, each plain
    number cut to what its quantity allows (``f2_lowest_bound`` to [0, 1]; intervals are cut by ``glue_numbers``);
    and those texts as ``{key: text}``, glued plain (not bold as a short text of the numbers table would be)."""
    plain = numbers["key"].map(_plain)
    nums = numbers[~plain].copy()
    cut = nums["n"].isna() & nums["value"].map(lambda v: isinstance(v, float) and v == v) & \
        np.isfinite(nums["lowest"].astype(float))
    nums.loc[cut, "value"] = [min(max(v, lo), hi) for v, lo, hi in
                              zip(nums.loc[cut, "value"], nums.loc[cut, "lowest"], nums.loc[cut, "highest"])]
    return printed_claims(claims), nums, dict(zip(numbers.loc[plain, "key"], numbers.loc[plain, "value"]))


def _verdicts_by_network(claims: pd.DataFrame, key: str, nets) -> str:
    return join([f"{verdict_md(claim(claims, f'{key}_{n}'))} for {_in_prose(n)}" for n in nets])


def answer(claims: pd.DataFrame, numbers: pd.DataFrame) -> str:
    """The answer box's outcome sentences (Markdown, glued as ``ch07_answer``), built from :func:`claims` and
    :func:`findings` so that they are true for any rows: task A after the one-line freeze per network, and the
    verdicts at the reference on task A against 1.5x chance, task A after minus before stage 2, task B and the
    mismatch's ranking of the cost."""
    x, nets = (lambda key: number(numbers, key)), networks_of(numbers)  # noqa: E731
    left = join([f"{x(f'task_a_train_mode_{n}').mean:.3f} with {_in_prose(n)} (from {x(f'task_a_source_{n}').mean:.3f})"
                 for n in nets])
    return (f"On scikit-learn's handwritten digits, after the one-line freeze (`train_mode`) task A is left at {left}; "
            f"chance is {x('chance'):.2f}. At the reference corruption ({x('reference')}), task A after stage 2 minus "
            f"1.5 times chance reads {_verdicts_by_network(claims, 'f2', nets)}, and task A after minus before stage 2 "
            f"reads {_verdicts_by_network(claims, 'drop', nets)}. On task B, `train_mode` minus the pinned "
            f"backbone reads {_verdicts_by_network(claims, 'f3', nets)}. Over every corruption and severity, "
            f"chapter 3's statistics mismatch against the cost of train mode reads "
            f"{_verdicts_by_network(claims, 'c1', nets)}.")


def _fell(c: pd.DataFrame, f: pd.DataFrame) -> list[str]:
    """The networks whose task A is shown to fall at the reference (``drop_<network>`` lower)."""
    return [n for n in networks_of(f) if claim(c, f"drop_{n}").kind == "lower"]


#: The answer box's advice in parts, each a rule on the claims (``c``) and numbers (``f``) tables and a fixed
#: sentence (:class:`bnstudy.study.words.Note`; exactly one of each key holds): ``fell``, where task A is shown to fall;
#: ``pin_keeps_a``, whether the check ``pinned_keep_a`` is exact on every network.
NOTES = (
    Note("fell", lambda c, f: bool(_fell(c, f)), "Turning off gradients does not keep task A on {networks}: ",
         lambda c, f: dict(networks=join([_in_prose(n) for n in _fell(c, f)]))),
    Note("fell", lambda c, f: not _fell(c, f), "Task A was not shown to fall on any network here, but the one-line "
                                               "freeze still rewrites every BatchNorm layer's statistics: "),
    Note("pin_keeps_a", lambda c, f: all(claim(c, f"pinned_keep_a_{n}").kind == "exact" for n in networks_of(f)),
         "keeps task A exactly on every network here (a check of the code)"),
    Note("pin_keeps_a", lambda c, f: not all(claim(c, f"pinned_keep_a_{n}").kind == "exact" for n in networks_of(f)),
         "should keep task A exactly, yet in some run here it did not (the checks below)"),
)


def what_to_do(claims: pd.DataFrame, numbers: pd.DataFrame) -> str:
    """The answer box's advice (Markdown, glued as ``ch07_what_to_do``), worded by the :data:`NOTES`: where task A
    is shown to fall on some network, the one-line freeze is not enough; the pin's exactness is the check
    ``pinned_keep_a``."""
    said = notes(NOTES, claims, numbers)
    return (said["fell"] + "set `requires_grad_(False)` and pin the backbone in eval mode with "
            f"`bnstudy.pin_eval(model.backbone)`, which {said['pin_keeps_a']}; wrap the first epoch in "
            "`bnstudy.FreezeAudit` to see what moved.")


def figure_takeaways(claims: pd.DataFrame, numbers: pd.DataFrame) -> dict[str, str]:
    """The data-dependent takeaway of each figure's caption (glued as ``ch07_<name>``): ``accuracy_takeaway``
    (task A after minus before stage 2), ``effects_takeaway`` (task B over the conditions, the book's counts) and
    ``mismatch_takeaway`` (the rank correlation's verdicts)."""
    x, nets = (lambda key: number(numbers, key)), networks_of(numbers)  # noqa: E731
    counts = join([f"higher at {x(f'f3_n_higher_{n}')}, lower at {x(f'f3_n_lower_{n}')} of {x('n_conditions')} "
                   f"conditions for {_in_prose(n)}" for n in nets])
    return dict(
        accuracy_takeaway=("Takeaway: task A under `train_mode`, after minus before stage 2, reads "
                           f"{_verdicts_by_network(claims, 'drop', nets)}."),
        effects_takeaway=f"Takeaway: on task B, train mode is shown {counts} (Holm over each network's conditions).",
        mismatch_takeaway=("Takeaway: the per-seed rank correlation of mismatch and cost reads "
                           f"{_verdicts_by_network(claims, 'c1', nets)}."),
    )
