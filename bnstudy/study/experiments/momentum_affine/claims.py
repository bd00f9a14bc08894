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
grid is closed below (``m = 0`` is the source statistics, nothing is slower) and open above (its largest ``m``; only
the last batch's statistics lie beyond), ``cma`` is off the axis and never an edge; a rate grid is open at both ends
(rate 0 trains nothing, and was not run).

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

import re

import pandas as pd

from ...inference import Question, ask

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


def _best(g: pd.DataFrame, order: list, column: str) -> pd.Series:
    """The row of ``g`` (one per candidate, ``accuracy`` a mean) with the highest accuracy, ties to the earliest in
    ``order`` (the values of ``column``)."""
    rank = g[column].map({v: i for i, v in enumerate(order)})
    return g.assign(_rank=rank).sort_values(["accuracy", "_rank"], ascending=[False, True]).iloc[0]


def momentum_choices(rows: pd.DataFrame) -> pd.DataFrame:
    """Per cell, the grid setting (:func:`grid`) with the highest mean task-B accuracy over the tuning seeds (a NaN
    accuracy counted as 0; ties to the smaller momentum). ``at_edge``: the choice is the largest ``m`` of the grid
    (its open end). Columns: the cell, ``condition``, ``accuracy`` (the tuning mean), ``at_edge``."""
    g = grid(rows)
    tune = _tune(rows)
    tune = tune[tune["condition"].isin(g)].assign(accuracy=lambda d: d["accuracy"].fillna(0.0))
    mean = tune.groupby([*CELL, "condition"], sort=True)["accuracy"].mean().reset_index()
    open_end = [c for c in g if c != "cma"][-1]
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
                at_edge=bool(best["condition"] == [c for c in g if c != "cma"][-1]))


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
                                each=CELL, words=f"{b} error") for a, b in zip(ema, ema[1:])),
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
QUESTIONS = questions([f"m{m:g}" for m in (0.0, 0.001, 0.01, 0.03, 0.1, 0.3)] + ["cma"])


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


def verdict_counts(claims_table: pd.DataFrame) -> pd.DataFrame:
    """How many claims of each family print each verdict kind (the book's counts rule: each claim's printed
    verdict). Columns: ``family`` and one per kind present, then ``claims``."""
    out = claims_table.groupby("family")["kind"].value_counts().unstack(fill_value=0)
    out["claims"] = out.sum(axis=1)
    return out.reset_index()

