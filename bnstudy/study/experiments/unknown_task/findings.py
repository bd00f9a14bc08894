"""Chapter 6, what is claimed, from :func:`.run.run`'s rows: the claims tables (:func:`claims`, :func:`cell_tests`,
:func:`family_claims`), the numbers tables (:func:`findings`, :func:`temperature_findings`, :func:`family_findings`),
the tidy tables the page saves and draws, and the words the data choose (notes: a predicate and a fixed sentence).

Intervals, tests and verdicts come from :mod:`bnstudy.study.inference`. Comparisons are paired per seed on the seed
means (tasks averaged within a seed), condition minus the oracle (the task's own bank); accuracies are fractions.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ...inference import Family, Interval, Question, _slug, ask, count_verdicts, decide, number, numbers_table, \
    one_sided_p, paired_differences, t_interval
from ...words import Note, claim, claim_text, count_word, counts_text, fmt_level, join, notes, verdict_md
from .run import CONDITIONS, FAMILY_SHIFTS, FIRST_STRENGTH_GRID, HARD_ROUTERS, ROUTE_OK, ROUTERS, TASK_NAMES, \
    TEMPERATURE_TRIED_FIRST, TOST_MARGIN, Config

KEYS = ["n_tasks", "strength", "inference_batch", "condition"]
CELL = KEYS[:3]
VALUES = ["routing_accuracy", "accuracy", "accuracy_routed_head"]
CLAIM_COLUMNS = ["key", "estimate", "low", "high", "n", "p", "p_adjusted", "p_equivalence", "margin", "confidence",
                 "kind", "verdict"]
#: Baselines that make no routing decision: the tidy tables keep them at the smallest inference batch only.
BATCH_FREE = ("train_mode", "pinned")
#: The page's direction words (condition minus the oracle, :func:`bnstudy.study.inference.decide`).
DIRECTIONS = tuple(f"{w} {d}" for w in ("router", "mixture", "train mode", "pinned", "routed head")
                   for d in ("lower", "higher"))
ALPHA = 0.05  # the overall level of every family on the page
NO_INTERVAL = Interval(math.nan, math.nan, math.nan, 0)
#: Verdict kinds that leave a comparison open (neither a direction nor equivalence shown).
OPEN_KINDS = ("not decided", "too few seeds")


# --- tidy tables ---------------------------------------------------------------------------------------------------

def seed_means(df: pd.DataFrame) -> pd.DataFrame:
    """Per seed and cell (:data:`KEYS`): :data:`VALUES` averaged over the tasks (a task's NaN makes its seed's mean
    NaN: the paired comparisons leave that seed out). Raises ``ValueError`` for a repeated (seed, cell, task) row."""
    cols = ["seed"] + KEYS + ["task"]
    dup = df.duplicated(cols)
    if dup.any():
        raise ValueError(f"seed_means: {int(dup.sum())} repeated (seed, {', '.join(KEYS)}, task) rows, e.g. "
                         f"{df.loc[dup, cols].iloc[0].to_dict()}; give each run once")
    return df.groupby(["seed"] + KEYS, sort=False)[VALUES].mean(skipna=False).reset_index()


def _batch_free_once(t: pd.DataFrame) -> pd.DataFrame:
    b1 = t.inference_batch.min()
    return t[~(t.condition.isin(BATCH_FREE) & (t.inference_batch != b1))].reset_index(drop=True)


def seed_table(df: pd.DataFrame, values: list, conditions=CONDITIONS) -> pd.DataFrame:
    """Tidy: ``seed`` and :data:`KEYS` with the task means ``values`` of ``conditions``."""
    m = seed_means(df)
    return _batch_free_once(m[m.condition.isin(conditions)][["seed"] + KEYS + list(values)])


def per_task_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per task and cell: :data:`VALUES` averaged over seeds, and ``n_seeds``."""
    g = df.groupby(KEYS + ["task"], sort=True)
    out = g[VALUES].mean()
    out["n_seeds"] = g["seed"].nunique()
    return _batch_free_once(out.reset_index())


def _diff(sel: pd.DataFrame, cond: str, ref: str, value: str = "accuracy", ref_value: str | None = None):
    """Per-seed ``value(cond) - ref_value(ref)`` (default ``ref_value``: ``value``) in the seed means ``sel``."""
    x = sel[sel.condition.isin([cond, ref])]
    x = x.assign(_v=np.where(x.condition == cond, x[value], x[ref_value or value]))
    return paired_differences(x, "_v", "condition", cond, ref)


def _gap_rows(m: pd.DataFrame, cond: str, value: str = "accuracy", **fixed) -> list[dict]:
    recs = []
    for key, sel in m.groupby(CELL):
        if {cond, "oracle"} <= set(sel.condition):
            iv = t_interval(_diff(sel, cond, "oracle", value, "accuracy"))
            recs.append(dict(zip(CELL, key), **fixed, mean=iv.mean, ci_low=iv.low, ci_high=iv.high, n_seeds=iv.n))
    return recs


def gap_table(df: pd.DataFrame, value: str = "accuracy", conditions=CONDITIONS) -> pd.DataFrame:
    """Per cell and condition: ``value(condition) - accuracy(oracle)`` over seeds, ``mean, ci_low, ci_high,
    n_seeds`` (95% t). With ``"accuracy_routed_head"`` the router picks the bank *and* the head."""
    m = seed_means(df)
    return _batch_free_once(pd.DataFrame([r for c in conditions if c != "oracle"
                                          for r in _gap_rows(m, c, value, condition=c)]))


def _temperature_means(df: pd.DataFrame, tau: float) -> pd.DataFrame:
    """Seed means of the oracle and, as ``mixture``, the mixture at temperature ``tau``, at the smallest batch."""
    d = df[(df.inference_batch == df.inference_batch.min()) & ((df.condition == "oracle") |
                                                                np.isclose(df.temperature, tau))]
    return seed_means(d.assign(condition=d.condition.where(d.condition == "oracle", "mixture")))


def temperature_table(df: pd.DataFrame) -> pd.DataFrame:
    """The temperature check's rows as mixture minus oracle per ``n_tasks, strength, temperature`` (smallest batch):
    ``mean, ci_low, ci_high, n_seeds``. Raises ``ValueError`` without a temperature column."""
    if "temperature" not in df or df["temperature"].isna().all():
        raise ValueError("temperature_table needs mixture rows with a temperature column (run with this version)")
    taus = sorted(df.loc[df.condition.str.startswith("mixture"), "temperature"].unique())
    recs = [r for tau in taus for r in _gap_rows(_temperature_means(df, tau), "mixture", temperature=float(tau))]
    return pd.DataFrame(recs)[["n_tasks", "strength", "temperature", "mean", "ci_low", "ci_high", "n_seeds"]]


# --- claims -----------------------------------------------------------------------------------------------------------

#: The page's questions, one family at margin :data:`TOST_MARGIN`, one claim per task count, one decision per sample
#: unless named; then the code's identities (exact checks, not findings).
_STRONG_B1 = dict(strength="max", inference_batch="min")
_GENTLE_B1 = dict(strength="min_positive", inference_batch="min")
_VS_ORACLE = dict(reference="oracle", each=("n_tasks",), table="means", margin=TOST_MARGIN)


def _routed_head(stem: str, strength, common: dict) -> tuple:
    """The fully task-unknown questions, ``accuracy_routed_head(nearest_first) - accuracy(oracle)`` at ``strength``,
    per sample (``<stem>_b1_k<K>``) and with the largest batches (``<stem>_bmax_k<K>``)."""
    return tuple(Question(f"{stem}_{name}_k{{n_tasks}}", "nearest_first", at=dict(strength=strength, inference_batch=b),
                          value="accuracy_routed_head", reference_value="accuracy", words="routed head", **common)
                 for name, b in (("b1", "min"), ("bmax", "max")))


QUESTIONS = (
    Question("train_vs_oracle_k{n_tasks}", "train_mode", at=_STRONG_B1, words="train mode", **_VS_ORACLE),
    Question("pinned_vs_oracle_k{n_tasks}", "pinned", at=_STRONG_B1, words="pinned", **_VS_ORACLE),
    Question("mixture_vs_oracle_k{n_tasks}", "mixture", at=_STRONG_B1, words="mixture", **_VS_ORACLE),
    Question("router_vs_oracle_k{n_tasks}", "nearest_first", at=_GENTLE_B1, words="router", **_VS_ORACLE),
    *_routed_head("routed_gentle", "min_positive", _VS_ORACLE),
    Question("oracle_exact", value="oracle_logit_change", table="rows", exact=0.0),
    Question("train_is_last_bank", "train_mode", "oracle", at=dict(n_tasks=2, task=TASK_NAMES[1]), table="rows",
             pair=("seed", "strength", "inference_batch"), exact=0.0, optional=True),  # a design without 2 tasks
    Question("perfect_at_strong", value="routing_accuracy", at=dict(strength="max", condition=HARD_ROUTERS),
             table="means", exact=1.0),
)


def _conditions(df: pd.DataFrame, who: str) -> pd.DataFrame:
    missing = set(CONDITIONS) - set(df["condition"])
    if missing:
        raise ValueError(f"{who} needs every condition; missing {sorted(missing)}")
    return df[df.condition.isin(CONDITIONS)]


def claims(df: pd.DataFrame) -> pd.DataFrame:
    """The claims table of :data:`QUESTIONS`. Raises ``ValueError`` if a condition is missing."""
    return ask(dict(means=seed_means(_conditions(df, "claims")), rows=df), QUESTIONS, ALPHA)


def cell_tests(df: pd.DataFrame) -> pd.DataFrame:
    """Every router cell (router, task count, strength, inference batch) against the oracle, one family: a claims
    table with the cell's columns, the verdict at half the margin (``*_half``), booleans ``equivalent``, ``below``,
    ``above``, ``identical`` (every input of every seed routed home with the oracle's accuracy: equal by
    construction, no finding; issue 35) and ``bound``, the largest |end| of the interval."""
    means = dict(means=seed_means(df))

    def asked(mg):
        return ask(means, [Question("{condition}|{n_tasks}|{strength}|{inference_batch}", conds, "oracle", each=CELL,
                                    table="means", margin=mg, words=w)
                           for conds, w in ((HARD_ROUTERS, "router"), (("mixture",), "mixture"))], ALPHA)

    out, half = asked(TOST_MARGIN), asked(TOST_MARGIN / 2)
    cell = out.key.str.split("|", expand=True)
    m = means["means"]
    oracle = m[m.condition == "oracle"].set_index(["seed"] + CELL)["accuracy"]
    routed = m[m.condition.isin(set(cell[0]))].set_index(["condition", "seed"] + CELL)
    same = (routed["accuracy"] - oracle.reindex(routed.index.droplevel("condition")).to_numpy()).eq(0) & \
        routed["routing_accuracy"].eq(1.0)
    identical = same.groupby(level=["condition"] + CELL).all()
    out = out.assign(condition=cell[0], n_tasks=cell[1].astype(int), strength=cell[2].astype(float),
                     inference_batch=cell[3].astype(int), p_equivalence_half=half.p_equivalence,
                     kind_half=half.kind, verdict_half=half.verdict, equivalent=out.kind == "equivalent",
                     equivalent_half=half.kind == "equivalent", below=out.kind == "lower", above=out.kind == "higher",
                     bound=np.maximum(out.low.abs(), out.high.abs()))
    out["identical"] = [bool(identical.get((c, k, t, b), False)) for c, k, t, b in
                        zip(out.condition, out.n_tasks, out.strength, out.inference_batch)]
    return out[["condition"] + CELL + [c for c in out.columns if c not in ["condition"] + CELL]]


def worst_cell(cells: pd.DataFrame) -> pd.DataFrame:
    """The router cell of :func:`cell_tests` with the most negative estimate, a one-row claims table (key
    ``worst_cell``). Raises ``ValueError`` without cells."""
    if not len(cells):
        raise ValueError("worst_cell needs at least one router cell (cell_tests of a table with routers)")
    w = cells.loc[[cells["estimate"].idxmin()]].assign(key="worst_cell", margin=float(TOST_MARGIN))
    return w[CLAIM_COLUMNS].reset_index(drop=True)


# --- findings: the numbers table ------------------------------------------------------------------------------------

def _threshold(levels: list[float], ok: list[bool]) -> float:
    """Smallest level from which ``ok`` holds at every larger level (NaN: at none): a fixed sequence, tested from
    the largest level down."""
    good = [t for i, t in enumerate(levels) if all(ok[i:])]
    return min(good) if good else math.nan


#: Numbers that are accuracies (printed in [0, 1]); every other interval is a difference (printed in [-1, 1]).
ACCURACY_FIELDS = ("route_zero_b1", "route_zero_bmax", "route_gentle_b1", "route_gentle_bmax", "route_strong_b1",
                   "route_gentle_b1_per_task", "route_at_works_b1", "routed_task_a_gentle_b1", "oracle_task_a",
                   "oracle_new_tasks")


def page_family(table: pd.DataFrame) -> Family:
    """The family (Bonferroni at :data:`ALPHA`) of the comparisons of a claims ``table`` (exact checks not counted).
    Raises ``ValueError`` if the table has no comparison."""
    comp = table[table.kind.isin(["higher", "lower", "equivalent", *OPEN_KINDS])]
    if not len(comp):
        raise ValueError("page_family needs a claims table with at least one comparison (findings.claims)")
    return Family(m=int(len(comp)), alpha=ALPHA)


#: The two wrong-bank baselines (condition, key stem): shared statistics and pinned (task A's) statistics.
BASELINES = (("train_mode", "train"), ("pinned", "pinned"))


def cost_before_routing(f: pd.DataFrame) -> list[tuple[str, int]]:
    """The (baseline stem, task count) pairs whose wrong-bank cost is shown below the strength from which
    per-sample routing works (anywhere, where routing never works), in task-count order."""
    out = []
    for k in _ks(f):
        w = number(f, f"works_from_b1_k{k}")
        out += [(stem, k) for _, stem in BASELINES
                if not math.isnan(t := number(f, f"wrong_from_{stem}_k{k}")) and (math.isnan(w) or t < w)]
    return out


def findings(df: pd.DataFrame, cells: pd.DataFrame | None = None) -> pd.DataFrame:
    """Chapter 6's numbers table (glued as ``ch06_<key>``) from :func:`.run.run`'s rows (``cells``:
    :func:`cell_tests` of ``df`` if already computed). Raises ``ValueError`` if a condition is missing.

    "zero", "gentle", "strong": the smallest strength, the smallest above zero, the largest; ``b1`` / ``bmax``: the
    smallest and largest inference batch; intervals 95% t over seeds, except the thresholds, which are read off the
    page's family intervals (:func:`page_family`; issue 35): ``works_from_*`` (``nearest_first`` shown above
    :data:`ROUTE_OK`) and ``wrong_from_*`` (a wrong bank shown lower), by :func:`_threshold`. The router cells'
    counts are those of the printed verdicts, also over the cells not equal by construction (``*_other``);
    ``n_above_chance``: one-sided tests at ``ALPHA / m``, Bonferroni over the cells at t = 0.
    """
    df = _conditions(df, "findings")
    fam = page_family(claims(df))
    m = seed_means(df)
    strengths, batches, ks = (sorted(m[c].unique()) for c in ("strength", "inference_batch", "n_tasks"))
    gentle = next((t for t in strengths if t > 0), strengths[0])
    strong, zero, b1, bmax, nf = strengths[-1], strengths[0], batches[0], batches[-1], "nearest_first"

    def at(k, t, b, cond=None):
        sel = m[(m.n_tasks == k) & (m.strength == t) & (m.inference_batch == b)]
        return sel if cond is None else sel[sel.condition == cond]

    def iv(col, cond, k, t, b, ref=None, ref_col=None):
        return t_interval(at(k, t, b, cond)[col] if ref is None else _diff(at(k, t, b), cond, ref, col, ref_col))

    out = dict(n_seeds=int(m.seed.nunique()), route_ok=ROUTE_OK, tost_margin=TOST_MARGIN, gentle=float(gentle),
               threshold_m=fam.m, threshold_confidence=100 * fam.confidence,
               strong=float(strong), zero=float(zero), b1=int(b1), bmax=int(bmax),
               route_strong_min={r: float(m[(m.strength == strong) & (m.condition == r)].routing_accuracy.min())
                                 for r in HARD_ROUTERS})
    for name, t, b in (("zero_b1", zero, b1), ("zero_bmax", zero, bmax), ("gentle_b1", gentle, b1),
                       ("gentle_bmax", gentle, bmax), ("strong_b1", strong, b1)):
        out[f"route_{name}"] = {f"k{k}_{nf}": iv("routing_accuracy", nf, k, t, b) for k in ks}
    chance_p = np.asarray([one_sided_p(at(k, zero, b, r).routing_accuracy, "greater", null=1 / k)
                           for k in ks for r in ROUTERS for b in batches], float)
    out.update(n_chance_cells=len(chance_p), n_above_chance=int((chance_p < ALPHA / max(len(chance_p), 1)).sum()))
    per_k = {}  # stem -> {"k<n>": value}
    for k in ks:
        put = lambda stem, v, sub="": per_k.setdefault(stem, {}).__setitem__(f"k{k}{sub}", v)  # noqa: E731
        for b, name in ((b1, "b1"), (bmax, "bmax")):
            ivs = [t_interval(at(k, t, b, nf).routing_accuracy, fam.confidence) for t in strengths]
            t0 = _threshold(strengths, [v.low > ROUTE_OK for v in ivs])
            put(f"works_from_{name}", t0)
            if name == "b1":
                put("route_at_works_b1", NO_INTERVAL if math.isnan(t0) else ivs[strengths.index(t0)])
        limit, lows = per_k["works_from_b1"][f"k{k}"], []
        for base, stem in BASELINES:
            ds = [_diff(at(k, t, b1), base, "oracle") for t in strengths]
            ivs = [t_interval(d, fam.confidence) for d in ds]
            t0 = _threshold(strengths, [decide(d, family=fam).kind == "lower" for d in ds])
            w = NO_INTERVAL if math.isnan(t0) else ivs[strengths.index(t0)]
            put(f"wrong_from_{stem}", t0)
            put(f"wrong_at_{stem}", w)
            put(f"wrong_from_{stem}_text", "at no strength tested" if math.isnan(t0) else
                f"from t = {fmt_level(t0)} on ({w.mean:.4f}, {100 * fam.confidence:.4g}% interval {w.low:.4f} to "
                f"{w.high:.4f})")
            lows += [v.low for t, v in zip(strengths, ivs) if math.isnan(limit) or t < limit]
        put("wrong_below_routing", float(np.nanmin(lows)) if any(v == v for v in lows) else math.nan)
        for r in ("classifier", "nearest_all"):
            put("route_diff_gentle_b1", iv("routing_accuracy", r, k, gentle, b1, nf), f"_{r}")
        nall = {t: iv("routing_accuracy", "nearest_all", k, t, b1, nf) for t in strengths}
        tw = min(nall, key=lambda t: nall[t].mean)
        put("nall_worst", nall[tw])
        put("nall_worst_t", float(tw))
        rows = df[(df.n_tasks == k) & (df.inference_batch == b1)]  # per task, at one decision per sample
        put("train_task_a", t_interval(_diff(rows[(rows.strength == strong) & (rows.task == "A")], "train_mode",
                                             "oracle")))
        rows = rows[rows.strength == gentle]
        for name, g in rows[rows.condition == nf].groupby("task"):
            put("route_gentle_b1_per_task", t_interval(g.groupby("seed").routing_accuracy.mean()), f"_{name}")
        a, new = rows[rows.task == "A"], rows[(rows.task != "A") & (rows.condition == "oracle")]
        put("routed_task_a_gentle_b1", t_interval(a[a.condition == nf].accuracy_routed_head))
        put("oracle_task_a", t_interval(a[a.condition == "oracle"].accuracy))
        put("oracle_new_tasks", t_interval(new.groupby("seed").accuracy.mean()))
        for name, b in (("zero_b1", b1), ("zero_bmax", bmax)):
            put(f"routed_{name}", iv("accuracy_routed_head", nf, k, zero, b, "oracle", "accuracy"))
    tests = cell_tests(df) if cells is None else cells
    other, kinds = tests[~tests.identical], ("equivalent", "lower", "higher", "not decided")
    for sub, t in (("", tests), ("_other", other)):
        counts = count_verdicts(t, ALPHA) if len(t) else dict.fromkeys(kinds, 0)
        out.update({f"n_{kind.replace(' ', '_')}{sub}": counts[kind] for kind in kinds},
                   **{f"n_equivalent_half{sub}": int(t.equivalent_half.sum())})
    worst = tests.loc[tests["estimate"].idxmin()]
    out.update(per_k, cost_after_routing=not cost_before_routing(numbers_table(per_k)), n_cells=len(tests),
               cells_confidence=100 * float(tests.confidence.iloc[0]), n_identical=int(tests.identical.sum()),
               n_cells_other=len(other), half_margin=TOST_MARGIN / 2,
               max_bound_hard=float(tests[tests.condition != "mixture"].bound.max()),
               worst_router=str(worst["condition"]), worst_strength=float(worst["strength"]),
               worst_batch=int(worst["inference_batch"]), worst_n_tasks=int(worst["n_tasks"]))
    return numbers_table(out, bounds=lambda key: (0.0, 1.0) if key in ACCURACY_FIELDS else (-1.0, 1.0))


def temperature_findings(df: pd.DataFrame, kept: float) -> pd.DataFrame:
    """The held-out temperature check's numbers table (glued as ``ch06t_<key>``): per temperature the most negative
    mixture minus oracle over the cells (``worst_tau_<value>``, 95%); ``best``, the temperature with the least
    negative worst mean, and whether no cell shows a direction there (``best_no_direction``, one family of
    ``best_m``); the seeds. Raises ``ValueError`` if the config's temperature ``kept`` was not checked."""
    t = temperature_table(df)
    if not np.isclose(t.temperature, kept).any():
        raise ValueError(f"temperature_findings: kept temperature {kept:g} not in {sorted(t.temperature.unique())}")
    worst = {tau: Interval(*g.loc[g["mean"].idxmin(), ["mean", "ci_low", "ci_high"]].astype(float),
                           int(g.loc[g["mean"].idxmin(), "n_seeds"])) for tau, g in t.groupby("temperature")}
    best = max(worst, key=lambda tau: worst[tau].mean)
    at_best = ask(dict(means=_temperature_means(df, best)), [Question(
        "{n_tasks}|{strength}", "mixture", "oracle", each=("n_tasks", "strength"), table="means")], ALPHA)
    seeds = sorted(df.seed.unique())
    return numbers_table(dict(kept=float(kept), best=float(best), best_no_direction=not at_best.kind.isin(
        ["higher", "lower"]).any(), best_m=len(at_best), worst={f"tau_{tau:g}": iv for tau, iv in worst.items()},
        seed_first=int(seeds[0]), seed_last=int(seeds[-1]), n_seeds=len(seeds)), bounds=lambda key: (-1.0, 1.0))


# --- words: the few sentences chosen by the data (every number the page cites is glued from the tables) -----------

def _ks(f: pd.DataFrame) -> list[int]:
    return sorted(int(k.rsplit("_k", 1)[1]) for k in f["key"] if k.startswith("works_from_b1_k"))


def _per_k(f: pd.DataFrame, stem: str) -> dict:
    return {key[len(stem) + 1:]: number(f, key) for key in f["key"] if key.startswith(f"{stem}_k")}


def works_phrase(thresholds: dict, gentle: float) -> str:
    """Where routing works, per task count (``thresholds``: ``{"k2": t, ...}``, NaN: at no strength tested; at or
    below ``gentle``: at every non-zero strength tested). One clause when every count shares the threshold."""
    ks = sorted(int(key[1:]) for key in thresholds)
    ts = [thresholds[f"k{k}"] for k in ks]
    desc = lambda t: ("at no strength tested" if math.isnan(t) else "at every non-zero strength tested"  # noqa: E731
                      if t <= gentle else f"from t = {fmt_level(t)} on")
    floor = lambda t: not math.isnan(t) and t <= gentle  # noqa: E731
    if all(a == ts[0] or math.isnan(a) and math.isnan(ts[0]) for a in ts):
        who = f"with {count_word(ks[0])} tasks" if len(ks) == 1 else "for both task counts" if len(ks) == 2 else \
            "for every task count"
        return f"{desc(ts[0])}, {who}" + (f" (t ≥ {fmt_level(gentle)}; the threshold may lie lower)"
                                          if floor(ts[0]) else "")
    return join([desc(t) + (f" (t ≥ {fmt_level(gentle)})" if floor(t) else "") + f" with {count_word(k)}"
                 + (" tasks" if i == 0 else "") for i, (k, t) in enumerate(zip(ks, ts))])


def page_settings(config: Config, table: pd.DataFrame) -> dict:
    """The settings the page cites (glued as ``ch06_<name>``): those tried first, chapter 3's gentlest ``both``
    level and margin (full profile), the router's samples, and the claims ``table``'s family (``claims_m``,
    ``claims_confidence``)."""
    from ..shift_strength.run import PROFILES as CH3_PROFILES, make_config as ch3_config
    fam = page_family(table)
    return dict(tau_first=TEMPERATURE_TRIED_FIRST, temperature=config.temperature,
                first_grid_text=", ".join(fmt_level(t) for t in FIRST_STRENGTH_GRID),
                ch3_gentlest=min(t for t in CH3_PROFILES["full"]["both_levels"] if t > 0),
                ch3_margin=ch3_config("full").tie_margin, router_samples=config.router_samples,
                router_samples_bmax=config.router_samples // max(config.inference_batches),
                claims_m=fam.m, claims_confidence=100 * fam.confidence)


def _early_fill(f: pd.DataFrame) -> dict:
    ks, words = _ks(f), dict(train="train mode", pinned="pinned statistics")
    counts = f"With {count_word(ks[0])} tasks" if len(ks) == 1 else "With both task counts" if len(ks) == 2 else \
        "With every task count"
    pairs = cost_before_routing(f)
    early = join([f"{join([words[s] for s, kk in pairs if kk == k])} with {count_word(k)} tasks"
                  for k in dict.fromkeys(kk for _, kk in pairs)]) if pairs else ""
    return dict(counts=counts, early=early)


def _works_at(f: pd.DataFrame) -> dict:
    """``at``: the family interval where per-sample routing starts to work, per task count that has one."""
    ks = [k for k in _ks(f) if not math.isnan(number(f, f"works_from_b1_k{k}"))]
    conf = f"{number(f, 'threshold_confidence'):.4g}% "
    ivs = [number(f, f"route_at_works_b1_k{k}") for k in ks]
    return {} if not ks else dict(at=join([
        f"{v.mean:.3f}, {conf if i == 0 else ''}interval {v.low:.3f} to {v.high:.3f}, with {count_word(k)}"
        + (" tasks" if i == 0 else "") for i, (k, v) in enumerate(zip(ks, ivs))]))


def _either(key: str, holds, yes: str, no: str, fill=None) -> tuple[Note, Note]:
    """Two notes of ``key``: ``yes`` where ``holds(claims, numbers)``, else ``no``."""
    return Note(key, holds, yes, fill), Note(key, lambda c, f: not holds(c, f), no, fill)


def _head(c: pd.DataFrame, f: pd.DataFrame, b: str, kinds=("lower",)) -> bool:
    """Whether some task count's fully task-unknown claim ``routed_gentle_<b>_k<K>`` is of one of ``kinds``."""
    return any(claim(c, f"routed_gentle_{b}_k{k}").kind in kinds for k in _ks(f))


#: The page's rule-triggered sentences (glued as ``ch06_<key>``): exactly one note of each key holds.
#: ``cost_vs_routing_text`` is plain words: the guide and the front page paste it across pages.
NOTES = (
    *_either("known_head_text", lambda c, f: number(f, "cost_after_routing"),
             "the first BatchNorm layer's input statistics pick the bank wherever a wrong bank measurably costs on "
             "this grid", "the first BatchNorm layer's input statistics pick the bank at strong shifts, but not "
             "everywhere a wrong bank measurably costs on this grid"),
    *_either("cost_vs_routing_text", lambda c, f: number(f, "cost_after_routing"),
             "{counts}, each wrong-bank cost is shown (at the page's family level) only at or above the strength from "
             "which per-sample routing works.", "Not everywhere does the cost wait for routing: the cost of {early} is "
             "shown (at the page's family level) below the strength from which per-sample routing works.",
             lambda c, f: _early_fill(f)),
    Note("works_at_text", lambda c, f: bool(_works_at(f)), "(routing there {at})", lambda c, f: _works_at(f)),
    Note("works_at_text", lambda c, f: not _works_at(f), "(no strength tested passes that rule)"),
    *_either("zero_shift_text", lambda c, f: number(f, "n_above_chance") == number(f, "n_chance_cells"),
             "which lets every router do better than chance (1/K) at every inference batch size",
             "which is not enough for every router to do better than chance (1/K) at every inference batch size "
             "({above} of the {cells} cells are shown above it)",
             lambda c, f: dict(above=number(f, "n_above_chance"), cells=number(f, "n_chance_cells"))),
    *_either("strong_routing_text", lambda c, f: claim(c, "perfect_at_strong").kind == "exact",
             f"There, every hard router ({join([f'`{r}`' for r in HARD_ROUTERS])}) sends every sample to its own bank "
             "at every inference batch size in every seed, so its accuracy equals the oracle's by construction: a "
             "check, not a finding.", "There, not every hard router routes every sample to its own bank (lowest "
             "seed's routing: {off}), so not every router's accuracy equals the oracle's by construction.",
             lambda c, f: dict(off=", ".join(f"`{r}` ({number(f, f'route_strong_min_{r}'):.3f})" for r in HARD_ROUTERS
                                             if number(f, f"route_strong_min_{r}") < 1.0))),
    *_either("batch_effect_text", lambda c, f: all(number(f, f"route_gentle_bmax_k{k}_nearest_first").mean
                                                   > number(f, f"route_gentle_b1_k{k}_nearest_first").mean
                                                   for k in _ks(f)),
             "pooling samples shrinks the noise in the estimated statistics, and here the larger batches route the "
             "gentlest shift more often on average with every task count",
             "pooling samples shrinks the noise in the estimated statistics, yet here the larger batches do not "
             "route the gentlest shift more often on average with every task count"),
)

#: The fully task-unknown outcomes at the gentlest shift, in order: a loss shown per sample and with batches; per
#: sample only, batches shown not to lose; per sample only, batches left open; no loss shown per sample but a claim
#: left open; none shown and none open. Each has the answer's first sentence (``lead``) and what to do.
_OUTCOMES = (
    lambda c, f: _head(c, f, "b1") and _head(c, f, "bmax"),
    lambda c, f: _head(c, f, "b1") and not _head(c, f, "bmax") and not _head(c, f, "bmax", OPEN_KINDS),
    lambda c, f: _head(c, f, "b1") and not _head(c, f, "bmax") and _head(c, f, "bmax", OPEN_KINDS),
    lambda c, f: not _head(c, f, "b1") and _head(c, f, "b1", OPEN_KINDS),
    lambda c, f: not _head(c, f, "b1") and not _head(c, f, "b1", OPEN_KINDS),
)
LEAD = tuple(Note("lead", when, text) for when, text in zip(_OUTCOMES, (
    "**Not without a cost.** Routing by statistics works at clear shifts, but with the task unknown and a gentle "
    "shift it loses accuracy, in batches too at some task count tried: keep a task label.",
    "**Yes, with batches.** Routing by statistics works at clear shifts, but one image at a time loses accuracy at "
    "gentle shifts when the task is unknown: route batches.",
    "**Not one image at a time.** Routing by statistics works at clear shifts, but one image at a time loses "
    "accuracy at gentle shifts when the task is unknown, and whether batches avoid that is not decided on this "
    "grid: keep a task label.",
    "**Not decided.** Routing by statistics works at clear shifts, but whether it loses accuracy at a gentle shift "
    "when the task is unknown is not decided on this grid (the intervals include losses): keep a task label until "
    "it is.",
    "**Yes, on this grid.** Routing by first-layer statistics shows no loss, even with the task unknown: keep one "
    "set of statistics per task and route.")))
HEAD = tuple(Note("unknown_head_text", when, text) for when, text in zip(_OUTCOMES, (
    "At gentle shifts, keep a task label: pooling inference batches cuts the loss but does not remove it.",
    "At gentle shifts, route pooled inference batches rather than single images, or keep a task label.",
    "At gentle shifts, single images lose, and whether pooled batches avoid the loss is not decided on this grid: "
    "keep a task label there.",
    "Whether a gentle shift needs a task label is not decided on this grid (some interval includes losses): keep "
    "one until it is.",
    "Even at gentle shifts no loss is shown on this grid: routing needs no task label there.")))


def page_words(f: pd.DataFrame, cells: pd.DataFrame, table: pd.DataFrame) -> dict[str, str]:
    """The page's data-chosen words (glued as ``ch06_<name>``) from :func:`findings`, :func:`cell_tests` and
    :func:`claims`: where routing works, the cells' counts, and the notes :data:`NOTES`, :data:`LEAD`, :data:`HEAD`."""
    gentle = number(f, "gentle")
    return dict(works_b1_short_text=works_phrase(_per_k(f, "works_from_b1"), gentle),
                works_bmax_text=works_phrase(_per_k(f, "works_from_bmax"), gentle),
                cell_counts_apart_text=cells_apart_text(cells), **notes(NOTES + LEAD + HEAD, table, f))


def cells_apart_text(cells: pd.DataFrame) -> str:
    """The router cells equal to the oracle by construction said apart (no finding; issue 35), then the book's
    counts of the printed verdicts over the others."""
    same, other = int(cells.identical.sum()), cells[~cells.identical]
    head = (f"{same} of the {len(cells)} router cells send every input to its own bank in every seed and so equal "
            "the oracle by construction (no finding); of the other cells, ")
    return head + counts_text(other, "others", "a router", "the oracle", TOST_MARGIN, ALPHA).replace(
        f" of the {len(other)} others", f" of {len(other)}", 1) if len(other) else head.replace(
        "; of the other cells, ", "; no other cell is left")


def _mixture(c: pd.DataFrame) -> str:
    """The kind of the soft mixture's claim at the largest task count."""
    return claim(c, max((key for key in c.key if key.startswith("mixture_vs_oracle_k")),
                        key=lambda key: int(key.rsplit("_k", 1)[1]))).kind


def _worst_at_best(tf: pd.DataFrame) -> dict:
    best = number(tf, "best")
    return dict(kept=number(tf, "kept"), best=best, m=number(tf, "best_m"),
                w=number(tf, f"worst_tau_{_slug(f'{best:g}')}"))


#: The practice bullet on the soft mixture: ``mixture_text`` by the mixture's verdict at the largest task count,
#: ``temperature_text`` by what the held-out temperature check (:func:`temperature_findings`) found.
MIXTURE_NOTES = (
    Note("mixture_text", lambda c, tf: _mixture(c) == "lower", "Prefer hard routing to the soft mixture."),
    Note("mixture_text", lambda c, tf: _mixture(c) == "higher", "The soft mixture beats the oracle here."),
    Note("mixture_text", lambda c, tf: _mixture(c) not in ("lower", "higher"),
         "The soft mixture gains nothing over hard routing."),
    Note("temperature_text", lambda c, tf: np.isclose(number(tf, "best"), number(tf, "kept")),
         "The held-out temperature check found no temperature better than τ = {kept:g}.",
         lambda c, tf: _worst_at_best(tf)),
    Note("temperature_text", lambda c, tf: not np.isclose(number(tf, "best"), number(tf, "kept"))
         and bool(number(tf, "best_no_direction")),
         "At τ = {best:g}, the least bad temperature in the held-out check, the mixture's worst difference from the "
         "oracle is {w.mean:.4f} ({w.low:.4f} to {w.high:.4f}) and no strength checked shows a direction (one "
         "family of {m}), so the advice is for τ = {kept:g} only (the main sweep was not rerun at τ = {best:g}).",
         lambda c, tf: _worst_at_best(tf)),
    Note("temperature_text", lambda c, tf: not np.isclose(number(tf, "best"), number(tf, "kept"))
         and not number(tf, "best_no_direction"),
         "At τ = {best:g}, the held-out check's least bad temperature, the mixture's worst difference from the "
         "oracle is {w.mean:.4f} ({w.low:.4f} to {w.high:.4f}); the main sweep was not rerun at it.",
         lambda c, tf: _worst_at_best(tf)),
)

# --- shift families that are not brightness/contrast (issue 35) ----------------------------------------------------

#: The family questions (a family of their own), per shift family and task count, condition minus the oracle: the
#: fully task-unknown cost and the task's own head on the routed statistics at the gentlest family strength, and the
#: cost of a wrong bank (shared drifting or pinned statistics) at the strongest.
_FAM = dict(reference="oracle", each=("shift_family", "n_tasks"), table="means", margin=TOST_MARGIN)
FAMILY_QUESTIONS = (
    *_routed_head("fam_{shift_family}_routed", "min_positive", _FAM),
    Question("fam_{shift_family}_router_k{n_tasks}", "nearest_first", at=_GENTLE_B1, words="router", **_FAM),
    Question("fam_{shift_family}_train_k{n_tasks}", "train_mode", at=_STRONG_B1, words="train mode", **_FAM),
    Question("fam_{shift_family}_pinned_k{n_tasks}", "pinned", at=_STRONG_B1, words="pinned", **_FAM),
)


def _per_family(fdf: pd.DataFrame, table) -> pd.DataFrame:
    """``table`` (a function of one family's rows) per shift family of ``fdf``, with ``shift_family``."""
    return pd.concat([table(g.drop(columns="shift_family")).assign(shift_family=f)
                      for f, g in fdf.groupby("shift_family", sort=False)], ignore_index=True)


def family_claims(fdf: pd.DataFrame) -> pd.DataFrame:
    """The claims table of :data:`FAMILY_QUESTIONS` and, at the second-gentlest strength (the first at which the
    blurs and added noise are more than next to nothing; added after issue 35's review), the fully task-unknown
    questions again (``fam_<family>_routed_next_<b1|bmax>_k<K>``); empty without rows. Raises ``ValueError`` if a
    condition is missing."""
    if not len(fdf):
        return pd.DataFrame(columns=CLAIM_COLUMNS)
    levels = sorted(fdf.strength.unique())
    questions = FAMILY_QUESTIONS + (_routed_head("fam_{shift_family}_routed_next", float(levels[1]), _FAM)
                                    if len(levels) > 1 else ())
    return ask(dict(means=_per_family(_conditions(fdf, "family_claims"), seed_means)), questions, ALPHA)


def family_findings(fdf: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """The families' numbers table (glued as ``ch06_<key>``), per shift family ``<f>`` and task count ``K``:
    ``fam_<f>_works_from_<b1|bmax>_k<K>`` (as in :func:`findings`, at the family claims' level, ``table``:
    :func:`family_claims`), routing and the new tasks' oracle accuracy at the gentlest and strongest strength,
    ``fam_<f>_worst_routed_k<K>`` (at ``_t_``): the most negative routed-head cost per sample where routing works
    (95%, not in the claims family); ``fam_bmax_home_from``: from which strength the largest batches route every
    input home. Raises ``ValueError`` if a condition is missing or ``table`` has no comparison."""
    fam = page_family(table)
    m = _per_family(_conditions(fdf, "family_findings"), seed_means)
    strengths, batches = sorted(m.strength.unique()), sorted(m.inference_batch.unique())
    amounts = [FAMILY_SHIFTS[f][t] for f in dict.fromkeys(m.shift_family) for t in TASK_NAMES[1:]]
    out = dict(fam_gentle=float(strengths[0]), fam_strong=float(strengths[-1]), fam_m=fam.m,
               fam_confidence=100 * fam.confidence,
               fam_next=float(strengths[1]) if len(strengths) > 1 else math.nan, fam_near_chance=NEAR_CHANCE,
               fam_gentle_blur_max=max(a[0] for a in amounts) * float(strengths[0]),
               fam_gentle_noise_max=max(a[1] for a in amounts) * float(strengths[0]))
    rows = fdf[fdf.inference_batch == batches[0]]
    for (f, k), g in m.groupby(["shift_family", "n_tasks"], sort=False):
        sel = g[g.condition == "nearest_first"]
        new = rows[(rows.shift_family == f) & (rows.n_tasks == k) & (rows.task != "A") & (rows.condition == "oracle")]
        for t, name in ((strengths[0], "gentle"), (strengths[-1], "strong")):
            out[f"fam_{f}_oracle_new_{name}_k{k}"] = t_interval(new[new.strength == t].groupby("seed").accuracy.mean())
            out[f"fam_{f}_route_{name}_b1_k{k}"] = t_interval(
                sel[(sel.strength == t) & (sel.inference_batch == batches[0])].routing_accuracy)
        for b, name in ((batches[0], "b1"), (batches[-1], "bmax")):
            ivs = [t_interval(sel[(sel.strength == t) & (sel.inference_batch == b)].routing_accuracy, fam.confidence)
                   for t in strengths]
            out[f"fam_{f}_works_from_{name}_k{k}"] = _threshold(strengths, [v.low > ROUTE_OK for v in ivs])
        beyond = {t: t_interval(_diff(g[(g.strength == t) & (g.inference_batch == batches[0])], "nearest_first",
                                      "oracle", "accuracy_routed_head", "accuracy"))
                  for t in strengths if t >= out[f"fam_{f}_works_from_b1_k{k}"]}  # NaN (never works): none
        if beyond:
            tw = min(beyond, key=lambda t: beyond[t].mean)
            out[f"fam_{f}_worst_routed_k{k}"], out[f"fam_{f}_worst_routed_t_k{k}"] = beyond[tw], float(tw)
    home = m[(m.condition == "nearest_first") & (m.inference_batch == batches[-1])].groupby("strength").routing_accuracy
    out["fam_bmax_home_from"] = _threshold(strengths, [bool((home.get_group(t) == 1.0).all()) for t in strengths])
    return numbers_table(out, bounds=lambda key: (0.0, 1.0) if "_route_" in key or "_oracle_" in key else (-1.0, 1.0))


def family_design_text(families) -> str:
    """The shift families of ``families`` in words, from :data:`.run.FAMILY_SHIFTS`."""
    def amount(v, unit):
        return f"{v:g}t{unit}" if v != 1 else f"t{unit}"

    def task(name, blur, noise):
        parts = ([f"blurred (std {amount(blur, ' px')})"] if blur else []) + \
            ([f"noised (extra std {amount(noise, '')})"] if noise else [])
        return f"{name} " + " and ".join(parts)
    return "; ".join(f"**{f}**: " + ", ".join(task(n, *FAMILY_SHIFTS[f][n]) for n in TASK_NAMES[1:])
                     for f in families)


#: A new task's accuracy under its own bank at or below this (1.5 x chance for ten classes) leaves nothing for a
#: wrong bank to cost: a wrong-bank verdict there is a floor effect, marked so in the table and the text.
NEAR_CHANCE = 0.15


def _near_chance(f: pd.DataFrame, fam: str, k: int) -> bool:
    return number(f, f"fam_{fam}_oracle_new_strong_k{k}").mean <= NEAR_CHANCE


def family_table(fdf: pd.DataFrame, table: pd.DataFrame, f: pd.DataFrame) -> pd.DataFrame:
    """The families' display table, one row per (shift family, task count), from :func:`family_claims` (``table``)
    and :func:`family_findings` (``f``); plain text (an HTML table shows no Markdown)."""
    bmax = int(fdf.inference_batch.max())
    gentle, nxt, strong = number(f, "fam_gentle"), number(f, "fam_next"), number(f, "fam_strong")
    where = lambda t: "none" if math.isnan(t) else f"t ≥ {fmt_level(t)}"  # noqa: E731
    rows = []
    for fam in dict.fromkeys(fdf.shift_family):
        for k in sorted(fdf[fdf.shift_family == fam].n_tasks.unique()):
            c = lambda q: family_claim_text(claim(table, f"fam_{fam}_{q}_k{k}"))  # noqa: E731
            floor = " (new tasks near chance: a floor, not a finding)" if _near_chance(f, fam, k) else ""
            row = {"family, tasks": f"{fam}, {k}",
                   f"routing t={gentle:g}": f"{number(f, f'fam_{fam}_route_gentle_b1_k{k}').mean:.3f}",
                   f"routing t={strong:g}": f"{number(f, f'fam_{fam}_route_strong_b1_k{k}').mean:.3f}",
                   "works (b=1)": where(number(f, f"fam_{fam}_works_from_b1_k{k}")),
                   f"works (b={bmax})": where(number(f, f"fam_{fam}_works_from_bmax_k{k}")),
                   f"own head: router - oracle, t={gentle:g}, b=1": c("router"),
                   f"routed head - oracle, t={gentle:g}, b=1": c("routed_b1"),
                   f"same, b={bmax}": c("routed_bmax")}
            if not math.isnan(nxt):
                row[f"routed head - oracle, t={nxt:g}, b=1"] = c("routed_next_b1")
                row[f"same, t={nxt:g}, b={bmax}"] = c("routed_next_bmax")
            row[f"oracle, new tasks, t={strong:g}"] = f"{number(f, f'fam_{fam}_oracle_new_strong_k{k}').mean:.3f}"
            row[f"train mode - oracle, t={strong:g}"] = c("train")  # task A's loss, not a floor (its mean counts A)
            row[f"pinned - oracle, t={strong:g}"] = c("pinned") + floor
            rows.append(row)
    return pd.DataFrame(rows).set_index("family, tasks").map(lambda v: v.replace("**", ""))  # an HTML table


def family_claim_text(c) -> str:
    """:func:`bnstudy.study.words.claim_text` of a family claim, or, for a difference zero in every seed (every
    input routed home: no finding), that."""
    if _kind_or_home(c) == "home":
        return f"0 in every seed (every input routed home; {verdict_md(c)})"
    return claim_text(c, clip=(-1, 1))


def family_routes(fdf: pd.DataFrame) -> pd.DataFrame:
    """:func:`seed_table` of the routers' routing accuracy, per shift family."""
    return _per_family(fdf, lambda g: seed_table(g, ["routing_accuracy"], ROUTERS))


#: How the page names each shift family in a list.
FAMILY_WORDS = {"blur": "blur", "noise": "added noise", "mix": "a mix of blur and added noise"}
#: The page's words for a family section with no rows (``shift_families`` empty).
NO_FAMILY = "No shift family other than brightness/contrast was run here (shift_families is empty)."


def family_words(fdf: pd.DataFrame, table: pd.DataFrame, f: pd.DataFrame | None) -> dict[str, str]:
    """The families' sentences (glued as ``ch06_<name>``) from the rows, :func:`family_claims` (``table``) and
    :func:`family_findings` (``f``): what was run, the oracle's own fall, the fully task-unknown cost, where routing
    works, the wrong-bank costs (floors named), the router cells and the answer (``fam_answer``, with what to do by
    :func:`family_advice`). With no rows each says so (:data:`NO_FAMILY`)."""
    families = list(dict.fromkeys(fdf.shift_family))
    keys = ("fam_intro_text", "fam_oracle_text", "fam_unknown_text", "fam_routing_text", "fam_wrong_text",
            "fam_cells_text", "fam_answer")
    if not families or f is None:
        return dict.fromkeys(keys, NO_FAMILY)
    bmax, gentle, strong, nxt = (int(fdf.inference_batch.max()), number(f, "fam_gentle"), number(f, "fam_strong"),
                                 number(f, "fam_next"))
    ks = sorted(int(k) for k in fdf.n_tasks.unique())
    names = join([FAMILY_WORDS.get(fam, fam) for fam in families])
    n_fam = f"{count_word(len(families))} shift famil{'y' if len(families) == 1 else 'ies'}"
    has_next = not math.isnan(nxt)
    little = (f"At the gentlest, t = {gentle:g}, the shifts are next to none: a blur of std at most "
              f"{number(f, 'fam_gentle_blur_max'):.2g} px, whose kernel leaves each pixel almost as it was, and added "
              f"noise of std at most {number(f, 'fam_gentle_noise_max'):.2g} against the images' own 3, so the claims "
              f"there measure the cost of an unknown task without a real shift; the claims at the next strength, "
              f"t = {nxt:g}, were added after a review pointed this out.") if has_next else ""
    out = dict(fam_intro_text=(
        f"So the same banks, routers, heads and tasks were also run under {n_fam} that no per-channel affine map "
        f"undoes, each new task shifted differently (the methods note below lists how), fixed before any of them "
        f"was run and not tuned, at strengths t from {gentle:g} to {strong:g}. {little}"))
    out["fam_oracle_text"] = (
        f"Each new task's shift at strength t: {family_design_text(families)}. "
        "A task's own statistics detect these shifts but do not undo them, so, unlike with brightness and contrast, "
        "the oracle itself loses accuracy as they grow: the new tasks under their own bank score " + "; ".join(
            f"**{fam}**: " + join([f"{number(f, f'fam_{fam}_oracle_new_gentle_k{k}').mean:.3f} at t = {gentle:g} and "
                                   f"{number(f, f'fam_{fam}_oracle_new_strong_k{k}').mean:.3f} at t = {strong:g} "
                                   f"with {count_word(k)} tasks" for k in ks]) for fam in families)
        + f" (chance {1 / 10:g}). On these images (white-noise templates under white pixel noise) blur and added "
        "noise change mostly each channel's variance, which the first BatchNorm layer's statistics see: these are "
        "shifts a BatchNorm layer cannot undo, not shifts its statistics cannot detect. A shift matched in variance "
        "(the mix's task B comes close where its routing dips) is the test left open.")

    def loss(fam, k):
        if f"fam_{fam}_worst_routed_k{k}" not in set(f["key"]):
            return f"none with {count_word(k)} tasks (routing never works there)"
        iv, t = number(f, f"fam_{fam}_worst_routed_k{k}"), number(f, f"fam_{fam}_worst_routed_t_k{k}")
        if not iv.mean < -0.0005:  # a loss that prints as -0.000 is none
            return f"none with {count_word(k)} tasks"
        return (f"{iv.mean:.3f} at t = {fmt_level(t)} with {count_word(k)} tasks (95% interval {iv.low:.3f} to "
                f"{iv.high:.3f})")
    worst = "; ".join(f"**{fam}**: " + join([loss(fam, k) for k in ks]) for fam in families) if has_next else ""
    n = len(families) * len(ks)
    rows = lambda q: [claim(table, f"fam_{fam}_{q}_k{k}") for fam in families for k in ks]  # noqa: E731
    kinds = lambda q: [c.kind for c in rows(q)]  # noqa: E731
    pairs = f"{n} (family, task count) pair{'' if n == 1 else 's'}"

    def at(q, who="it"):  # the routed-head verdicts counted, setting first
        return (f"per sample {who} is {_counted(rows(f'routed_{q}b1'))}; with batches of {bmax} it is "
                f"{_counted(rows(f'routed_{q}bmax'))}")
    out["fam_unknown_text"] = (
        f"**The cost when the task is unknown** (`nearest_first` picks the bank and the head; the routed head minus "
        f"the oracle), over the {pairs}: at t = {gentle:g}, {at('')}" + (
            f". At t = {nxt:g}, {at('next_')}. Where per-sample routing works it is still not free when the "
            "router picks the head: the largest mean loss per sample at those strengths (not in the claims family) "
            "is " + worst + "." if has_next else "."))
    out["fam_routing_text"] = (
        f"Where routing works, by the rule above at these claims' own family level ({number(f, 'fam_confidence'):.4g}% "
        f"intervals, Bonferroni over {number(f, 'fam_m'):.0f} comparisons) and on the levels tested: " + "; ".join(
            f"**{fam}**: per sample {works_phrase(_per_k(f, f'fam_{fam}_works_from_b1'), gentle)}, with batches of "
            f"{bmax} {works_phrase(_per_k(f, f'fam_{fam}_works_from_bmax'), gentle)}" for fam in families))
    floors = {f"fam_{fam}_pinned_k{k}": f"{fam} with {count_word(k)} tasks" for fam in families for k in ks
              if _near_chance(f, fam, k)}
    wrong = table[table.key.str.contains(r"_(?:train|pinned)_k") & ~table.key.isin(list(floors))]
    out["fam_wrong_text"] = counts_text(wrong, "comparisons", "a wrong bank", "the oracle", TOST_MARGIN, ALPHA) + (
        "; not counted: pinned statistics minus the oracle for " + join([
            f"{who} ({verdict_md(claim(table, key))})" for key, who in floors.items()]) +
        f", where the new tasks' oracle accuracy is at or below {NEAR_CHANCE:g}, so that pinned statistics have "
        "nothing to cost (a floor, not a finding)" if floors else "")
    out["fam_cells_text"] = "; ".join(
        f"**{fam}**: " + cells_apart_text(cell_tests(fdf[fdf.shift_family == fam].drop(columns="shift_family")))
        for fam in families)
    home = number(f, "fam_bmax_home_from")
    home_text = ("" if math.isnan(home) else f"; from t = {fmt_level(home)} on, batches of {bmax} send every input "
                 "to its own bank in every pair and seed")
    cap, head = (lambda s: s[0].upper() + s[1:]), "the routed head minus the oracle"  # noqa: E731
    if has_next:
        lead = (f"at t = {nxt:g}, the first real shift, over {pairs}: {at('next_', head)}. "
                + cap(family_advice(kinds("routed_next_b1"), kinds("routed_next_bmax"))).rstrip(".")
                + f"{home_text}. At t = {gentle:g}, next to no shift, which measures the cost of an unknown task "
                f"alone: {at('')}.")
    else:
        lead = (f"at t = {gentle:g}, over {pairs}: {at('', head)}. "
                + cap(family_advice(kinds("routed_b1"), kinds("routed_bmax"))))
    out["fam_answer"] = (
        f"Under {names} ({n_fam}, each new task shifted differently, t from {gentle:g} to {strong:g}; a three-block "
        f"CNN on the synthetic template tasks, whose new tasks score about a third right under their own bank), with "
        f"the task unknown and the router picking the head too, " + lead)
    return out


def _kind_or_home(c) -> str:
    """A family claim's verdict kind, or ``"home"`` where the difference is zero in every seed."""
    return "home" if c.n > 0 and c.estimate == 0 and c.low == 0 and c.high == 0 else c.kind


def _counted(rows: list) -> str:
    """Family claims counted by printed verdict kind, those zero in every seed said to be such."""
    kinds, home = [c.kind for c in rows], [c.kind for c in rows if _kind_or_home(c) == "home"]
    words = {"lower": "shown lower", "equivalent": f"equivalent within ±{TOST_MARGIN:g}", "not decided": "not decided",
             "higher": "shown higher", "too few seeds": "with too few seeds"}

    def routed(k):
        h = home.count(k)
        return "" if not h else " (0 in every seed: every input routed home)" if h == kinds.count(k) else \
            f" ({h} of them 0 in every seed: every input routed home)"
    parts = [f"{words.get(k, k)} in {kinds.count(k)}{routed(k)}" for k in words if kinds.count(k)]
    return join(parts) if parts else "in none"


def family_advice(b1: list, bmax: list) -> str:
    """What to do under the other shift families, from the routed-head verdict kinds per sample (``b1``) and with
    the largest batches (``bmax``); an open comparison (:data:`OPEN_KINDS`) is never read as no loss."""
    if "lower" in bmax:
        return "where the shift is this gentle, keep a task label, since pooled batches lose there too."
    if "lower" in b1:
        return ("where the shift is this gentle, route batches rather than single images, or keep a task label."
                if not any(k in OPEN_KINDS for k in bmax) else "where the shift is this gentle, single images lose "
                "in some pairs, and for some pairs whether batches avoid the loss is not decided: keep a task label "
                "there.")
    if any(k in OPEN_KINDS for k in b1 + bmax):
        return "no loss is shown, but its absence is not shown either (some intervals include losses): whether " \
               "these shifts need a task label is not decided on this grid."
    return "no loss is shown there, so routing by statistics serves these shifts too on this grid."
