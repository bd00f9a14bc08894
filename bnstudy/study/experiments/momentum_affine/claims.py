"""Chapter 9, what is asked (issue 39), fixed before any full-profile row was computed: the questions as data, the
margin and the rules that pick each setting, run by :func:`bnstudy.study.inference.ask`; then the page's numbers,
tables and rule-triggered sentences.

**Settings chosen by trying are chosen on the tuning seeds only** (``role == "tune"``; the reported seeds never
inform a choice): per part-1 cell the momentum of the grid with the highest mean task-B accuracy (``best_m``,
:func:`momentum_choices`) and the one setting best over every cell (``global_m``, :func:`global_choice`); per part-2
cell and part-3 condition the rate (:func:`rate_choices`). Ties go to the smaller value (``cma`` counts as larger
than every ``m``); a diverged run (NaN) counts as accuracy 0. A choice at an open end of its grid is flagged
(``at_edge``): the momentum grid is closed below (``m = 0``) and, where it reaches ``m = 1``, above; a rate grid is
open at both ends. The momentum grid was widened once (``m = 1`` added after a first full run chose 0.3, then its
largest, in 7 of 12 tuning cells); nothing else changed.

**The families** (Bonferroni within each, paired on the seed; accuracy questions with a TOST at ±:data:`MARGIN`, the
book's margin; the statistics error, with no agreed threshold, without one): ``momentum`` and ``error`` (each
momentum setting minus precise BN, on task-B accuracy and on ``stats_error``), ``order`` (each momentum's error minus
the next smaller one's), ``rule`` (each rule minus ``best_m``), ``train`` and ``retain`` (each part-2 condition minus
full fine-tuning, on task B and task A), ``bn_mode`` (train-mode minus pinned statistics), ``frankle`` (BatchNorm's
affine minus as many random weights, and minus the head alone) and ``checks`` (identities of the code, ``==``).
"""

from __future__ import annotations

import math
import re
from functools import partial

import pandas as pd

from ...inference import Interval, Question, ask, numbers_table, t_interval
from ...inference import number as _n
from ...words import Note, counts_text, join, notes
from .run import CLASSES, SOURCE_MOMENTUM, TRAIN_CONDITIONS

#: Equivalence margin (accuracy, fraction): the book's, two points, the smallest difference we would act on.
MARGIN = 0.02
#: A cell of part 1 and of part 2.
CELL = ("target", "batch_size", "budget")
TRAIN_CELL = ("classes", "shift")
#: The momentum settings compared with precise BN besides the grid: ``momentum=None`` on a loaded checkpoint, and
#: Kornblith et al.'s rule.
EXTRA_SETTINGS = ("cma_loaded", "kornblith")
#: The rules compared with the per-cell best momentum.
RULES = ("kornblith", "pytorch", "precise", "global_m")
#: Part 2's conditions compared with full fine-tuning.
TRAIN_COMPARED = TRAIN_CONDITIONS[:-1]
#: Conditions whose statistics are pinned (their buffers must not change).
PINNED = ("head", "affine_pinned")
KINDS = ("higher", "equivalent", "not decided", "lower")
_EMA = re.compile(r"^m[0-9.e+-]+$")


def _report(rows: pd.DataFrame) -> pd.DataFrame:
    return rows[rows["role"] == "report"]


def _tune(rows: pd.DataFrame) -> pd.DataFrame:
    return rows[rows["role"] == "tune"].assign(accuracy=lambda d: d["accuracy"].fillna(0.0))


def grid(rows: pd.DataFrame) -> list[str]:
    """The momentum grid of part 1's rows, in order: every ``m<value>`` setting by its momentum, then ``cma``."""
    ema = rows[rows["condition"].str.match(_EMA)].drop_duplicates("condition").sort_values("momentum")
    return list(ema["condition"]) + (["cma"] if (rows["condition"] == "cma").any() else [])


def _best(g: pd.DataFrame, order: list, column: str) -> pd.Series:
    """The row of ``g`` with the highest ``accuracy``, ties to the earliest of ``order`` (values of ``column``)."""
    rank = g[column].map({v: i for i, v in enumerate(order)})
    return g.assign(_rank=rank).sort_values(["accuracy", "_rank"], ascending=[False, True]).iloc[0]


def _grid_means(rows: pd.DataFrame, by: list) -> tuple[list, str | None, pd.DataFrame]:
    """The grid, its open upper end (its largest ``m`` if below 1) and the tuning seeds' mean accuracy per ``by``
    and grid setting."""
    g = grid(rows)
    top = [c for c in g if c != "cma"][-1]
    tune = _tune(rows)
    mean = tune[tune["condition"].isin(g)].groupby([*by, "condition"], sort=True)["accuracy"].mean().reset_index()
    return g, None if float(top[1:]) >= 1 else top, mean


def momentum_choices(rows: pd.DataFrame) -> pd.DataFrame:
    """Per cell, the grid setting with the highest mean task-B accuracy over the tuning seeds. Columns: the cell,
    ``condition``, ``accuracy`` (the tuning mean), ``at_edge`` (the choice is the grid's open end)."""
    g, open_end, mean = _grid_means(rows, list(CELL))
    out = []
    for key, cell in mean.groupby(list(CELL), sort=True):
        best = _best(cell, g, "condition")
        out.append(dict(zip(CELL, key), condition=best["condition"], accuracy=best["accuracy"],
                        at_edge=bool(best["condition"] == open_end)))
    return pd.DataFrame(out, columns=[*CELL, "condition", "accuracy", "at_edge"])


def global_choice(rows: pd.DataFrame) -> dict:
    """The one grid setting with the highest mean task-B accuracy over every cell and tuning seed:
    ``{"condition", "accuracy", "at_edge"}``."""
    g, open_end, mean = _grid_means(rows, [])
    best = _best(mean, g, "condition")
    return dict(condition=best["condition"], accuracy=float(best["accuracy"]),
                at_edge=bool(best["condition"] == open_end))


def momentum_table(rows: pd.DataFrame) -> pd.DataFrame:
    """The reported seeds' part-1 rows as conditions: every recorded condition, plus ``pytorch`` (the ``m0.1``
    rows), ``best_m`` (each cell's :func:`momentum_choices` setting) and ``global_m`` (:func:`global_choice`)."""
    cols = ["seed", *CELL, "condition", "accuracy", "task_a", "stats_error"]
    rep = _report(rows)[cols]
    picks = momentum_choices(rows)[[*CELL, "condition"]]
    parts = [rep, rep[rep["condition"] == "m0.1"].assign(condition="pytorch"),
             rep.merge(picks, on=[*CELL, "condition"]).assign(condition="best_m"),
             rep[rep["condition"] == global_choice(rows)["condition"]].assign(condition="global_m")]
    return pd.concat(parts, ignore_index=True)[cols]


def rate_choices(rows: pd.DataFrame, by: tuple = (*TRAIN_CELL, "condition")) -> pd.DataFrame:
    """Per ``by`` (part 2: task-B classes, shift family and condition; part 3: ``("condition",)``), the rate with the
    highest mean ``accuracy`` over the tuning seeds. Columns: ``by``, ``lr``, ``accuracy``, ``at_edge`` (the
    smallest or largest rate of a grid of more than one)."""
    mean = _tune(rows).groupby([*by, "lr"], sort=True)["accuracy"].mean().reset_index()
    out = []
    for key, g in mean.groupby(list(by), sort=True):
        rates = sorted(g["lr"])
        best = _best(g, rates, "lr")
        out.append(dict(zip(by, key if isinstance(key, tuple) else (key,)), lr=best["lr"], accuracy=best["accuracy"],
                        at_edge=bool(len(rates) > 1 and best["lr"] in (rates[0], rates[-1]))))
    return pd.DataFrame(out, columns=[*by, "lr", "accuracy", "at_edge"])


def chosen_rows(rows: pd.DataFrame, by: tuple = (*TRAIN_CELL, "condition")) -> pd.DataFrame:
    """The reported seeds' rows of parts 2 or 3 at each ``by``'s rate chosen on the tuning seeds."""
    return _report(rows).merge(rate_choices(rows, by)[[*by, "lr"]], on=[*by, "lr"])


def questions(grid_settings, extra=EXTRA_SETTINGS, rules=RULES) -> dict[str, tuple]:
    """The questions per family (module docstring) for a momentum grid ``grid_settings`` (:func:`grid`; the design's
    is every ``m`` of ``momenta`` and ``cma``), the extra settings and the rules present in the rows."""
    ema = [c for c in grid_settings if c != "cma"]
    settings = tuple(grid_settings) + tuple(extra)
    cell = "{target}_b{batch_size}_t{budget}"
    acc = partial(Question, margin=MARGIN)  # accuracy: a TOST at the book's margin beside the direction test
    train = partial(acc, each=TRAIN_CELL, table="train")
    mode = partial(train, condition="affine_train", reference="affine_pinned", words="train-mode statistics")
    check = partial(Question, exact=0.0)
    return {
        "momentum": (acc("mom_{condition}_" + cell, condition=settings, reference="precise", each=CELL),),
        "error": (Question("err_{condition}_" + cell, condition=settings, reference="precise", value="stats_error",
                           each=CELL),),
        "order": tuple(Question(f"order_{b}_vs_{a}_" + cell, condition=b, reference=a, value="stats_error",
                                each=CELL, words="larger momentum's error") for a, b in zip(ema, ema[1:])),
        "rule": (acc("rule_{condition}_" + cell, condition=tuple(rules), reference="best_m", each=CELL),),
        "train": (train("train_{condition}_{classes}_{shift}", condition=TRAIN_COMPARED, reference="full"),),
        "retain": (train("retain_{condition}_{classes}_{shift}", condition=TRAIN_COMPARED, reference="full",
                         value="task_a"),),
        "bn_mode": (mode("bn_mode_affine_{classes}_{shift}"),
                    mode("bn_mode_affine_retain_{classes}_{shift}", value="task_a"),
                    mode("bn_mode_head_{classes}_{shift}", condition="head_train", reference="head")),
        "frankle": tuple(acc(f"frankle_bn_affine_vs_{r}", condition="bn_affine", reference=r, table="frankle",
                             words="BatchNorm-only") for r in ("random_same", "head")),
        "checks": (check("check_m0_keeps_source", value="change_from_source", at=dict(condition="m0"),
                         table="momentum_rows"),
                   check("check_pinned_buffers_{condition}", value="max_buffer_change", at=dict(condition=PINNED),
                         each=("condition",), table="train_rows"),
                   *(check(f"check_frozen_{t}_{{condition}}", value="max_frozen_change", each=("condition",),
                           table=f"{t}_rows") for t in ("train", "frankle")),
                   check("check_random_same_count", value="trainable", condition="random_same",
                         reference="bn_affine", table="frankle")),
    }


#: The design's questions (the full profile's grid: every ``m`` of :data:`.run.MOMENTA` and ``cma``).
QUESTIONS = questions([f"m{m:g}" for m in (0.0, 0.001, 0.01, 0.03, 0.1, 0.3, 1.0)] + ["cma"])


def claims(momentum: pd.DataFrame, train: pd.DataFrame, frankle: pd.DataFrame) -> pd.DataFrame:
    """The claims table of every family (column ``family``; module docstring) from the three run tables (each with
    its reported and tuning seeds, ``role``). Each family is one :func:`bnstudy.study.inference.ask` call, so its
    comparisons share one Bonferroni correction; ``rule`` asks only the rules present (``pytorch`` needs 0.1 in the
    grid)."""
    table = momentum_table(momentum)
    present = set(table["condition"])
    qs = questions(grid(momentum), [c for c in EXTRA_SETTINGS if c in present], [r for r in RULES if r in present])
    tables = dict(main=table, train=chosen_rows(train), frankle=chosen_rows(frankle, ("condition",)),
                  momentum_rows=momentum, train_rows=train, frankle_rows=frankle)
    return pd.concat([ask(tables, qs[f], family=f) for f in qs], ignore_index=True)


# --- the page: parsed keys, descriptive means, tables, the numbers table and the rule-triggered notes ----------------

#: The direction words this chapter's verdicts use (the glossary's table lists them).
DIRECTIONS = ("higher", "lower", "larger momentum's error higher", "larger momentum's error lower",
              "train-mode statistics higher", "train-mode statistics lower", "BatchNorm-only higher",
              "BatchNorm-only lower")
#: How the page names each momentum setting, rule, training choice and part-3 condition.
SETTING_NAMES = dict(cma="cumulative average", cma_loaded="momentum=None on the loaded model",
                     kornblith="Kornblith's rule", precise="precise BN after training", pytorch="PyTorch's 0.1",
                     best_m="the best momentum", global_m="one momentum for all cells", reference="reference")
TRAIN_NAMES = dict(head="head only, statistics pinned", head_train="head only, train mode",
                   affine_pinned="affine + head, statistics pinned", affine_train="affine + head, train mode",
                   first_block="first block + head", full="full fine-tuning")
FRANKLE_NAMES = dict(bn_affine="BatchNorm's gamma and beta", random_same="as many random weights",
                     head="output layer only", all="every parameter")
_MOM_KEY = re.compile(r"^(?P<q>mom|err|rule)_(?P<condition>.+)_(?P<target>close|shifted)_b(?P<batch_size>\d+)"
                      r"_t(?P<budget>\d+)$")
_TRAIN_KEY = re.compile(r"^(?P<q>train|retain|bn_mode_affine_retain|bn_mode_affine|bn_mode_head)_"
                        r"(?:(?P<condition>" + "|".join(TRAIN_COMPARED) + r")_)?(?P<classes>new|same)"
                        r"_(?P<shift>[a-z]+)$")


def setting_label(c: str) -> str:
    """A momentum setting's name on the page: ``m0.01`` -> ``m = 0.01``; the others from :data:`SETTING_NAMES`."""
    return f"m = {c[1:]}" if _EMA.match(c) else SETTING_NAMES.get(c, c)


def parsed(claims_table: pd.DataFrame) -> pd.DataFrame:
    """The claims of parts 1 and 2 with their cell read back from each key: ``q`` (the question: ``mom``, ``err``,
    ``rule``, ``train``, ``retain``, ``bn_mode_affine``, ``bn_mode_affine_retain``, ``bn_mode_head``),
    ``condition`` and part 1's ``target``, ``batch_size``, ``budget`` or part 2's ``classes``, ``shift``. Other
    claims (``order``, ``frankle``, ``checks``) are left out."""
    m = claims_table["key"].str.extract(_MOM_KEY)
    t = claims_table["key"].str.extract(_TRAIN_KEY)
    out = claims_table.copy()
    out["q"] = m["q"].fillna(t["q"])
    out["condition"] = m["condition"].fillna(t["condition"])
    for c in ("target", "classes", "shift"):
        out[c] = (m if c == "target" else t)[c]
    for c in ("batch_size", "budget"):
        out[c] = pd.to_numeric(m[c])
    return out[out["q"].notna()]


def _short(g: pd.DataFrame, default: str = "") -> str:
    """``"0/3/1/0"``: how many claims of ``g`` are higher / equivalent / not decided / lower (``default`` if none)."""
    return "/".join(str(int(g["kind"].eq(k).sum())) for k in KINDS) if len(g) else default


def seed_means(table: pd.DataFrame, by: list, values=("accuracy",)) -> pd.DataFrame:
    """Descriptive means (no verdict rests on them): each seed's mean of ``values`` over the rows of one ``by``
    group, then the mean over seeds with its Student's t interval. Columns: ``by``, then per value ``<value>``,
    ``<value>_low``, ``<value>_high``, and ``n_seeds``."""
    per_seed = table.groupby([*by, "seed"])[list(values)].mean().reset_index()
    rows = []
    for key, g in per_seed.groupby(by, sort=False):
        row = dict(zip(by, key if isinstance(key, tuple) else (key,)))
        for v in values:
            iv = t_interval(g[v].dropna().to_numpy())
            row.update({v: iv.mean, f"{v}_low": iv.low, f"{v}_high": iv.high})
        rows.append(dict(row, n_seeds=g["seed"].nunique()))
    return pd.DataFrame(rows)


def _columns(cols: dict, names: list) -> pd.DataFrame:
    out = pd.DataFrame(cols)
    out.columns = pd.MultiIndex.from_tuples(out.columns, names=names)
    return out


def momentum_main_table(rows: pd.DataFrame, claims_table: pd.DataFrame) -> pd.DataFrame:
    """Table 9.1: per momentum setting (rows) and step budget (columns): the statistics error and the task-B
    accuracy, each seed's mean over the targets and batch sizes then the mean over seeds, and against precise BN
    after training the ``momentum`` family's verdict counts over the targets x batch sizes."""
    rep = _report(rows)
    means = seed_means(rep, ["condition", "budget"], ("accuracy", "stats_error")).set_index(["condition", "budget"])
    p = parsed(claims_table)
    p = p[p["q"] == "mom"]
    order = grid(rows) + [c for c in ("cma_loaded", "kornblith", "precise") if c in set(rows["condition"])]
    cols = {}
    for t in sorted(rep["budget"].unique()):
        for name, v in (("error", "stats_error"), ("accuracy", "accuracy")):
            cols[(f"{t} steps", name)] = {setting_label(c): f"{means.loc[(c, t), v]:.3f}" for c in order}
        cols[(f"{t} steps", "vs precise")] = {setting_label(c): _short(p[(p["condition"] == c) & (p["budget"] == t)],
                                                                       "—") for c in order}
    return _columns(cols, ["budget", ""])


def rules_table(claims_table: pd.DataFrame, rows: pd.DataFrame) -> pd.DataFrame:
    """Table 9.2: per rule (rows), each rule minus the per-cell best momentum (``rule`` family): the verdict counts
    over every cell and per step budget, and the range of the estimates; the global momentum's row is left out
    where it is PyTorch's 0.1 (the same comparisons)."""
    p = parsed(claims_table)
    p = p[p["q"] == "rule"]
    same = global_choice(rows)["condition"] == "m0.1"
    out = []
    for r in [x for x in RULES if x in set(p["condition"]) and not (same and x == "global_m")]:
        g = p[p["condition"] == r]
        out.append({"rule": SETTING_NAMES[r], "all cells": _short(g),
                    **{f"{t:.0f} steps": _short(g[g["budget"] == t]) for t in sorted(g["budget"].unique())},
                    "estimates": f"{g['estimate'].min():+.3f} to {g['estimate'].max():+.3f}"})
    return pd.DataFrame(out)


def choices_table(rows: pd.DataFrame) -> pd.DataFrame:
    """The per-cell momentum chosen on the tuning seeds (``best_m``) beside the one with the smallest mean
    statistics error on the reported seeds, and Kornblith's rule's momentum."""
    rep = _report(rows)
    ema = rep[rep["condition"].isin([c for c in grid(rows) if c != "cma"])]
    err = ema.groupby([*CELL, "condition"])["stats_error"].mean().reset_index()
    low = err.loc[err.groupby(list(CELL))["stats_error"].idxmin()].set_index(list(CELL))["condition"]
    k = rep.groupby(list(CELL))["kornblith"].first()
    return pd.DataFrame([{"target": r.target, "batch": int(r.batch_size), "steps": int(r.budget),
                          "best momentum (tuning seeds)": setting_label(r.condition),
                          "smallest error": setting_label(low[(r.target, r.batch_size, r.budget)]),
                          "Kornblith's m": f"{k[(r.target, r.batch_size, r.budget)]:.3g}"}
                         for r in momentum_choices(rows).itertuples()])


def train_table(train: pd.DataFrame, claims_table: pd.DataFrame) -> pd.DataFrame:
    """Table 9.3: per training choice (rows) and task-B classes (column groups): the trainable share, task-B
    accuracy and task A's retention (means over seeds of each seed's mean over the shift families, at each
    condition's tuned rate) and, against full fine-tuning, the ``train`` and ``retain`` verdict counts."""
    means = seed_means(chosen_rows(train), ["classes", "condition"], ("accuracy", "task_a", "trainable_share"))
    p = parsed(claims_table)
    cols = {}
    for k in [c for c in CLASSES if c in set(means["classes"])]:
        label = "new classes" if k == "new" else "same classes"
        m = means[means["classes"] == k].set_index("condition")
        m = m.loc[[c for c in TRAIN_CONDITIONS if c in m.index]].rename(index=TRAIN_NAMES)
        v = {q: {TRAIN_NAMES[c]: _short(p[(p["q"] == q) & (p["condition"] == c) & (p["classes"] == k)], "reference")
                 for c in TRAIN_CONDITIONS if TRAIN_NAMES[c] in m.index} for q in ("train", "retain")}
        cols.update({(label, "trained"): {n: f"{100 * r.trainable_share:.1f}%" for n, r in m.iterrows()},
                     (label, "task B"): {n: f"{r.accuracy:.3f} ({r.accuracy_low:.3f}–{r.accuracy_high:.3f})"
                                         for n, r in m.iterrows()},
                     (label, "vs full"): v["train"],
                     (label, "task A kept"): {n: f"{r.task_a:.3f}" for n, r in m.iterrows()},
                     (label, "kept vs full"): v["retain"]})
    return _columns(cols, ["task B", ""])


def _counts(g: pd.DataFrame) -> dict:
    """Verdict counts of the claims ``g`` (``higher``, ``equivalent``, ``not_decided``, ``lower``), their number
    ``cells`` and the range of their estimates (``est_min``, ``est_max``)."""
    return dict({k.replace(" ", "_"): int(g["kind"].eq(k).sum()) for k in KINDS}, cells=len(g),
                est_min=float(g["estimate"].min()), est_max=float(g["estimate"].max()))


def page_numbers(momentum: pd.DataFrame, train: pd.DataFrame, frankle: pd.DataFrame, claims_table: pd.DataFrame,
                 config) -> pd.DataFrame:
    """The page's flat numbers table (:func:`bnstudy.study.inference.numbers_table`): the statistics error per
    setting at the longest budget (``err_<setting>_tmax``), verdict counts per question and setting
    (``<q>_<setting>_<kind>``, ``..._cells``, ``..._est_min`` / ``_est_max``), part 2's and 3's means, the grids'
    choices, the units' recorded compute (``cost_worker_min``) and the design's settings (``cfg_*``)."""
    rep, p = _report(momentum), parsed(claims_table)
    values: dict = {f"err_{r.condition.replace('.', '_')}_tmax": Interval(r.stats_error, r.stats_error_low,
                                                                          r.stats_error_high, r.n_seeds)
                    for r in seed_means(rep[rep["budget"] == rep["budget"].max()], ["condition"],
                                        ("stats_error",)).itertuples()}
    for (q, c), g in p[p["q"].isin(("mom", "err", "rule"))].groupby(["q", "condition"]):
        values.update({f"{q}_{c.replace('.', '_')}_{k}": v for k, v in _counts(g).items()})
    for q, g in p[p["q"].str.startswith("bn_mode")].groupby("q"):
        values.update({f"{q}_{k}": v for k, v in _counts(g).items()})
    if momentum["target"].nunique() == 2:
        w = rep.pivot_table(index=["seed", "batch_size", "budget", "condition"], columns="target", values="accuracy")
        values["target_diff"] = float((w.iloc[:, 0] - w.iloc[:, 1]).abs().mean())
    for r in seed_means(chosen_rows(train), ["classes", "condition"], ("accuracy", "trainable_share")).itertuples():
        values[f"t_{r.classes}_{r.condition}"] = Interval(r.accuracy, r.accuracy_low, r.accuracy_high, r.n_seeds)
        values[f"share_{r.classes}_{r.condition}"] = 100 * float(r.trainable_share)
    for r in seed_means(chosen_rows(frankle, ("condition",)), ["condition"], ("accuracy", "trainable")).itertuples():
        values[f"fr_{r.condition}"] = Interval(r.accuracy, r.accuracy_low, r.accuracy_high, r.n_seeds)
        values[f"fr_{r.condition}_trainable"] = int(round(r.trainable))
    for fam, g in claims_table.groupby("family"):
        values[f"n_{fam}"], values[f"conf_{fam}"] = len(g), float(g["confidence"].iloc[0]) * 100
    picks, checks = momentum_choices(momentum), claims_table[claims_table["family"] == "checks"]
    mom = p[(p["q"] == "mom") & p["condition"].isin([c for c in grid(momentum) if c != "m0"] + ["cma_loaded"])]
    above = p[(p["q"] == "bn_mode_affine") & (p["kind"] == "higher") & (p["estimate"] > MARGIN)]
    tr, fr = rate_choices(train), rate_choices(frankle, ("condition",))
    units = (momentum.drop_duplicates(["seed", "target", "batch_size"])["unit_wall_s"].sum()
             + train.drop_duplicates(["seed", "classes", "shift", "unit_wall_s"])["unit_wall_s"].sum()
             + frankle.drop_duplicates(["seed", "unit_wall_s"])["unit_wall_s"].sum())  # a cell's rate chunks: units
    k, s = rep.groupby("batch_size")["kornblith"].first(), rep.groupby("batch_size")["steps_per_epoch"].first()
    values.update(
        mom_worst=float(mom["estimate"].min()), bn_mode_affine_above_margin=len(above),
        rule_pytorch_identical=int((picks["condition"] == "m0.1").sum()),
        frankle_bn_affine_vs_random_same_kind=str(claims_table.set_index("key").loc[
            "frankle_bn_affine_vs_random_same", "kind"]),
        train_at_edge=int(tr["at_edge"].sum()), train_cells=len(tr), frankle_at_edge=int(fr["at_edge"].sum()),
        frankle_cells=len(fr), global_m=setting_label(global_choice(momentum)["condition"]),
        exact_checks=len(checks), exact_failed=int((checks["kind"] != "exact").sum()),
        best_m_names=join(sorted({setting_label(c) for c in picks["condition"]},
                                 key=lambda s: float(s[4:]) if s.startswith("m = ") else 9)),
        cost_worker_min=float(units) / 60, kornblith_low=float(k.iloc[0]), kornblith_high=float(k.iloc[-1]),
        steps_per_epoch_low=int(s.iloc[0]), cfg_source_momentum=SOURCE_MOMENTUM,
        half_life_default=math.log(2) / -math.log(1 - SOURCE_MOMENTUM),
        half_life_tenth=math.log(2) / -math.log(1 - SOURCE_MOMENTUM / 10),
        n_seeds=len(config.seeds), cfg_n_seeds=len(config.seeds), cfg_n_tuning=len(config.tuning_seeds),
        cfg_tuning_first=min(config.tuning_seeds), cfg_tuning_last=max(config.tuning_seeds), cfg_margin=MARGIN,
        cfg_train_size=config.train_size, cfg_budget_low=min(config.budgets), cfg_budget_high=max(config.budgets),
        cfg_batch_low=min(config.batch_sizes), cfg_batch_high=max(config.batch_sizes), cfg_base_lr=config.base_lr,
        cfg_lr_batch=config.lr_batch, cfg_reference_samples=config.reference_samples,
        cfg_precise_samples=config.precise_samples, cfg_train_steps=config.train_steps,
        cfg_train_batch=config.train_batch, cfg_frankle_steps=config.frankle_steps)
    return numbers_table(values, lambda key: (0.0, 1.0) if key.startswith(("t_", "fr_")) else (0.0, math.inf)
                         if key.startswith("err_") else (-math.inf, math.inf))


def _k(n, prefix: str) -> dict:
    """``{higher, equivalent, not_decided, lower, cells}`` of a counted prefix (:func:`page_numbers`)."""
    return {k: _n(n, f"{prefix}_{k}") for k in ("higher", "equivalent", "not_decided", "lower", "cells")}


def _holds(d: dict) -> bool:
    """A rule holds: equivalent to (or above) the per-cell best in every cell, below it in none."""
    return d["cells"] > 0 and d["lower"] == 0 and d["equivalent"] + d["higher"] == d["cells"]


def _half(n, prefix: str) -> bool:
    """Below the reference in at least half of the cells (and there are cells)."""
    d = _k(n, prefix)
    return 2 * d["lower"] >= d["cells"] > 0


def _cma(_, n):
    return dict(_k(n, "mom_cma_loaded"), cma_lower=_k(n, "mom_cma")["lower"])


def _PR(_, n):  # precise BN after training against the best momentum
    return dict(_k(n, "rule_precise"), m=MARGIN)


def _rules(_, n) -> list[str]:
    return [r for r in ("kornblith", "global_m", "pytorch") if _holds(_k(n, f"rule_{r}"))]


def _rule_fill(c, n):
    held, same = _rules(c, n), _n(n, "global_m") == setting_label("m0.1")
    if same and {"global_m", "pytorch"} <= set(held):  # one setting under two names: said once
        held.remove("global_m")
    names = [SETTING_NAMES[r] + (f" ({_n(n, 'global_m')})" if r == "global_m" else
                                 ", which is also the one momentum best over every tuning cell," if r == "pytorch"
                                 and same else "") for r in held]
    return dict(names=join(names) if held else "", verb="were" if len(held) > 1 else "was",
                cells=_n(n, "rule_precise_cells"), worst=-_n(n, "mom_worst"))


def _M0(_, n):  # momentum 0 (the source statistics kept) against precise BN
    return _k(n, "mom_m0")


def _frankle(_, n):
    return dict(kind=_n(n, "frankle_bn_affine_vs_random_same_kind"), bn=_n(n, "fr_bn_affine").mean,
                rnd=_n(n, "fr_random_same").mean, head=_n(n, "fr_head").mean, all=_n(n, "fr_all").mean,
                k=_n(n, "fr_bn_affine_trainable"), head_k=_n(n, "fr_head_trainable"),
                own=_n(n, "fr_bn_affine_trainable") - _n(n, "fr_head_trainable"), steps=_n(n, "cfg_frankle_steps"))


def _wu(_, n):
    """Wu & Johnson's two failure ends on the ``error`` family: the largest (``bh`` of ``bc`` cells) and the
    smallest non-zero momentum (``sh`` of ``sc``) farther from the population's statistics than precise BN."""
    g = [c for c in ("m0_3", "m1") if f"err_{c}_higher" in set(n["key"])]
    big, small = _k(n, f"err_{g[-1] if g else 'm0_3'}"), _k(n, "err_m0_001")
    return dict(bh=big["higher"], bc=big["cells"], sh=small["higher"], sc=small["cells"],
                big=setting_label((g[-1] if g else "m0_3").replace("_", ".")))


def _wu_same(c, n):
    d = _wu(c, n)
    return 2 * d["bh"] >= d["bc"] > 0 and 2 * d["sh"] >= d["sc"]


def _aff(c, n):
    d = _k(n, "bn_mode_affine")
    return dict(d, nd=d["not_decided"], gain=_n(n, "bn_mode_affine_est_max"), loss=_n(n, "bn_mode_affine_est_min"),
                big=_n(n, "bn_mode_affine_above_margin"),
                r_loss=-_n(n, "bn_mode_affine_retain_est_min"),
                **{f"r_{k}": v for k, v in _k(n, "bn_mode_affine_retain").items()})


#: Phrases that several alternatives of one note share.
_CMA = ("A cumulative average (PyTorch's momentum None) on a loaded model, its counter carried over from the source's "
        "training, fell below precise BN in {lower} of {cells} cells")
_KEEP = ": the source's batches keep most of the weight."
_FROZEN = "Never updating the running statistics while the network trains in train mode (momentum 0"
_TRAIN_BN = ("With the affine parameters and the head trained, train-mode statistics (what fastai's and Lightning's "
             "train-BN freezing does) were ")
_RETAIN = "On task A, which the frozen backbone is meant to keep, train mode was below pinned statistics in "
_FRANKLE = ("From random initialisation, training only BatchNorm's gamma and beta (with the output layer) reached "
            "{bn:.3f} on task A against {rnd:.3f} for as many randomly chosen weights (")
_FRANKLE_K = "{k} parameters each; the output layer alone {head:.3f}, every parameter {all:.3f})"
_WU = "The moving average's statistics were farther from the population's than precise BN's "

#: The page's rule-triggered sentences (:class:`bnstudy.study.words.Note`), each with a flip test.
NOTES = (
    Note("lead_momentum", lambda c, n: _PR(c, n)["lower"] == 0 and 2 * _PR(c, n)["equivalent"] >= _PR(c, n)["cells"],
         "**Re-estimate the statistics after training (precise BN).** Precise BN after training was within ±{m:g} "
         "of the best momentum (chosen per cell on the tuning seeds) in {equivalent} of {cells} cells and below it "
         "in none, so it makes the momentum used during training irrelevant to the result.", _PR),
    Note("lead_momentum", lambda c, n: _PR(c, n)["lower"] > 0,
         "**Not precise BN everywhere.** Precise BN after training fell below the best momentum (chosen per cell on "
         "the tuning seeds) in {lower} of {cells} cells and was within ±{m:g} of it in {equivalent}.", _PR),
    Note("lead_momentum", lambda c, n: _PR(c, n)["lower"] == 0 and 2 * _PR(c, n)["equivalent"] < _PR(c, n)["cells"],
         "**Not decided.** Precise BN after training was within ±{m:g} of the best momentum (chosen per cell on "
         "the tuning seeds) in only {equivalent} of {cells} cells, below it in none.", _PR),
    Note("rule_holds", lambda c, n: bool(_rules(c, n)),
         "A rule held in every cell: {names} {verb} within the margin of the per-cell best in all {cells} "
         "cells. Without re-estimation the momentum does matter: other settings lost up to {worst:.2f} (below).",
         _rule_fill),
    Note("rule_holds", lambda c, n: not _rules(c, n),
         "No momentum rule (Kornblith's from the steps per epoch, PyTorch's 0.1, or the one momentum best over every "
         "cell of the tuning seeds) was within the margin of the per-cell best in every one of the {cells} cells: "
         "the data do not support a rule for the momentum from the steps and the batch size.", _rule_fill),
    Note("cma_loaded", lambda c, n: _half(n, "mom_cma_loaded") and _half(n, "mom_cma"),
         _CMA + _KEEP + " Resetting the counter did not rescue it (below precise BN in {cma_lower} of {cells}, every "
         "batch of a run weighted equally however stale): do not fine-tune with a cumulative average.", _cma),
    Note("cma_loaded", lambda c, n: _half(n, "mom_cma_loaded") and not _half(n, "mom_cma"),
         _CMA + _KEEP + " With the counter reset to 0 before fine-tuning it fell below precise BN in {cma_lower}.",
         _cma),
    Note("cma_loaded", lambda c, n: not _half(n, "mom_cma_loaded"),
         _CMA + "; with the counter reset, in {cma_lower}.", _cma),
    Note("frozen_stats", lambda c, n: 2 * _k(n, "mom_m0")["lower"] >= _k(n, "mom_m0")["cells"] > 0,
         _FROZEN + ": the source statistics at evaluation) fell below precise BN in {lower} of {cells} cells.",
         _M0),
    Note("frozen_stats", lambda c, n: not 2 * _k(n, "mom_m0")["lower"] >= _k(n, "mom_m0")["cells"] > 0,
         _FROZEN + ") fell below precise BN in {lower} of {cells} cells.", _M0),
    Note("lead_affine", lambda c, n: _aff(c, n)["lower"] > 0 and _aff(c, n)["higher"] == 0,
         "**Pin the statistics when only BatchNorm's affine parameters train.** " + _TRAIN_BN + "below pinned "
         "statistics on task B in {lower} of {cells} cells and above them in none.", _aff),
    Note("lead_affine", lambda c, n: _aff(c, n)["higher"] > 0 and _aff(c, n)["lower"] == 0,
         "**Train-mode statistics were above pinned ones on the new task in {higher} of {cells} cells, by more than "
         "the book's margin in {big}.** " + _TRAIN_BN + "below pinned statistics on task B in none (largest gain "
         "{gain:.3f}).", _aff),
    Note("lead_affine", lambda c, n: _aff(c, n)["higher"] > 0 and _aff(c, n)["lower"] > 0,
         "**Whether to pin depends on the task.** " + _TRAIN_BN + "above pinned statistics on task B in {higher} of "
         "{cells} cells and below them in {lower}.", _aff),
    Note("lead_affine", lambda c, n: _aff(c, n)["higher"] == 0 and _aff(c, n)["lower"] == 0,
         "**Pinned or train-mode statistics: no difference shown.** " + _TRAIN_BN + "equivalent to pinned "
         "statistics on task B in {equivalent} of {cells} cells; {nd} are not decided.", _aff),
    Note("affine_retention", lambda c, n: _aff(c, n)["r_lower"] > 0,
         _RETAIN + "{r_lower} of {r_cells} cells (by up to {r_loss:.3f}) and above them in {r_higher}.", _aff),
    Note("affine_retention", lambda c, n: _aff(c, n)["r_lower"] == 0,
         _RETAIN + "none of {r_cells} cells and above them in {r_higher}.", _aff),
    Note("anchor_frankle", lambda c, n: _frankle(c, n)["kind"] == "higher",
         "**Same direction.** " + _FRANKLE + "{own} each, plus the output layer's {head_k}; the output layer alone "
         "{head:.3f}, every parameter {all:.3f}), after one budget of {steps} steps: a gap far smaller than Frankle "
         "et al.'s, on a far smaller network.", _frankle),
    Note("anchor_frankle", lambda c, n: _frankle(c, n)["kind"] == "lower",
         "**Opposite direction.** " + _FRANKLE + _FRANKLE_K + ".", _frankle),
    Note("anchor_frankle", lambda c, n: _frankle(c, n)["kind"] not in ("higher", "lower"),
         "**Not shown.** " + _FRANKLE + _FRANKLE_K + ": {kind}.", _frankle),
    Note("anchor_wu", _wu_same,
         "**Same direction.** " + _WU + "at the largest momentum ({big}: {bh} of {bc} cells) and at the smallest "
         "non-zero one (m = 0.001: {sh} of {sc}).", _wu),
    Note("anchor_wu", lambda c, n: not _wu_same(c, n),
         "**In part.** " + _WU + "at the largest momentum ({big}) in {bh} of {bc} cells and at the smallest non-zero "
         "one (m = 0.001) in {sh} of {sc}.", _wu),
)


def page_words(claims_table: pd.DataFrame, numbers: pd.DataFrame) -> dict[str, str]:
    """``{name: Markdown}``: the notes of :data:`NOTES`; each rule's ``rule`` claims counted (``count_rule_<rule>``,
    :func:`bnstudy.study.words.counts_text`); the momentum settings' counts against precise BN (``mom_counts``);
    per task-B classes, each training choice's ``train`` and ``retain`` claims (``count_train_<condition>_<classes>``,
    ``count_retain_...``) and the ``bn_mode`` family's three questions (``count_bn_mode_affine_<classes>``, ...)."""
    out = notes(NOTES, claims_table, numbers)
    p = parsed(claims_table)
    for c, g in p[p["q"] == "rule"].groupby("condition"):
        out[f"count_rule_{c}"] = counts_text(g, "cells", setting_label(c), "the best momentum", MARGIN)
    ema = sorted({c for c in p["condition"].dropna() if _EMA.match(c)}, key=lambda c: float(c[1:]))
    shown = [c for c in dict.fromkeys([*ema[:1], "m0.1", *ema[-1:], "cma"]) if c in set(p["condition"])]
    out["mom_counts"] = "; ".join(
        f"{'PyTorch' + chr(39) + 's default' if c == 'm0.1' else setting_label(c)}, "
        + counts_text(p[(p["q"] == "mom") & (p["condition"] == c)], "cells", setting_label(c), "precise BN", MARGIN)
        for c in shown) + "."
    for (q, c, k), g in p[p["q"].isin(("train", "retain"))].groupby(["q", "condition", "classes"]):
        out[f"count_{q}_{c}_{k}"] = counts_text(g, "shift families", TRAIN_NAMES[c], "full fine-tuning", MARGIN)
    for (q, k), g in p[p["q"].str.startswith("bn_mode")].groupby(["q", "classes"]):
        out[f"count_{q}_{k}"] = counts_text(g, "shift families", "train mode", "pinned statistics", MARGIN)
    return out


def config_words(config) -> dict[str, str]:
    """The design's lists in words (plain text, glued as ``ch09_<name>``): ``budgets`` (``"100, 400 and 1600"``),
    ``momenta`` (the grid), ``train_grid`` and ``frankle_grid`` (the Adam rates of parts 2 and 3)."""
    return dict(budgets=join([f"{b}" for b in config.budgets]), momenta=join([f"{m:g}" for m in config.momenta]),
                train_grid=join([f"{r:g}" for r in config.train_lrs]),
                frankle_grid=join([f"{r:g}" for r in config.frankle_lrs]))
