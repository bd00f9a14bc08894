"""Chapter 5, what is claimed: the claims tables (:mod:`bnstudy.study.inference`), the flat numbers table the page glues
beside them (:func:`bnstudy.study.inference.numbers_table`), the tidy tables they are computed from and the sentences the
data choose (:data:`NOTES`, :func:`page_words`).

:func:`findings` takes :func:`.run.run`'s tables (or the saved ones: :func:`.run.diag_from_tables`).
"""

from __future__ import annotations

import dataclasses
import math
import numpy as np
import pandas as pd
from ...inference import NOT_DECIDED, TOO_FEW, Claim, Family, Question, ask, claims_table, decide, holm, number, \
    numbers_table, one_sided_p, rank_correlation, t_interval, tost_p, two_sided_p
from ...words import Note, notes
from ...config import STRATEGY_NORM
from .run import BN_STRATEGIES, CONTENDERS, PER_SAMPLE_STRATEGIES, STRATEGY_LABELS, Config, best_rate_table, \
    chosen_factors, noise_table, precise_table

#: Wu & Johnson (2021)'s range for the samples precise BN needs.
CLAIM_RANGE = (1e3, 1e4)
#: The per-sample-norm control of the difference-in-differences break criterion (no batch statistics).
CONTROL = "group_pretrained"
#: The sensitivity margin of the controlled break verdict below the reference (``breaks_stats_wide``).
WIDE_MARGIN = 0.05
#: Strategies that compute no batch statistics: their break against the control is "n/a" (it is a difference between
#: two per-sample norms, not a batch-statistics effect).
NO_BATCH_STATISTICS = ("to_group", "to_layer", "group_pretrained", "layer_pretrained")
#: A cell whose accuracy a one-sided t test (Holm over the table's cells) does not place above chance + this is "near
#: chance": rankings there are meaningless (:func:`near_chance_cells`).
NEAR_CHANCE = 0.06
#: The page's direction words, condition minus reference per seed (:func:`bnstudy.study.inference.decide`'s ``higher`` and
#: ``lower``): best per-sample norm minus BatchNorm (``ps``), AdaBN minus inherited frozen statistics (``adabn``), the
#: winner minus the runner-up (``winner``), BN in train mode's accuracy measured in train mode minus eval mode
#: (``gap``), re-estimated running statistics minus those fine-tuning left (``restat``), the deepest layer's spread of
#: the batch mean minus the largest other layer's (``noise``), a strategy's accuracy at the smallest batch size minus
#: at the reference (``drop``) and the same minus the control's (``did``, :data:`CONTROL`).
WORDS = {"ps": ("per-sample norm higher", "per-sample norm lower"), "adabn": ("AdaBN higher", "AdaBN lower"),
         "winner": ("winner higher", "winner lower"),
         "gap": ("train-mode accuracy higher", "train-mode accuracy lower"),
         "restat": ("re-estimated higher", "re-estimated lower"),
         "noise": ("deepest layer noisier", "deepest layer less noisy"),
         "drop": ("higher at the smallest batch", "lower at the smallest batch"),
         "did": ("higher beyond the control", "lower beyond the control")}
#: Every direction word the page may print (:func:`bnstudy.study.inference.is_verdict`).
DIRECTIONS: tuple[str, ...] = tuple(w for pair in WORDS.values() for w in pair)
#: The overall level of every family of claims (:class:`bnstudy.study.inference.Family`) and of the Holm counts.
ALPHA = 0.05
#: Precise BN's statistics are "close enough" when their mean error is below this (population SDs for the mean,
#: absolute log ratio for the variance): 1% of the population scale.
STAT_TOLERANCE = 0.01


def page_values(config: Config, f: pd.DataFrame, runs: pd.DataFrame, tune: pd.DataFrame,
                tuned: pd.DataFrame | None = None) -> dict:
    """The settings and costs the page cites beside its findings (glued as ``ch05_<name>``): worker-minutes
    the fine-tuning runs measured (``wall_s``; main grid, learning-rate check and its share, tuned-rate runs), the
    check's sizes, AdaBN's settings, samples, steps and learning rates at the smallest and largest batch size, the
    base rate, the sensitivity margin, the number of strategy/target pairs and precise BN's source-minus-exact
    accuracy."""
    tuned = tuned if tuned is not None and len(tuned) else pd.DataFrame({"wall_s": []})
    sb, lb = number(f, "smallest_batch"), number(f, "largest_batch")
    return dict(main_cpu_min=float(runs.wall_s.sum()) / 60, tune_cpu_min=float(tune.wall_s.sum()) / 60,
                tuned_cpu_min=float(tuned.wall_s.sum()) / 60, n_tuned_runs=len(tuned), base_lr=config.base_lr,
                wide_margin=WIDE_MARGIN, n_pairs=int(runs.groupby(["target_name", "strategy"]).ngroups),
                precise_source_gap=number(f, "precise_source_acc") - number(f, "precise_exact_acc"),
                tune_share=float(tune.wall_s.sum() / runs.wall_s.sum()), n_tune_seeds=len(config.tune_seeds),
                n_lr_factors=len(config.lr_factors), lr_factor_low=min(config.lr_factors),
                lr_factor_high=max(config.lr_factors), adabn_batch_size=config.adabn_batch_size,
                adabn_samples=config.adabn_samples, samples=config.samples,
                steps_smallest=config.samples // sb, steps_largest=config.samples // lb,
                lr_smallest=config.lr_for(sb), lr_largest=config.lr_for(lb),
                stage1_steps=config.stage1_steps, near_chance_margin=NEAR_CHANCE)

def page_numbers(config: Config, f: pd.DataFrame, runs: pd.DataFrame, tune: pd.DataFrame,
                 tuned: pd.DataFrame | None = None) -> pd.DataFrame:
    """The page's whole numbers table: :func:`findings`' ``f`` and the :func:`page_values` beside it, one flat
    table (glued as ``ch05_<key>``)."""
    return pd.concat([f, numbers_table(page_values(config, f, runs, tune, tuned))], ignore_index=True)


def _ci_long(df, by, metrics):
    recs = []
    for key, g in df.groupby(by, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        for m in metrics:
            iv = t_interval(g[m])
            recs.append(dict(zip(by, key), metric=m, mean=iv.mean, ci_low=iv.low, ci_high=iv.high,
                             sd=float(np.std(g[m], ddof=1)) if len(g) > 1 else 0.0, n_seeds=iv.n))
    return pd.DataFrame(recs)


def accuracy_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per target, strategy and batch size: mean, 95% interval and SD over seeds of ``target``,
    ``task_a_after``, ``train_eval_gap`` (long: ``target_name, strategy, batch_size, metric, ...``), with
    ``diverged_runs`` (runs with a non-finite loss in the cell: a zero-width interval there is runs stuck at
    chance, not certainty)."""
    by = ["target_name", "strategy", "batch_size"]
    out = _ci_long(df, by, ["target", "task_a_after", "train_eval_gap"])
    if "diverged" in df:
        out = out.merge(df.groupby(by)["diverged"].sum().astype(int).rename("diverged_runs").reset_index(), on=by)
    return out


def tradeoff_table(df: pd.DataFrame, batch_sizes) -> pd.DataFrame:
    """Retention against adaptation: mean and interval of ``target`` and ``task_a_after`` per target, strategy
    and batch size in ``batch_sizes`` (wide: ``target_mean, target_lo, target_hi, retention_mean, ...``)."""
    recs = []
    for (t, s, b), g in df[df.batch_size.isin(batch_sizes)].groupby(["target_name", "strategy", "batch_size"]):
        a, r = t_interval(g["target"]), t_interval(g["task_a_after"])
        recs.append(dict(target_name=t, strategy=s, batch_size=b, target_mean=a.mean, target_lo=a.low,
                         target_hi=a.high, retention_mean=r.mean, retention_lo=r.low, retention_hi=r.high))
    return pd.DataFrame(recs)


def mismatch_table(df: pd.DataFrame, batch_size: int, baseline: str = "stats_frozen") -> pd.DataFrame:
    """Per seed, target and strategy at ``batch_size``: the mismatch before fine-tuning and the paired
    target-accuracy difference to ``baseline`` (``advantage``)."""
    d = df[df.batch_size == batch_size]
    base = d[d.strategy == baseline].set_index(["seed", "target_name"])["target"]
    out = d[d.strategy != baseline][["seed", "target_name", "strategy", "mismatch_kl", "target"]].copy()
    out["advantage"] = out["target"].to_numpy() - base.loc[list(zip(out.seed, out.target_name))].to_numpy()
    return out.reset_index(drop=True)


# --- findings -----------------------------------------------------------------------------------------------------

def break_batch(df: pd.DataFrame, target: str, strategy: str, reference: int, margin: float,
                confidence: float = 0.95, control: str | None = None, side: str = "below") -> tuple[int, dict]:
    """The batch size nearest ``reference`` on ``side`` (``"below"``: largest smaller, ``"above"``: smallest
    larger; 0: none) from which on ``strategy`` breaks on ``target``.

    Breaks at ``m``: the paired per-seed difference ``target(m) - target(reference)`` (with ``control``: the
    difference-in-differences ``[strategy(m) - strategy(ref)] - [control(m) - control(ref)]``, paired within
    seed, so a drop the control shares is not a break) has the upper end of its family interval
    (:class:`bnstudy.study.inference.Family` of the ``k`` batch sizes tested on that side, Bonferroni at
    ``1 - (1 - confidence) / k``; :func:`bnstudy.study.inference.t_interval`) below ``-margin``. A break further from
    the reference counts only if every batch size beyond it also breaks (the verdict is "from m on"). Also
    returns ``{m: Interval}`` of those differences (family intervals; NaN ends with fewer than two seeds, never
    a break). Raises ``ValueError`` for a bad ``side``.
    """
    diffs = break_differences(df, target, strategy, reference, control, side)
    sizes = sorted(diffs)
    family = Family(max(len(sizes), 1), 1 - confidence)
    ivs = {m: t_interval(diffs[m], family.confidence) for m in sizes}
    broken = {m for m, iv in ivs.items() if iv.high < -margin}
    # walk away from the reference: the threshold is the nearest m from which every further m breaks
    order = sorted(sizes, reverse=(side == "below"))
    for i, m in enumerate(order):
        if all(k in broken for k in order[i:]):
            return m, ivs
    return 0, ivs


def break_differences(df: pd.DataFrame, target: str, strategy: str, reference: int, control: str | None = None,
                      side: str = "below") -> dict:
    """``{m: per-seed differences}`` that :func:`break_batch` judges: ``target(m) - target(reference)`` of
    ``strategy`` on ``target`` (with ``control``: minus the control's, paired within seed) for every batch size
    ``m`` on ``side`` of the reference. Raises ``ValueError`` for a bad ``side``."""
    if side not in ("below", "above"):
        raise ValueError(f"side must be 'below' or 'above', got {side!r}")
    d = df[df.target_name == target]
    piv = d[d.strategy == strategy].pivot(index="seed", columns="batch_size", values="target")
    if control is not None and control != strategy:
        cp = d[d.strategy == control].pivot(index="seed", columns="batch_size", values="target")
        piv = (piv - cp).dropna()
    elif control is not None:
        piv = piv * 0.0
    sizes = sorted(b for b in piv.columns if (b < reference if side == "below" else b > reference))
    return {m: piv[m] - piv[reference] for m in sizes}


def _smallest_family(name: str, items: dict, words: str, smallest: int) -> pd.DataFrame:
    """The claims on the differences at the ``smallest`` batch size of ``items`` ``{key: break_differences}``,
    each decided at its break verdict's level (:func:`break_batch`'s family: the batch sizes below the
    reference, Bonferroni at 95%), with this page's words :data:`WORDS` ``[words]``; family ``name``."""
    higher, lower = WORDS[words]
    return claims_table([decide(d[smallest], k, family=Family(max(len(d), 1), 1 - 0.95), higher=higher, lower=lower)
                         for k, d in items.items()], family=name)


def break_word(m: int, side: str = "below") -> str:
    """The threshold token for a break batch: ``"never"``, ``"<= m"`` (below) or ``">= m"`` (above)."""
    return "never" if m == 0 else (f"<= {m}" if side == "below" else f">= {m}")


def _decide(values, key: str, words: str, family: Family, margin: float | None = None) -> Claim:
    """:func:`bnstudy.study.inference.decide` with this page's direction words :data:`WORDS` ``[words]``."""
    higher, lower = WORDS[words]
    return decide(values, key, margin=margin, family=family, higher=higher, lower=lower)


#: The page's comparisons that are questions as data (:func:`bnstudy.study.inference.ask`; every difference condition
#: minus reference per seed, of the target accuracy, between two strategies; :func:`_asked` adds the run's levels):
#: ``adabn_vs_frozen_<target>_b<m>``, AdaBN minus inherited frozen statistics at the smallest and reference batch
#: sizes; ``rate_<target>_<contender>_<base|tuned>``, each per-sample contender minus BN in train mode at the
#: smallest batch size, at the linear-scaling rate (table ``base``) and at the tuned rates (``tuned``,
#: :func:`rate_comparison`); ``gap_zero_elsewhere``, the exact check that every strategy but BN in train mode has a
#: train/eval gap ``== 0`` in every run (an identity of the code). The other families compare strategies the data
#: choose (the best, the winner: :func:`bn_vs_per_sample`, :func:`winners`), one strategy's two columns (``gap``,
#: ``restat``), layers (``noise``) or batch sizes at a break's own level (``drop``, ``did``, ``lr_did``:
#: :func:`_smallest_family`), which a :class:`~bnstudy.study.inference.Question` does not express.
_BY_STRATEGY = dict(value="target", by="strategy")
#: The per-sample contenders of the rate comparison (:func:`rate_comparison` asks those present).
PS_CONTENDERS = tuple(s for s in CONTENDERS if s != "bn_train")
ADABN_QUESTION = Question("adabn_vs_frozen_{target_name}_b{batch_size}", "adabn", "stats_frozen",
                          each=("target_name", "batch_size"), words="AdaBN", **_BY_STRATEGY)
RATE_QUESTIONS = tuple(Question(f"rate_{{target_name}}_{{condition}}_{tag}", PS_CONTENDERS, "bn_train",
                                each=("target_name",), table=tag, words="per-sample norm", **_BY_STRATEGY)
                       for tag in ("base", "tuned"))
CHECK_QUESTION = Question("gap_zero_elsewhere", value="train_eval_gap", exact=0.0)


def _asked(name: str, tables, questions, alpha: float = ALPHA, at: dict | None = None,
           fill: dict | None = None) -> pd.DataFrame:
    """One family of claims from :func:`bnstudy.study.inference.ask`, with a first column ``family`` = ``name``: the
    ``questions`` with the run's levels ``at`` added to their selections and the fields ``fill`` (e.g. the
    contenders present as ``condition``) replaced."""
    qs = [dataclasses.replace(q, at={**q.at, **(at or {})}, **(fill or {})) for q in questions]
    return ask(tables, qs, alpha, family=name)


def _family(name: str, items: dict, words: str, alpha: float = ALPHA) -> pd.DataFrame:
    """One family of claims: ``items`` ``{key: per-seed differences}`` printed together, decided at
    ``Family(len(items), alpha)`` (:func:`_decide`), as a claims table (Holm within the family) with a first
    column ``family`` = ``name`` (:func:`bnstudy.study.inference.claims_table`'s ``family``)."""
    fam = Family(max(len(items), 1), alpha)
    return claims_table([_decide(v, k, words, fam) for k, v in items.items()], family=name)


def near_chance_cells(df: pd.DataFrame, chance: float, alpha: float = ALPHA) -> pd.DataFrame:
    """The (target, strategy, batch size) cells whose target accuracy is not placed above ``chance +``
    :data:`NEAR_CHANCE`: the one-sided t test (:func:`bnstudy.study.inference.one_sided_p`, ``"greater"``), Holm-adjusted
    over every cell of the table (:func:`bnstudy.study.inference.holm`), is not below ``alpha`` (a cell with fewer than
    two seeds is never shown above). Columns ``target_name, strategy, batch_size, target`` (the mean), ``p``,
    ``p_adjusted``."""
    by = ["target_name", "strategy", "batch_size"]
    groups = df.groupby(by, sort=True)["target"]
    m = groups.mean().reset_index()
    m["p"] = [one_sided_p(v, "greater", null=chance + NEAR_CHANCE) for _, v in groups]
    m["p_adjusted"] = holm(m["p"].to_numpy(dtype=float)) if len(m) else []
    return m[~(m.p_adjusted < alpha)].reset_index(drop=True)


def _winners(df: pd.DataFrame, strategies=None, chance: float | None = None, alpha: float = ALPHA):
    """:func:`winners` and its claims table (family ``"winners"``, keys ``winner_<target>_b<m>``)."""
    near = set()
    if chance is not None:
        near = set(near_chance_cells(df, chance, alpha)[["target_name", "strategy", "batch_size"]]
                   .itertuples(index=False, name=None))
    recs, diffs = [], {}
    for (t, b), g in df.groupby(["target_name", "batch_size"]):
        piv = g.pivot(index="seed", columns="strategy", values="target")
        if strategies is not None:
            piv = piv[[s for s in strategies if s in piv.columns]]
        order = piv.mean().sort_values(ascending=False).index
        best, second = order[0], order[1]
        diffs[f"winner_{t}_b{int(b)}"] = piv[best] - piv[second]
        div = int(g[g.strategy.isin([best, second])]["diverged"].sum()) if "diverged" in g else 0
        recs.append(dict(target_name=t, batch_size=int(b), winner=best, winner_mean=float(piv[best].mean()),
                         runner_up=second, diverged_runs=div, near_chance=(t, best, b) in near))
    claims = _family("winners", diffs, "winner", alpha)
    out = pd.DataFrame(recs)
    if len(out):
        out["diff_mean"], out["diff_lo"], out["diff_hi"] = claims.estimate.values, claims.low.values, claims.high.values
        out["verdict"], out["p"], out["p_adjusted"] = claims.verdict.values, claims.p.values, claims.p_adjusted.values
        out["separated_holm"] = (out.p_adjusted < alpha) & (out.diff_mean > 0)
    return out, claims


def winners(df: pd.DataFrame, strategies=None, chance: float | None = None, alpha: float = ALPHA) -> pd.DataFrame:
    """Per target and batch size: the strategy with the highest mean target accuracy, the runner-up, the paired
    difference winner minus runner-up with its family interval (``diff_mean, diff_lo, diff_hi``: every row of the
    table is one :class:`bnstudy.study.inference.Family`, Bonferroni) and ``verdict`` (:func:`bnstudy.study.inference.decide`:
    "winner higher", "not decided", "too few seeds"), the two-sided ``p`` and its Holm-adjusted ``p_adjusted`` over
    the table, ``separated_holm`` (``p_adjusted < alpha`` and the difference positive: what the page counts),
    ``diverged_runs`` (runs with a non-finite loss in the winner's or runner-up's cell, if the column exists) and
    ``near_chance`` (the winner's cell is in :func:`near_chance_cells`; False without ``chance``)."""
    return _winners(df, strategies, chance, alpha)[0]


def bn_vs_per_sample(df: pd.DataFrame, target: str, batch_size: int, bn_strategies=BN_STRATEGIES,
                     family: Family = Family(), key: str = "") -> tuple[str, str, Claim]:
    """Best BN strategy against best per-sample-norm strategy (by mean) at one target and batch size.

    ``bn_strategies``: the BN strategies that compete (e.g. ``("bn_train",)`` for BN that uses batch
    statistics). Returns ``(best_bn, best_ps, claim)``: the :class:`bnstudy.study.inference.Claim` on the per-seed
    differences ``best_ps - best_bn`` at ``family``'s level, verdict "per-sample norm higher", "per-sample norm
    lower", "not decided" or "too few seeds". Raises ``ValueError`` without a BN or a per-sample strategy.
    """
    g = df[(df.target_name == target) & (df.batch_size == batch_size)]
    piv = g.pivot(index="seed", columns="strategy", values="target")
    bn = [s for s in bn_strategies if s in piv.columns]
    ps = [s for s in PER_SAMPLE_STRATEGIES if s in piv.columns]
    if not bn or not ps:
        raise ValueError("bn_vs_per_sample needs at least one BN and one per-sample strategy")
    best_bn = max(bn, key=lambda s: piv[s].mean())
    best_ps = max(ps, key=lambda s: piv[s].mean())
    return best_bn, best_ps, _decide(piv[best_ps] - piv[best_bn], key, "ps", family)


def samples_enough(pt: pd.DataFrame, batch_size: int, margin: float, alpha: float = ALPHA) -> int:
    """Smallest ``n_samples`` from which on (it and every larger count) precise BN's accuracy is equivalent to
    the exact statistics' within ``+-margin``: the TOST p-value (:func:`bnstudy.study.inference.tost_p`) of the
    per-seed differences below ``alpha`` at each of those counts (an intersection of tests, each at ``alpha``);
    0 if none. A count with fewer than two seeds is never equivalent."""
    d = pt[(pt.kind == "precise") & (pt.batch_size == batch_size)]
    ok = {int(n): bool(tost_p(g["acc_vs_exact"], margin) < alpha) for n, g in d.groupby("n_samples")}
    ns = sorted(ok)
    for i, n in enumerate(ns):
        if all(ok[k] for k in ns[i:]):
            return n
    return 0


def stats_enough(pt: pd.DataFrame, batch_size: int, column: str, tolerance: float = STAT_TOLERANCE,
                 alpha: float = ALPHA) -> int:
    """Smallest ``n_samples`` from which on precise BN's ``column`` error (``mean_err`` or ``var_err``) is shown
    below ``tolerance``: the one-sided t test over seeds (:func:`bnstudy.study.inference.one_sided_p`, ``"less"``,
    null ``tolerance``) below ``alpha`` at it and every larger count; 0 if no count tried is."""
    d = pt[(pt.kind == "precise") & (pt.batch_size == batch_size)]
    ok = {int(n): bool(one_sided_p(g[column], "less", null=tolerance) < alpha) for n, g in d.groupby("n_samples")}
    ns = sorted(ok)
    for i, n in enumerate(ns):
        if all(ok[k] for k in ns[i:]):
            return n
    return 0


def enough_word(n: int, smallest: int) -> str:
    """``n`` from :func:`samples_enough` / :func:`stats_enough` as a token: ``"none tried"`` (0), ``"<= n"`` when
    ``n`` is the smallest count tried (censored by the grid), else ``"n"``."""
    if n == 0:
        return "none tried"
    return f"<= {n}" if n == smallest else f"{n}"


def claim_word(n_enough: int, grid_max: int) -> str:
    """Wu & Johnson's 10^3-10^4 against ``n_enough`` (a comparison of a count with a range, not a test):
    ``"within the range"``, ``"fewer suffice"``, ``"more needed"`` (none enough, or only beyond 10^4) or
    ``"not reached"`` (none enough and the grid stops below 10^4)."""
    lo, hi = CLAIM_RANGE
    if n_enough == 0:
        return "more needed" if grid_max >= hi else "not reached"
    if n_enough < lo:
        return "fewer suffice"
    return "within the range" if n_enough <= hi else "more needed"


def _edge(factor: float, grid) -> bool:
    """A best factor that moved off 1 and sits at an end of the grid: the true best may lie beyond it."""
    return factor != 1.0 and factor in (min(grid), max(grid))


def _summary_verdict(verdicts: list[str]) -> str:
    """The recommendation from the per-sample contenders' verdicts against BN in train mode: "per-sample norm
    lower" if every contender is lower, "per-sample norm higher" if one is higher and none lower, "too few seeds"
    if every comparison had too few, else "not decided"."""
    higher, lower = WORDS["ps"]
    if verdicts and all(v == TOO_FEW for v in verdicts):
        return TOO_FEW
    if verdicts and all(v == lower for v in verdicts):
        return lower
    if higher in verdicts and lower not in verdicts:
        return higher
    return NOT_DECIDED


def rate_comparison(df: pd.DataFrame, tuned: pd.DataFrame, tune: pd.DataFrame, alpha: float = ALPHA) -> dict:
    """The small-batch recommendation at the linear-scaling rate and at tuned rates (B1), reported seeds only.

    At the smallest batch size of ``df``, each per-sample contender (GN-, LN-pretrained) minus BN in train mode,
    paired within seed, per target, at the linear-scaling rate (``df``: factor 1) and at the tuned rates
    (``tuned``: each contender at the factor the tuning seeds chose, :func:`chosen_factors` on ``tune``). Every
    comparison made is one :class:`bnstudy.study.inference.Family` (Bonferroni intervals, Holm p-values). Returns a
    dict: ``factor`` / ``edge`` per ``<target>_<strategy>`` (the chosen factor; ``edge``: "at the edge of the
    grid" or "inside the grid"); ``claims``: the claims table (family ``"rate"``, keys
    ``rate_<target>_<strategy>_<base|tuned>``, verdicts "per-sample norm higher/lower", "not decided", "too few
    seeds"); ``rec`` per ``<target>_<base|tuned>_verdict`` (:func:`_summary_verdict` of the contenders'
    verdicts); ``depends`` per target (``"the verdict depends on the rate"`` or ``"the same verdict at both
    rates"``), ``n_comparisons``, ``n_edge``. Raises ``ValueError`` if a tuned run's factor is not the one the
    tuning seeds chose (a check that nothing was selected on the reported seeds), or if bn_train or every
    per-sample contender is missing.
    """
    sb = int(df.batch_size.min())
    chosen = chosen_factors(tune, sb)
    for r in tuned.drop_duplicates(["target_name", "strategy"]).itertuples():
        if chosen.get((r.target_name, r.strategy)) != float(r.lr_factor):
            raise ValueError(f"tuned runs of {r.strategy} on {r.target_name} use factor {r.lr_factor}, but the "
                             f"tuning seeds chose {chosen.get((r.target_name, r.strategy))}")
    ps = [s for s in CONTENDERS if s != "bn_train" and s in set(tuned.strategy) and s in set(df.strategy)]
    if "bn_train" not in set(tuned.strategy) or not ps:
        raise ValueError("rate_comparison needs bn_train and a per-sample contender in both tables")
    grid = sorted(set(tune.lr_factor))
    targets = sorted(set(tuned.target_name))
    out: dict = dict(factor={}, edge={}, rec={}, depends={})
    for t in targets:
        for s in ["bn_train"] + ps:
            f = chosen[(t, s)]
            out["factor"][f"{t}_{s}"] = f
            out["edge"][f"{t}_{s}"] = "at the edge of the grid" if _edge(f, grid) else "inside the grid"
    claims = _asked("rate", dict(base=df[df.batch_size == sb], tuned=tuned), RATE_QUESTIONS, alpha,
                    dict(target_name=tuple(targets)), dict(condition=tuple(ps)))
    word = dict(zip(claims.key, claims.verdict))
    for t in targets:
        for tag in ("base", "tuned"):
            out["rec"][f"{t}_{tag}_verdict"] = _summary_verdict([word[f"rate_{t}_{s}_{tag}"] for s in ps])
        same = out["rec"][f"{t}_base_verdict"] == out["rec"][f"{t}_tuned_verdict"]
        out["depends"][t] = "the same verdict at both rates" if same else "the verdict depends on the rate"
    out["claims"] = claims
    out["n_comparisons"] = len(claims)
    out["n_edge"] = int(sum(v == "at the edge of the grid" for v in out["edge"].values()))
    return out


def lr_check(tune: pd.DataFrame, reference: int, margin: float, control: str = CONTROL) -> dict:
    """The learning-rate check's summary (tuning seeds only; nothing here selects on the reported seeds).

    Returns a dict: ``best_factor`` per ``<target>_<strategy>_b<m>``; ``n_cells`` and ``n_moved`` (cells whose
    best factor is not 1); ``gain_max`` (largest mean gain of the best over the reported rate) and where
    (``gain_where``, readable); per ``<target>_b<m>``: ``winner_base`` / ``winner_best`` (labels) and
    ``winner_same`` (bool), ``winner_pair`` (a phrase: "unchanged (label)" or both labels);
    ``n_winner_changes``; per target, the break verdicts of bn_train against the control at the reported and at the
    best rates (``break_base``, ``break_best``: tokens) and ``claims``: their difference-in-differences at the
    smallest tuning batch size (family ``lr_did``, keys ``lr_did_<base|best>_<target>``, :func:`_smallest_family`);
    ``n_edge``: moved cells whose best
    factor is an end of the grid (a "best of the rates tried", a lower bound on the gain); ``n_diverged`` of
    ``n_runs``.
    """
    base = tune[tune.lr_factor == 1.0]
    best = best_rate_table(tune)
    out: dict = dict(best_factor={}, winner_base={}, winner_best={}, winner_same={}, winner_pair={}, break_base={},
                     break_best={})
    means = tune.groupby(["target_name", "strategy", "batch_size", "lr_factor"])["target"].mean()
    gains = {}
    for r in best.drop_duplicates(["target_name", "strategy", "batch_size"]).itertuples():
        k = f"{r.target_name}_{r.strategy}_b{r.batch_size}"
        out["best_factor"][k] = float(r.best_factor)
        gains[(r.target_name, r.strategy, r.batch_size)] = float(
            means[(r.target_name, r.strategy, r.batch_size, r.best_factor)]
            - means[(r.target_name, r.strategy, r.batch_size, 1.0)])
    out["n_cells"] = len(out["best_factor"])
    out["n_moved"] = int(sum(v != 1.0 for v in out["best_factor"].values()))
    grid = sorted(set(tune.lr_factor))
    out["n_edge"] = int(sum(_edge(v, grid) for v in out["best_factor"].values()))
    out["n_diverged"] = int(tune.diverged.sum()) if "diverged" in tune else 0
    out["n_runs"] = len(tune)
    gk = max(gains, key=gains.get)
    out["gain_max"] = gains[gk]
    out["gain_where"] = f"{STRATEGY_LABELS[gk[1]]}, {gk[0]} target, batch {gk[2]}"
    wb, wt = winners(base), winners(best)
    for a, b in zip(wb.itertuples(), wt.itertuples()):
        k = f"{a.target_name}_b{a.batch_size}"
        out["winner_base"][k], out["winner_best"][k] = STRATEGY_LABELS[a.winner], STRATEGY_LABELS[b.winner]
        out["winner_same"][k] = bool(a.winner == b.winner)
        out["winner_pair"][k] = (f"unchanged ({STRATEGY_LABELS[a.winner]})" if a.winner == b.winner else
                                 f"{STRATEGY_LABELS[a.winner]} at the reported rate, {STRATEGY_LABELS[b.winner]} at the "
                                 f"best rates tried")
    out["n_winner_changes"] = int(sum(not v for v in out["winner_same"].values()))
    sb = int(tune.batch_size.min())
    did = {}
    for t in sorted(tune.target_name.unique()):
        for tag, d in (("base", base), ("best", best)):
            if "bn_train" in set(d.strategy) and control in set(d.strategy):
                m, ivs = break_batch(d, t, "bn_train", reference, margin, control=control)
                out[f"break_{tag}"][t] = break_word(m)
                did[f"lr_did_{tag}_{t}"] = break_differences(d, t, "bn_train", reference, control)
    out["claims"] = _smallest_family("lr_did", did, "did", sb)
    return out


def diverged_where(df: pd.DataFrame) -> str:
    """Where runs diverged (a non-finite loss), readable: ``"<target> target, <strategy>, batch m: k of n runs"``
    joined by "; ", or ``"none"``."""
    if "diverged" not in df or not df.diverged.any():
        return "none"
    parts = []
    for (t, s, b), g in df.groupby(["target_name", "strategy", "batch_size"]):
        if g.diverged.any():
            parts.append(f"{t} target, {STRATEGY_LABELS[s]}, batch {b}: {int(g.diverged.sum())} of {len(g)} runs")
    return "; ".join(parts)



def _cells_where(cells: pd.DataFrame, most: int = 8) -> str:
    """Near-chance cells, readable; more than ``most``: a count pointing to the figure instead of a list."""
    if not len(cells):
        return "none"
    if len(cells) > most:
        return f"{len(cells)} cells, too many to list; the accuracy figure shows them"
    return "; ".join(f"{r.target_name} target, {STRATEGY_LABELS[r.strategy]}, batch {r.batch_size} ({r.target:.3f})"
                     for r in cells.itertuples())


def _n_small_beats_large(df: pd.DataFrame, small: int, large: int, alpha: float = ALPHA) -> tuple[int, int]:
    """``(k, m)``: of the ``m`` strategy/target pairs with both batch sizes, the ``k`` whose accuracy at ``small``
    is shown above that at ``large`` (paired per-seed differences; two-sided t test, Holm over the ``m`` pairs
    below ``alpha``, the mean difference positive)."""
    ps, means = [], []
    for (t, s), g in df.groupby(["target_name", "strategy"]):
        piv = g.pivot(index="seed", columns="batch_size", values="target")
        if small in piv and large in piv and small != large:
            d = piv[small] - piv[large]
            ps.append(two_sided_p(d))
            means.append(float(d.mean()))
    adj = holm(ps) if ps else np.array([])
    return int(sum(bool(a < alpha) and m > 0 for a, m in zip(adj, means))), len(ps)


def _seed_means(d: pd.DataFrame, column: str) -> pd.Series:
    """Per seed the mean of ``column`` over its (target, strategy, batch size) runs. A run's missing value (NaN)
    makes its seed's mean NaN (the interval leaves that seed out) instead of averaging over fewer runs; a repeated
    (seed, target_name, strategy, batch_size) row raises ``ValueError`` (a mean would hide it)."""
    keys = ["seed", "target_name", "strategy", "batch_size"]
    dup = d.duplicated(keys)
    if dup.any():
        raise ValueError(f"batch_size findings: {int(dup.sum())} repeated ({', '.join(keys)}) rows, e.g. "
                         f"{d.loc[dup, keys].iloc[0].to_dict()}; give each run once")
    return d.groupby("seed")[column].mean(skipna=False)


def _deepest_minus_others(nt: pd.DataFrame) -> pd.Series:
    """Per seed, at the smallest noise batch size: the deepest layer's relative standard deviation of the batch
    mean (``sqrt(var_mean_rel)``) minus the largest of the other layers' (empty with one layer). A seed with a layer's value
    missing (NaN, or no row) gets NaN; a repeated (seed, layer) row raises ``ValueError`` (``DataFrame.pivot``)."""
    n2 = nt[nt.batch_size == nt.batch_size.min()]
    piv = n2.assign(rel=np.sqrt(n2.var_mean_rel)).pivot(index="seed", columns="layer", values="rel")
    if piv.shape[1] < 2:
        return pd.Series(dtype=float)
    deepest = piv.columns.max()
    # a layer's NaN makes its seed's value NaN (the engine leaves that seed out), not the largest over fewer layers
    return piv[deepest] - piv.drop(columns=deepest).max(axis=1, skipna=False)


def findings(df: pd.DataFrame, diag: pd.DataFrame, reference: int, margin: float = 0.02,
             equivalence_margin: float = 0.01, tune: pd.DataFrame | None = None, control: str = CONTROL,
             wide_margin: float = None, tuned: pd.DataFrame | None = None, alpha: float = ALPHA
             ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Chapter 5's claims table and numbers table from :func:`run`'s tables: ``(claims, f)``.

    ``claims``: one :func:`bnstudy.study.inference.claims_table` per family (column ``family``; every difference is
    condition minus reference, per seed; intervals and verdicts at ``Family(m)``, Holm within the family), glued
    by the page with :func:`bnstudy.study.pages.glue_claims`:

    * ``recommend``: ``recommend_<target>_b<m>``, best per-sample norm minus best BN strategy (by mean) at the
      smallest and reference batch size (:func:`bn_vs_per_sample`);
    * ``adabn``: ``adabn_vs_frozen_<target>_b<m>``, AdaBN minus inherited frozen statistics, same cells;
    * ``winners``: ``winner_<target>_b<m>``, winner minus runner-up (:func:`winners`);
    * ``rate``: :func:`rate_comparison` (with ``tune`` and ``tuned``);
    * ``gap``: ``gap_<target>_b<m>`` (smallest, reference) and ``gap_<target>_top`` (largest): BN in train mode's
      accuracy in train mode minus eval mode;
    * ``restat``: ``restat_gain_<target>``: BN in train mode after its running statistics are re-estimated minus
      before, at the largest batch size (C1; where ``target_restat`` is there);
    * ``noise``: ``deepest_noisiest``: the deepest layer's batch-mean spread minus the largest other's at the
      smallest noise batch size (:func:`_deepest_minus_others`);
    * ``check``: ``gap_zero_elsewhere``, :func:`bnstudy.study.inference.exact_check` that every other strategy's
      train/eval gap is ``== 0`` in every run (an identity of the code);
    * ``drop``: ``drop_<target>_<strategy>_b<smallest>``, accuracy at the smallest batch size minus at
      ``reference``, and ``did``: ``did_<target>_<strategy>_b<smallest>``, the same minus the control's (strategies
      with batch statistics), each at its break verdict's level (:func:`_smallest_family`; the page glues the
      ``did`` family's interval cut to [-2, 2], a difference of two accuracy differences);
    * ``lr_did``: ``lr_did_<base|best>_<target>``, the same difference-in-differences of bn_train on the tuning
      seeds at the reported and at the best rates (:func:`lr_check`, with ``tune``).

    ``f``: the descriptive numbers the prose cites beside the claims, a flat numbers table
    (:func:`bnstudy.study.inference.numbers_table`; read one with :func:`bnstudy.study.inference.number`; glued with
    :func:`bnstudy.study.pages.glue_numbers` as ``ch05_<key>``, intervals as ``_mean`` / ``_ci_low`` / ``_ci_high``, not
    cut; accuracies are fractions 0..1; a dict of entries is flattened to ``<key>_<entry>``, e.g.
    ``breaks_close_bn_train``): breaks (:func:`break_batch` against ``reference`` with ``margin``, below and above,
    raw and against ``control``; ``breaks_stats_wide`` at ``wide_margin``; strategies in
    :data:`NO_BATCH_STATISTICS` get ``"n/a"`` against the control; ``breaks_stats_above_restat``: bn_train above
    the reference with its re-estimated statistics), winners' labels and their Holm count, near-chance cells
    (:func:`near_chance_cells`), accuracies and retention (:func:`bnstudy.study.inference.t_interval`), spreads (SD over
    seeds), the noise measurements, precise BN (:func:`samples_enough`, :func:`stats_enough`, :func:`enough_word`,
    :func:`claim_word`), the mismatch (within-target Spearman, :func:`bnstudy.study.inference.rank_correlation`; NaN
    with fewer than 4 seeds), :func:`lr_check` on ``tune``, :func:`rate_comparison`'s factors and summary verdicts,
    per-source accuracies, head A right after BN is replaced (``task_a_before``) and ``family_size``. Raises
    ``ValueError`` if ``reference`` is not a batch size of ``df``.
    """
    wide_margin = WIDE_MARGIN if wide_margin is None else wide_margin
    if reference not in set(df.batch_size):
        raise ValueError(f"reference={reference} is not a batch size of the results {sorted(set(df.batch_size))}")
    sb, lb = int(df.batch_size.min()), int(df.batch_size.max())
    chance = 1 / int(df.n_classes.iloc[0])
    strategies = set(df.strategy)
    has_control = control in strategies
    targets = sorted(df.target_name.unique())
    cells = sorted({sb, reference})
    # --- breaks: thresholds from family intervals within strategy, target and side
    breaks, above, sbreaks, sabove, swide, did, drop = {}, {}, {}, {}, {}, {}, {}
    for t in targets:
        for s in sorted(df[df.target_name == t].strategy.unique()):
            k = f"{t}_{s}"
            m, ivs = break_batch(df, t, s, reference, margin)
            breaks[k] = break_word(m)
            if sb in ivs:
                drop[f"drop_{k}_b{sb}"] = break_differences(df, t, s, reference)
            above[k] = break_word(break_batch(df, t, s, reference, margin, side="above")[0], "above")
            if has_control and s != control and s in NO_BATCH_STATISTICS:
                sbreaks[k] = sabove[k] = swide[k] = "n/a"
            elif has_control and s != control:
                m, ivs = break_batch(df, t, s, reference, margin, control=control)
                sbreaks[k] = break_word(m)
                if sb in ivs:
                    did[f"did_{k}_b{sb}"] = break_differences(df, t, s, reference, control)
                sabove[k] = break_word(break_batch(df, t, s, reference, margin, control=control, side="above")[0],
                                       "above")
                swide[k] = break_word(break_batch(df, t, s, reference, wide_margin, control=control)[0])
    above_restat = {}
    if has_control and "bn_train" in strategies and "target_restat" in df:
        dr = df.copy()
        sel = dr.strategy == "bn_train"
        if dr.loc[sel, "target_restat"].notna().all():
            dr.loc[sel, "target"] = dr.loc[sel, "target_restat"]
            for t in targets:
                above_restat[t] = break_word(break_batch(dr, t, "bn_train", reference, margin, control=control,
                                                         side="above")[0], "above")
    # --- the claims, one family per table or paragraph
    tables = []
    w, wclaims = _winners(df, chance=chance, alpha=alpha)
    tables.append(wclaims)
    win = {f"{r.target_name}_b{r.batch_size}": STRATEGY_LABELS[r.winner] for r in w.itertuples()}
    rec, bbn, bps = {}, {}, {}
    for t in targets:
        for b in cells:
            best_bn, best_ps, _ = bn_vs_per_sample(df, t, b)
            bbn[f"{t}_b{b}"], bps[f"{t}_b{b}"] = STRATEGY_LABELS[best_bn], STRATEGY_LABELS[best_ps]
            piv = df[(df.target_name == t) & (df.batch_size == b)].pivot(index="seed", columns="strategy",
                                                                         values="target")
            rec[f"recommend_{t}_b{b}"] = piv[best_ps] - piv[best_bn]
    tables.append(_family("recommend", rec, "ps", alpha))
    if {"adabn", "stats_frozen"} <= strategies:
        tables.append(_asked("adabn", df, [ADABN_QUESTION], alpha, dict(batch_size=tuple(cells))))
    gap, restat = {}, {}
    for t in targets:
        g_t = df[(df.target_name == t) & (df.strategy == "bn_train")]
        for b, name in [(b, f"b{b}") for b in cells] + [(lb, "top")]:
            g = g_t[g_t.batch_size == b]
            if len(g):
                gap[f"gap_{t}_{name}"] = g.set_index("seed")["train_eval_gap"]
        g = g_t[g_t.batch_size == lb]
        if len(g) and "target_restat" in g and g.target_restat.notna().all():
            restat[f"restat_gain_{t}"] = g.set_index("seed")["target_restat"] - g.set_index("seed")["target"]
    if gap:
        tables.append(_family("gap", gap, "gap", alpha))
    if restat:
        tables.append(_family("restat", restat, "restat", alpha))
    nt = noise_table(diag)
    tables.append(_family("noise", {"deepest_noisiest": _deepest_minus_others(nt)}, "noise", alpha))
    tables.append(_asked("check", df, [CHECK_QUESTION], alpha, dict(strategy=tuple(sorted(strategies - {"bn_train"})))))
    tables += [_smallest_family(name, items, name, sb) for name, items in (("drop", drop), ("did", did)) if items]
    lr = lr_check(tune, reference, margin, control) if tune is not None and len(tune) else {}
    lr_claims = lr.pop("claims", None)
    if lr_claims is not None and len(lr_claims):
        tables.append(lr_claims)
    rate = rate_comparison(df, tuned, tune, alpha) if tuned is not None and len(tuned) and lr else {}
    if rate:
        tables.append(rate.pop("claims"))
    claims = pd.concat(tables, ignore_index=True)
    # --- descriptive numbers: means with 95% t intervals, spreads, the noise and precise-BN measurements
    acc, retention = {}, {}
    for t in targets:
        for s in df.strategy.unique():
            for b in sorted({sb, reference, lb}):
                g = df[(df.target_name == t) & (df.strategy == s) & (df.batch_size == b)]
                acc[f"{t}_{s}_b{b}"] = t_interval(g["target"])
                retention[f"{t}_{s}_b{b}"] = t_interval(g["task_a_after"])
    spread = {f"{t}_{s}": float(np.std(g["target"], ddof=1))
              for (t, s), g in df[df.batch_size == sb].groupby(["target_name", "strategy"])}
    spread_top = {f"{t}_{s}": float(np.std(g["target"], ddof=1))
                  for (t, s), g in df[df.batch_size == lb].groupby(["target_name", "strategy"])}
    n2 = nt[nt.batch_size == nt.batch_size.min()]
    ratio = {f"l{l}": float((g.var_mean_rel / g.pred_mean_rel).mean()) for l, g in n2.groupby("layer")}
    ntop = nt[nt.batch_size == nt.batch_size.max()]
    vratio = {f"l{l}": float((g.var_var_rel / g.pred_var_rel).mean()) for l, g in n2.groupby("layer")}
    vratio_top = {f"l{l}": float((g.var_var_rel / g.pred_var_rel).mean()) for l, g in ntop.groupby("layer")}
    rel_std = {f"l{l}": float(np.sqrt(g.var_mean_rel).mean()) for l, g in n2.groupby("layer")}
    neff = {f"l{l}": float(g.n_eff_frac.mean()) for l, g in nt.groupby("layer")}
    slope_m, slope_v = {}, {}
    for l, g in nt.groupby("layer"):
        mm_ = g.groupby("batch_size")[["var_mean_rel", "var_var_rel"]].mean()
        if len(mm_) >= 2:
            x = np.log(mm_.index.to_numpy(dtype=float))
            slope_m[f"l{l}"] = float(np.polyfit(x, np.log(mm_.var_mean_rel), 1)[0])
            slope_v[f"l{l}"] = float(np.polyfit(x, np.log(mm_.var_var_rel), 1)[0])
    pt = precise_table(diag)
    enough, claim, menough, venough, smallest_n, pgap, perr, pverr = {}, {}, {}, {}, {}, {}, {}, {}
    gmax = int(pt.n_samples.max())
    for m in sorted(pt[pt.kind == "precise"].batch_size.unique()):
        d = pt[(pt.kind == "precise") & (pt.batch_size == m)]
        n0 = int(d.n_samples.min())
        n = samples_enough(pt, int(m), equivalence_margin, alpha)
        enough[f"b{m}"], claim[f"b{m}"] = enough_word(n, n0), claim_word(n, gmax)
        menough[f"b{m}"] = enough_word(stats_enough(pt, int(m), "mean_err", alpha=alpha), n0)
        venough[f"b{m}"] = enough_word(stats_enough(pt, int(m), "var_err", alpha=alpha), n0)
        smallest_n[f"b{m}"] = n0
        for nn_, tag in ((1024, "n1024"), (gmax, "nmax")):
            g = d[d.n_samples == nn_]
            if len(g):
                pgap[f"b{m}_{tag}"] = t_interval(g["acc_vs_exact"])
                perr[f"b{m}_{tag}"] = t_interval(g["mean_err"])
                pverr[f"b{m}_{tag}"] = t_interval(g["var_err"])
    top = pt[(pt.kind == "precise") & (pt.n_samples == gmax)].groupby("batch_size")[["mean_err", "var_err"]].mean()
    ratio_of = lambda col: float(top.loc[2, col] / top.loc[32, col]) if {2, 32} <= set(top.index) else math.nan
    mism = {t: t_interval(diag[f"mismatch_kl_{t}"]) for t in targets if f"mismatch_kl_{t}" in diag}
    rho_w = {}
    if {"adabn", "stats_frozen"} <= strategies:
        mt = mismatch_table(df, reference)
        for t in targets:
            a = mt[(mt.strategy == "adabn") & (mt.target_name == t)]
            rho_w[t] = rank_correlation(a.mismatch_kl, a.advantage)[0]
    same = sum(len(set(g.winner)) == 1 for _, g in w.groupby("batch_size"))
    src = {}
    if "source_task_a_accuracy" in df:
        norm = df.strategy.map(STRATEGY_NORM)
        src = {n: float(g.groupby("seed")["source_task_a_accuracy"].first().mean())
               for n, g in df.groupby(norm, sort=True)}
    replaced = {s: t_interval(_seed_means(df[df.strategy == s], "task_a_before"))
                for s in ("to_group", "to_layer") if "task_a_before" in df and s in strategies}
    near = near_chance_cells(df, chance, alpha)
    n_small, n_pairs = _n_small_beats_large(df, sb, lb, alpha)
    family_size = {str(k): int(v) for k, v in claims.groupby("family").size().items()}
    family_size.update(near_chance=int(df.groupby(["target_name", "strategy", "batch_size"]).ngroups),
                       small_beats_large=n_pairs)
    f = numbers_table(dict(
        n_seeds=int(df.seed.nunique()), n_runs=len(df), chance=chance, smallest_batch=sb, largest_batch=lb,
        reference_batch=int(reference), margin=float(margin), equivalence_margin=float(equivalence_margin),
        control=STRATEGY_LABELS.get(control, control), breaks=breaks, breaks_above=above, breaks_stats=sbreaks,
        breaks_stats_above=sabove, breaks_stats_wide=swide, breaks_stats_above_restat=above_restat,
        n_break_above=int(sum(v != "never" for v in above.values())),
        n_break_below=int(sum(v != "never" for v in breaks.values())),
        n_stats_break_below=int(sum(v not in ("never", "n/a") for v in sbreaks.values())),
        winner=win, n_winner_separated_holm=int(w.separated_holm.sum()), best_bn=bbn, best_ps=bps,
        acc=acc, acc_top={k.rsplit("_b", 1)[0]: v for k, v in acc.items() if k.endswith(f"_b{lb}")},
        n_diverged=int(df.diverged.sum()) if "diverged" in df else 0, diverged_where=diverged_where(df),
        n_near_chance=len(near), near_chance_where=_cells_where(near), n_small_beats_large=n_small,
        spread=spread, spread_top=spread_top, retention=retention, source_acc=src, replaced_before=replaced,
        noise_ratio_m2=ratio, noise_var_ratio_m2=vratio, noise_var_ratio_top=vratio_top,
        noise_largest_batch=int(nt.batch_size.max()), noise_rel_std_m2=rel_std, n_eff_frac=neff,
        noise_slope_mean=slope_m, noise_slope_var=slope_v, precise_enough=enough, precise_claim=claim,
        precise_mean_enough=menough, precise_var_enough=venough, precise_smallest_n=smallest_n,
        precise_acc_gap=pgap, precise_mean_err=perr, precise_var_err=pverr,
        precise_mean_err_ratio_b2_b32=ratio_of("mean_err"), precise_var_err_ratio_b2_b32=ratio_of("var_err"),
        precise_source_acc=float(pt[pt.kind == "source"].accuracy.mean()),
        precise_exact_acc=float(pt[pt.kind == "exact"].accuracy.mean()), stat_tolerance=STAT_TOLERANCE,
        mismatch=mism, mismatch_rho_within=rho_w, n_sizes=int(df.batch_size.nunique()),
        n_winner_same_targets=int(same), lr=lr, rate=rate, family_size=family_size,
    ))
    return claims, f


# --- the page's answer: sentences chosen by the findings (issue 25) -------------------------------------------------

def _get(f: pd.DataFrame, key: str, default=None):
    """The entry ``key`` of the numbers table ``f`` (:func:`bnstudy.study.inference.number`), ``default`` where there is
    none."""
    return number(f, key) if (f["key"] == key).any() else default


def entries(f: pd.DataFrame, stem: str) -> dict:
    """``{entry: value}`` of the rows ``<stem>_<entry>`` of the numbers table ``f`` (a flattened dict)."""
    return {k[len(stem) + 1:]: number(f, k) for k in f["key"] if k.startswith(f"{stem}_")}


def _verdict_of(claims: pd.DataFrame, key: str) -> str | None:
    t = claims[claims["key"] == key]
    return str(t.iloc[0]["verdict"]) if len(t) else None


def break_phrase(token: str | None, reference: int, side: str = "below") -> str:
    """A :func:`break_word` token in words: ``"<= 8"`` -> "breaks from batch size 8 down", ``">= 128"`` ->
    "breaks from batch size 128 up", ``"never"`` -> "shows no break below (above) batch size <reference>",
    ``"n/a"`` or missing -> "is not judged against the control"."""
    if token is None or token == "n/a":
        return "is not judged against the control"
    if token == "never":
        return f"shows no break {side} batch size {reference}"
    m = token.split()[-1]
    return f"breaks from batch size {m} {'down' if token.startswith('<=') else 'up'}"


def enough_phrase(token: str | None, batch: int) -> str:
    """Where an :func:`enough_word` token says precise BN is enough, in words, for batches of ``batch``:
    ``"none tried"`` -> "in batches of 2 at no number of samples tried", ``"<= 64"`` -> "in batches of 32 from
    N = 64 samples on (already the smallest tried)", ``"256"`` -> "in batches of 32 from N = 256 samples on"."""
    if token is None:
        return f"in batches of {batch} at an untested number of samples"
    if token == "none tried":
        return f"in batches of {batch} at no number of samples tried"
    if token.startswith("<="):
        return f"in batches of {batch} from N = {token.split()[-1]} samples on (already the smallest tried)"
    return f"in batches of {batch} from N = {token} samples on"


def answer(claims: pd.DataFrame, f: pd.DataFrame) -> str:
    """The answer box's outcome sentences (Markdown), filled and chosen from the claims table and the numbers table
    ``f`` so that they are true for any rows: BatchNorm in train mode's breaks beyond the per-sample control, the
    best per-sample norm against the best BatchNorm strategy at the smallest batch size (and at tuned rates where
    the rate check ran), train-mode minus eval-mode accuracy, and how many samples precise BN needs."""
    sb, ref = number(f, "smallest_batch"), number(f, "reference_batch")
    out = [f"Judged against GroupNorm from pretraining (which computes no batch statistics), BatchNorm in train mode "
           f"{break_phrase(_get(f, 'breaks_stats_close_bn_train'), ref)} on the close target and "
           f"{break_phrase(_get(f, 'breaks_stats_shifted_bn_train'), ref)} on the shifted one (a break: more than "
           f"{number(f, 'margin'):.2f} below its own accuracy at batch size {ref}, with 95% confidence)."]
    rc, rs = (_verdict_of(claims, f"recommend_{t}_b{sb}") for t in ("close", "shifted"))
    if rc and rs:
        rec = (f"At batch size {sb} and the linear-scaling rate, the best per-sample norm minus the best BatchNorm "
               f"strategy reads **{rc}** on the close target and **{rs}** on the shifted one")
        tc, ts = (_get(f, f"rate_rec_{t}_tuned_verdict") for t in ("close", "shifted"))
        if tc and ts:
            rec += (f"; at rates tuned on separate seeds, the per-sample norms against BatchNorm in train mode read "
                    f"**{tc}** and **{ts}**")
        out.append(rec + ".")
    g = claims[claims["key"] == f"gap_close_b{sb}"]
    if len(g):
        e = float(g.iloc[0]["estimate"])
        shown = g.iloc[0]["kind"] in ("higher", "lower")
        out.append(f"BatchNorm in train mode's accuracy measured in train mode minus eval mode at batch size {sb} is "
                   f"{'n/a' if math.isnan(e) else format(e, '+.3f')} on the close target (**{g.iloc[0]['verdict']}**)"
                   + (": the number a training loop reports is not the deployed model's." if shown else "."))
    p32, p2 = _get(f, "precise_enough_b32"), _get(f, "precise_enough_b2")
    if p32 is not None and p2 is not None:
        out.append(f"Precise BN's re-estimate is within ±{number(f, 'equivalence_margin'):.2f} of the exact "
                   f"statistics' accuracy {enough_phrase(p32, 32)} and {enough_phrase(p2, 2)}.")
    return " ".join(out)


def _shown_on_both(verdicts) -> str | None:
    """``"higher"`` / ``"lower"`` where every verdict of ``verdicts`` is the per-sample norm higher / lower than
    BatchNorm (:data:`WORDS` ``["ps"]``), else ``None``."""
    for side, word in zip(("higher", "lower"), WORDS["ps"]):
        if all(x == word for x in verdicts):
            return side
    return None


def small_batch_outcome(claims: pd.DataFrame, f: pd.DataFrame) -> tuple[str | None, str | None]:
    """``(base, tuned)``: where the small-batch verdicts of both targets agree at the linear-scaling rate
    (``recommend_<target>_b<smallest>``: ``"higher"`` / ``"lower"`` for the per-sample norm, else ``None``), and
    where they do not, the same of the summary verdicts at tuned rates (:func:`rate_comparison`'s ``rec``)."""
    sb = number(f, "smallest_batch")
    base = _shown_on_both([_verdict_of(claims, f"recommend_{t}_b{sb}") for t in ("close", "shifted")])
    tuned = None if base else _shown_on_both([_get(f, f"rate_rec_{t}_tuned_verdict") for t in ("close", "shifted")])
    return base, tuned


def _outcome(case):
    return lambda c, f: small_batch_outcome(c, f) == case  # noqa: E731


def _ratio(f: pd.DataFrame) -> float:
    return float(number(f, "precise_var_err_ratio_b2_b32"))


_SB = lambda c, f: dict(sb=number(f, "smallest_batch"))  # noqa: E731
_SB_BEST = lambda c, f: dict(sb=(sb := number(f, "smallest_batch")),  # noqa: E731
                             best_bn=_get(f, f"best_bn_close_b{sb}", "see the table"))
_LARGE = lambda c, f: dict(ref=number(f, "reference_batch"), n=number(f, "n_break_above"))  # noqa: E731

#: The page's rule-triggered sentences (:func:`bnstudy.study.words.notes`): ``advice``, the answer box's first "what to do",
#: chosen by the small-batch verdicts at the linear-scaling rate on both targets (:func:`small_batch_outcome`), else
#: by those at tuned rates, else to measure both; ``restat_advice``, to re-estimate in large batches where precise BN
#: in batches of 2 errs more than in batches of 32; ``large_batch``, a large-batch collapse named only where some
#: strategy is shown to break above the reference.
NOTES = (
    Note("advice", _outcome(("higher", None)),
         "To fine-tune a whole network at batch size {sb}, start from a network pretrained with a per-sample norm "
         "(GroupNorm here); swapping BatchNorm out afterwards (`bnstudy.replace_norm`) changes the network's function, "
         "so it needs retraining.", _SB),
    Note("advice", _outcome(("lower", None)),
         "To fine-tune a whole network at batch size {sb}, keep BatchNorm with the strategy shown best here ({best_bn} "
         "on the close target); a per-sample norm did not do better.", _SB_BEST),
    Note("advice", _outcome((None, "lower")),
         "At batch size {sb}, at rates tuned on separate seeds, BatchNorm in train mode is ahead of the per-sample "
         "norms on both targets (at the linear-scaling rate the comparison is not decided on both): keep BatchNorm "
         "and tune the learning rate for the small batch.", _SB),
    Note("advice", _outcome((None, "higher")),
         "At batch size {sb}, at rates tuned on separate seeds, a per-sample norm from pretraining is ahead of "
         "BatchNorm in train mode on both targets: start from a network pretrained with one.", _SB),
    Note("advice", _outcome((None, None)),
         "At batch size {sb} this chapter does not decide between BatchNorm and a per-sample norm on both targets: "
         "try both on your own task, each at its own tuned learning rate.", _SB),
    Note("restat_advice", lambda c, f: _ratio(f) > 1,
         "Re-estimate BatchNorm statistics with `bnstudy.update_bn_stats(model, loader)` in large batches (a forward "
         "pass without gradients): in batches of 2 the variance's error is {ratio:.1f} times that in batches of 32.",
         lambda c, f: dict(ratio=_ratio(f))),
    Note("restat_advice", lambda c, f: not _ratio(f) > 1,
         "Re-estimate BatchNorm statistics with `bnstudy.update_bn_stats(model, loader)` (a forward pass without "
         "gradients)."),
    Note("large_batch", lambda c, f: number(f, "n_break_above") == 0,
         "Above the reference batch size of {ref}, no strategy and target pair is shown to break from any cause.",
         _LARGE),
    Note("large_batch", lambda c, f: number(f, "n_break_above") != 0,
         "Above the reference batch size of {ref}, {n} strategy and target pairs are shown to break from any cause: "
         "the large batches of this protocol lose accuracy.", _LARGE),
)


def advice(claims: pd.DataFrame, f: pd.DataFrame) -> str:
    """The answer box's "what to do" (Markdown) with the front-door call: the :data:`NOTES` ``advice`` then
    ``restat_advice``."""
    n = notes(NOTES, claims, f)
    return n["advice"] + " " + n["restat_advice"]


def page_words(claims: pd.DataFrame, f: pd.DataFrame) -> dict[str, str]:
    """The page's sentences (plain Markdown, glued as ``ch05_<name>``): ``answer`` (:func:`answer`), ``advice``
    (:func:`advice`), ``large_batch`` (:data:`NOTES`) and ``mismatch_rho_text_<target>`` (the within-target rank
    correlation to two decimals, ``"n/a"`` where too few seeds give none: never NaN)."""
    out = dict(answer=answer(claims, f), advice=advice(claims, f), large_batch=notes(NOTES, claims, f)["large_batch"])
    for t, rho in entries(f, "mismatch_rho_within").items():
        out[f"mismatch_rho_text_{t}"] = "n/a" if rho != rho else f"{rho:.2f}"
    return out
