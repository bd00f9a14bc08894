"""Chapter 5, what is claimed: the claims table, the numbers table glued beside it and the page's sentences
(:data:`NOTES`, :func:`page_words`), from :func:`.run.run`'s tables or the saved ones (:func:`.run.diag_from_tables`).
Every difference is condition minus reference, paired within seed.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ...config import STRATEGY_NORM
from ...inference import Family, Question, ask, claims_table, count_verdicts, decide, number, numbers_table, \
    one_sided_p, rank_correlation, t_interval, tost_p
from ...words import Note, notes
from . import decision
from .decision import ALPHA, CONTROL, NEAR_CHANCE
from .run import BN_STRATEGIES, PER_SAMPLE_STRATEGIES, STRATEGY_LABELS, Config, best_rate_table, noise_table, \
    precise_table

#: Wu & Johnson (2021)'s range for the samples precise BN needs.
CLAIM_RANGE = (1e3, 1e4)
#: The sensitivity margin of the controlled break verdict below the reference (``breaks_stats_wide``).
WIDE_MARGIN = 0.05
#: The page's direction words per family of claims (condition minus reference).
WORDS = {"ps": ("per-sample norm higher", "per-sample norm lower"), "adabn": ("AdaBN higher", "AdaBN lower"),
         "winner": ("winner higher", "winner lower"),
         "gap": ("train-mode accuracy higher", "train-mode accuracy lower"),
         "restat": ("re-estimated higher", "re-estimated lower"),
         "noise": ("deepest layer noisier", "deepest layer less noisy"),
         "drop": ("higher at the smallest batch", "lower at the smallest batch"),
         "did": ("higher beyond the control", "lower beyond the control")}
#: Every direction word the page may print (:func:`bnstudy.study.inference.is_verdict`).
DIRECTIONS: tuple[str, ...] = tuple(w for pair in WORDS.values() for w in pair) + tuple(
    w for pair in decision.WORDS.values() for w in pair)
#: Precise BN's statistics are "close enough" below this mean error (population SDs for the mean, absolute log
#: ratio for the variance): 1% of the population scale.
STAT_TOLERANCE = 0.01
CELL = ["target_name", "strategy", "batch_size"]


def _family(name: str, items: dict, words: str, family=None) -> pd.DataFrame:
    """One family of claims (``name``) on ``{key: per-seed differences}``, worded by ``WORDS[words]``, each at
    ``family(key)`` (default: Bonferroni over the items)."""
    higher, lower = WORDS[words]
    fam = Family(max(len(items), 1), ALPHA)
    return claims_table([decide(v, k, family=family(k) if family else fam, higher=higher, lower=lower)
                         for k, v in items.items()], family=name)


def _from_on(ok: dict, order) -> int:
    """The first key of ``order`` from which on ``ok`` holds for it and every later key; 0 if none."""
    for i, k in enumerate(order):
        if all(ok[j] for j in order[i:]):
            return k
    return 0


# --- tidy tables ----------------------------------------------------------------------------------------------------

def accuracy_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per cell and ``metric`` (``target``, ``task_a_after``, ``train_eval_gap``): mean, 95% interval and SD over
    seeds, with ``diverged_runs`` (a zero-width interval there is runs stuck at chance, not certainty)."""
    out = pd.DataFrame([dict(zip(CELL, key), metric=m, mean=iv.mean, ci_low=iv.low, ci_high=iv.high,
                             sd=float(np.std(g[m], ddof=1)) if len(g) > 1 else 0.0, n_seeds=iv.n)
                        for key, g in df.groupby(CELL, sort=True) for m in ("target", "task_a_after", "train_eval_gap")
                        for iv in [t_interval(g[m])]])
    if "diverged" in df:
        out = out.merge(df.groupby(CELL)["diverged"].sum().astype(int).rename("diverged_runs").reset_index(), on=CELL)
    return out


def tradeoff_table(df: pd.DataFrame, batch_sizes) -> pd.DataFrame:
    """Per cell at ``batch_sizes``: mean and 95% interval of ``target`` and ``task_a_after`` (``target_mean,
    target_lo, target_hi, retention_mean, ...``)."""
    return pd.DataFrame([dict(zip(CELL, key), **{f"{name}_{end}": getattr(t_interval(g[col]), attr)
                                                 for name, col in (("target", "target"), ("retention", "task_a_after"))
                                                 for end, attr in (("mean", "mean"), ("lo", "low"), ("hi", "high"))})
                         for key, g in df[df.batch_size.isin(batch_sizes)].groupby(CELL)])


def mismatch_table(df: pd.DataFrame, batch_size: int, baseline: str = "stats_frozen") -> pd.DataFrame:
    """Per seed, target and strategy at ``batch_size``: the mismatch before fine-tuning and the paired
    target-accuracy difference to ``baseline`` (``advantage``)."""
    d = df[df.batch_size == batch_size]
    base = d[d.strategy == baseline].set_index(["seed", "target_name"])["target"]
    out = d[d.strategy != baseline][["seed", "target_name", "strategy", "mismatch_kl", "target"]].copy()
    out["advantage"] = out["target"].to_numpy() - base.loc[list(zip(out.seed, out.target_name))].to_numpy()
    return out.reset_index(drop=True)


# --- the chapter's own estimators -----------------------------------------------------------------------------------

def break_differences(df: pd.DataFrame, target: str, strategy: str, reference: int, control: str | None = None,
                      side: str = "below") -> dict:
    """``{m: per-seed target(m) - target(reference)}`` of ``strategy`` for every batch size ``m`` on ``side`` of
    ``reference`` (with ``control``: minus the control's). Raises ``ValueError`` for a bad ``side``."""
    if side not in ("below", "above"):
        raise ValueError(f"side must be 'below' or 'above', got {side!r}")
    d = df[df.target_name == target]
    piv = d[d.strategy == strategy].pivot(index="seed", columns="batch_size", values="target")
    if control is not None:  # the control against itself: zeros, never a break
        piv = (piv - d[d.strategy == control].pivot(index="seed", columns="batch_size", values="target")).dropna()
    sizes = sorted(b for b in piv.columns if (b < reference if side == "below" else b > reference))
    return {m: piv[m] - piv[reference] for m in sizes}


def break_batch(df: pd.DataFrame, target: str, strategy: str, reference: int, margin: float,
                control: str | None = None, side: str = "below") -> tuple[int, dict]:
    """The batch size nearest ``reference`` on ``side`` from which on ``strategy`` breaks on ``target`` (0: none),
    and ``{m: Interval}`` of :func:`break_differences`. Breaks at ``m``: the upper end of the 95% family interval
    (Bonferroni over the batch sizes on that side) is below ``-margin``, and every batch size further out breaks
    too. NaN ends (one seed) never break."""
    diffs = break_differences(df, target, strategy, reference, control, side)
    family = Family(max(len(diffs), 1), 1 - 0.95)
    ivs = {m: t_interval(diffs[m], family.confidence) for m in sorted(diffs)}
    return _from_on({m: iv.high < -margin for m, iv in ivs.items()}, sorted(ivs, reverse=side == "below")), ivs


def break_word(m: int, side: str = "below") -> str:
    """The threshold token for a break batch: ``"never"``, ``"<= m"`` (below) or ``">= m"`` (above)."""
    return "never" if m == 0 else (f"<= {m}" if side == "below" else f">= {m}")


def _smallest_family(name: str, items: dict, words: str, smallest: int) -> pd.DataFrame:
    """The claims on the ``smallest`` batch size's differences of ``{key: break_differences}``, each at its break
    verdict's level."""
    return _family(name, {k: d[smallest] for k, d in items.items()}, words,
                   lambda k: Family(max(len(items[k]), 1), 1 - 0.95))


def near_chance_cells(df: pd.DataFrame, chance: float) -> pd.DataFrame:
    """The cells (``CELL``, mean ``target``, ``p``, ``p_adjusted``) a one-sided t test against ``chance +``
    :data:`NEAR_CHANCE` does not place above it at :data:`ALPHA`, Bonferroni over every cell (``p_adjusted =
    min(1, m p)``; one seed is never placed above)."""
    groups = df.groupby(CELL, sort=True)["target"]
    m = groups.mean().reset_index()
    m["p"] = [one_sided_p(v, "greater", null=chance + NEAR_CHANCE) for _, v in groups]
    m["p_adjusted"] = np.minimum(1.0, m["p"].to_numpy(dtype=float) * max(len(m), 1)) if len(m) else []
    return m[~(m.p_adjusted < ALPHA)].reset_index(drop=True)


def winners(df: pd.DataFrame, chance: float | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per target and batch size, the strategy with the highest mean target accuracy against the runner-up:
    ``(table, claims)`` (family ``winners``, keys ``winner_<target>_b<m>``). The table: ``winner``, ``runner_up``,
    ``winner_mean``, the claim's ``diff_mean, diff_lo, diff_hi, verdict, p, p_adjusted``, ``separated`` (the
    winner shown higher), ``diverged_runs`` (in the two cells) and ``near_chance`` (needs ``chance``)."""
    near = set() if chance is None else set(near_chance_cells(df, chance)[CELL].itertuples(index=False, name=None))
    recs, diffs = [], {}
    for (t, b), g in df.groupby(["target_name", "batch_size"]):
        piv = g.pivot(index="seed", columns="strategy", values="target")
        best, second = piv.mean().sort_values(ascending=False).index[:2]
        diffs[f"winner_{t}_b{int(b)}"] = piv[best] - piv[second]
        div = int(g[g.strategy.isin([best, second])]["diverged"].sum()) if "diverged" in g else 0
        recs.append(dict(target_name=t, batch_size=int(b), winner=best, winner_mean=float(piv[best].mean()),
                         runner_up=second, diverged_runs=div, near_chance=(t, best, b) in near))
    claims = _family("winners", diffs, "winner")
    out = pd.DataFrame(recs)
    if len(out):
        out = out.assign(diff_mean=claims.estimate, diff_lo=claims.low, diff_hi=claims.high, verdict=claims.verdict,
                         p=claims.p, p_adjusted=claims.p_adjusted, separated=claims.kind.eq("higher"))
    return out, claims


def bn_vs_per_sample(df: pd.DataFrame, target: str, batch_size: int) -> tuple[str, str, pd.Series]:
    """``(best_bn, best_ps, per-seed best_ps - best_bn)``: the best BN and per-sample-norm strategies by mean at one
    target and batch size. Raises ``ValueError`` without one of each."""
    piv = df[(df.target_name == target) & (df.batch_size == batch_size)].pivot(index="seed", columns="strategy",
                                                                               values="target")
    bn, ps = ([s for s in group if s in piv.columns] for group in (BN_STRATEGIES, PER_SAMPLE_STRATEGIES))
    if not bn or not ps:
        raise ValueError("bn_vs_per_sample needs at least one BN and one per-sample strategy")
    best_bn, best_ps = (max(group, key=lambda s: piv[s].mean()) for group in (bn, ps))
    return best_bn, best_ps, piv[best_ps] - piv[best_bn]


def _enough(pt: pd.DataFrame, batch_size: int, p_of) -> int:
    """Smallest ``n_samples`` of precise BN in batches of ``batch_size`` from which on ``p_of(rows) <`` :data:`ALPHA`
    at every larger count too (an intersection of tests); 0 if none."""
    d = pt[(pt.kind == "precise") & (pt.batch_size == batch_size)]
    ok = {int(n): bool(p_of(g) < ALPHA) for n, g in d.groupby("n_samples")}
    return _from_on(ok, sorted(ok))


def samples_enough(pt: pd.DataFrame, batch_size: int, margin: float) -> int:
    """:func:`_enough` by the TOST of the accuracy difference to the exact statistics within ``+-margin``."""
    return _enough(pt, batch_size, lambda g: tost_p(g["acc_vs_exact"], margin))


def stats_enough(pt: pd.DataFrame, batch_size: int, column: str, tolerance: float = STAT_TOLERANCE) -> int:
    """:func:`_enough` by the one-sided t test that the ``column`` error is below ``tolerance``."""
    return _enough(pt, batch_size, lambda g: one_sided_p(g[column], "less", null=tolerance))


def enough_word(n: int, smallest: int) -> str:
    """``n`` from :func:`_enough` as a token: ``"none tried"`` (0), ``"<= n"`` when ``n`` is the smallest count
    tried (censored by the grid), else ``"n"``."""
    return "none tried" if n == 0 else f"<= {n}" if n == smallest else f"{n}"


def enough_phrase(token: str) -> str:
    """An :func:`enough_word` token as the words after "is within ...": ``"from N = 512 on"``, ``"already at N = 32,
    the smallest N tried,"`` or ``"at none of the N tried"``."""
    if token == "none tried":
        return "at none of the N tried"
    return f"already at N = {token[3:]}, the smallest N tried," if token.startswith("<= ") else f"from N = {token} on"


def claim_word(n_enough: int, grid_max: int) -> str:
    """Wu & Johnson's 10^3-10^4 against ``n_enough`` (a count against a range, not a test): ``"within the range"``,
    ``"fewer suffice"``, ``"more needed"`` (none enough, or only beyond 10^4) or ``"not reached"`` (none enough and
    the grid stops below 10^4)."""
    lo, hi = CLAIM_RANGE
    if n_enough == 0:
        return "more needed" if grid_max >= hi else "not reached"
    return "fewer suffice" if n_enough < lo else "within the range" if n_enough <= hi else "more needed"


def _edge(factor: float, grid) -> bool:
    """A best factor that moved off 1 and sits at an end of the grid: the true best may lie beyond it."""
    return factor != 1.0 and factor in (min(grid), max(grid))


def lr_check(tune: pd.DataFrame, reference: int, control: str = CONTROL) -> dict:
    """The learning-rate check on the tuning seeds: how many cells' best factors moved (``n_moved``; to an edge of
    the grid, ``n_edge``: a lower bound on the gain), the largest gain and where, the winners at the reported and the
    best rates (``winner_pair``, ``n_winner_changes``) and ``claims``: bn_train's difference-in-differences against
    ``control`` at the smallest tuning batch size, at both (family ``lr_did``, keys ``lr_did_<base|best>_<target>``)."""
    base, best = tune[tune.lr_factor == 1.0], best_rate_table(tune)
    means = tune.groupby(CELL + ["lr_factor"])["target"].mean()
    cells = best.drop_duplicates(CELL)
    gains = {(r.target_name, r.strategy, r.batch_size): float(means[(r.target_name, r.strategy, r.batch_size,
             r.best_factor)] - means[(r.target_name, r.strategy, r.batch_size, 1.0)]) for r in cells.itertuples()}
    grid = sorted(set(tune.lr_factor))
    gk = max(gains, key=gains.get)
    out: dict = dict(winner_pair={}, n_cells=len(cells), n_moved=int((cells.best_factor != 1.0).sum()),
                     n_edge=int(sum(_edge(v, grid) for v in cells.best_factor)),
                     n_diverged=int(tune.diverged.sum()) if "diverged" in tune else 0, n_runs=len(tune),
                     gain_max=gains[gk], gain_where=f"{STRATEGY_LABELS[gk[1]]}, {gk[0]} target, batch {gk[2]}")
    for a, b in zip(winners(base)[0].itertuples(), winners(best)[0].itertuples()):
        la, lb = STRATEGY_LABELS[a.winner], STRATEGY_LABELS[b.winner]
        out["winner_pair"][f"{a.target_name}_b{a.batch_size}"] = f"unchanged ({la})" if a.winner == b.winner else \
            f"{la} at the reported rate, {lb} at the best rates tried"
    out["n_winner_changes"] = sum(not v.startswith("unchanged") for v in out["winner_pair"].values())
    did = {f"lr_did_{tag}_{t}": break_differences(d, t, "bn_train", reference, control)
           for t in sorted(tune.target_name.unique()) for tag, d in (("base", base), ("best", best))
           if {"bn_train", control} <= set(d.strategy)}
    out["claims"] = _smallest_family("lr_did", did, "did", int(tune.batch_size.min()))
    return out


def diverged_where(df: pd.DataFrame) -> str:
    """Where runs diverged: ``"<target> target, <strategy>, batch m: k of n runs"`` joined by "; ", or ``"none"``."""
    if "diverged" not in df or not df.diverged.any():
        return "none"
    return "; ".join(f"{t} target, {STRATEGY_LABELS[s]}, batch {b}: {int(g.diverged.sum())} of {len(g)} runs"
                     for (t, s, b), g in df.groupby(CELL) if g.diverged.any())


def _cells_where(cells: pd.DataFrame, most: int = 8) -> str:
    """Near-chance cells, readable; more than ``most``: a count pointing to the figure instead of a list."""
    if len(cells) > most:
        return f"{len(cells)} cells, too many to list; the accuracy figure shows them"
    return "; ".join(f"{r.target_name} target, {STRATEGY_LABELS[r.strategy]}, batch {r.batch_size} ({r.target:.3f})"
                     for r in cells.itertuples()) or "none"


def _n_small_beats_large(df: pd.DataFrame, small: int, large: int) -> tuple[int, int]:
    """``(k, m)``: of the ``m`` strategy/target pairs with both batch sizes, the ``k`` whose paired accuracy at
    ``small`` minus ``large`` is shown above zero (Bonferroni over the ``m``, counted as printed)."""
    diffs = [piv[small] - piv[large] for _, g in df.groupby(["target_name", "strategy"])
             for piv in [g.pivot(index="seed", columns="batch_size", values="target")]
             if small in piv and large in piv and small != large]
    if not diffs:
        return 0, 0
    fam = Family(len(diffs), ALPHA)
    return count_verdicts(claims_table([decide(d, str(i), family=fam) for i, d in enumerate(diffs)]))["higher"], len(diffs)


def _seed_means(d: pd.DataFrame, column: str) -> pd.Series:
    """Per seed the mean of ``column`` over its runs; a run's NaN drops its seed (not averaged over fewer runs); a
    repeated (seed, cell) row raises ``ValueError``."""
    keys = ["seed"] + CELL
    dup = d.duplicated(keys)
    if dup.any():
        raise ValueError(f"batch_size findings: {int(dup.sum())} repeated ({', '.join(keys)}) rows, e.g. "
                         f"{d.loc[dup, keys].iloc[0].to_dict()}; give each run once")
    return d.groupby("seed")[column].mean(skipna=False)


def _deepest_minus_others(nt: pd.DataFrame) -> pd.Series:
    """Per seed, at the smallest noise batch size: the deepest layer's ``sqrt(var_mean_rel)`` minus the largest
    other layer's (empty with one layer; a missing layer makes the seed's NaN; a repeated row raises)."""
    n2 = nt[nt.batch_size == nt.batch_size.min()]
    piv = n2.assign(rel=np.sqrt(n2.var_mean_rel)).pivot(index="seed", columns="layer", values="rel")
    if piv.shape[1] < 2:
        return pd.Series(dtype=float)
    deepest = piv.columns.max()
    return piv[deepest] - piv.drop(columns=deepest).max(axis=1, skipna=False)


# --- the claims and the numbers -------------------------------------------------------------------------------------

def findings(df: pd.DataFrame, diag: pd.DataFrame, reference: int, margin: float = 0.02,
             equivalence_margin: float = 0.01, tune: pd.DataFrame | None = None,
             tuned: pd.DataFrame | None = None, decided: tuple | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Chapter 5's ``(claims, numbers)``.

    Claim families (Bonferroni intervals, Holm within each): ``winners``, ``recommend`` (best per-sample norm minus
    best BN strategy), ``adabn``, ``gap`` (train minus eval mode), ``restat`` (re-estimated minus fine-tuned
    statistics at the largest batch size), ``noise``, ``check``, ``drop`` / ``did`` (smallest batch size minus the
    reference, and minus the control's, at the break verdict's level), ``lr_did`` and, with ``decided``
    (:func:`.run.decision_tables`' ``(check, reported)``), :func:`.decision.decision`'s. Numbers: accuracies are
    fractions; break tokens from :func:`break_batch` (``"n/a"`` against the control for a per-sample norm). Raises
    ``ValueError`` if ``reference`` is not a batch size of ``df``."""
    if reference not in set(df.batch_size):
        raise ValueError(f"reference={reference} is not a batch size of the results {sorted(set(df.batch_size))}")
    sb, lb = int(df.batch_size.min()), int(df.batch_size.max())
    chance = 1 / int(df.n_classes.iloc[0])
    strategies, targets, cells = set(df.strategy), sorted(df.target_name.unique()), sorted({sb, reference})
    has_control = CONTROL in strategies

    def tok(t, s, ctl=None, side="below", mg=margin, d=df):  # the break token of one strategy on one target
        return break_word(break_batch(d, t, s, reference, mg, ctl, side)[0], side)

    breaks, above, sbreaks, sabove, swide, did, drop = {}, {}, {}, {}, {}, {}, {}
    for t in targets:
        for s in sorted(df[df.target_name == t].strategy.unique()):
            k = f"{t}_{s}"
            breaks[k], above[k] = tok(t, s), tok(t, s, side="above")
            if sb in (d := break_differences(df, t, s, reference)):
                drop[f"drop_{k}_b{sb}"] = d
            if has_control and s != CONTROL and s in PER_SAMPLE_STRATEGIES:
                sbreaks[k] = sabove[k] = swide[k] = "n/a"
            elif has_control and s != CONTROL:
                sbreaks[k], sabove[k], swide[k] = tok(t, s, CONTROL), tok(t, s, CONTROL, "above"), tok(
                    t, s, CONTROL, mg=WIDE_MARGIN)
                if sb in (d := break_differences(df, t, s, reference, CONTROL)):
                    did[f"did_{k}_b{sb}"] = d
    above_restat = {}
    bn = df.strategy == "bn_train"
    if has_control and bn.any() and "target_restat" in df and df.loc[bn, "target_restat"].notna().all():
        dr = df.assign(target=df.target.where(~bn, df.target_restat))
        above_restat = {t: tok(t, "bn_train", CONTROL, "above", d=dr) for t in targets}
    # --- the claims
    w, wclaims = winners(df, chance)
    best = {(t, b): bn_vs_per_sample(df, t, b) for t in targets for b in cells}
    tables = [wclaims, _family("recommend", {f"recommend_{t}_b{b}": v[2] for (t, b), v in best.items()}, "ps")]
    if {"adabn", "stats_frozen"} <= strategies:
        tables.append(ask(df, [Question("adabn_vs_frozen_{target_name}_b{batch_size}", "adabn", "stats_frozen",
                                        value="target", by="strategy", each=("target_name", "batch_size"),
                                        at=dict(batch_size=tuple(cells)), words="AdaBN")], ALPHA, family="adabn"))
    gap, restat = {}, {}
    for t in targets:
        g_t = df[(df.target_name == t) & bn].set_index("seed")
        for b, name in [(b, f"b{b}") for b in cells] + [(lb, "top")]:
            if (g_t.batch_size == b).any():
                gap[f"gap_{t}_{name}"] = g_t[g_t.batch_size == b]["train_eval_gap"]
        g = g_t[g_t.batch_size == lb]
        if len(g) and "target_restat" in g and g.target_restat.notna().all():
            restat[f"restat_gain_{t}"] = g["target_restat"] - g["target"]
    tables += [_family(name, items, name) for name, items in (("gap", gap), ("restat", restat)) if items]
    nt = noise_table(diag)
    tables.append(_family("noise", {"deepest_noisiest": _deepest_minus_others(nt)}, "noise"))
    tables.append(ask(df, [Question("gap_zero_elsewhere", value="train_eval_gap", exact=0.0,
                                    at=dict(strategy=tuple(sorted(strategies - {"bn_train"}))))], ALPHA, family="check"))
    tables += [_smallest_family(name, items, name, sb) for name, items in (("drop", drop), ("did", did)) if items]
    lr = lr_check(tune, reference) if tune is not None and len(tune) else {}
    if len(lr_claims := lr.pop("claims", ())):
        tables.append(lr_claims)
    dec = decision.decision(decided[1], decided[0], margin) if decided is not None and len(decided[1]) else None
    if dec is not None:
        tables.append(dec["claims"])
    claims = pd.concat(tables, ignore_index=True)
    # --- descriptive numbers
    acc, retention = ({f"{t}_{s}_b{b}": t_interval(df[(df.target_name == t) & (df.strategy == s) &
                                                      (df.batch_size == b)][col])
                       for t in targets for s in df.strategy.unique() for b in sorted({sb, reference, lb})}
                      for col in ("target", "task_a_after"))
    spread, spread_top = ({f"{t}_{s}": float(np.std(g["target"], ddof=1))
                           for (t, s), g in df[df.batch_size == b].groupby(["target_name", "strategy"])}
                          for b in (sb, lb))
    n2, ntop = nt[nt.batch_size == nt.batch_size.min()], nt[nt.batch_size == nt.batch_size.max()]
    per_layer = lambda t, fn: {f"l{l}": float(fn(g)) for l, g in t.groupby("layer")}  # noqa: E731
    slopes = {}
    for l, g in nt.groupby("layer"):
        mm_ = g.groupby("batch_size")[["var_mean_rel", "var_var_rel"]].mean()
        if len(mm_) >= 2:
            x = np.log(mm_.index.to_numpy(dtype=float))
            slopes[f"l{l}"] = [float(np.polyfit(x, np.log(mm_[c]), 1)[0]) for c in ("var_mean_rel", "var_var_rel")]
    pt = precise_table(diag)
    pp = pt[pt.kind == "precise"]
    gmax = int(pt.n_samples.max())
    precise = {k: {} for k in ("enough", "claim", "mean_enough", "var_enough", "stats_enough", "smallest_n")}
    for m in sorted(pp.batch_size.unique()):
        n0, n = int(pp[pp.batch_size == m].n_samples.min()), samples_enough(pt, int(m), equivalence_margin)
        nm, nv = stats_enough(pt, int(m), "mean_err"), stats_enough(pt, int(m), "var_err")
        for k, v in dict(enough=enough_word(n, n0), claim=claim_word(n, gmax), mean_enough=enough_word(nm, n0),
                         var_enough=enough_word(nv, n0), smallest_n=n0,
                         stats_enough=enough_word(max(nm, nv) if nm and nv else 0, n0)).items():  # mean and variance
            precise[k][f"b{m}"] = v
    top = pp[pp.n_samples == gmax].groupby("batch_size")[["mean_err", "var_err"]].mean()
    ratio_of = lambda col: float(top.loc[2, col] / top.loc[32, col]) if {2, 32} <= set(top.index) else math.nan  # noqa
    mt = mismatch_table(df, reference) if {"adabn", "stats_frozen"} <= strategies else None
    rho_w = {} if mt is None else {t: rank_correlation(a.mismatch_kl, a.advantage)[0] for t in targets
                                   for a in [mt[(mt.strategy == "adabn") & (mt.target_name == t)]]}
    src = {n: float(g.groupby("seed")["source_task_a_accuracy"].first().mean())
           for n, g in df.groupby(df.strategy.map(STRATEGY_NORM), sort=True)} if "source_task_a_accuracy" in df else {}
    replaced = {s: t_interval(_seed_means(df[df.strategy == s], "task_a_before"))
                for s in ("to_group", "to_layer") if "task_a_before" in df and s in strategies}
    near = near_chance_cells(df, chance)
    n_small, n_pairs = _n_small_beats_large(df, sb, lb)
    family_size = {str(k): int(v) for k, v in claims.groupby("family").size().items()}
    family_size.update(near_chance=int(df.groupby(CELL).ngroups), small_beats_large=n_pairs)
    return claims, numbers_table(dict(
        n_seeds=int(df.seed.nunique()), n_runs=len(df), chance=chance, smallest_batch=sb, largest_batch=lb,
        reference_batch=int(reference), margin=float(margin), equivalence_margin=float(equivalence_margin),
        breaks=breaks, breaks_above=above, breaks_stats=sbreaks, breaks_stats_above=sabove, breaks_stats_wide=swide,
        breaks_stats_above_restat=above_restat, n_break_above=int(sum(v != "never" for v in above.values())),
        n_break_below=int(sum(v != "never" for v in breaks.values())),
        n_stats_break_below=int(sum(v not in ("never", "n/a") for v in sbreaks.values())),
        winner={f"{r.target_name}_b{r.batch_size}": STRATEGY_LABELS[r.winner] for r in w.itertuples()},
        n_winner_separated=int(w.separated.sum()),
        best_bn={f"{t}_b{b}": STRATEGY_LABELS[v[0]] for (t, b), v in best.items()},
        best_ps={f"{t}_b{b}": STRATEGY_LABELS[v[1]] for (t, b), v in best.items()},
        acc=acc, acc_top={k.rsplit("_b", 1)[0]: v for k, v in acc.items() if k.endswith(f"_b{lb}")},
        n_diverged=int(df.diverged.sum()) if "diverged" in df else 0, diverged_where=diverged_where(df),
        n_near_chance=len(near), near_chance_where=_cells_where(near), n_small_beats_large=n_small,
        spread=spread, spread_top=spread_top, retention=retention, source_acc=src, replaced_before=replaced,
        noise_ratio_m2=per_layer(n2, lambda g: (g.var_mean_rel / g.pred_mean_rel).mean()),
        noise_var_ratio_m2=per_layer(n2, lambda g: (g.var_var_rel / g.pred_var_rel).mean()),
        noise_var_ratio_top=per_layer(ntop, lambda g: (g.var_var_rel / g.pred_var_rel).mean()),
        noise_largest_batch=int(nt.batch_size.max()),
        noise_rel_std_m2=per_layer(n2, lambda g: np.sqrt(g.var_mean_rel).mean()),
        n_eff_frac=per_layer(nt, lambda g: g.n_eff_frac.mean()),
        noise_slope_mean={k: v[0] for k, v in slopes.items()}, noise_slope_var={k: v[1] for k, v in slopes.items()},
        **{f"precise_{k}": v for k, v in precise.items()},
        precise_mean_err_ratio_b2_b32=ratio_of("mean_err"), precise_var_err_ratio_b2_b32=ratio_of("var_err"),
        precise_source_acc=float(pt[pt.kind == "source"].accuracy.mean()),
        precise_exact_acc=float(pt[pt.kind == "exact"].accuracy.mean()), stat_tolerance=STAT_TOLERANCE,
        mismatch={t: t_interval(diag[f"mismatch_kl_{t}"]) for t in targets if f"mismatch_kl_{t}" in diag},
        mismatch_rho_within=rho_w, n_sizes=int(df.batch_size.nunique()),
        n_winner_same_targets=int(sum(len(set(g.winner)) == 1 for _, g in w.groupby("batch_size"))),
        lr=lr, family_size=family_size, **(decision.numbers(dec) if dec is not None else {})))


def decided_tables(tables: dict) -> tuple | None:
    """The decision's ``(check, reported)`` from a page's sibling tables (:data:`.run.SIBLING_TABLES`); ``None``
    where the run had none."""
    dec = tables.get("decision")
    return None if dec is None or not len(dec) else (tables["decision_check"], dec)


def page_numbers(config: Config, f: pd.DataFrame, runs: pd.DataFrame, tune: pd.DataFrame,
                 tuned: pd.DataFrame | None = None, decided: tuple | None = None) -> pd.DataFrame:
    """:func:`findings`' numbers ``f`` with the settings and costs the page cites beside them (worker-minutes of
    the runs' ``wall_s``; with ``decided``, the decision's runs, costs, steps budget and grid)."""
    extra = {}
    if decided is not None:
        one_run = ["seed", "strategy", "batch_size", "samples", "lr", "target_name"]
        check, dec = (t.drop_duplicates(one_run) for t in decided)
        small, large = min(config.decision_batch_sizes), max(config.decision_batch_sizes)
        extra = dict(decision_cpu_min=float(pd.concat([check, dec]).drop_duplicates(one_run).wall_s.sum()) / 60,
                     decision_n_runs=len(dec), decision_n_check_runs=len(check),
                     budget_steps=config.budget_steps, grid_extensions=config.grid_extensions,
                     steps_budget_samples_small=config.budget_steps * small,
                     steps_budget_samples_large=config.budget_steps * large,
                     samples_budget_steps_small=config.samples // small,
                     samples_budget_steps_large=config.samples // large)
    tuned = tuned if tuned is not None and len(tuned) else pd.DataFrame({"wall_s": []})
    sb, lb = number(f, "smallest_batch"), number(f, "largest_batch")
    return pd.concat([f, numbers_table(dict(
        main_cpu_min=float(runs.wall_s.sum()) / 60, tune_cpu_min=float(tune.wall_s.sum()) / 60,
        tuned_cpu_min=float(tuned.wall_s.sum()) / 60, n_tuned_runs=len(tuned), base_lr=config.base_lr,
        wide_margin=WIDE_MARGIN, n_pairs=int(runs.groupby(["target_name", "strategy"]).ngroups),
        precise_source_gap=number(f, "precise_source_acc") - number(f, "precise_exact_acc"),
        n_tune_seeds=len(config.tune_seeds), n_lr_factors=len(config.lr_factors), lr_factor_low=min(config.lr_factors),
        lr_factor_high=max(config.lr_factors), adabn_batch_size=config.adabn_batch_size,
        adabn_samples=config.adabn_samples, samples=config.samples, steps_smallest=config.samples // sb,
        steps_largest=config.samples // lb, lr_smallest=config.lr_for(sb), lr_largest=config.lr_for(lb),
        stage1_steps=config.stage1_steps, near_chance_margin=NEAR_CHANCE, **extra))], ignore_index=True)


# --- the page's sentences -------------------------------------------------------------------------------------------

def entries(f: pd.DataFrame, stem: str) -> dict:
    """``{entry: value}`` of the rows ``<stem>_<entry>`` of the numbers table ``f``."""
    return {k[len(stem) + 1:]: number(f, k) for k in f["key"] if k.startswith(f"{stem}_")}


_RATIO = lambda c, f: dict(ratio=float(number(f, "precise_var_err_ratio_b2_b32")))  # noqa: E731
_LARGE = lambda c, f: dict(ref=number(f, "reference_batch"), n=number(f, "n_break_above"))  # noqa: E731
_ENOUGH = lambda c, f: dict(  # noqa: E731
    margin=number(f, "equivalence_margin"), tol=number(f, "stat_tolerance"),
    conj="but" if number(f, "precise_stats_enough_b2") == "none tried" else "and",
    **{f"{name}{m}": enough_phrase(number(f, f"precise_{row}_b{m}"))
       for name, row in (("acc", "enough"), ("stats", "stats_enough")) for m in (2, 32)})
_RESTAT = "Re-estimate BatchNorm statistics with `bnstudy.update_bn_stats(backbone, target_loader)`"

#: The page's rule-triggered sentences: ``restat_advice`` (in large batches where precise BN in batches of 2 errs
#: more than in batches of 32), ``large_batch`` (a collapse only where a pair breaks above the reference) and
#: ``precise_enough`` (the samples precise BN needs by both criteria).
NOTES = (
    Note("restat_advice", lambda c, f: _RATIO(c, f)["ratio"] > 1,
         _RESTAT + " in large batches (a forward pass without gradients): in batches of 2 the variance's error is "
         "{ratio:.1f} times that in batches of 32.", _RATIO),
    Note("restat_advice", lambda c, f: not _RATIO(c, f)["ratio"] > 1, _RESTAT + " (a forward pass without gradients)."),
    Note("large_batch", lambda c, f: number(f, "n_break_above") == 0,
         "Above the reference batch size of {ref}, no strategy and target pair is shown to break from any cause.",
         _LARGE),
    Note("large_batch", lambda c, f: number(f, "n_break_above") != 0,
         "Above the reference batch size of {ref}, {n} strategy and target pairs are shown to break from any cause: "
         "the large batches of this protocol lose accuracy.", _LARGE),
    Note("precise_enough", lambda c, f: True,
         "Precise BN's re-estimate is within ±{margin:.2f} of the exact statistics' accuracy {acc32} in batches of 32 "
         "and {acc2} in batches of 2 (a weak test here: that accuracy is at its ceiling); by the stricter test, its "
         "mean and variance errors are below {tol:.2f} {stats32} in batches of 32 {conj} {stats2} in batches of 2.",
         _ENOUGH),
)


def page_words(claims: pd.DataFrame, f: pd.DataFrame, dec: dict) -> dict[str, str]:
    """The page's sentences (glued as ``ch05_<name>``): the :data:`NOTES`, :func:`.decision.words` of the decision
    ``dec`` as ``decision_<name>`` and ``mismatch_rho_text_<target>`` (``"n/a"`` where too few seeds give none).
    Raises ``ValueError`` without ``dec`` (the page's answer is the decision's)."""
    if dec is None:
        raise ValueError("page_words needs the batch-size-2 decision (decision_batch_sizes empty, or rows without it)")
    out = dict(notes(NOTES, claims, f), **{f"decision_{k}": v for k, v in decision.words(dec).items()})
    for t, rho in entries(f, "mismatch_rho_within").items():
        out[f"mismatch_rho_text_{t}"] = "n/a" if rho != rho else f"{rho:.2f}"
    return out
