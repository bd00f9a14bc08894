"""Chapter 9, what is asked (issue 39), fixed before any full-profile row was computed: the questions as data, the
margin and the rules that pick each setting, run by :func:`bnstudy.study.inference.ask`.

**Settings chosen by trying are chosen on the tuning seeds only** (rows with ``role == "tune"``; the reported seeds,
``role == "report"``, never inform a choice):

* part 1 (:func:`momentum_choices`): per cell (target, batch size, budget), the momentum of the grid (every ``m``
  of ``momenta`` and ``cma``) with the highest mean task-B accuracy over the tuning seeds: ``best_m``; and
  (:func:`global_choice`) the one grid setting with the highest mean over every cell: ``global_m``, a rule that
  ignores steps and batch size, chosen the same way;
* parts 2 and 3 (:func:`rate_choices`): per task-B classes, shift family and condition (part 3: per condition), the
  learning rate of the grid with the highest mean accuracy (task B; part 3 task A) over the tuning seeds.

Ties go to the smaller value (``cma`` counts as larger than every ``m``). A run that diverged (accuracy NaN) counts
as accuracy 0 in a choice, so a rate that diverges on a tuning seed is chosen only if nothing else trains. A choice
at an open end of its grid is flagged (``at_edge``), and the page says so where a verdict rests on it: the momentum
grid is closed below (``m = 0`` is the source statistics, nothing is slower) and, where it reaches ``m = 1`` (the
last training batch's statistics alone), above; a largest ``m`` below 1 is an open end; ``cma`` is off the axis and
never an edge; a rate grid is open at both ends (rate 0 trains nothing, and was not run).

**The momentum grid was widened once** (before the reported run, as chapter 8's grids were): a first full run on the
issue's grid (0 to 0.3) chose its largest momentum, 0.3, an open end, in 7 of the 12 cells of the tuning seeds; ``m
= 1`` was added, closing the grid. Nothing else (questions, margin, families, rules) changed.

**The margin.** :data:`MARGIN` = 0.02 (accuracy, a fraction): the book's margin, two points, the smallest difference
in accuracy we would act on; every accuracy question is a TOST at ±0.02 beside its direction test. The statistics
error (:func:`.run.statistics_error`) has no agreed practical threshold, so its questions have no margin: a
direction or "not decided".

**The families** (Bonferroni within each, :func:`bnstudy.study.inference.ask`; at least 10 reported seeds in the full
profile, paired on the seed):

* ``momentum``: per cell, each momentum setting (the grid, ``cma_loaded``, ``kornblith``) minus ``precise`` (precise
  BN after training), task-B accuracy, at ±:data:`MARGIN`;
* ``error``: the same comparisons on ``stats_error``, no margin (is the moving average farther from the population
  statistics than precise BN's re-estimate?);
* ``order``: per cell, each momentum of the grid minus the next smaller one, on ``stats_error`` (where the error
  stops falling and starts rising as ``m`` grows: the noise against staleness ordering of Wu & Johnson 2021);
* ``rule``: per cell, each rule minus ``best_m`` (the per-cell best chosen on the tuning seeds), task-B accuracy at
  ±:data:`MARGIN`: ``kornblith`` (Kornblith, Shlens & Le 2019), ``pytorch`` (PyTorch's 0.1), ``precise`` (Wu & Johnson
  2021's recipe) and ``global_m`` (one momentum for every cell, chosen on the tuning seeds);
* ``train``: per task-B classes (``new``, ``same``) and shift family, each condition minus ``full`` (full
  fine-tuning), each at its own tuned rate, task-B accuracy at ±:data:`MARGIN`;
* ``retain``: the same on task A's retention (head A on the fine-tuned backbone);
* ``bn_mode``: the key contrast, per task-B classes and shift family: ``affine_train`` minus ``affine_pinned`` on
  task-B accuracy and on retention, and ``head_train`` minus ``head`` (the two-by-two's other arm), at
  ±:data:`MARGIN`;
* ``frankle``: ``bn_affine`` minus ``random_same`` (Frankle, Schwab & Morcos 2021's comparison) and minus ``head``,
  task-A accuracy from random initialisation, at ±:data:`MARGIN`;
* ``checks``: identities of the code, exact (``==``), not findings: ``m0`` keeps the source statistics; the pinned
  conditions (``head``, ``affine_pinned``) leave every buffer unchanged; no parameter outside a condition's trained
  set changes; ``random_same`` trains exactly as many parameters as ``bn_affine``.
"""

from __future__ import annotations

import math
import re

import pandas as pd

from ...inference import Question, ask
from .run import CLASSES

#: Equivalence margin (accuracy, fraction): the book's, two points, the smallest difference we would act on.
MARGIN = 0.02
#: A cell of part 1.
CELL = ("target", "batch_size", "budget")
#: A cell of part 2.
TRAIN_CELL = ("classes", "shift")
#: The momentum settings compared with precise BN besides the grid: PyTorch's ``momentum=None`` on a loaded
#: checkpoint, and Kornblith et al.'s rule.
EXTRA_SETTINGS = ("cma_loaded", "kornblith")
#: The rules compared with the per-cell best momentum.
RULES = ("kornblith", "pytorch", "precise", "global_m")
#: Part 2's reference and the conditions compared with it.
TRAIN_REFERENCE = "full"
TRAIN_COMPARED = ("head", "head_train", "affine_pinned", "affine_train", "first_block")
#: Conditions whose statistics are pinned (their buffers must not change).
PINNED = ("head", "affine_pinned")
_EMA = re.compile(r"^m[0-9.e+-]+$")


def _report(rows: pd.DataFrame) -> pd.DataFrame:
    return rows[rows["role"] == "report"]


def _tune(rows: pd.DataFrame) -> pd.DataFrame:
    return rows[rows["role"] == "tune"]


def grid(rows: pd.DataFrame) -> list[str]:
    """The momentum grid of part 1's rows, in order: every ``m<value>`` setting by its momentum, then ``cma``."""
    ema = rows[rows["condition"].str.match(_EMA)].drop_duplicates("condition").sort_values("momentum")
    return list(ema["condition"]) + (["cma"] if (rows["condition"] == "cma").any() else [])


def _open_end(g: list[str]) -> str | None:
    """The grid's open upper end: its largest ``m`` if below 1 (``m = 1``, the last batch alone, closes it)."""
    top = [c for c in g if c != "cma"][-1]
    return None if float(top[1:]) >= 1 else top


def _best(g: pd.DataFrame, order: list, column: str) -> pd.Series:
    """The row of ``g`` (one per candidate, ``accuracy`` a mean) with the highest accuracy, ties to the earliest in
    ``order`` (the values of ``column``)."""
    rank = g[column].map({v: i for i, v in enumerate(order)})
    return g.assign(_rank=rank).sort_values(["accuracy", "_rank"], ascending=[False, True]).iloc[0]


def momentum_choices(rows: pd.DataFrame) -> pd.DataFrame:
    """Per cell, the grid setting (:func:`grid`) with the highest mean task-B accuracy over the tuning seeds (a NaN
    accuracy counted as 0; ties to the smaller momentum). ``at_edge``: the choice is the largest ``m`` of the grid
    (an open end, :func:`_open_end`). Columns: the cell, ``condition``, ``accuracy`` (the tuning mean), ``at_edge``."""
    g = grid(rows)
    tune = _tune(rows)
    tune = tune[tune["condition"].isin(g)].assign(accuracy=lambda d: d["accuracy"].fillna(0.0))
    mean = tune.groupby([*CELL, "condition"], sort=True)["accuracy"].mean().reset_index()
    open_end = _open_end(g)
    out = []
    for key, cell in mean.groupby(list(CELL), sort=True):
        best = _best(cell, g, "condition")
        out.append(dict(zip(CELL, key), condition=best["condition"], accuracy=best["accuracy"],
                        at_edge=bool(best["condition"] == open_end)))
    return pd.DataFrame(out, columns=[*CELL, "condition", "accuracy", "at_edge"])


def global_choice(rows: pd.DataFrame) -> dict:
    """The one grid setting with the highest mean task-B accuracy over every cell and tuning seed (NaN as 0, ties to
    the smaller momentum): ``{"condition", "accuracy", "at_edge"}``."""
    g = grid(rows)
    tune = _tune(rows)
    tune = tune[tune["condition"].isin(g)].assign(accuracy=lambda d: d["accuracy"].fillna(0.0))
    mean = tune.groupby("condition")["accuracy"].mean().reset_index()
    best = _best(mean, g, "condition")
    return dict(condition=best["condition"], accuracy=float(best["accuracy"]),
                at_edge=bool(best["condition"] == _open_end(g)))


def momentum_table(rows: pd.DataFrame) -> pd.DataFrame:
    """The reported seeds' part-1 rows as conditions: every recorded condition, plus ``pytorch`` (the ``m0.1`` rows,
    where 0.1 is in the grid), ``best_m`` (each cell's :func:`momentum_choices` setting) and ``global_m``
    (:func:`global_choice`). Columns: ``seed``, the cell, ``condition``, ``accuracy``, ``task_a``, ``stats_error``."""
    cols = ["seed", *CELL, "condition", "accuracy", "task_a", "stats_error"]
    rep = _report(rows)[cols]
    picks = momentum_choices(rows)[[*CELL, "condition"]]
    parts = [rep, rep[rep["condition"] == "m0.1"].assign(condition="pytorch"),
             rep.merge(picks, on=[*CELL, "condition"]).assign(condition="best_m"),
             rep[rep["condition"] == global_choice(rows)["condition"]].assign(condition="global_m")]
    return pd.concat(parts, ignore_index=True)[cols]


def rate_choices(rows: pd.DataFrame, by: tuple = (*TRAIN_CELL, "condition")) -> pd.DataFrame:
    """Per ``by`` (part 2: task-B classes, shift family and condition; part 3: ``("condition",)``), the rate with the
    highest mean ``accuracy`` over the tuning seeds (NaN as 0; ties to the smaller rate). ``at_edge``: the smallest or
    largest rate of the grid (both ends open), where the grid has more than one rate. Columns: ``by``, ``lr``,
    ``accuracy``, ``at_edge``."""
    tune = _tune(rows).assign(accuracy=lambda d: d["accuracy"].fillna(0.0))
    mean = tune.groupby([*by, "lr"], sort=True)["accuracy"].mean().reset_index()
    out = []
    for key, g in mean.groupby(list(by), sort=True):
        rates = sorted(g["lr"])
        best = _best(g, rates, "lr")
        out.append(dict(zip(by, key if isinstance(key, tuple) else (key,)), lr=best["lr"], accuracy=best["accuracy"],
                        at_edge=bool(len(rates) > 1 and best["lr"] in (rates[0], rates[-1]))))
    return pd.DataFrame(out, columns=[*by, "lr", "accuracy", "at_edge"])


def chosen_rows(rows: pd.DataFrame, by: tuple = (*TRAIN_CELL, "condition")) -> pd.DataFrame:
    """The reported seeds' rows of parts 2 or 3 at each ``by``'s rate chosen on the tuning seeds
    (:func:`rate_choices`): one row per seed and ``by``."""
    picks = rate_choices(rows, by)[[*by, "lr"]]
    return _report(rows).merge(picks, on=[*by, "lr"])


def questions(grid_settings, extra=EXTRA_SETTINGS, rules=RULES) -> dict[str, tuple]:
    """The questions per family (module docstring) for a momentum grid ``grid_settings`` (:func:`grid`; the design's
    is every ``m`` of ``momenta`` and ``cma``), the extra settings and the rules present in the rows."""
    ema = [c for c in grid_settings if c != "cma"]
    settings = tuple(grid_settings) + tuple(extra)
    cell = "{target}_b{batch_size}_t{budget}"
    return {
        "momentum": (Question("mom_{condition}_" + cell, condition=settings, reference="precise", each=CELL,
                              margin=MARGIN),),
        "error": (Question("err_{condition}_" + cell, condition=settings, reference="precise", value="stats_error",
                           each=CELL),),
        "order": tuple(Question(f"order_{b}_vs_{a}_" + cell, condition=b, reference=a, value="stats_error",
                                each=CELL, words="larger momentum's error") for a, b in zip(ema, ema[1:])),
        "rule": (Question("rule_{condition}_" + cell, condition=tuple(rules), reference="best_m", each=CELL,
                          margin=MARGIN),),
        "train": (Question("train_{condition}_{classes}_{shift}", condition=TRAIN_COMPARED,
                           reference=TRAIN_REFERENCE, each=TRAIN_CELL, table="train", margin=MARGIN),),
        "retain": (Question("retain_{condition}_{classes}_{shift}", condition=TRAIN_COMPARED,
                            reference=TRAIN_REFERENCE, value="task_a", each=TRAIN_CELL, table="train", margin=MARGIN),),
        "bn_mode": (Question("bn_mode_affine_{classes}_{shift}", condition="affine_train",
                             reference="affine_pinned", each=TRAIN_CELL, table="train", margin=MARGIN,
                             words="train-mode statistics"),
                    Question("bn_mode_affine_retain_{classes}_{shift}", condition="affine_train",
                             reference="affine_pinned", value="task_a", each=TRAIN_CELL, table="train",
                             margin=MARGIN, words="train-mode statistics"),
                    Question("bn_mode_head_{classes}_{shift}", condition="head_train", reference="head",
                             each=TRAIN_CELL, table="train", margin=MARGIN, words="train-mode statistics")),
        "frankle": (Question("frankle_bn_affine_vs_random_same", condition="bn_affine", reference="random_same",
                             table="frankle", margin=MARGIN, words="BatchNorm-only"),
                    Question("frankle_bn_affine_vs_head", condition="bn_affine", reference="head", table="frankle",
                             margin=MARGIN, words="BatchNorm-only")),
        "checks": (Question("check_m0_keeps_source", value="change_from_source", at=dict(condition="m0"),
                            table="momentum_rows", exact=0.0),
                   Question("check_pinned_buffers_{condition}", value="max_buffer_change",
                            at=dict(condition=PINNED), each=("condition",), table="train_rows", exact=0.0),
                   Question("check_frozen_train_{condition}", value="max_frozen_change", each=("condition",),
                            table="train_rows", exact=0.0),
                   Question("check_frozen_frankle_{condition}", value="max_frozen_change", each=("condition",),
                            table="frankle_rows", exact=0.0),
                   Question("check_random_same_count", value="trainable", condition="random_same",
                            reference="bn_affine", table="frankle", exact=0.0)),
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


def edge_counts(momentum: pd.DataFrame, train: pd.DataFrame, frankle: pd.DataFrame) -> dict:
    """How many choices sit at an open end of their grid: ``momentum_at_edge`` / ``momentum_cells`` (per-cell
    ``best_m``), ``global_at_edge`` (0 or 1), ``train_at_edge`` / ``train_cells``, ``frankle_at_edge`` /
    ``frankle_cells``; and ``momentum_chose_source`` (cells whose best is ``m0``: a closed end, a finding)."""
    m, t, f = momentum_choices(momentum), rate_choices(train), rate_choices(frankle, ("condition",))
    return dict(momentum_at_edge=int(m["at_edge"].sum()), momentum_cells=len(m),
                momentum_chose_source=int((m["condition"] == "m0").sum()),
                global_at_edge=int(global_choice(momentum)["at_edge"]),
                train_at_edge=int(t["at_edge"].sum()), train_cells=len(t),
                frankle_at_edge=int(f["at_edge"].sum()), frankle_cells=len(f))



# --- the page: parsed keys, descriptive means, tables, the numbers table and the rule-triggered notes ----------------

from ...words import Note, counts_text, join, notes  # noqa: E402

#: The direction words this chapter's verdicts use (the glossary's table lists them).
DIRECTIONS = ("higher", "lower", "larger momentum's error higher", "larger momentum's error lower", "train-mode statistics higher",
              "train-mode statistics lower", "BatchNorm-only higher", "BatchNorm-only lower")
#: How the page names each momentum setting, rule, training choice and part-3 condition.
SETTING_NAMES = dict(cma="cumulative average", cma_loaded="momentum=None on the loaded model",
                     kornblith="Kornblith's rule", precise="precise BN after training", pytorch="PyTorch's 0.1",
                     best_m="the best momentum", global_m="one momentum for all cells", reference="reference")
TRAIN_NAMES = dict(head="head only, statistics pinned", head_train="head only, train mode",
                   affine_pinned="affine + head, statistics pinned", affine_train="affine + head, train mode",
                   first_block="first block + head", full="full fine-tuning")
FRANKLE_NAMES = dict(bn_affine="BatchNorm's gamma and beta", random_same="as many random weights",
                     head="output layer only", all="every parameter")
KINDS = ("higher", "equivalent", "not decided", "lower")
_MOM_KEY = re.compile(r"^(?P<q>mom|err|rule)_(?P<condition>.+)_(?P<target>close|shifted)_b(?P<batch_size>\d+)"
                      r"_t(?P<budget>\d+)$")
_TRAIN_KEY = re.compile(r"^(?P<q>train|retain|bn_mode_affine_retain|bn_mode_affine|bn_mode_head)_"
                        r"(?:(?P<condition>" + "|".join(TRAIN_COMPARED) + r")_)?(?P<classes>new|same)_(?P<shift>[a-z]+)$")


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


def _kinds(g: pd.DataFrame) -> dict:
    return {k: int(g["kind"].eq(k).sum()) for k in KINDS}


def _short(counts: dict) -> str:
    """``"0/3/1/0"``: higher / equivalent / not decided / lower."""
    return "/".join(str(counts[k]) for k in KINDS)


def seed_means(table: pd.DataFrame, by: list, values=("accuracy",), confidence: float = 0.95) -> pd.DataFrame:
    """Descriptive means (no verdict rests on them): each seed's mean of ``values`` over the rows of one ``by``
    group, then the mean over seeds with its Student's t interval. Columns: ``by``, then per value ``<value>``,
    ``<value>_low``, ``<value>_high``, and ``n_seeds``."""
    from ...inference import t_interval
    per_seed = table.groupby([*by, "seed"])[list(values)].mean().reset_index()
    rows = []
    for key, g in per_seed.groupby(by, sort=False):
        row = dict(zip(by, key if isinstance(key, tuple) else (key,)))
        for v in values:
            iv = t_interval(g[v].dropna().to_numpy(), confidence)
            row.update({v: iv.mean, f"{v}_low": iv.low, f"{v}_high": iv.high})
        rows.append(dict(row, n_seeds=g["seed"].nunique()))
    return pd.DataFrame(rows)


def momentum_order(rows: pd.DataFrame) -> list[str]:
    """The momentum settings in the page's order: the grid (:func:`grid`), ``cma_loaded``, ``kornblith``,
    ``precise``."""
    present = set(rows["condition"])
    return grid(rows) + [c for c in ("cma_loaded", "kornblith", "precise") if c in present]


def momentum_main_table(rows: pd.DataFrame, claims_table: pd.DataFrame) -> pd.DataFrame:
    """Table 9.1: per momentum setting (rows) and step budget (columns): the statistics error and the task-B
    accuracy, each seed's mean over the targets and batch sizes then the mean over seeds, and against precise BN
    after training the ``momentum`` family's verdict counts over the targets x batch sizes (higher / equivalent /
    not decided / lower)."""
    rep = _report(rows)
    means = seed_means(rep, ["condition", "budget"], ("accuracy", "stats_error"))
    p = parsed(claims_table)
    p = p[p["q"] == "mom"]
    order = momentum_order(rows)
    cols = {}
    for t in sorted(rep["budget"].unique()):
        err, acc, ver = {}, {}, {}
        for c in order:
            m = means[(means["condition"] == c) & (means["budget"] == t)].iloc[0]
            err[setting_label(c)], acc[setting_label(c)] = f"{m['stats_error']:.3f}", f"{m['accuracy']:.3f}"
            g = p[(p["condition"] == c) & (p["budget"] == t)]
            ver[setting_label(c)] = _short(_kinds(g)) if len(g) else "—"
        cols.update({(f"{t} steps", "error"): err, (f"{t} steps", "accuracy"): acc,
                     (f"{t} steps", "vs precise"): ver})
    out = pd.DataFrame(cols)
    out.columns = pd.MultiIndex.from_tuples(out.columns, names=["budget", ""])
    return out


def rules_table(claims_table: pd.DataFrame, rows: pd.DataFrame) -> pd.DataFrame:
    """Table 9.2: per rule (rows), each rule minus the per-cell best momentum chosen on the tuning seeds
    (``rule`` family): the verdict counts over every cell and per step budget, and the range of the estimates; the
    global momentum's row is left out where it is PyTorch's 0.1 (the same comparisons).
    Also the per-cell choices behind ``best_m`` in the column ``best_m``."""
    p = parsed(claims_table)
    p = p[p["q"] == "rule"]
    out = []
    same = global_choice(rows)["condition"] == "m0.1"  # the global momentum is PyTorch's: one row, not two
    for r in [x for x in RULES if x in set(p["condition"]) and not (same and x == "global_m")]:
        g = p[p["condition"] == r]
        row = {"rule": SETTING_NAMES[r], "all cells": _short(_kinds(g))}
        for t in sorted(g["budget"].unique()):
            row[f"{t:.0f} steps"] = _short(_kinds(g[g["budget"] == t]))
        row["estimates"] = f"{g['estimate'].min():+.3f} to {g['estimate'].max():+.3f}"
        out.append(row)
    return pd.DataFrame(out)


def choices_table(rows: pd.DataFrame) -> pd.DataFrame:
    """The per-cell momentum chosen on the tuning seeds (``best_m``) beside the one with the smallest mean
    statistics error on the reported seeds, and Kornblith's rule's momentum. Columns: the cell, ``best_m``,
    ``smallest error``, ``Kornblith``."""
    picks = momentum_choices(rows)
    rep = _report(rows)
    ema = rep[rep["condition"].isin([c for c in grid(rows) if c != "cma"])]
    err = ema.groupby([*CELL, "condition"])["stats_error"].mean().reset_index()
    low = err.loc[err.groupby(list(CELL))["stats_error"].idxmin()].set_index(list(CELL))["condition"]
    k = rep.groupby(list(CELL))["kornblith"].first()
    return pd.DataFrame([{"target": r.target, "batch": int(r.batch_size), "steps": int(r.budget),
                          "best momentum (tuning seeds)": setting_label(r.condition),
                          "smallest error": setting_label(low[(r.target, r.batch_size, r.budget)]),
                          "Kornblith's m": f"{k[(r.target, r.batch_size, r.budget)]:.3g}"}
                         for r in picks.itertuples()])


def train_means(train: pd.DataFrame) -> pd.DataFrame:
    """Part 2 at each condition's tuned rate (:func:`chosen_rows`): per task-B classes and condition, each seed's
    mean over the shift families of task-B accuracy and task A's retention, then means over seeds with 95%
    intervals (:func:`seed_means`), with the trainable share."""
    ch = chosen_rows(train)
    out = seed_means(ch, ["classes", "condition"], ("accuracy", "task_a", "trainable_share"))
    return out


def train_table(train: pd.DataFrame, claims_table: pd.DataFrame) -> pd.DataFrame:
    """Table 9.3: per training choice (rows) and task-B classes (column groups): the trainable share of the
    network's parameters, task-B accuracy and task A's retention (means over seeds of each seed's mean over the
    shift families, at each condition's tuned rate) and, against full fine-tuning, the ``train`` and ``retain``
    families' verdict counts over the shift families."""
    means = train_means(train)
    p = parsed(claims_table)
    cols = {}
    for k in [c for c in CLASSES if c in set(means["classes"])]:
        share, acc, va, ret, vr = {}, {}, {}, {}, {}
        for c in TRAIN_CONDITIONS_ORDER:
            m = means[(means["classes"] == k) & (means["condition"] == c)]
            if not len(m):
                continue
            m, name = m.iloc[0], TRAIN_NAMES[c]
            share[name] = f"{100 * m['trainable_share']:.1f}%"
            acc[name] = f"{m['accuracy']:.3f} ({m['accuracy_low']:.3f}–{m['accuracy_high']:.3f})"
            ret[name] = f"{m['task_a']:.3f}"
            for q, d in (("train", va), ("retain", vr)):
                g = p[(p["q"] == q) & (p["condition"] == c) & (p["classes"] == k)]
                d[name] = _short(_kinds(g)) if len(g) else "reference"
        label = "new classes" if k == "new" else "same classes"
        cols.update({(label, "trained"): share, (label, "task B"): acc, (label, "vs full"): va,
                     (label, "task A kept"): ret, (label, "kept vs full"): vr})
    out = pd.DataFrame(cols)
    out.columns = pd.MultiIndex.from_tuples(out.columns, names=["task B", ""])
    return out


#: Part 2's conditions in the page's order.
TRAIN_CONDITIONS_ORDER = ("head", "head_train", "affine_pinned", "affine_train", "first_block", "full")


def frankle_means(frankle: pd.DataFrame) -> pd.DataFrame:
    """Part 3 at each condition's tuned rate: accuracy (task A, from random initialisation) per condition, means
    over seeds with 95% intervals, the trainable count and the chosen rate."""
    ch = chosen_rows(frankle, ("condition",))
    out = seed_means(ch, ["condition"], ("accuracy", "trainable"))
    return out.merge(rate_choices(frankle, ("condition",))[["condition", "lr", "at_edge"]], on="condition")


def _count(p, q, condition=None, **at) -> dict:
    g = p[p["q"] == q]
    if condition is not None:
        g = g[g["condition"] == condition]
    for k, v in at.items():
        g = g[g[k] == v]
    return dict(_kinds(g), cells=len(g), est_min=float(g["estimate"].min()) if len(g) else math.nan,
                est_max=float(g["estimate"].max()) if len(g) else math.nan)


def page_numbers(momentum: pd.DataFrame, train: pd.DataFrame, frankle: pd.DataFrame, claims_table: pd.DataFrame,
                 config) -> pd.DataFrame:
    """The page's flat numbers table (:func:`bnstudy.study.inference.numbers_table`): part 1's means per setting
    and budget (``acc_<setting>_t<budget>``, ``err_...``, intervals over seeds, pooled over targets and batch
    sizes), verdict counts per question, setting or rule (``<q>_<setting>_<kind>``, ``..._cells``,
    ``..._est_min`` / ``_est_max``; per budget ``<q>_<setting>_t<budget>_<kind>``; part 2 per classes
    ``<q>_<condition>_<classes>_<kind>``), part 2's and 3's means, the grids' choices (:func:`edge_counts`), the
    units' recorded compute (``cost_worker_min``) and the design's settings (``cfg_*``)."""
    from ...inference import Interval, numbers_table
    values: dict = {}
    rep = _report(momentum)
    mm = seed_means(rep, ["condition", "budget"], ("accuracy", "stats_error", "task_a"))
    top = int(mm["budget"].max())
    for r in mm.itertuples():
        slug = r.condition.replace(".", "_")
        for t in {f"t{int(r.budget)}", *(["tmax"] if int(r.budget) == top else [])}:  # tmax: the longest budget
            values[f"acc_{slug}_{t}"] = Interval(r.accuracy, r.accuracy_low, r.accuracy_high, r.n_seeds)
            values[f"err_{slug}_{t}"] = Interval(r.stats_error, r.stats_error_low, r.stats_error_high, r.n_seeds)
            values[f"keep_{slug}_{t}"] = Interval(r.task_a, r.task_a_low, r.task_a_high, r.n_seeds)
    p = parsed(claims_table)
    budgets = sorted(rep["budget"].unique())
    for q in ("mom", "err", "rule"):
        for c in sorted(set(p.loc[p["q"] == q, "condition"])):
            slug = c.replace(".", "_")
            d = _count(p, q, c)
            values.update({f"{q}_{slug}_{k.replace(' ', '_')}": v for k, v in d.items()})
            for t in budgets:
                d = _count(p, q, c, budget=t)
                values.update({f"{q}_{slug}_t{int(t)}_{k.replace(' ', '_')}": v for k, v in d.items()
                               if k in (*KINDS, "cells")})
    for q in ("train", "retain"):
        for c in TRAIN_COMPARED:
            for k in CLASSES:
                d = _count(p, q, c, classes=k)
                values.update({f"{q}_{c}_{k}_{x.replace(' ', '_')}": v for x, v in d.items()})
    for q in ("bn_mode_affine", "bn_mode_affine_retain", "bn_mode_head"):
        d = _count(p, q)
        values.update({f"{q}_{x.replace(' ', '_')}": v for x, v in d.items()})
        for k in CLASSES:
            d = _count(p, q, classes=k)
            values.update({f"{q}_{k}_{x.replace(' ', '_')}": v for x, v in d.items()})
    g = p[(p["q"] == "bn_mode_affine") & (p["kind"] == "higher")]
    values["bn_mode_affine_above_margin"] = int((g["estimate"] > MARGIN).sum())
    mom = p[(p["q"] == "mom") & p["condition"].isin([c for c in grid(momentum) if c != "m0"] + ["cma_loaded"])]
    values["mom_worst"] = float(mom["estimate"].min()) if len(mom) else math.nan
    if momentum["target"].nunique() == 2:
        w = rep.pivot_table(index=["seed", "batch_size", "budget", "condition"], columns="target", values="accuracy")
        values["target_diff"] = float((w.iloc[:, 0] - w.iloc[:, 1]).abs().mean())
    picks = momentum_choices(momentum)
    values["rule_pytorch_identical"] = int((picks["condition"] == "m0.1").sum())
    tm = train_means(train)
    for r in tm.itertuples():
        values[f"t_{r.classes}_{r.condition}"] = Interval(r.accuracy, r.accuracy_low, r.accuracy_high, r.n_seeds)
        values[f"kept_{r.classes}_{r.condition}"] = Interval(r.task_a, r.task_a_low, r.task_a_high, r.n_seeds)
        values[f"share_{r.classes}_{r.condition}"] = 100 * float(r.trainable_share)
    fm = frankle_means(frankle)
    for r in fm.itertuples():
        values[f"fr_{r.condition}"] = Interval(r.accuracy, r.accuracy_low, r.accuracy_high, r.n_seeds)
        values[f"fr_{r.condition}_trainable"] = int(round(r.trainable))
        values[f"fr_{r.condition}_lr"] = float(r.lr)
    fr = claims_table.set_index("key")
    for key in ("frankle_bn_affine_vs_random_same", "frankle_bn_affine_vs_head"):
        if key in fr.index:
            values[f"{key}_kind"] = str(fr.loc[key, "kind"])
    for fam, g in claims_table.groupby("family"):
        values[f"n_{fam}"], values[f"conf_{fam}"] = len(g), float(g["confidence"].iloc[0]) * 100
    values.update(edge_counts(momentum, train, frankle))
    gm = global_choice(momentum)
    values.update(global_m=setting_label(gm["condition"]),
                  exact_checks=int((claims_table["family"] == "checks").sum()),
                  exact_failed=int(((claims_table["family"] == "checks") & (claims_table["kind"] != "exact")).sum()))
    picks = momentum_choices(momentum)
    values["best_m_names"] = join(sorted({setting_label(c) for c in picks["condition"]},
                                         key=lambda s: float(s[4:]) if s.startswith("m = ") else 9))
    units = (momentum.drop_duplicates(["seed", "target", "batch_size"])["unit_wall_s"].sum()
             + train.drop_duplicates(["seed", "classes", "shift", "unit_wall_s"])["unit_wall_s"].sum()
             + frankle.drop_duplicates(["seed", "unit_wall_s"])["unit_wall_s"].sum())  # a cell's rate chunks: units
    values["cost_worker_min"] = float(units) / 60
    k, s = rep.groupby("batch_size")["kornblith"].first(), rep.groupby("batch_size")["steps_per_epoch"].first()
    for name, b in (("low", min(k.index)), ("high", max(k.index))):
        values.update({f"kornblith_{name}": float(k[b]), f"steps_per_epoch_{name}": int(s[b])})
    from .run import SOURCE_MOMENTUM
    values.update(cfg_source_momentum=SOURCE_MOMENTUM, half_life_default=math.log(2) / -math.log(1 - SOURCE_MOMENTUM),
                  half_life_tenth=math.log(2) / -math.log(1 - SOURCE_MOMENTUM / 10))
    values.update(n_seeds=len(config.seeds), cfg_n_seeds=len(config.seeds), cfg_n_tuning=len(config.tuning_seeds),
                  cfg_tuning_first=min(config.tuning_seeds), cfg_tuning_last=max(config.tuning_seeds),
                  cfg_margin=MARGIN, cfg_train_size=config.train_size, cfg_n_eval=config.n_eval,
                  cfg_budget_low=min(config.budgets), cfg_budget_high=max(config.budgets),
                  cfg_batch_low=min(config.batch_sizes), cfg_batch_high=max(config.batch_sizes),
                  cfg_base_lr=config.base_lr, cfg_lr_batch=config.lr_batch,
                  cfg_reference_samples=config.reference_samples, cfg_precise_samples=config.precise_samples,
                  cfg_train_steps=config.train_steps, cfg_train_batch=config.train_batch,
                  cfg_frankle_steps=config.frankle_steps, cfg_strength=config.shift_strength,
                  cfg_n_shifts=len(config.shifts), cfg_n_cells=len(picks))
    acc_like = ("acc_", "keep_", "t_", "kept_", "fr_")
    return numbers_table(values, lambda key: (0.0, 1.0) if key.startswith(acc_like) and not key.endswith(
        ("_trainable", "_lr", "_kind")) else (0.0, math.inf) if key.startswith("err_") else (-math.inf, math.inf))


def _n(numbers: pd.DataFrame, key: str):
    from ...inference import number
    return number(numbers, key)


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


def _precise(_, n):
    return _k(n, "rule_precise")


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


def _mode(q):
    return lambda c, n: _k(n, q)


def _frankle(_, n):
    return dict(kind=_n(n, "frankle_bn_affine_vs_random_same_kind"), bn=_n(n, "fr_bn_affine").mean,
                rnd=_n(n, "fr_random_same").mean, head=_n(n, "fr_head").mean, all=_n(n, "fr_all").mean,
                k=_n(n, "fr_bn_affine_trainable"), head_k=_n(n, "fr_head_trainable"),
                own=_n(n, "fr_bn_affine_trainable") - _n(n, "fr_head_trainable"), steps=_n(n, "cfg_frankle_steps"))


def _wu(_, n):
    """Wu & Johnson's two failure ends on the ``error`` family: the largest and the smallest non-zero momentum
    against precise BN, counted over every cell."""
    g = [c for c in ("m0_3", "m1") if f"err_{c}_higher" in set(n["key"])]
    big = g[-1] if g else "m0_3"
    return dict(big=_k(n, f"err_{big}"), small=_k(n, "err_m0_001"), big_name=setting_label(big.replace("_", ".")))


def _wu_fill(c, n):
    d = _wu(c, n)
    return dict(bh=d["big"]["higher"], bc=d["big"]["cells"], sh=d["small"]["higher"], sc=d["small"]["cells"],
                big=d["big_name"])


def _aff(c, n):
    d = _k(n, "bn_mode_affine")
    return dict(d, nd=d["not_decided"], gain=_n(n, "bn_mode_affine_est_max"), loss=_n(n, "bn_mode_affine_est_min"),
                big=_n(n, "bn_mode_affine_above_margin"),
                r_loss=-_n(n, "bn_mode_affine_retain_est_min"),
                **{f"r_{k}": v for k, v in _k(n, "bn_mode_affine_retain").items()})


#: The page's rule-triggered sentences (:class:`bnstudy.study.words.Note`), each with a flip test.
NOTES = (
    Note("lead_momentum", lambda c, n: _precise(c, n)["lower"] == 0 and 2 * _precise(c, n)["equivalent"]
         >= _precise(c, n)["cells"],
         "**Re-estimate the statistics after training (precise BN).** Precise BN after training was within ±{m:g} "
         "of the best momentum (chosen per cell on the tuning seeds) in {equivalent} of {cells} cells and below it "
         "in none, so it makes the momentum used during training irrelevant to the result.",
         lambda c, n: dict(_precise(c, n), m=MARGIN)),
    Note("lead_momentum", lambda c, n: _precise(c, n)["lower"] > 0,
         "**Not precise BN everywhere.** Precise BN after training fell below the best momentum (chosen per cell on "
         "the tuning seeds) in {lower} of {cells} cells and was within ±{m:g} of it in {equivalent}.",
         lambda c, n: dict(_precise(c, n), m=MARGIN)),
    Note("lead_momentum", lambda c, n: _precise(c, n)["lower"] == 0 and 2 * _precise(c, n)["equivalent"]
         < _precise(c, n)["cells"],
         "**Not decided.** Precise BN after training was within ±{m:g} of the best momentum (chosen per cell on "
         "the tuning seeds) in only {equivalent} of {cells} cells, below it in none.",
         lambda c, n: dict(_precise(c, n), m=MARGIN)),
    Note("rule_holds", lambda c, n: bool(_rules(c, n)),
         "A rule held in every cell: {names} {verb} within the margin of the per-cell best in all {cells} "
         "cells. Without re-estimation the momentum does matter: other settings lost up to {worst:.2f} (below).",
         _rule_fill),
    Note("rule_holds", lambda c, n: not _rules(c, n),
         "No momentum rule (Kornblith's from the steps per epoch, PyTorch's 0.1, or the one momentum best over every "
         "cell of the tuning seeds) was within the margin of the per-cell best in every one of the {cells} cells: "
         "the data do not support a rule for the momentum from the steps and the batch size.", _rule_fill),
    Note("cma_loaded", lambda c, n: _half(n, "mom_cma_loaded") and _half(n, "mom_cma"),
         "A cumulative average (PyTorch's momentum None) on a loaded model, its counter carried over from the "
         "source's training, fell below precise BN in {lower} of {cells} cells: the source's batches keep most of "
         "the weight. Resetting the counter did not rescue it (below precise BN in {cma_lower} of {cells}, every "
         "batch of a run weighted equally however stale): do not fine-tune with a cumulative average.", _cma),
    Note("cma_loaded", lambda c, n: _half(n, "mom_cma_loaded") and not _half(n, "mom_cma"),
         "A cumulative average (PyTorch's momentum None) on a loaded model, its counter carried over from the "
         "source's training, fell below precise BN in {lower} of {cells} cells: the source's batches keep most of "
         "the weight. With the counter reset to 0 before fine-tuning it fell below precise BN in {cma_lower}.", _cma),
    Note("cma_loaded", lambda c, n: not _half(n, "mom_cma_loaded"),
         "A cumulative average (PyTorch's momentum None) on a loaded model, its counter carried over from the "
         "source's training, fell below precise BN in {lower} of {cells} cells; with the counter reset, in "
         "{cma_lower}.", _cma),
    Note("frozen_stats", lambda c, n: 2 * _k(n, "mom_m0")["lower"] >= _k(n, "mom_m0")["cells"] > 0,
         "Never updating the running statistics while the network trains in train mode (momentum 0: the source "
         "statistics at evaluation) fell below precise BN in {lower} of {cells} cells.", _mode("mom_m0")),
    Note("frozen_stats", lambda c, n: not 2 * _k(n, "mom_m0")["lower"] >= _k(n, "mom_m0")["cells"] > 0,
         "Never updating the running statistics while the network trains in train mode (momentum 0) fell below "
         "precise BN in {lower} of {cells} cells.", _mode("mom_m0")),
    Note("lead_affine", lambda c, n: _aff(c, n)["lower"] > 0 and _aff(c, n)["higher"] == 0,
         "**Pin the statistics when only BatchNorm's affine parameters train.** With the affine parameters and the "
         "head trained, train-mode statistics (what fastai's and Lightning's train-BN freezing does) were below "
         "pinned statistics on task B in {lower} of {cells} cells and above them in none.", _aff),
    Note("lead_affine", lambda c, n: _aff(c, n)["higher"] > 0 and _aff(c, n)["lower"] == 0,
         "**Train-mode statistics were above pinned ones on the new task in {higher} of {cells} cells, by more than "
         "the book's margin in {big}.** With the affine parameters and the head trained, train-mode statistics (what "
         "fastai's and Lightning's train-BN freezing does) were below pinned statistics on task B in none (largest "
         "gain {gain:.3f}).", _aff),
    Note("lead_affine", lambda c, n: _aff(c, n)["higher"] > 0 and _aff(c, n)["lower"] > 0,
         "**Whether to pin depends on the task.** With the affine parameters and the head trained, train-mode "
         "statistics (what fastai's and Lightning's train-BN freezing does) were above pinned statistics on task B in "
         "{higher} of {cells} cells and below them in {lower}.", _aff),
    Note("lead_affine", lambda c, n: _aff(c, n)["higher"] == 0 and _aff(c, n)["lower"] == 0,
         "**Pinned or train-mode statistics: no difference shown.** With the affine parameters and the head "
         "trained, train-mode statistics (what fastai's and Lightning's train-BN freezing does) were equivalent to "
         "pinned statistics on task B in {equivalent} of {cells} cells; {nd} are not decided.", _aff),
    Note("affine_retention", lambda c, n: _aff(c, n)["r_lower"] > 0,
         "On task A, which the frozen backbone is meant to keep, train mode was below pinned statistics in "
         "{r_lower} of {r_cells} cells (by up to {r_loss:.3f}) and above them in {r_higher}.", _aff),
    Note("affine_retention", lambda c, n: _aff(c, n)["r_lower"] == 0,
         "On task A, which the frozen backbone is meant to keep, train mode was below pinned statistics in none of "
         "{r_cells} cells and above them in {r_higher}.", _aff),
    Note("anchor_frankle", lambda c, n: _frankle(c, n)["kind"] == "higher",
         "**Same direction.** From random initialisation, training only BatchNorm's gamma and beta (with the output "
         "layer) reached {bn:.3f} on task A against {rnd:.3f} for as many randomly chosen weights ({own} each, plus "
         "the output layer's {head_k}; the output layer alone {head:.3f}, every parameter {all:.3f}), after one "
         "budget of {steps} steps: a gap far smaller than Frankle et al.'s, on a far smaller network.", _frankle),
    Note("anchor_frankle", lambda c, n: _frankle(c, n)["kind"] == "lower",
         "**Opposite direction.** From random initialisation, training only BatchNorm's gamma and beta (with the "
         "output layer) reached {bn:.3f} on task A against {rnd:.3f} for as many randomly chosen weights ({k} "
         "parameters each; the output layer alone {head:.3f}, every parameter {all:.3f}).", _frankle),
    Note("anchor_frankle", lambda c, n: _frankle(c, n)["kind"] not in ("higher", "lower"),
         "**Not shown.** From random initialisation, training only BatchNorm's gamma and beta (with the output "
         "layer) reached {bn:.3f} on task A against {rnd:.3f} for as many randomly chosen weights ({k} parameters "
         "each; the output layer alone {head:.3f}, every parameter {all:.3f}): {kind}.", _frankle),
    Note("anchor_wu", lambda c, n: 2 * _wu(c, n)["big"]["higher"] >= _wu(c, n)["big"]["cells"] > 0
         and 2 * _wu(c, n)["small"]["higher"] >= _wu(c, n)["small"]["cells"],
         "**Same direction.** The moving average's statistics were farther from the population's than precise BN's "
         "at the largest momentum ({big}: {bh} of {bc} cells) and at the smallest non-zero one (m = 0.001: {sh} of "
         "{sc}).", _wu_fill),
    Note("anchor_wu", lambda c, n: not (2 * _wu(c, n)["big"]["higher"] >= _wu(c, n)["big"]["cells"] > 0
                                        and 2 * _wu(c, n)["small"]["higher"] >= _wu(c, n)["small"]["cells"]),
         "**In part.** The moving average's statistics were farther from the population's than precise BN's at the "
         "largest momentum ({big}) in {bh} of {bc} cells and at the smallest non-zero one (m = 0.001) in {sh} of "
         "{sc}.", _wu_fill),
)


def page_words(claims_table: pd.DataFrame, numbers: pd.DataFrame) -> dict[str, str]:
    """``{name: Markdown}``: the notes of :data:`NOTES`; each rule's ``rule`` claims counted (``count_rule_<rule>``,
    :func:`bnstudy.study.words.counts_text`); each momentum setting's ``mom`` and ``err`` claims counted
    (``count_mom_<setting>``, ``count_err_<setting>``); per task-B classes, each training choice's ``train`` and
    ``retain`` claims (``count_train_<condition>_<classes>``, ``count_retain_...``) and the ``bn_mode`` family's
    three questions (``count_bn_mode_affine_<classes>``, ...)."""
    out = notes(NOTES, claims_table, numbers)
    p = parsed(claims_table)
    for (q, c), g in p[p["q"].isin(("mom", "err", "rule"))].groupby(["q", "condition"]):
        ref = "the best momentum" if q == "rule" else "precise BN"
        what = "cells" if q != "err" else "cells (statistics error)"
        out[f"count_{q}_{c.replace('.', '_')}"] = counts_text(g, what, setting_label(c), ref,
                                                               MARGIN if q != "err" else 0)
    shown = [c for c in dict.fromkeys([*grid_of(p)[:1], "m0.1", *grid_of(p)[-1:], "cma"]) if c in set(p["condition"])]
    out["mom_counts"] = "; ".join(
        f"{'PyTorch' + chr(39) + 's default' if c == 'm0.1' else setting_label(c)}, "
        + counts_text(p[(p["q"] == "mom") & (p["condition"] == c)], "cells", setting_label(c), "precise BN", MARGIN)
        for c in shown) + "."
    for (q, c, k), g in p[p["q"].isin(("train", "retain"))].groupby(["q", "condition", "classes"]):
        out[f"count_{q}_{c}_{k}"] = counts_text(g, "shift families", TRAIN_NAMES[c], "full fine-tuning", MARGIN)
    for (q, k), g in p[p["q"].str.startswith("bn_mode")].groupby(["q", "classes"]):
        subj = "train mode"
        out[f"count_{q}_{k}"] = counts_text(g, "shift families", subj, "pinned statistics", MARGIN)
    return out


def grid_of(p: pd.DataFrame) -> list[str]:
    """The ``m<value>`` settings among the parsed claims (:func:`parsed`), by momentum."""
    ema = {c for c in p["condition"].dropna() if _EMA.match(c)}
    return sorted(ema, key=lambda c: float(c[1:]))


def config_words(config) -> dict[str, str]:
    """The design's lists in words (plain text, glued as ``ch09_<name>``): ``budgets`` (``"100, 400 and 1600"``),
    ``batch_sizes``, ``momenta`` (the grid), ``train_grid`` and ``frankle_grid`` (the Adam rates of parts 2 and 3)."""
    return dict(budgets=join([f"{b}" for b in config.budgets]), batch_sizes=join([f"{b}" for b in config.batch_sizes]),
                momenta=join([f"{m:g}" for m in config.momenta]), train_grid=join([f"{r:g}" for r in config.train_lrs]),
                frankle_grid=join([f"{r:g}" for r in config.frankle_lrs]))
