"""Chapter 2: the everyday calls that undo a freeze, each caught by the audit and then fixed.

Five traps, each run on a small conv network trained on task A (stage 1 of the engine,
:func:`bnstudy.engine.train_source`, cached like every chapter's) or on a single BatchNorm
layer, each wrapped in a :class:`bnstudy.audit.FreezeAudit` or checked by a
:mod:`bnstudy.audit` lint:

1. ``train_call``: a loop calls ``model.train()`` every epoch and undoes the backbone's
   ``eval()``; fixed by :func:`bnstudy.freeze.pin_eval`.
2. ``no_grad``: a teacher (or validation) pass left in train mode under ``torch.no_grad()``
   still overwrites running statistics, and a sample's output depends on its batch mates;
   fixed by ``eval()``.
3. ``whole_eval``: the whole model in eval mode turns dropout off and changes what ``forward``
   returns (auxiliary logits only in train mode, as torchvision's Inception v3); fixed by
   pinning only the backbone.
4. ``sorted_batches``: batches whose composition follows the label; the gap between a module
   in train and in eval mode grows with the share of each batch that has one class.
5. ``tiny_batch``: accuracy with BatchNorm in train mode against the per-device batch size,
   and the batch-of-1 and batch-of-2 cases of BatchNorm1d/2d (:func:`single_layer_cases`).
6. ``sorted_training``: a network *trained* on class-sorted batches (every batch one class, the
   seed article's case) against one trained on shuffled batches: the training loop's accuracy
   meter (train mode, batch statistics) against held-out accuracy in eval mode.

Trap 3's third case, ``backbone_only_dropout_off``, is the recommended fix with the head's
dropout pinned off: it measures how much of the fix's lower main-head accuracy is dropout's.
``whole_eval_tuned`` (issue 10, referee item 6) trains trap 3's main head again, without the
audit, for ``t3_steps`` steps at every learning rate of ``t3_lrs``, with the whole model pinned and
with the fix; :func:`findings` picks each setup's rate on a task-B *validation* set (drawn apart
from the test set) and reports test accuracy at that rate, so the fix is judged on a head that
had a fair chance to learn.

``Config`` -> :func:`run` (one row per (seed, trap, case), cached by :mod:`bnstudy.sweep`)
-> :func:`findings` (a claims table from :mod:`bnstudy.inference`, every verdict the page prints, and the
descriptive numbers its prose cites). Here ``module_mode`` is a
module's train/eval flag; "train mode" in prose means that flag, never chapter 1's freeze
mode ``train_mode``.
"""

from __future__ import annotations

import copy
import re
from collections import OrderedDict, namedtuple
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from .. import audit

from ..inference import Family, Interval, claims_table, count_verdicts, decide, exact_check, intersection_union_p, \
    one_sided_p, t_interval
from ..config import Execution, SourceConfig, _Frozen, check_choice, check_float, check_int, check_seeds, \
    check_sequence, from_profile, seeds_label
from ..engine import accuracy, ensure_sources, load_source, logits_of, make_optimizer, seeded, source_version, \
    train_step
from ..freeze import pin_eval
from ..models import Classifier, ConvBackbone, make_head
from ..modes import TransferModel
from ..sweep import default_cache_dir, run_sweep
from ..tasks import BatchStream, derive_seed, eval_set, generator, make_task

NAMESPACE = "ch02_eval_traps"
#: Parameters that only change the analysis: none (every field of :class:`Config` decides runs), so a page given
#: ``rows`` (an earlier run's tables) must be given every parameter as that run was.
ANALYSIS_PARAMETERS = ()
#: The tables a run saves beside ``02_eval_traps.csv`` (``02_eval_traps_<suffix>.csv``) that the page's analysis
#: needs (:func:`run_tables`): the thread check's rows (:func:`thread_check`), the first seed's audit printouts
#: (:func:`audit_table`) and the one-layer facts (:func:`single_layer_table`).
SIBLING_TABLES = ("threads", "audits", "single_layer")
#: The first seed's cases whose audit the page prints (trap 1's drifting loop, trap 2's train-mode teacher, trap 3's
#: whole model), each with the lint codes printed above its audit: ``(trap, case, lint_codes)``.
PRINTED_AUDITS = (("train_call", "eval_once", ()), ("no_grad", "teacher_train", ()),
                  ("whole_eval", "whole_model", ("forward_changes_with_mode", "dropout_present")))
#: quick: one thread-check seed and a three-rate grid for the standardized fix (about 8 added 600-step runs per seed)
PROFILES = {"quick": dict(seeds=3, thread_seeds=1, t3_std_lrs=(0.01, 0.02, 0.05)),
            "full": dict(seeds=10, thread_seeds=2, t3_std_lrs=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2))}
TRAPS = ("train_call", "no_grad", "whole_eval", "sorted_batches", "tiny_batch", "sorted_training",
         "whole_eval_tuned", "train_call_tuned", "batch_training", "dropout_mechanism")
#: Trap 3's setups in the learning-rate sweep (the fix with dropout off equals ``whole_model`` for the main head).
TUNED_SETUPS = ("whole_model", "backbone_only")
#: Trap 1 at tuned rates (``train_call_tuned``): the backbone's statistics drifting (BatchNorm in train mode, the
#: head's dropout pinned off); its pinned partner is trap 3's ``whole_model`` sweep (same head init and batches).
DRIFT_SETUP = "drifting"
#: Trap 5's training arm (``batch_training``): stage 1 continued with BatchNorm normalizing with batch statistics
#: (``batch_stats``) or pinned in eval mode (``pinned``), on the same batches.
BATCH_TRAINING_MODES = ("batch_stats", "pinned")
#: Batches that trap 5's training arm uses to re-estimate the statistics with the weights fixed (seed 002's remedy).
REESTIMATE_BATCHES = 16
#: The fixed cases of traps 1-3 (traps 4 and 5 have one case per swept value).
CASES = {"train_call": ("eval_once", "pinned"), "no_grad": ("teacher_train", "teacher_eval"),
         "whole_eval": ("whole_model", "backbone_only", "backbone_only_dropout_off"),
         "sorted_training": ("shuffled", "class_sorted")}
STAGE1_LR = 3e-3
#: Stated tolerances the prose quotes: "within 0.01" (trap 4's curve), "about chance" (1.5x chance), and the
#: equivalence margin of "unchanged" (trap 4: TOST against +-TOL_AFTER at the family's level). All set by us.
TOL_CURVE, CHANCE_FACTOR, TOL_AFTER = 0.01, 1.5, 0.02
#: Trap 5: a batch size "loses less than TOL_LOSS" when the one-sided t test of (train mode - eval mode accuracy)
#: against -TOL_LOSS rejects at the family's level (:func:`bnstudy.inference.one_sided_p`).
TOL_LOSS = 0.02
AUX_WEIGHT = 0.4  # the auxiliary head's loss weight (trap 3)
P_DROP = 0.3  # the main head's dropout rate in trap 3's model (AuxHeadNet's default)
#: Trap 3's dropout mechanism (``dropout_mechanism``, referee ch2c N5): the fix's main head on ``raw`` features or on
#: ``std`` features (standardized per feature with the mean and SD of the pinned backbone's task-B features, as
#: chapter 1's standardized heads), at head dropout p (0: the dropout pinned off).
FEATURE_KINDS = ("raw", "std")
#: The chapter's family-wise level: its claims (:func:`findings`' claims table) and its two safe-batch rules form
#: one :class:`bnstudy.inference.Family`, Bonferroni intervals at ``1 - ALPHA/m``, Holm's adjusted p for counts.
ALPHA = 0.05
#: The direction words of this page's verdicts (:func:`bnstudy.inference.decide`), each naming the direction of
#: *condition minus reference* of its claim (see :data:`CLAIMS`), as ``(higher, lower)`` pairs flattened.
DIRECTIONS: tuple[str, ...] = (
    "drifting higher", "drifting lower",  # trap 1: drifting (train-mode BatchNorm) head - pinned head
    "above 1.5 times chance", "below 1.5 times chance",  # trap 3: the fix's main head - 1.5 x chance
    "whole model higher", "whole model lower",  # trap 3: whole model pinned - the fix (backbone pinned)
    "cost shrinks with the rate", "cost grows with the rate",  # trap 3: dropout's effect at the top p - at the lowest
    "standardized costs less", "standardized costs more",  # trap 3: dropout's effect, standardized - raw features
    "higher after the pass", "lower after the pass",  # trap 4: held-out accuracy after the sorted pass - before
    "train mode higher", "train mode lower",  # trap 4: train mode - eval mode on the same batches
    "batch statistics higher", "batch statistics lower",  # trap 5: trained with batch statistics - pinned
    "meter higher", "meter lower",  # trap 6: the training meter - held-out accuracy
)
#: The chapter's claims (key stems of its claims table; ``t5t_reest_b<m>`` one per training batch m below
#: ``min_batch``): what each compares, condition minus reference, and its ``(higher, lower)`` words.
CLAIMS = {
    "t1_tuned_price": ("trap 1 at tuned rates: drifting head minus pinned head", DIRECTIONS[0:2]),
    "t3_fix_chance": ("trap 3: the run line's fix minus 1.5 times chance", DIRECTIONS[2:4]),
    "t3_tuned_fix_chance": ("trap 3: the tuned fix minus 1.5 times chance", DIRECTIONS[2:4]),
    "t3_whole_vs_fix": ("trap 3 at the run line's rate: whole model minus the fix", DIRECTIONS[4:6]),
    "t3_tuned_whole_vs_fix": ("trap 3 at tuned rates: whole model minus the fix", DIRECTIONS[4:6]),
    "t3d_growth_raw": ("trap 3, raw features: dropout's effect at the highest rate minus at the lowest",
                       DIRECTIONS[6:8]),
    "t3d_std_vs_raw": ("trap 3: dropout's effect at the model's rate, standardized minus raw features",
                       DIRECTIONS[8:10]),
    "t4_after": ("trap 4: held-out accuracy after the sorted pass minus before", DIRECTIONS[10:12]),
    "t4_first_flagged": ("trap 4: train mode minus eval mode at the first flagged share", DIRECTIONS[12:14]),
    "t5t_reest": ("trap 5, training, re-estimated: batch statistics minus pinned at batch {m}", DIRECTIONS[14:16]),
    "t6_meter_gap": ("trap 6, trained class-sorted: the meter minus held-out accuracy", DIRECTIONS[16:18]),
}
#: The two safe-batch rules (intersection-union tests of one-sided t tests at the family's level), family members
#: beside the claims table.
RULES = {"t5_safe_batch": "trap 5, inference: train mode loses less than the tolerance from the safe batch on",
         "t5t_safe_batch": "trap 5, training, re-estimated: batch statistics lose less than the tolerance from the "
                           "safe batch on"}
#: Trap 6: the equivalence margin for "the training meter agrees with held-out accuracy" (TOST against +-TOL_TIE at
#: the family's level). Set by us before the check, not fitted.
TOL_TIE = 0.05
#: ``lint_loader``'s default threshold on label dependence (with p < 1e-3); trap 4 quotes it.
LINT_MAX_DEPENDENCE = 0.05
CPU = torch.device("cpu")  # the traps' networks are tiny; the audits and probes live on the CPU


@dataclass(frozen=True)
class Config(_Frozen):
    """Chapter 2's parameters (the notebook's parameters, plus the ones only a library user changes).

    ``seeds``: an int ``n`` (seeds 0..n-1) or a list. Stage 1: ``n_classes``, ``noise``,
    ``widths``, ``momentum``, ``stage1_steps``, ``stage1_batch_size``, ``n_eval`` (held-out
    samples per task, also the audit's probe). Task B's shift: ``brightness``, ``contrast``.
    Traps 1 and 3 train new heads for ``steps`` steps of ``batch_size`` (SGD, ``lr``), calling
    ``model.train()`` every ``epoch_steps`` steps; trap 2 runs ``teacher_batches`` batches;
    trap 3's learning-rate sweep trains for ``t3_steps`` steps at each rate of ``t3_lrs``;
    trap 4 sweeps ``sorted_fractions`` (share of each batch from one class), trap 5
    ``batch_sizes`` (per-device batch); ``min_batch`` is the ``small_batch`` lint's threshold.
    Trap 3's dropout mechanism: the fix's head dropout rates ``t3_dropout_ps`` (each in (0, 0.9], must include the
    model's :data:`P_DROP`) and the standardized fix's rate grid ``t3_std_lrs``. ``thread_seeds``: how many of the
    first seeds :func:`thread_check` reruns at the other torch thread count (0: none; at most the number of seeds).
    Raises ``ValueError`` naming the parameter for any bad value, before any work starts.
    """

    profile: str = "quick"
    seeds: tuple = (0, 1, 2)
    n_classes: int = 10
    noise: float = 1.0
    widths: tuple = (8, 16)
    momentum: float = 0.1
    stage1_steps: int = 200
    stage1_batch_size: int = 32
    n_eval: int = 512
    brightness: float = 4.0
    contrast: float = 5.0
    steps: int = 60
    batch_size: int = 32
    epoch_steps: int = 10
    lr: float = 0.05
    teacher_batches: int = 3
    t3_lrs: tuple = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05)
    t3_steps: int = 600
    t1_lrs: tuple = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
    t5_train_batch_sizes: tuple = (2, 4, 8, 16, 32)
    t5_train_steps: int = 100
    sorted_fractions: tuple = (0.0, 0.25, 0.5, 0.75, 1.0)
    batch_sizes: tuple = (1, 2, 4, 8, 16, 32, 64)
    min_batch: int = audit.MIN_BATCH
    t3_dropout_ps: tuple = (0.1, 0.3, 0.5)
    t3_std_lrs: tuple = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2)
    thread_seeds: int = 2

    def __post_init__(self):
        check_choice("profile", self.profile, tuple(PROFILES))
        self._set("seeds", check_seeds(self.seeds))
        self._set("momentum", check_float("momentum", self.momentum, 0.0, 1.0, low_open=True))
        for name in ("steps", "epoch_steps", "teacher_batches", "min_batch", "t3_steps", "t5_train_steps"):
            self._set(name, check_int(name, getattr(self, name), 1))
        self._set("batch_size", check_int("batch_size", self.batch_size, 2))
        self._set("lr", check_float("lr", self.lr, 0.0, low_open=True))
        self._set("t3_lrs", check_sequence("t3_lrs", self.t3_lrs, lambda n, v: check_float(n, v, 0.0, low_open=True),
                                           1))
        self._set("brightness", check_float("brightness", self.brightness))
        self._set("contrast", check_float("contrast", self.contrast, 0.0, low_open=True))
        self._set("sorted_fractions", check_sequence("sorted_fractions", self.sorted_fractions,
                                                     lambda n, v: check_float(n, v, 0.0, 1.0), 1))
        self._set("batch_sizes", check_sequence("batch_sizes", self.batch_sizes, lambda n, v: check_int(n, v, 1), 1))
        self._set("t1_lrs", check_sequence("t1_lrs", self.t1_lrs, lambda n, v: check_float(n, v, 0.0, low_open=True),
                                           1))
        self._set("t5_train_batch_sizes", check_sequence("t5_train_batch_sizes", self.t5_train_batch_sizes,
                                                         lambda n, v: check_int(n, v, 2), 1))
        self._set("t3_dropout_ps", check_sequence("t3_dropout_ps", self.t3_dropout_ps,
                                                  lambda n, v: check_float(n, v, 0.0, 0.9, low_open=True), 2))
        if len(set(self.t3_dropout_ps)) != len(self.t3_dropout_ps):
            raise ValueError(f"t3_dropout_ps must not repeat a rate, got {self.t3_dropout_ps}")
        if P_DROP not in self.t3_dropout_ps:
            raise ValueError(f"t3_dropout_ps must contain the model's own rate {P_DROP:g} (trap 3's runs are reused "
                             f"for it), got {self.t3_dropout_ps}")
        self._set("t3_std_lrs", check_sequence("t3_std_lrs", self.t3_std_lrs,
                                               lambda n, v: check_float(n, v, 0.0, low_open=True), 1))
        self._set("thread_seeds", check_int("thread_seeds", self.thread_seeds, 0))
        if self.thread_seeds > len(self.seeds):
            raise ValueError(f"thread_seeds must be <= the number of seeds ({len(self.seeds)}), got {self.thread_seeds}")
        self.source(self.seeds[0])  # stage 1's values, checked with the engine's own messages
        self._set("widths", self.source(self.seeds[0]).widths)
        self._set("n_eval", check_int("n_eval", self.n_eval, 2 * self.batch_size))

    def source(self, seed: int) -> SourceConfig:
        """Stage 1 of ``seed`` (BatchNorm backbone, Adam at 3e-3, see :func:`bnstudy.engine.train_source`)."""
        return SourceConfig(seed=seed, n_classes=self.n_classes, noise=self.noise, widths=self.widths, norm="batch",
                            momentum=self.momentum, stage1_steps=self.stage1_steps, stage1_lr=STAGE1_LR,
                            stage1_batch_size=self.stage1_batch_size, n_eval=self.n_eval)

    def run_configs(self) -> list["TrapRun"]:
        """One :class:`TrapRun` per (seed, trap, case), seeds outermost, traps in :data:`TRAPS` order."""
        shared = {f.name: getattr(self, f.name) for f in fields(TrapRun)
                  if f.name not in ("seed", "trap", "case", "sorted_fraction", "device_batch_size")}
        out = []
        for s in self.seeds:
            for trap in TRAPS:
                base = {k: v for k, v in shared.items() if k not in ("lr", "steps")}
                if trap == "whole_eval_tuned":
                    out += [TrapRun(seed=s, trap=trap, case=f"{setup}_lr{lr:g}", lr=lr, steps=self.t3_steps, **base)
                            for setup in TUNED_SETUPS for lr in self.t3_lrs]
                elif trap == "train_call_tuned":
                    out += [TrapRun(seed=s, trap=trap, case=f"{DRIFT_SETUP}_lr{lr:g}", lr=lr, steps=self.t3_steps,
                                    **base) for lr in self.t1_lrs]
                elif trap == "batch_training":
                    out += [TrapRun(seed=s, trap=trap, case=f"{mode}_b{b}", device_batch_size=b, lr=STAGE1_LR,
                                    steps=self.t5_train_steps, **base)
                            for b in self.t5_train_batch_sizes for mode in BATCH_TRAINING_MODES]
                elif trap == "dropout_mechanism":  # the standardized fix's rate sweep; the rest: dropout_configs
                    out += [TrapRun(seed=s, trap=trap, case=dropout_case("std", P_DROP, lr), lr=lr,
                                    steps=self.t3_steps, **base) for lr in self.t3_std_lrs]
                elif trap in CASES:
                    out += [TrapRun(seed=s, trap=trap, case=c, **shared) for c in CASES[trap]]
                elif trap == "sorted_batches":
                    out += [TrapRun(seed=s, trap=trap, case=f"fraction_{p:g}", sorted_fraction=p, **shared)
                            for p in self.sorted_fractions]
                else:
                    out += [TrapRun(seed=s, trap=trap, case=f"batch_{b}", device_batch_size=b, **shared)
                            for b in self.batch_sizes]
        return out

    def dropout_configs(self, lr_raw: float, lr_std: float) -> list["TrapRun"]:
        """Trap 3's dropout mechanism at the chosen rates (the second pass of :func:`run`).

        ``lr_raw``: the fix's rate chosen on validation in ``whole_eval_tuned``; ``lr_std``: the standardized fix's
        (p = :data:`P_DROP`) chosen over ``t3_std_lrs``. Per seed: the raw fix at every p of ``t3_dropout_ps`` but
        :data:`P_DROP` (that run is ``whole_eval_tuned``'s, and its dropout-off partner is the whole-model run at
        the same rate), and the standardized fix at the other p and with dropout off (p = 0).
        """
        base = {f.name: getattr(self, f.name) for f in fields(TrapRun)
                if f.name not in ("seed", "trap", "case", "sorted_fraction", "device_batch_size", "lr", "steps")}
        others = [p for p in self.t3_dropout_ps if p != P_DROP]
        return [TrapRun(seed=s, trap="dropout_mechanism", case=dropout_case(kind, p, lr), lr=lr, steps=self.t3_steps,
                        **base)
                for s in self.seeds for kind, lr, ps in (("raw", lr_raw, others), ("std", lr_std, others + [0.0]))
                for p in ps]

    def thread_configs(self, rates: dict) -> list["TrapRun"]:
        """The runs whose per-seed accuracies the page cites in traps 1 and 3, for the first ``thread_seeds`` seeds.

        ``rates``: :func:`chosen_rates`'s ``drifting`` / ``whole_model`` / ``backbone_only``. Trap 1's two run-line
        cases and its drifting head at its chosen rate; trap 3's whole model and fix at the run line and at their
        chosen rates (the whole model's is also trap 1's pinned partner). The fix with dropout off is left out: it
        repeats the whole-model run by construction.
        """
        keep = {("train_call", "eval_once"), ("train_call", "pinned"), ("whole_eval", "whole_model"),
                ("whole_eval", "backbone_only"), ("train_call_tuned", f"{DRIFT_SETUP}_lr{rates[DRIFT_SETUP]:g}"),
                ("whole_eval_tuned", f"whole_model_lr{rates['whole_model']:g}"),
                ("whole_eval_tuned", f"backbone_only_lr{rates['backbone_only']:g}")}
        seeds = set(self.seeds[:self.thread_seeds])
        return [c for c in self.run_configs() if c.seed in seeds and (c.trap, c.case) in keep]

    def describe(self) -> str:
        """The parameters for the page's run line."""
        return (f"profile={self.profile}, {seeds_label(self.seeds)}, steps={self.steps}, "
                f"epoch_steps={self.epoch_steps}, batch_size={self.batch_size}, "
                f"lr={self.lr:g}, t3_steps={self.t3_steps}, t3_lrs={','.join(f'{x:g}' for x in self.t3_lrs)}, "
                f"t1_lrs={','.join(f'{x:g}' for x in self.t1_lrs)}, t5_train_steps={self.t5_train_steps}, "
                f"t5_train_batch_sizes={','.join(str(b) for b in self.t5_train_batch_sizes)}, "
                f"teacher_batches={self.teacher_batches}, n_eval={self.n_eval}, brightness={self.brightness:g}, "
                f"contrast={self.contrast:g}, noise={self.noise:g}, momentum={self.momentum:g}, "
                f"t3_dropout_ps={','.join(f'{x:g}' for x in self.t3_dropout_ps)}, "
                f"t3_std_lrs={','.join(f'{x:g}' for x in self.t3_std_lrs)}, thread_seeds={self.thread_seeds}")


@dataclass(frozen=True)
class TrapRun(_Frozen):
    """One (seed, trap, case): the run cache's key and the columns every results row starts with.

    ``sorted_fraction`` is set for trap 4 only, ``device_batch_size`` for trap 5 only.
    """

    seed: int
    trap: str
    case: str
    sorted_fraction: float | None = None
    device_batch_size: int | None = None
    n_classes: int = 10
    noise: float = 1.0
    widths: tuple = (8, 16)
    momentum: float = 0.1
    stage1_steps: int = 200
    stage1_batch_size: int = 32
    n_eval: int = 512
    brightness: float = 4.0
    contrast: float = 5.0
    steps: int = 60
    batch_size: int = 32
    epoch_steps: int = 10
    lr: float = 0.05
    teacher_batches: int = 3
    min_batch: int = audit.MIN_BATCH

    def __post_init__(self):
        check_choice("trap", self.trap, TRAPS)

    @property
    def source(self) -> SourceConfig:
        return SourceConfig(seed=self.seed, n_classes=self.n_classes, noise=self.noise, widths=self.widths,
                            norm="batch", momentum=self.momentum, stage1_steps=self.stage1_steps,
                            stage1_lr=STAGE1_LR, stage1_batch_size=self.stage1_batch_size, n_eval=self.n_eval)


def dropout_case(kind: str, p: float, lr: float) -> str:
    """The case name of a ``dropout_mechanism`` run: ``<kind>_p<p>_lr<lr>`` (``kind`` in :data:`FEATURE_KINDS`)."""
    check_choice("kind", kind, FEATURE_KINDS)
    return f"{kind}_p{p:g}_lr{lr:g}"


def parse_dropout_case(case: str) -> tuple[str, float, float]:
    """``(kind, p, lr)`` of a :func:`dropout_case` name; ``ValueError`` naming the case otherwise."""
    m = re.fullmatch(r"([a-z]+)_p([0-9.eE+-]+)_lr([0-9.eE+-]+)", case)
    if m is None or m.group(1) not in FEATURE_KINDS:
        raise ValueError(f"case must look like '<kind>_p<p>_lr<lr>' with kind in {list(FEATURE_KINDS)}, got {case!r}")
    return m.group(1), float(m.group(2)), float(m.group(3))


def make_config(profile: str = "quick", **overrides) -> Config:
    """A :class:`Config` from :data:`PROFILES` with ``overrides`` (``seeds=None``: the profile's)."""
    return from_profile(Config, PROFILES, profile, **overrides)


# --- the models and helpers the traps share ----------------------------------------------------------------------

AuxOutputs = namedtuple("AuxOutputs", "logits aux_logits")


class AuxHeadNet(nn.Module):
    """A backbone, a main head behind dropout, and an auxiliary head that only train mode returns.

    ``forward(x)`` returns ``AuxOutputs(logits, aux_logits)`` (each ``(B, K)``) in train mode
    and the main ``logits`` ``(B, K)`` alone in eval mode, which is what torchvision's
    Inception v3 does with its auxiliary classifier.
    """

    def __init__(self, backbone: nn.Module, n_features: int, n_classes: int, p_drop: float = P_DROP):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Sequential(nn.Dropout(p_drop), nn.Linear(n_features, n_classes))
        self.aux = nn.Linear(n_features, n_classes)

    def forward(self, x: torch.Tensor):
        f = self.backbone(x)
        logits = self.head(f)
        return AuxOutputs(logits, self.aux(f)) if self.training else logits


def aux_loss(out, y: torch.Tensor, aux_weight: float = AUX_WEIGHT) -> torch.Tensor:
    """Cross-entropy of the main logits, plus ``aux_weight`` times the auxiliary one when ``out`` has it.

    The usual loss for such models; with the model in eval mode the auxiliary term silently
    disappears.
    """
    if isinstance(out, AuxOutputs):
        return F.cross_entropy(out.logits, y) + aux_weight * F.cross_entropy(out.aux_logits, y)
    return F.cross_entropy(out, y)


def sorted_fraction_labels(n_batches: int, batch_size: int, n_classes: int, sorted_fraction: float,
                           gen: torch.Generator) -> list[torch.Tensor]:
    """Labels of ``n_batches`` batches where ``round(sorted_fraction * batch_size)`` samples share one class.

    The shared class cycles through the classes in a random order (a new order every
    ``n_classes`` batches); the rest of each batch is drawn uniformly at random, and each batch
    is shuffled. ``sorted_fraction=0`` is a shuffled loader, ``1`` a class-sorted one. Raises
    ``ValueError`` for a fraction outside [0, 1] or a non-positive size.
    """
    check_float("sorted_fraction", sorted_fraction, 0.0, 1.0)
    for name, v in (("n_batches", n_batches), ("batch_size", batch_size), ("n_classes", n_classes)):
        check_int(name, v, 1)
    m = round(sorted_fraction * batch_size)
    out, order = [], []
    for _ in range(n_batches):
        if not order:
            order = torch.randperm(n_classes, generator=gen).tolist()
        c = order.pop(0)
        y = torch.cat([torch.full((m,), c, dtype=torch.long),
                       torch.randint(n_classes, (batch_size - m,), generator=gen)])
        out.append(y[torch.randperm(batch_size, generator=gen)])
    return out


class _Ctx:
    """Everything one seed's traps share: the cached source and both tasks' fixed held-out sets."""

    def __init__(self, c: TrapRun, source: dict):
        self.c, self.source = c, source
        self.task_a = make_task(c.seed, "A", c.n_classes, c.noise)
        self.task_b = make_task(c.seed, "B", c.n_classes, c.noise, c.brightness, c.contrast)
        self.eval_a = eval_set(self.task_a, c.n_eval, c.seed, "A")
        self.eval_b = eval_set(self.task_b, c.n_eval, c.seed, "B")

    def backbone(self) -> ConvBackbone:
        bb = ConvBackbone(3, self.c.widths, "batch", self.c.momentum)
        bb.load_state_dict(self.source["backbone"])
        return bb

    def head_a(self) -> nn.Module:
        head = make_head("linear", self.c.widths[-1], self.c.n_classes)
        head.load_state_dict(self.source["head_a"])
        return head

    def classifier(self) -> Classifier:
        return Classifier(self.backbone(), self.head_a())

    def seeded(self, tag: str, build):
        return seeded((self.c.seed, "ch02", tag), build)

    def stream_b(self, tag: str) -> BatchStream:
        return BatchStream(self.task_b, self.c.batch_size, generator(self.c.seed, "ch02", "stream", tag))

    def train(self, model: nn.Module, forward, params, tag: str, loss_fn=F.cross_entropy) -> None:
        """The engine's loop (:func:`bnstudy.engine.train_step`): ``model.train()`` every epoch, SGD on ``params``."""
        opt = make_optimizer("sgd", params, self.c.lr)
        stream = self.stream_b(tag)
        for step in range(1, self.c.steps + 1):
            x, y = stream.next()
            train_step(model, forward, opt, step, x, y, self.c.epoch_steps, CPU, loss_fn=loss_fn)


def _acc(forward, x: torch.Tensor, y: torch.Tensor) -> float:
    return accuracy(logits_of(forward, x, CPU), y)


def _eval_accuracy(model: nn.Module, forward, x, y) -> float:
    """Accuracy with every module of ``model`` in eval mode (flags restored afterwards, pins untouched)."""
    saved = [(m, m.training) for m in model.modules()]
    for m, _ in saved:
        m.training = False
    try:
        return _acc(forward, x, y)
    finally:
        for m, flag in saved:
            m.training = flag


def _buffer_stats(a: audit.FreezeAudit, module_prefix: str) -> dict:
    rep = a.report()
    inside = rep["module"].map(lambda m: not module_prefix or m == module_prefix or m.startswith(module_prefix + "."))
    stats = rep[inside & rep["name"].isin(["running_mean", "running_var"])]
    nbt = rep[inside & (rep["name"] == "num_batches_tracked")]
    params = rep[inside & (rep["kind"] == "param")]
    return dict(max_buffer_change=float(stats["max_abs_change"].max()),
                num_batches_tracked_change=float(nbt["max_abs_change"].max()),
                max_param_change=float(params["max_abs_change"].max()))


def _bn_state(model: nn.Module) -> dict:
    """Copies of every BatchNorm's ``(running_mean, running_var)``, by module name."""
    return {n: (m.running_mean.clone(), m.running_var.clone()) for n, m in model.named_modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.running_mean is not None}


def _bn_drift(before: dict, model: nn.Module) -> dict:
    """How far each BatchNorm's running statistics moved from ``before`` (:func:`_bn_state`), on readable scales.

    ``max_mean_shift_sd``: largest ``|mean_after - mean_before| / sqrt(var_before + eps)`` over layers
    and channels (the mean's move in units of the old running standard deviation);
    ``max_abs_log_var_ratio``: largest ``|ln(var_after / var_before)|`` (0: unchanged; ln 2 = 0.69:
    doubled or halved). Referee item 8: the audit's raw ``max_buffer_change`` mixes a variance's squared
    units with a mean's.
    """
    mods = dict(model.named_modules())
    shift, ratio = [], []
    for name, (mu0, var0) in before.items():
        m = mods[name]
        shift.append(float(((m.running_mean - mu0).abs() / (var0 + m.eps).sqrt()).max()))
        ratio.append(float((m.running_var.clamp_min(1e-12) / var0.clamp_min(1e-12)).log().abs().max()))
    return dict(max_mean_shift_sd=max(shift), max_abs_log_var_ratio=max(ratio))


def _bn_train_fraction(a: audit.FreezeAudit) -> float:
    modes = a.modes()
    bn = modes[(modes["kind"] == "batchnorm") & (modes["calls"] > 0)]
    return float(bn["train_calls"].sum() / bn["calls"].sum()) if len(bn) else float("nan")


def _n_warnings(lints) -> int:
    return sum(x.severity == "warning" for x in lints)


# --- the five traps: each case returns (quantities, audit or None, lints) --------------------------------------

def _train_call(ctx: _Ctx, case: str):
    """Trap 1: ``backbone.eval()`` once, then ``model.train()`` every epoch, against :func:`pin_eval`."""
    c, (xa, ya) = ctx.c, ctx.eval_a
    head_b = ctx.seeded("head_b", lambda: make_head("linear", c.widths[-1], c.n_classes))
    model = TransferModel(ctx.backbone(), ctx.head_a(), head_b)
    model.backbone.requires_grad_(False)
    model.head_a.requires_grad_(False)
    if case == "eval_once":
        model.backbone.eval()  # the freeze as usually written
    else:
        pin_eval(model.backbone)
    before = _eval_accuracy(model, model.forward_a, xa, ya)
    stats_before = _bn_state(model.backbone)
    losses = []

    def loss_fn(o, y):  # records the head's cross-entropy (nats) at every step
        loss = F.cross_entropy(o, y)
        losses.append(float(loss.detach()))
        return loss

    with audit.FreezeAudit(model, probe=xa, forward=model.forward_a, warn=False) as a:
        ctx.train(model, model.forward_b, model.head_b.parameters(), "train_call", loss_fn)
    q = _buffer_stats(a, "backbone")
    q.update(head_loss_first=float(np.mean(losses[:c.epoch_steps])),
             head_loss_last=float(np.mean(losses[-c.epoch_steps:])))
    q.update(_bn_drift(stats_before, model.backbone))
    q.update(task_a_before=before, task_a_after=_eval_accuracy(model, model.forward_a, xa, ya),
             task_b=_eval_accuracy(model, model.forward_b, *ctx.eval_b),
             max_probe_change=float(a.outputs()["max_abs_change"].max()),
             bn_train_fraction=_bn_train_fraction(a), n_lint_warnings=_n_warnings(a.lints),
             frozen_bn_lint=float(any(x.code == "frozen_bn_in_train_mode" for x in a.lints)))
    return q, a, a.lints


def _batch_mate_logits(model: nn.Module, x_own: torch.Tensor, mates: torch.Tensor, half: int) -> torch.Tensor:
    """Logits of ``x_own`` in chunks of ``half``, each chunk batched with ``half`` rows of ``mates``."""
    outs = []
    with torch.no_grad():
        for i in range(0, len(x_own) - half + 1, half):
            j = (i // half * half) % (len(mates) - half + 1)
            outs.append(model(torch.cat([x_own[i:i + half], mates[j:j + half]]))[:half])
    return torch.cat(outs)


def _no_grad(ctx: _Ctx, case: str):
    """Trap 2: a teacher left in train mode under ``no_grad`` drifts; its outputs depend on the batch mates."""
    c, (xa, ya), xb = ctx.c, ctx.eval_a, ctx.eval_b[0]
    train_flag = case == "teacher_train"
    half = c.batch_size // 2
    n = (len(xa) // 2) // half * half  # own samples; the other half of the set provides task-A batch mates
    teacher = ctx.classifier().train(train_flag)
    before = _eval_accuracy(teacher, teacher, xa, ya)
    stream = ctx.stream_b("teacher")
    stats_before = _bn_state(teacher)
    with audit.FreezeAudit(teacher, probe=xa, warn=False) as a, torch.no_grad():
        for _ in range(c.teacher_batches):
            teacher(stream.next()[0])  # soft targets for task B, or a validation pass
    q = _buffer_stats(a, "")
    q.update(_bn_drift(stats_before, teacher))
    q.update(task_a_before=before, task_a_after=_eval_accuracy(teacher, teacher, xa, ya),
             max_probe_change=float(a.outputs()["max_abs_change"].max()), n_lint_warnings=_n_warnings(a.lints),
             no_grad_lint=float(any(x.code == "train_mode_under_no_grad" for x in a.lints)))
    fresh = ctx.classifier().train(train_flag)  # the same task-A samples, batched with task-A or task-B mates
    with_a = _batch_mate_logits(copy.deepcopy(fresh), xa[:n], xa[n:], half)
    with_b = _batch_mate_logits(copy.deepcopy(fresh), xa[:n], xb, half)
    q.update(accuracy_with_a_mates=accuracy(with_a, ya[:n]), accuracy_with_b_mates=accuracy(with_b, ya[:n]),
             max_logit_change_by_mates=float((with_a - with_b).abs().max()))
    return q, a, a.lints


def _whole_eval(ctx: _Ctx, case: str):
    """Trap 3: the whole model pinned in eval mode (dropout off, no auxiliary logits) against the backbone only."""
    c, (xb, yb) = ctx.c, ctx.eval_b
    model = ctx.seeded("aux_net", lambda: AuxHeadNet(ctx.backbone(), c.widths[-1], c.n_classes))
    model.backbone.requires_grad_(False)
    forward_lints = audit.lint_forward_modes(model, xb[:c.batch_size], warn=False)
    pin_eval(model if case == "whole_model" else model.backbone)
    if case == "backbone_only_dropout_off":
        pin_eval(model.head[0])  # the fix, with the head's dropout off: isolates dropout's share of the difference
    aux_terms, main_losses = [], []

    def loss_fn(o, y):
        aux_terms.append(isinstance(o, AuxOutputs))
        main_losses.append(float(F.cross_entropy(o.logits if isinstance(o, AuxOutputs) else o, y).detach()))
        return aux_loss(o, y)

    # dropout draws from torch's global generator: seed it per seed so the trap is reproducible on its own
    with audit.FreezeAudit(model, warn=False) as a, torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(c.seed, "ch02", "dropout"))
        ctx.train(model, model, list(model.head.parameters()) + list(model.aux.parameters()), "whole_eval", loss_fn)
    rep, modes = a.report(), a.modes()
    drop = modes[modes["kind"] == "dropout"]
    q = dict(head_max_param_change=float(rep[rep["module"].str.startswith("head")]["max_abs_change"].max()),
             aux_max_param_change=float(rep[rep["module"] == "aux"]["max_abs_change"].max()),
             backbone_max_buffer_change=_buffer_stats(a, "backbone")["max_buffer_change"],
             dropout_train_fraction=float(drop["train_calls"].sum() / drop["calls"].sum()),
             aux_loss_fraction=float(np.mean(aux_terms)),
             main_loss_first=float(np.mean(main_losses[:c.epoch_steps])),
             main_loss_last=float(np.mean(main_losses[-c.epoch_steps:])),
             eval_dropout_off=_dropout_off_at_eval(model, xb),
             task_b_main=_eval_accuracy(model, model, xb, yb),
             task_b_aux=_eval_accuracy(model, lambda x: model.aux(model.backbone(x)), xb, yb),
             forward_mode_lint=float(any(x.code == "forward_changes_with_mode" for x in forward_lints)),
             dropout_lint=float(any(x.code == "dropout_off_in_training" for x in a.lints)),
             n_lint_warnings=_n_warnings(a.lints))
    return q, a, forward_lints + a.lints


def _dropout_off_at_eval(model: AuxHeadNet, x: torch.Tensor) -> float:
    """1.0 if the logits :func:`_eval_accuracy` scores equal, bit for bit, the head without its dropout layer.

    A check of the evaluation path (referee item 6): dropout must be off when accuracy is measured.
    """
    saved = [(m, m.training) for m in model.modules()]
    for m, _ in saved:
        m.training = False
    try:
        with torch.no_grad():
            scored, plain = model(x), model.head[1](model.backbone(x))
    finally:
        for m, flag in saved:
            m.training = flag
    return float(torch.equal(scored, plain))


class _Standardize(nn.Module):
    """``f -> (f - mean) / sd`` per feature with fixed statistics (chapter 1's ``_feature_standardizer``)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, f: torch.Tensor) -> torch.Tensor:
        return self.fn(f)


def _dropout_mechanism(ctx: _Ctx, case: str):
    """Trap 3's fix (backbone pinned) at head dropout p on raw or standardized features (referee ch2c N5).

    ``case``: :func:`dropout_case`; p = 0 pins the head's dropout off. ``std``: the backbone's pooled features are
    standardized per feature with the mean and SD of the pinned backbone's features on task-B images drawn apart
    from the test and validation sets (chapter 1's :func:`~bnstudy.experiments.freeze_modes._feature_standardizer`),
    for both heads, before the head's dropout. Same head initialization, batches and dropout seed as
    :func:`_whole_eval_tuned` (whose quantities it records).
    """
    kind, p, _ = parse_dropout_case(case)
    return _whole_eval_tuned(ctx, "backbone_only", p_drop=p if p > 0 else P_DROP, dropout_off=p == 0,
                             standardize=kind == "std", extra=dict(kind=kind, p_drop=p))


def _whole_eval_tuned(ctx: _Ctx, case: str, p_drop: float = P_DROP, dropout_off: bool = False,
                      standardize: bool = False, extra: dict | None = None):
    """Trap 3's main head, trained without the audit at one learning rate for ``steps`` steps (issue 10).

    ``case`` is ``<setup>_lr<lr>`` with ``setup`` in :data:`TUNED_SETUPS` or :data:`DRIFT_SETUP` (trap 1 at tuned
    rates, ``train_call_tuned``: nothing pinned but the head's dropout, so the backbone's BatchNorm normalizes
    with batch statistics and its running statistics drift to task B, as in trap 1's ``eval_once``; its pinned
    partner is ``whole_model``, which pins the backbone and, having no dropout, trains the main head as trap 1's
    ``pinned`` does); the rate and budget are the
    run's ``lr`` and ``steps``. Same head initialization, batches and dropout draws as :func:`_whole_eval`.
    Records the main and auxiliary heads' accuracy on task B's test set and on a validation set
    drawn apart from it (``eval_set(..., "B-validation")``: the set the rate is chosen on), the main
    head's test and validation accuracy at half the budget, and its mean training loss (cross-entropy,
    nats; ln 10 = 2.30 is a uniform guess) over the first and the last epoch.
    """
    c, (xb, yb) = ctx.c, ctx.eval_b
    setup = case.rsplit("_lr", 1)[0]
    check_choice("setup", setup, TUNED_SETUPS + (DRIFT_SETUP,))
    xv, yv = eval_set(ctx.task_b, c.n_eval, c.seed, "B-validation")
    model = ctx.seeded("aux_net", lambda: AuxHeadNet(ctx.backbone(), c.widths[-1], c.n_classes, p_drop))
    if standardize:  # after the seeded build, so the heads' initialization is the raw runs'
        from .freeze_modes import _feature_standardizer
        xs = eval_set(ctx.task_b, c.n_eval, c.seed, "B-standardize")[0]
        model.backbone.eval()
        model.backbone = nn.Sequential(model.backbone, _Standardize(
            _feature_standardizer(model.backbone, xs, c.batch_size, CPU, torch.contiguous_format)))
    model.backbone.requires_grad_(False)
    if dropout_off:
        pin_eval(model.head[0])
    if setup == DRIFT_SETUP:  # trap 1 at tuned rates: the backbone's BatchNorm follows model.train(); no dropout
        pin_eval(model.head[0])
    else:
        pin_eval(model if setup == "whole_model" else model.backbone)
    opt = make_optimizer("sgd", list(model.head.parameters()) + list(model.aux.parameters()), c.lr)
    stream, losses, half = ctx.stream_b("whole_eval"), [], {}

    def loss_fn(o, y):
        losses.append(float(F.cross_entropy(o.logits if isinstance(o, AuxOutputs) else o, y).detach()))
        return aux_loss(o, y)

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(c.seed, "ch02", "dropout"))
        for step in range(1, c.steps + 1):
            x, y = stream.next()
            train_step(model, model, opt, step, x, y, c.epoch_steps, CPU, loss_fn=loss_fn)
            if step == c.steps // 2:
                half = dict(task_b_main_half=_eval_accuracy(model, model, xb, yb),
                            val_main_half=_eval_accuracy(model, model, xv, yv))
    aux = lambda x: model.aux(model.backbone(x))
    q = dict(setup=setup, task_b_main=_eval_accuracy(model, model, xb, yb),
             val_main=_eval_accuracy(model, model, xv, yv),
             task_b_aux=_eval_accuracy(model, aux, xb, yb), val_aux=_eval_accuracy(model, aux, xv, yv),
             main_loss_first=float(np.mean(losses[:c.epoch_steps])),
             main_loss_last=float(np.mean(losses[-c.epoch_steps:])),
             eval_dropout_off=_dropout_off_at_eval(model, xb), **half, **(extra or {}))
    return q, None, []


def _sorted_batches(ctx: _Ctx, case: str):
    """Trap 4: the trained model on batches where a share of each batch has one class.

    Accuracy with the module in eval mode (running statistics: independent of the batching),
    in train mode (batch statistics, what a training loop's accuracy meter sees; the copy's
    running statistics are updated as a loop would), in eval mode on the held-out set after
    that one train-mode pass, the loader's :func:`bnstudy.audit.batch_label_dependence` and
    whether :func:`bnstudy.audit.lint_loader` flags it.
    """
    c, (xa, ya), p = ctx.c, ctx.eval_a, ctx.c.sorted_fraction
    g = generator(c.seed, "ch02", "sorted", p)
    labels = sorted_fraction_labels(max(c.n_eval // c.batch_size, 2), c.batch_size, c.n_classes, p, g)
    xs = [ctx.task_a.sample(y, g) for y in labels]
    model = ctx.classifier().eval()
    module_eval = _acc(model, torch.cat(xs), torch.cat(labels))
    model.train()
    with torch.no_grad():
        module_train = accuracy(torch.cat([model(x) for x in xs]), torch.cat(labels))
    lints = audit.lint_loader(None, c.batch_size, labels_per_batch=labels, warn=False)
    q = dict(module_eval_accuracy=module_eval, module_train_accuracy=module_train,
             module_eval_accuracy_after_pass=_eval_accuracy(model, model, xa, ya),
             label_dependence=audit.batch_label_dependence(labels)["dependence"],
             sorted_lint=float(any(x.code == "label_sorted_batches" for x in lints)))
    return q, None, lints


def _tiny_batch(ctx: _Ctx, case: str):
    """Trap 5: accuracy of the trained model with BatchNorm in train mode at a per-device batch size."""
    c, (xa, ya), b = ctx.c, ctx.eval_a, ctx.c.device_batch_size
    model = ctx.classifier().eval()
    module_eval = _acc(model, xa, ya)
    model.train()
    n = len(xa) // b * b
    with torch.no_grad():
        logits = torch.cat([model(xa[i:i + b]) for i in range(0, n, b)])
    lints = audit.lint_model(model, batch_size=b, min_batch=c.min_batch, warn=False)
    counts = []  # values per channel each BatchNorm2d averages over: m x H x W (seed article 002's effective count)
    hooks = [m.register_forward_pre_hook(lambda mod, inp: counts.append(inp[0].numel() // inp[0].shape[1]))
             for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    with torch.no_grad():
        model(xa[:b])
    for h in hooks:
        h.remove()
    q = dict(module_train_accuracy=accuracy(logits, ya[:n]), module_eval_accuracy=module_eval,
             min_values_per_channel=float(min(counts)),
             small_batch_lint=float(bool({x.code for x in lints} & {"small_batch", "single_sample_batch"})))
    return q, None, lints


def _sorted_training(ctx: _Ctx, case: str):
    """Trap 6: train backbone and head from scratch on task A with shuffled or class-sorted batches.

    Stage 1's recipe (Adam at ``STAGE1_LR``, ``stage1_steps`` steps of ``stage1_batch_size``, train
    mode throughout) with :class:`bnstudy.tasks.BatchStream`'s sampler set to ``case``. Records the
    loop's accuracy meter over the last ``n_classes`` steps (train mode, on the batches it trained
    on, before each update), held-out accuracy in eval mode (running statistics) and, on the same
    held-out set, in train mode on shuffled batches of ``stage1_batch_size`` (batch statistics).
    """
    c, (xa, ya) = ctx.c, ctx.eval_a
    model = ctx.seeded("sorted_training_init", lambda: Classifier(
        ConvBackbone(3, c.widths, "batch", c.momentum), make_head("linear", c.widths[-1], c.n_classes)))
    stream = BatchStream(ctx.task_a, c.stage1_batch_size, generator(c.seed, "ch02", "sorted_training", case), case)
    opt = torch.optim.Adam(model.parameters(), lr=STAGE1_LR)
    model.train()
    hits, seen = 0, 0
    for step in range(c.stage1_steps):
        x, y = stream.next()
        out = model(x)
        if step >= c.stage1_steps - c.n_classes:
            hits, seen = hits + int((out.argmax(-1) == y).sum()), seen + len(y)
        loss = F.cross_entropy(out, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    held_eval = _eval_accuracy(model, model, xa, ya)
    b, n = c.stage1_batch_size, len(xa) // c.stage1_batch_size * c.stage1_batch_size
    model.train()
    with torch.no_grad():
        held_train = accuracy(torch.cat([model(xa[i:i + b]) for i in range(0, n, b)]), ya[:n])
    return dict(train_meter_accuracy=hits / seen, heldout_eval_accuracy=held_eval,
                heldout_batch_stats_accuracy=held_train), None, []


def _batch_training(ctx: _Ctx, case: str):
    """Trap 5's training arm: stage 1 continued on task A at a small per-device batch (referee ch2 item 3).

    ``case`` is ``<mode>_b<m>`` with ``mode`` in :data:`BATCH_TRAINING_MODES`: the trained source network is
    trained further, every weight trainable, for ``steps`` steps of ``device_batch_size`` samples with stage 1's
    optimizer (Adam at ``lr``, :data:`STAGE1_LR`), with its BatchNorm layers normalizing with batch statistics and
    updating their running statistics (``batch_stats``, seed 000's "fully unfreezing BN") or pinned in eval mode
    (``pinned``: running statistics fixed, what ``lint_model`` recommends below ``min_batch``). Both modes see the
    same batches (their generator depends on the seed and ``m`` only). Records held-out task-A accuracy in eval
    mode after training, the same after re-estimating the running statistics with the weights fixed
    (:func:`bnstudy.update_bn_stats` over :data:`REESTIMATE_BATCHES` shuffled batches of
    ``stage1_batch_size``: seed 002's remedy), and the mean training loss (nats) over the last ``epoch_steps``
    steps. The source's own accuracy is the row's ``source_task_a_accuracy``.
    """
    from ..running_stats import update_bn_stats  # local: running_stats imports nothing from here, but keep the trap self-contained

    c, (xa, ya), m = ctx.c, ctx.eval_a, ctx.c.device_batch_size
    mode = case.rsplit("_b", 1)[0]
    check_choice("mode", mode, BATCH_TRAINING_MODES)
    model = ctx.classifier()
    if mode == "pinned":
        pin_eval(model.backbone)  # flags only: every weight stays trainable
    stream = BatchStream(ctx.task_a, m, generator(c.seed, "ch02", "batch_training", m))
    opt = torch.optim.Adam(model.parameters(), lr=c.lr)
    model.train()
    losses = []
    for _ in range(c.steps):
        x, y = stream.next()
        loss = F.cross_entropy(model(x), y)
        losses.append(float(loss.detach()))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    held = _eval_accuracy(model, model, xa, ya)
    g = generator(c.seed, "ch02", "batch_training", "reestimate")
    batches = [ctx.task_a.sample(torch.randint(c.n_classes, (c.stage1_batch_size,), generator=g), g)
               for _ in range(REESTIMATE_BATCHES)]
    update_bn_stats(model, batches, modules=model)  # every BatchNorm, pinned or not (no warning: asked for)
    return dict(heldout_eval_accuracy=held, heldout_reestimated_accuracy=_eval_accuracy(model, model, xa, ya),
                train_loss_last=float(np.mean(losses[-c.epoch_steps:])), mode=mode), None, []


TRAP_FUNCTIONS = dict(train_call=_train_call, no_grad=_no_grad, whole_eval=_whole_eval,
                      sorted_batches=_sorted_batches, tiny_batch=_tiny_batch, sorted_training=_sorted_training,
                      whole_eval_tuned=_whole_eval_tuned, train_call_tuned=_whole_eval_tuned,
                      batch_training=_batch_training, dropout_mechanism=_dropout_mechanism)


def run_case(c: TrapRun, source: dict):
    """One (seed, trap, case): its results row, its audit (traps 1-3; else ``None``) and its lints."""
    q, a, lints = TRAP_FUNCTIONS[c.trap](_Ctx(c, source), c.case)
    row = c.asdict()
    row["widths"] = "-".join(map(str, c.widths))
    row["module_mode"] = {"teacher_train": "train", "teacher_eval": "eval"}.get(c.case, "")
    row["source_task_a_accuracy"] = source["task_a_accuracy"]
    row.update({k: (v if isinstance(v, str) else float(v)) for k, v in q.items()})
    return row, a, lints


def _trap_group(configs: list[TrapRun], cache_root: str, version: str) -> list[dict]:
    sources = {}
    rows = []
    for c in configs:
        if c.source not in sources:
            sources[c.source] = load_source(c.source, cache_root, version)
        rows.append(run_case(c, sources[c.source])[0])
    return rows


def _groups(configs: list[TrapRun]) -> list[list[int]]:
    """One group per (seed, trap); trap 3's sweep, the longest, gets one group per run so workers share it."""
    groups: dict = {}
    for i, c in enumerate(configs):
        key = (c.seed, c.trap, c.case) if c.trap in ("whole_eval_tuned", "train_call_tuned", "batch_training",
                                                     "dropout_mechanism") \
            else (c.seed, c.trap)
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def _cache(execution: Execution | None):
    ex = execution or Execution()
    return ex, str(Path(ex.cache_dir) if ex.cache_dir is not None else default_cache_dir())


def run(config: Config, execution: Execution | None = None, version: str | None = None) -> pd.DataFrame:
    """Chapter 2's results: one row per (seed, trap, case), in :meth:`Config.run_configs` order.

    Columns: the :class:`TrapRun` fields (``sorted_fraction`` trap 4 only, ``device_batch_size``
    trap 5 only), ``module_mode`` (trap 2's teacher: ``train`` / ``eval``), the source's
    held-out accuracy, then each trap's quantities (NaN where a trap has no such quantity).
    Accuracies are exact fractions 0..1; changes are absolute, in the tensor's units (logits
    for probe outputs). Stage 1 and every case are cached (:mod:`bnstudy.sweep`). Two passes: every run of
    :meth:`Config.run_configs`, then trap 3's dropout mechanism at the rates the first pass chose on validation data
    (:func:`chosen_rates`, :meth:`Config.dropout_configs`), appended.
    """
    if not isinstance(config, Config):
        raise TypeError(f"run needs an eval_traps.Config (see make_config), got {type(config).__name__}")
    ex, root = _cache(execution)
    sv = version or source_version()  # stage 1's code version: the runs read the backbones with it
    sweep = lambda configs, desc: run_sweep(configs, _trap_group, namespace=NAMESPACE, cache_dir=root, execution=ex,
                                            groups=_groups(configs), group_kwargs={"cache_root": root, "version": sv},
                                            version=version, desc=desc)
    configs = config.run_configs()
    ensure_sources([c.source for c in configs], ex, sv)
    first = sweep(configs, "chapter 2 traps")
    rates = chosen_rates(first)
    second = sweep(config.dropout_configs(rates["backbone_only"], rates["std"]), "chapter 2 dropout mechanism")
    return pd.concat([first, second], ignore_index=True)


def chosen_rates(df: pd.DataFrame) -> dict:
    """The learning rates :func:`findings` reports at, each with the best mean validation accuracy of the main head
    over seeds (ties: the smaller rate): ``whole_model`` / ``backbone_only`` (``whole_eval_tuned``), ``drifting``
    (``train_call_tuned``) and ``std`` (the standardized fix at p = :data:`P_DROP`, ``dropout_mechanism``; NaN
    without those rows). Raises ``KeyError`` when a sweep is missing."""
    def best(rows, what):
        if rows.empty:
            raise KeyError(f"no rows of {what}")
        return float(rows.groupby("lr")["val_main"].mean().idxmax())
    tu, dr = df[df["trap"] == "whole_eval_tuned"], df[df["trap"] == "train_call_tuned"]
    out = {setup: best(tu[tu["setup"] == setup], f"setup={setup!r} in trap='whole_eval_tuned'")
           for setup in TUNED_SETUPS}
    out[DRIFT_SETUP] = best(dr, "trap='train_call_tuned'")
    dm = df[df["trap"] == "dropout_mechanism"] if "trap" in df else df.iloc[:0]
    if not dm.empty:
        k = dm["case"].map(parse_dropout_case)
        dm = dm[(k.str[0] == "std") & (k.str[1] == P_DROP)]
    out["std"] = best(dm, "the standardized fix's rate sweep (trap='dropout_mechanism')") if len(dm) else float("nan")
    return out


def thread_check(config: Config, df: pd.DataFrame, execution: Execution | None = None) -> pd.DataFrame:
    """The runs the page cites in traps 1 and 3 (:meth:`Config.thread_configs`), for the first ``thread_seeds``
    seeds, again at the other torch thread count (1 or 2, whichever ``execution.threads`` is not), stage 1 included,
    in their own cache folder ``<cache>/threads<n>`` (the thread count is not part of a cache key): chapter 1's
    :func:`~bnstudy.experiments.freeze_modes.thread_check` on this chapter's network.

    ``df``: :func:`run`'s table (the main thread count's rows, and the chosen rates). Returns one row per (seed,
    quantity, threads): ``seed, quantity, threads, accuracy``, with ``quantity`` a key of :data:`THREAD_QUANTITIES`.
    Empty (those columns) when ``thread_seeds`` is 0.
    """
    ex, root = _cache(execution)
    cols = ["seed", "quantity", "threads", "accuracy"]
    if config.thread_seeds == 0:
        return pd.DataFrame(columns=cols)
    other = 2 if ex.threads == 1 else 1
    configs = config.thread_configs(chosen_rates(df))
    e = ex.replace(threads=other, cache_dir=str(Path(root) / f"threads{other}"))
    version = source_version()
    ensure_sources([c.source for c in configs], e, version)
    oroot = str(Path(root) / f"threads{other}")
    rerun = run_sweep(configs, _trap_group, namespace=NAMESPACE, cache_dir=oroot, execution=e,
                      groups=_groups(configs), group_kwargs={"cache_root": oroot, "version": version},
                      desc=f"chapter 2 thread check ({other} threads)")
    keys = {(c.trap, c.case) for c in configs}
    cited = np.array([(t, c) in keys for t, c in zip(df["trap"], df["case"])], dtype=bool)
    main = df[cited & df["seed"].isin(config.seeds[:config.thread_seeds]).to_numpy()]
    frames = []
    for th, d in ((ex.threads, main), (other, rerun)):
        for q, (trap, case_of, col) in THREAD_QUANTITIES.items():
            sub = d[d["trap"] == trap]
            sub = sub[sub["case"].map(lambda cs: case_of(cs))]
            frames.append(pd.DataFrame(dict(seed=sub["seed"].astype(int).values, quantity=q, threads=th,
                                            accuracy=sub[col].astype(float).values)))
    return pd.concat(frames, ignore_index=True)[cols]


#: The accuracies the thread check compares: name -> (trap, which case, column). Tuned cases are the chosen rate's
#: (the only ones :meth:`Config.thread_configs` reruns).
THREAD_QUANTITIES = {
    "t1_eval_once": ("train_call", lambda cs: cs == "eval_once", "task_b"),
    "t1_pinned": ("train_call", lambda cs: cs == "pinned", "task_b"),
    "t1_tuned_drifting": ("train_call_tuned", lambda cs: True, "task_b_main"),
    "t3_whole": ("whole_eval", lambda cs: cs == "whole_model", "task_b_main"),
    "t3_fix": ("whole_eval", lambda cs: cs == "backbone_only", "task_b_main"),
    "t3_tuned_whole": ("whole_eval_tuned", lambda cs: cs.startswith("whole_model_lr"), "task_b_main"),
    "t3_tuned_fix": ("whole_eval_tuned", lambda cs: cs.startswith("backbone_only_lr"), "task_b_main"),
}
#: The paired differences the page reports, as (minuend, subtrahend) quantities of the thread check.
THREAD_PAIRS = {"t1_price": ("t1_eval_once", "t1_pinned"), "t1_tuned_price": ("t1_tuned_drifting", "t3_tuned_whole"),
                "t3_fix_vs_whole": ("t3_fix", "t3_whole"), "t3_tuned_fix_vs_whole": ("t3_tuned_fix", "t3_tuned_whole")}


@dataclass(frozen=True)
class ThreadFindings:
    """Run-to-run variation of chapter 2's cited accuracies between two torch thread counts (fractions 0..1).

    From :func:`thread_check`'s table. ``threads_main`` / ``threads_other``: the two counts; ``n_seeds`` seeds,
    ``n_runs`` (seed, quantity) pairs, ``n_differ`` of them changed. Per quantity of :data:`THREAD_QUANTITIES`:
    ``largest`` |other - main| over seeds and ``typical`` (the mean |change| over seeds); ``max_diff`` /
    ``mean_diff`` over every pair, ``max_quantity`` the quantity with the largest. ``paired_largest``: per
    difference of :data:`THREAD_PAIRS`, the largest |change| of that per-seed paired difference when both of its
    runs move to the other count (the page's paired differences are computed within one count).
    """

    n_seeds: int
    threads_main: int
    threads_other: int
    n_runs: int
    n_differ: int
    largest: dict
    typical: dict
    max_diff: float
    mean_diff: float
    max_quantity: str
    paired_largest: dict


def thread_findings(tc: pd.DataFrame, main_threads: int = 1) -> ThreadFindings:
    """:class:`ThreadFindings` from :func:`thread_check`'s table (``seed, quantity, threads, accuracy``).

    Raises ``ValueError`` unless the table has exactly two thread counts, one of them ``main_threads``, and every
    (seed, quantity) at both.
    """
    ths = sorted(int(t) for t in tc["threads"].unique())
    if len(ths) != 2 or main_threads not in ths:
        raise ValueError(f"thread_findings needs exactly two thread counts including main_threads={main_threads}, "
                         f"got {ths}")
    other = [t for t in ths if t != main_threads][0]
    a, b = (tc[tc["threads"] == t].set_index(["seed", "quantity"])["accuracy"].astype(float).sort_index()
            for t in (main_threads, other))
    if not a.index.equals(b.index):
        raise ValueError("thread_findings needs every (seed, quantity) at both thread counts")
    d = (b - a).abs()
    qs = [q for q in THREAD_QUANTITIES if q in d.index.get_level_values("quantity")] + \
        sorted(set(d.index.get_level_values("quantity")) - set(THREAD_QUANTITIES))
    per = {q: d.xs(q, level="quantity") for q in qs}
    pair = lambda x, m, s_: x.xs(m, level="quantity") - x.xs(s_, level="quantity")
    paired = {k: float((pair(b, m, s_) - pair(a, m, s_)).abs().max()) for k, (m, s_) in THREAD_PAIRS.items()
              if m in per and s_ in per}
    return ThreadFindings(n_seeds=int(a.index.get_level_values("seed").nunique()), threads_main=main_threads,
                          threads_other=other, n_runs=int(len(d)), n_differ=int((d > 0).sum()),
                          largest={q: float(v.max()) for q, v in per.items()},
                          typical={q: float(v.mean()) for q, v in per.items()},
                          max_diff=float(d.max()), mean_diff=float(d.mean()),
                          max_quantity=THREAD_WORDS.get(max(per, key=lambda q: per[q].max()), ""),
                          paired_largest=paired)


#: How the page names each thread-check quantity.
THREAD_WORDS = {"t1_eval_once": "trap 1's drifting head at the run line's rate",
                "t1_pinned": "trap 1's pinned head at the run line's rate",
                "t1_tuned_drifting": "trap 1's drifting head at its tuned rate",
                "t3_whole": "trap 3's whole-model main head at the run line's rate",
                "t3_fix": "trap 3's fix at the run line's rate",
                "t3_tuned_whole": "trap 3's whole-model main head at its tuned rate (trap 1's pinned partner)",
                "t3_tuned_fix": "trap 3's fix at its tuned rate"}


def first_seed_audit(config: Config, trap: str, case: str, execution: Execution | None = None):
    """The first seed's audit and lints for one case (recomputed from the cached source, deterministically).

    Returns ``(audit, lints)``; the audit is ``None`` for traps 4 and 5. Uses the source cached by
    :func:`run` (trained again if the code changed since).
    """
    ex, root = _cache(execution)
    c = next((r for r in config.run_configs() if r.seed == config.seeds[0] and r.trap == trap and r.case == case),
             None)
    if c is None:
        raise ValueError(f"no case {case!r} in trap {trap!r}; cases: "
                         f"{[r.case for r in config.run_configs() if r.trap == trap and r.seed == config.seeds[0]]}")
    version = source_version()  # one version for both calls; trains the source if this code has none cached
    ensure_sources([c.source], ex, version)
    _, a, lints = run_case(c, load_source(c.source, root, version))
    return a, lints


def first_seed_printout(config: Config, trap: str, case: str, execution: Execution | None = None,
                        lint_codes: tuple = ()) -> str:
    """What the page shows for one case: the lints whose code is in ``lint_codes``, then the audit's printout."""
    a, lints = first_seed_audit(config, trap, case, execution)
    shown = [str(x) for x in lints if x.code in lint_codes]
    return "\n".join(shown + ([""] if shown else []) + [str(a)])


def audit_table(config: Config, execution: Execution | None = None, cases=PRINTED_AUDITS) -> pd.DataFrame:
    """The first seed's audit printouts the page shows, as a table: one row per ``(trap, case, lint_codes)`` of
    ``cases``, columns ``seed, trap, case, printout`` (:func:`first_seed_printout`'s text: each case run again on the
    cached source, traps 1 and 3 training their new head for ``steps`` steps). :func:`printout` reads one back."""
    from ..sweep import torch_threads
    # the printed heads train here, not in a sweep: at the execution's thread count, as every run does (at the
    # process's own count the numbers depended on where the page ran; the release's verification found it)
    with torch_threads((execution or Execution()).threads):
        rows = [dict(seed=int(config.seeds[0]), trap=trap, case=case,
                     printout=first_seed_printout(config, trap, case, execution, lint_codes=codes))
                for trap, case, codes in cases]
    return pd.DataFrame(rows, columns=["seed", "trap", "case", "printout"])


def printout(table: pd.DataFrame, trap: str, case: str) -> str:
    """The printout of ``(trap, case)`` in :func:`audit_table`'s ``table``; ``KeyError`` naming the cases it has."""
    hit = table[(table["trap"] == trap) & (table["case"] == case)]
    if len(hit) != 1:
        raise KeyError(f"no single printout of trap={trap!r}, case={case!r}; the table has "
                       f"{list(zip(table['trap'], table['case']))}")
    return str(hit["printout"].iloc[0])


def run_tables(config: Config, execution: Execution | None = None) -> tuple[pd.DataFrame, dict]:
    """Everything chapter 2's page analyses, as the tables it saves: ``(run(config), {"threads": thread_check(...),
    "audits": audit_table(...), "single_layer": single_layer_table(first seed)})`` (keys: :data:`SIBLING_TABLES`).
    Every run that trains is here (all cached but the audit printouts, which retrain the first seed's printed heads
    from its cached source), so a page given these tables trains nothing. The one-layer facts are saved too (their
    layers are seeded, so they are the same in every execution)."""
    if not isinstance(config, Config):
        raise TypeError(f"run_tables needs an eval_traps.Config (see make_config), got {type(config).__name__}")
    df = run(config, execution)
    return df, dict(threads=thread_check(config, df, execution), audits=audit_table(config, execution),
                    single_layer=single_layer_table(config.seeds[0]))


def rows_table(df: pd.DataFrame) -> pd.DataFrame:
    """:func:`run`'s table as it returns it, also when read back from its CSV (a page given ``rows``): there
    ``module_mode``'s empty text comes back as NaN, and :func:`trap_table` would then drop the column that the run's
    own tables keep. Returns ``df`` with NaN in ``module_mode`` as ``""`` (a run's own table has none)."""
    return df.assign(module_mode=df["module_mode"].fillna("")) if "module_mode" in df else df


def trap_table(df: pd.DataFrame, trap: str) -> pd.DataFrame:
    """The rows of ``trap`` with only the columns that trap fills (a figure's tidy table)."""
    sub = df[df["trap"] == trap]
    return sub.dropna(axis=1, how="all").reset_index(drop=True)


# --- the one-layer facts ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SingleLayer:
    """The one-layer facts chapter 2 quotes (traps 4 and 5), computed on fresh layers.

    ``t5_error``: PyTorch's error for a train-mode BatchNorm1d on a ``(1, C)`` batch;
    ``t5_lint1``: the audit's lint that named the layer first (up to its explanation);
    ``t5_bn2d_mean``: largest |per-channel mean| of a train-mode BatchNorm2d's output on one
    image (0 up to rounding: an instance norm); ``t5_dev2``: largest ||y| - 1| of a train-mode
    BatchNorm1d on two samples; ``t5_loader``: the lint code for 17 samples at batch 16;
    ``t4_sorted_rm`` / ``t4_shuffled_rm`` / ``t4_data_mean``: BatchNorm1d(1)'s running_mean after
    one epoch at batch 10 over 10 classes x 100 values from N(k, 0.5), class-sorted or shuffled,
    and the data mean.
    """

    t5_error: str
    t5_lint1: str
    t5_bn2d_mean: float
    t5_dev2: float
    t5_loader: str
    t4_sorted_rm: float
    t4_shuffled_rm: float
    t4_data_mean: float


def single_layer_cases(seed: int = 0) -> SingleLayer:
    """:class:`SingleLayer` for ``seed`` (random inputs from ``derive_seed(seed, "ch02", "single")``, layers
    initialized under their own seeds: the same in every process)."""
    g = torch.Generator().manual_seed(derive_seed(seed, "ch02", "single"))
    # layers initialized from their own seeds, not torch's global generator (seeded every process differently,
    # it made t5_bn2d_mean differ between executions; the release's verification found it)
    bn1 = seeded((seed, "ch02", "single", "bn1"),
                 lambda: nn.Sequential(OrderedDict(fc=nn.Linear(4, 4), norm=nn.BatchNorm1d(4))).train())
    error = ""
    with audit.FreezeAudit(bn1, warn=False) as a:
        try:
            bn1(torch.randn(1, 4, generator=g))
        except ValueError as e:
            error = f"ValueError: {e}"
    bn2 = seeded((seed, "ch02", "single", "bn2"),
                 lambda: nn.Sequential(OrderedDict(conv=nn.Conv2d(3, 4, 3), norm=nn.BatchNorm2d(4))).train())
    y2 = bn2(torch.randn(1, 3, 8, 8, generator=g) * 3 + 1)
    y = nn.BatchNorm1d(4, affine=False).train()(torch.randn(2, 4, generator=g) * 5 + 3)
    ys = torch.arange(10).repeat_interleave(100)
    x = (ys.float() + 0.5 * torch.randn(1000, generator=g)).unsqueeze(1)
    rm = {}
    for name, order in (("sorted", torch.arange(1000)), ("shuffled", torch.randperm(1000, generator=g))):
        bn = nn.BatchNorm1d(1).train()
        for i in range(0, 1000, 10):
            bn(x[order[i:i + 10]])
        rm[name] = float(bn.running_mean)
    return SingleLayer(t5_error=error, t5_lint1=str(a.lints[0]).split(" normalises")[0] if a.lints else "",
                       t5_bn2d_mean=float(y2.detach().mean((0, 2, 3)).abs().max()),
                       t5_dev2=float((y.detach().abs() - 1).abs().max()),
                       t5_loader=str(audit.lint_loader(17, 16, warn=False)[0]).split(":")[0],
                       t4_sorted_rm=rm["sorted"], t4_shuffled_rm=rm["shuffled"], t4_data_mean=float(x.mean()))


def single_layer_table(seed: int = 0) -> pd.DataFrame:
    """:func:`single_layer_cases` of ``seed`` as a one-row table to save: ``seed`` and one column per field."""
    return pd.DataFrame([dict(seed=int(seed), **{f.name: getattr(c, f.name) for f in fields(c)})
                         for c in (single_layer_cases(seed),)])


def single_layer_from_table(table: pd.DataFrame) -> SingleLayer:
    """:func:`single_layer_table`'s inverse, also for the table read back from its CSV (where an empty text comes
    back as NaN: it is the empty string again). Raises ``ValueError`` unless the table has exactly one row."""
    if len(table) != 1:
        raise ValueError(f"single_layer_from_table needs single_layer_table's one row, got {len(table)} rows")
    r = table.iloc[0]
    return SingleLayer(**{f.name: (("" if pd.isna(r[f.name]) else str(r[f.name])) if f.type in ("str", str)
                                   else float(r[f.name])) for f in fields(SingleLayer)})


# --- findings ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Numbers:
    """The descriptive numbers chapter 2's prose and checklist cite (accuracies are fractions 0..1); its verdicts
    are in :class:`Findings`' claims table, not here.

    A plain number is the mean over seeds; ``<name>_min`` / ``<name>_max`` are the lowest and highest seed's value
    (for a per-seed largest value, ``<name>`` is its mean over seeds). Intervals are 95% Student-t intervals over
    seeds of a per-seed difference, *condition minus reference*, descriptive (no verdict). Booleans are plain facts
    of the run (a lint fired in every seed, a chosen rate lies inside its grid), not statistical claims.
    ``t1_price_b``: ``task_b(eval_once) - task_b(pinned)`` at the run line's untuned rate (referee ch2 item 2);
    ``t1_loss_*``: the head's mean training cross-entropy (nats) over the first / last epoch (NaN for runs made
    before it was recorded). ``t3_same_rate_*``: whole model minus fix at the same rate (paired), at the grid's
    lowest / highest rate and the lowest / highest mean over the grid; ``t3_tuned_aux``: the fix's auxiliary head
    (no dropout, same run) at the rate with its best validation accuracy (``t3_lr_aux``). ``t3d_effect``: dropout's
    effect, fix at p minus fix with dropout off (negative: dropout costs). ``t5_safe_batch`` / ``t5t_safe_batch``:
    the smallest batch from which every larger one loses less than ``TOL_LOSS`` (one-sided t tests at the family's
    level, intersection-union; ``*_p`` the largest of those p-values), NaN if none. ``t5t_costs_n``: batches below
    ``min_batch`` where batch statistics score lower than pinned (re-estimated), Holm-adjusted p below ``ALPHA``
    over the claims table, of ``t5t_n_below``. ``family_m``: the family's size (the claims that are tests, plus
    the two safe-batch rules); ``family_confidence``: its intervals' confidence in percent.
    """

    n_seeds: int
    chance: float
    source_acc: float
    steps: int
    epoch_steps: int
    batch_size: int
    teacher_batches: int
    n_eval: int
    min_batch: int
    family_m: int
    family_confidence: float
    # trap 1
    t1_bn_train: float
    t1_nbt: float
    t1_param: float
    t1_buffer: float
    t1_buffer_min: float
    t1_buffer_max: float
    t1_probe: float
    t1_probe_min: float
    t1_probe_max: float
    t1_task_a_before: float
    t1_task_a_before_min: float
    t1_task_a_before_max: float
    t1_task_a_after: float
    t1_task_a_after_min: float
    t1_task_a_after_max: float
    t1_task_b_eval_once: float
    t1_task_b_pinned: float
    t1_task_a_after_pinned: float
    t1_probe_pinned: float
    t1_buffer_pinned: float
    t1_lint_every_seed: bool
    t1_price_b: Interval
    t1_price_b_pos_seeds: int
    t1_price_b_neg_seeds: int
    t1_loss_first_eval_once: float
    t1_loss_first_pinned: float
    t1_loss_last_eval_once: float
    t1_loss_last_pinned: float
    t1_mean_shift: float
    t1_mean_shift_min: float
    t1_mean_shift_max: float
    t1_log_var: float
    t1_log_var_min: float
    t1_log_var_max: float
    # trap 1 at tuned rates
    t1_tuned_lr_drifting: float
    t1_tuned_lr_pinned: float
    t1_tuned_lr_interior: bool
    t1_tuned_n_lrs: int
    t1_tuned_lr_min: float
    t1_tuned_lr_max: float
    t1_tuned_b_drifting: float
    t1_tuned_b_drifting_min: float
    t1_tuned_b_drifting_max: float
    t1_tuned_b_pinned: float
    t1_tuned_b_pinned_min: float
    t1_tuned_b_pinned_max: float
    t1_tuned_price_b_pos_seeds: int
    t1_tuned_price_b_neg_seeds: int
    t1_tuned_price_b_same_rate: Interval
    t1_tuned_gain_drifting: Interval
    t1_tuned_gain_pinned: Interval
    t1_tuned_price_b_half: Interval
    t1_tuned_price_change: Interval
    t1_tuned_loss_last_drifting: float
    t1_tuned_loss_last_pinned: float
    # trap 2
    t2_nbt: float
    t2_buffer: float
    t2_buffer_min: float
    t2_buffer_max: float
    t2_probe: float
    t2_task_a_before: float
    t2_task_a_after: float
    t2_task_a_after_min: float
    t2_task_a_after_max: float
    t2_acc_a_mates: float
    t2_acc_a_mates_min: float
    t2_acc_a_mates_max: float
    t2_acc_b_mates: float
    t2_acc_b_mates_min: float
    t2_acc_b_mates_max: float
    t2_logit_mates: float
    t2_logit_mates_min: float
    t2_logit_mates_max: float
    t2_logit_mates_eval: float
    t2_acc_mates_eval: float
    t2_buffer_eval: float
    t2_mean_shift: float
    t2_mean_shift_min: float
    t2_mean_shift_max: float
    t2_log_var: float
    t2_log_var_min: float
    t2_log_var_max: float
    # trap 3
    t3_aux_loss_whole: float
    t3_aux_change_whole: float
    t3_dropout_whole: float
    t3_task_b_aux_whole: float
    t3_task_b_aux_whole_min: float
    t3_task_b_aux_whole_max: float
    t3_aux_loss_fixed: float
    t3_aux_change_fixed: float
    t3_dropout_fixed: float
    t3_task_b_aux_fixed: float
    t3_task_b_aux_fixed_min: float
    t3_task_b_aux_fixed_max: float
    t3_task_b_main_whole: float
    t3_task_b_main_fixed: float
    t3_task_b_main_nodrop: float
    t3_dropout_effect: Interval
    t3_n_features: int
    t3_p_drop_pct: float
    t3_chance_line: float
    t3_fix_ci: Interval
    t3_fix_seeds_below: int
    t3_lr_aux: float
    t3_tuned_aux: Interval
    t3_tuned_aux_vs_whole: Interval
    t3_same_rate_low_lr: float
    t3_same_rate_low: Interval
    t3_same_rate_high_lr: float
    t3_same_rate_high: Interval
    t3_same_rate_min: float
    t3_same_rate_max: float
    t3_loss_first_fixed: float
    t3_loss_last_fixed: float
    t3_loss_last_whole: float
    t3_lr_whole: float
    t3_lr_fixed: float
    t3_lr_interior: bool
    t3_lr_runline: float
    t3_n_lrs: int
    t3_lr_min: float
    t3_lr_max: float
    t3_tuned_steps: int
    t3_tuned_main_whole: float
    t3_tuned_main_whole_min: float
    t3_tuned_main_whole_max: float
    t3_tuned_main_fixed: float
    t3_tuned_main_fixed_min: float
    t3_tuned_main_fixed_max: float
    t3_tuned_fixed_ci: Interval
    t3_tuned_gain_fixed: Interval
    t3_tuned_gain_whole: Interval
    t3_tuned_loss_last_fixed: float
    t3_tuned_loss_last_whole: float
    t3_tuned_aux_fixed: float
    t3_aux_vs_fix_main: Interval
    t3_aux_vs_fix_main_same_rate: Interval
    t3_aux_weight: float
    # trap 3's dropout mechanism (referee ch2c N5)
    t3d_ps: str
    t3d_p_low: float
    t3d_p_high: float
    t3d_p_page: float
    t3d_lr_raw: float
    t3d_lr_std: float
    t3d_std_n_lrs: int
    t3d_std_lr_interior: bool
    t3d_acc: dict
    t3d_effect: dict
    t3d_std_vs_raw_at: dict
    t3d_growth_std: Interval
    t3d_rel_effect: dict
    t3d_rel_std_vs_raw: Interval
    t3d_hypothesis: bool
    t3d_hypothesis_words: str
    # trap 4
    t4_eval_shuffled: float
    t4_eval_sorted: float
    t4_train_shuffled: float
    t4_train_half: float
    t4_half: float
    t4_train_sorted: float
    t4_train_sorted_min: float
    t4_train_sorted_max: float
    t4_monotone: bool
    t4_first_flagged: float
    t4_dep_first_flagged: float
    t4_dep_shuffled: float
    t4_shuffled_clean: bool
    t4_flagged_every_seed: bool
    t4_after_sorted: float
    t4_train_vs_eval_shuffled: Interval
    t4_train_vs_eval_half: Interval
    t4_train_vs_eval_sorted: Interval
    t4_lint_max_dependence: float
    t4_tol_after: float
    # trap 5
    t5_train: dict
    t5_smallest: int
    t5_eval: float
    t5_first_ok: float
    t5_train_vs_eval: dict
    t5_count: dict
    t5_safe_batch: float
    t5_safe_p: float
    t5_safe_count: float
    t5_tol: float
    t5t_steps: int
    t5t_largest: int
    t5t_smallest: int
    t5t_samples: dict
    t5t_eval: dict
    t5t_reest: dict
    t5t_bs_vs_pinned: dict
    t5t_reest_bs_vs_pinned: dict
    t5t_change: dict
    t5t_reest_gain: dict
    t5t_loss_last: dict
    t5t_safe_batch: float
    t5t_safe_p: float
    t5t_safe_batch_as_trained: float
    t5t_threshold_word: str
    t5t_n_below: int
    t5t_costs_n: int
    t5t_costs_n_as_trained: int
    t5t_pinned_reest_below_n: int
    t5t_reest_batches: int
    stage1_lr: float
    # trap 6
    t6_meter_shuffled: float
    t6_meter_sorted: float
    t6_eval_shuffled: float
    t6_eval_sorted: float
    t6_eval_sorted_min: float
    t6_eval_sorted_max: float
    t6_batch_stats_sorted: float
    t6_gap_shuffled: Interval
    t6_sorted_vs_shuffled: Interval
    t6_tie_margin: float


@dataclass(frozen=True)
class Findings:
    """Chapter 2's findings: ``claims``, its claims table (:func:`bnstudy.inference.claims_table`; the notebook glues
    it with :func:`bnstudy.pages.glue_claims`: every verdict the page prints is a ``verdict`` of it), and
    ``numbers``, the descriptive :class:`Numbers`. Attribute access falls through to ``numbers``
    (``f.t1_buffer``); ``f.claim(key)`` is one row of ``claims``."""

    claims: pd.DataFrame
    numbers: Numbers

    def __getattr__(self, name):
        if name in ("claims", "numbers"):
            raise AttributeError(name)
        return getattr(self.numbers, name)

    def claim(self, key: str) -> pd.Series:
        """The claims table's row ``key``; ``KeyError`` naming the keys it has."""
        hit = self.claims[self.claims["key"] == key]
        if len(hit) != 1:
            raise KeyError(f"no claim {key!r}; claims: {list(self.claims['key'])}")
        return hit.iloc[0]

    def verdict(self, key: str) -> str:
        return str(self.claim(key)["verdict"])


def _values(df: pd.DataFrame, trap: str, case: str, quantity: str) -> pd.Series:
    """One quantity per seed (indexed by seed); ``KeyError`` if the case or quantity is missing."""
    sel = df[(df["trap"] == trap) & (df["case"] == case)]
    if sel.empty or quantity not in sel or sel[quantity].isna().all():
        raise KeyError(f"no values of {quantity!r} for trap={trap!r}, case={case!r}")
    return sel.set_index("seed")[quantity].astype(float)


def _safe_from(batches: list, diff, family: Family) -> tuple[float, float]:
    """The smallest batch from which every larger one loses less than ``TOL_LOSS``: for each batch ``b``,
    ``diff(b)`` (per-seed condition minus reference, negative: a loss) is tested one-sided against ``-TOL_LOSS``
    (:func:`bnstudy.inference.one_sided_p`, ``"greater"``); the claim "every batch from ``b`` on" is Berger's
    intersection-union test over those batches (:func:`bnstudy.inference.intersection_union_p`), shown when its p
    is below ``family.level``. Returns ``(batch, p)`` with ``p`` that test's p; ``(nan, nan)`` if no batch is."""
    p = {b: one_sided_p(diff(b), "greater", null=-TOL_LOSS) for b in batches}
    for i, b in enumerate(batches):
        p_iu = intersection_union_p([p[x] for x in batches[i:]])
        if p_iu < family.level:
            return float(b), p_iu
    return float("nan"), float("nan")


def findings(df: pd.DataFrame) -> Findings:
    """Chapter 2's findings from :func:`run`'s table (every trap and case, at least two seeds): the claims table
    and the descriptive :class:`Numbers`.

    Every difference is *condition minus reference*, per seed (:data:`CLAIMS` names each claim's). Claims that
    are tests (:func:`bnstudy.inference.decide`, words :data:`DIRECTIONS`) form one family with the two safe-batch
    rules (:data:`RULES`): ``m = len(tests) + 2``, Bonferroni intervals at ``1 - ALPHA/m``, equivalence (trap 4's
    ``t4_after`` within ``TOL_AFTER``, trap 6's ``t6_meter_gap`` within ``TOL_TIE``) at ``ALPHA/m``, Holm's
    adjusted p over the table. The identities of the code are :func:`bnstudy.inference.exact_check` rows:
    ``t1_pinned`` (every backbone buffer, weight and probe logit changed by exactly 0 with the pin),
    ``t2_eval`` (in eval mode, logits bit-identical whatever the batch mates, no buffer or probe change),
    ``t3_aux_untouched`` (the auxiliary head's weights unchanged with the whole model in eval mode),
    ``t3_nodrop_equals_whole`` (the fix with dropout off equals the whole-model run's main head),
    ``t3_eval_dropout_off`` (every scored logit equals the head without its dropout layer) and
    ``t5_lint_matches`` (the small-batch lint fires exactly below ``min_batch``), each over every seed.
    Rates: per setup the rate with the best mean *validation* accuracy (ties: the smaller). Raises ``KeyError``
    if a case is missing.
    """
    first = df.iloc[0]
    v = lambda trap, case, q: _values(df, trap, case, q)
    spread = lambda name, s: {name: float(s.mean()), f"{name}_min": float(s.min()), f"{name}_max": float(s.max())}
    ci = t_interval  # a descriptive 95% interval over seeds
    out = dict(n_seeds=int(df["seed"].nunique()), chance=1 / int(first["n_classes"]),
               source_acc=float(df.groupby("seed")["source_task_a_accuracy"].first().mean()),
               **{k: int(first[k]) for k in ("steps", "epoch_steps", "batch_size", "teacher_batches", "n_eval",
                                             "min_batch")})
    chance, min_batch = out["chance"], out["min_batch"]
    tests: list[tuple] = []  # (key, per-seed differences, margin, (higher, lower)): decided once m is known
    checks: list = []
    # trap 1
    tc = lambda case, q: v("train_call", case, q)
    price = tc("eval_once", "task_b") - tc("pinned", "task_b")
    pinned_moves = pd.concat([tc("pinned", q) for q in ("max_buffer_change", "num_batches_tracked_change",
                                                        "max_param_change", "max_probe_change")])
    checks.append(exact_check(pinned_moves, 0.0, "t1_pinned"))
    out.update(t1_bn_train=tc("eval_once", "bn_train_fraction").mean(),
               t1_nbt=tc("eval_once", "num_batches_tracked_change").mean(),
               t1_param=tc("eval_once", "max_param_change").max(),
               **spread("t1_buffer", tc("eval_once", "max_buffer_change")),
               **spread("t1_probe", tc("eval_once", "max_probe_change")),
               **spread("t1_task_a_before", tc("eval_once", "task_a_before")),
               **spread("t1_task_a_after", tc("eval_once", "task_a_after")),
               t1_task_b_eval_once=tc("eval_once", "task_b").mean(), t1_task_b_pinned=tc("pinned", "task_b").mean(),
               t1_task_a_after_pinned=tc("pinned", "task_a_after").mean(),
               t1_probe_pinned=tc("pinned", "max_probe_change").mean(),
               t1_buffer_pinned=tc("pinned", "max_buffer_change").mean(),
               t1_lint_every_seed=bool((tc("eval_once", "frozen_bn_lint") == 1).all()),
               t1_price_b=ci(price), t1_price_b_pos_seeds=int((price > 0).sum()),
               t1_price_b_neg_seeds=int((price < 0).sum()),
               **{f"t1_loss_{w}_{k}": (tc(case, f"head_loss_{w}").mean() if "head_loss_first" in df
                                       and df["head_loss_first"].notna().any() else float("nan"))
                  for w in ("first", "last") for case, k in (("eval_once", "eval_once"), ("pinned", "pinned"))},
               **spread("t1_mean_shift", tc("eval_once", "max_mean_shift_sd")),
               **spread("t1_log_var", tc("eval_once", "max_abs_log_var_ratio")))
    # trap 2
    ng = lambda case, q: v("no_grad", case, q)
    eval_moves = pd.concat([ng("teacher_eval", q) for q in ("max_logit_change_by_mates", "max_buffer_change",
                                                            "max_probe_change")])
    checks.append(exact_check(eval_moves, 0.0, "t2_eval"))
    out.update(t2_nbt=ng("teacher_train", "num_batches_tracked_change").mean(),
               **spread("t2_buffer", ng("teacher_train", "max_buffer_change")),
               t2_probe=ng("teacher_train", "max_probe_change").mean(),
               t2_task_a_before=ng("teacher_train", "task_a_before").mean(),
               **spread("t2_task_a_after", ng("teacher_train", "task_a_after")),
               **spread("t2_acc_a_mates", ng("teacher_train", "accuracy_with_a_mates")),
               **spread("t2_acc_b_mates", ng("teacher_train", "accuracy_with_b_mates")),
               **spread("t2_logit_mates", ng("teacher_train", "max_logit_change_by_mates")),
               t2_logit_mates_eval=ng("teacher_eval", "max_logit_change_by_mates").mean(),
               t2_acc_mates_eval=ng("teacher_eval", "accuracy_with_b_mates").mean(),
               t2_buffer_eval=ng("teacher_eval", "max_buffer_change").mean(),
               **spread("t2_mean_shift", ng("teacher_train", "max_mean_shift_sd")),
               **spread("t2_log_var", ng("teacher_train", "max_abs_log_var_ratio")))
    # trap 3 at the run line's rate
    we = lambda case, q: v("whole_eval", case, q)
    main = lambda case: we(case, "task_b_main")
    checks.append(exact_check(we("whole_model", "aux_max_param_change"), 0.0, "t3_aux_untouched"))
    checks.append(exact_check(main("backbone_only_dropout_off") - main("whole_model"), 0.0, "t3_nodrop_equals_whole"))
    line = CHANCE_FACTOR * chance
    tests.append(("t3_fix_chance", main("backbone_only") - line, None))
    tests.append(("t3_whole_vs_fix", main("whole_model") - main("backbone_only"), None))
    out.update(t3_aux_loss_whole=we("whole_model", "aux_loss_fraction").mean(),
               t3_aux_change_whole=we("whole_model", "aux_max_param_change").mean(),
               t3_dropout_whole=we("whole_model", "dropout_train_fraction").mean(),
               **spread("t3_task_b_aux_whole", we("whole_model", "task_b_aux")),
               t3_aux_loss_fixed=we("backbone_only", "aux_loss_fraction").mean(),
               t3_aux_change_fixed=we("backbone_only", "aux_max_param_change").mean(),
               t3_dropout_fixed=we("backbone_only", "dropout_train_fraction").mean(),
               **spread("t3_task_b_aux_fixed", we("backbone_only", "task_b_aux")),
               t3_task_b_main_whole=main("whole_model").mean(), t3_task_b_main_fixed=main("backbone_only").mean(),
               t3_task_b_main_nodrop=main("backbone_only_dropout_off").mean(),
               t3_dropout_effect=ci(main("backbone_only") - main("backbone_only_dropout_off")))
    # trap 3's learning-rate sweep
    tu = df[df["trap"] == "whole_eval_tuned"]
    if tu.empty:
        raise KeyError("no rows of trap='whole_eval_tuned' (trap 3's learning-rate sweep)")

    def chosen(setup):  # the rate with the best mean validation accuracy (ties: the smaller rate)
        g = tu[tu["setup"] == setup]
        if g.empty:
            raise KeyError(f"no rows of setup={setup!r} in trap='whole_eval_tuned'")
        lr = float(g.groupby("lr")["val_main"].mean().idxmax())
        return lr, g[g["lr"] == lr].set_index("seed")

    grid = sorted(float(x) for x in tu["lr"].unique())
    lr_w, tw = chosen("whole_model")
    lr_f, tf = chosen("backbone_only")
    checks_eval = pd.concat([we(cs, "eval_dropout_off") for cs in CASES["whole_eval"]] + [tu["eval_dropout_off"]])
    checks.append(exact_check(checks_eval, 1.0, "t3_eval_dropout_off"))
    tests.append(("t3_tuned_fix_chance", tf["task_b_main"] - line, None))
    tests.append(("t3_tuned_whole_vs_fix", tw["task_b_main"] - tf["task_b_main"], None))
    widths = re.split(r"[^0-9]+", str(first["widths"]).strip("()[] -"))  # "8-16" or "(8, 16)"
    aux_of = lambda setup: tu[tu["setup"] == setup].groupby("lr")
    lr_aux = float(aux_of("backbone_only")["val_aux"].mean().idxmax())
    ta = tu[(tu["setup"] == "backbone_only") & (tu["lr"] == lr_aux)].set_index("seed")
    pw = tu[tu["setup"] == "whole_model"].pivot(index="seed", columns="lr", values="task_b_main")
    pf = tu[tu["setup"] == "backbone_only"].pivot(index="seed", columns="lr", values="task_b_main")
    same = {lr: ci(pw[lr] - pf[lr]) for lr in grid if lr in pf and lr in pw}  # whole model - fix, same rate
    out.update(t3_n_features=int(widths[-1]), t3_p_drop_pct=100 * P_DROP, t3_chance_line=line,
               t3_fix_ci=ci(main("backbone_only")), t3_fix_seeds_below=int((main("backbone_only") <= line).sum()),
               t3_lr_aux=lr_aux, t3_tuned_aux=ci(ta["task_b_aux"]),
               t3_tuned_aux_vs_whole=ci(ta["task_b_aux"] - tw["task_b_main"]),
               t3_same_rate_low_lr=min(same), t3_same_rate_low=same[min(same)],
               t3_same_rate_high_lr=max(same), t3_same_rate_high=same[max(same)],
               t3_same_rate_min=min(x.mean for x in same.values()),
               t3_same_rate_max=max(x.mean for x in same.values()),
               t3_loss_first_fixed=we("backbone_only", "main_loss_first").mean(),
               t3_loss_last_fixed=we("backbone_only", "main_loss_last").mean(),
               t3_loss_last_whole=we("whole_model", "main_loss_last").mean(),
               t3_lr_whole=lr_w, t3_lr_fixed=lr_f,
               t3_lr_interior=bool(all(grid[0] < x < grid[-1] for x in (lr_w, lr_f))),
               t3_lr_runline=float(we("whole_model", "lr").iloc[0]), t3_n_lrs=len(grid), t3_lr_min=grid[0],
               t3_lr_max=grid[-1], t3_tuned_steps=int(tu["steps"].iloc[0]),
               **spread("t3_tuned_main_whole", tw["task_b_main"]), **spread("t3_tuned_main_fixed", tf["task_b_main"]),
               t3_tuned_fixed_ci=ci(tf["task_b_main"]),
               t3_tuned_gain_fixed=ci(tf["task_b_main"] - tf["task_b_main_half"]),
               t3_tuned_gain_whole=ci(tw["task_b_main"] - tw["task_b_main_half"]),
               t3_tuned_loss_last_fixed=tf["main_loss_last"].mean(), t3_tuned_loss_last_whole=tw["main_loss_last"].mean(),
               t3_tuned_aux_fixed=tf["task_b_aux"].mean(),
               t3_aux_vs_fix_main=ci(ta["task_b_aux"] - tf["task_b_main"]),  # each at its own chosen rate
               t3_aux_vs_fix_main_same_rate=ci(tf["task_b_aux"] - tf["task_b_main"]),  # the fix's rate, one run
               t3_aux_weight=AUX_WEIGHT)
    # trap 1 at tuned rates (its pinned partner: trap 3's whole-model sweep), trap 3's dropout mechanism
    tuned1, price_tuned = _tuned_trap1_findings(df, tu, lr_w, tw)
    out.update(tuned1)
    tests.insert(0, ("t1_tuned_price", price_tuned, None))
    mech, growth_raw, std_vs_raw = _dropout_mechanism_findings(df, tu, lr_f)
    out.update(mech)
    tests += [("t3d_growth_raw", growth_raw, None), ("t3d_std_vs_raw", std_vs_raw, None)]
    # trap 4: train mode minus eval mode on the same batches; the held-out set after the pass minus before
    t4 = df[df["trap"] == "sorted_batches"]
    fr = sorted(t4["sorted_fraction"].unique())
    case_of = dict(zip(t4["sorted_fraction"], t4["case"]))
    sb = lambda p, q: v("sorted_batches", case_of[p], q)
    t4d = lambda p: sb(p, "module_train_accuracy") - sb(p, "module_eval_accuracy")
    curve = [sb(p, "module_train_accuracy").mean() for p in fr]
    flagged = [p for p in fr if sb(p, "sorted_lint").mean() > 0.5]
    src = df.groupby("seed")["source_task_a_accuracy"].first()
    tests.append(("t4_after", sb(fr[-1], "module_eval_accuracy_after_pass") - src, TOL_AFTER))  # same images
    tests.append(("t4_first_flagged", t4d(min(flagged)) if flagged else pd.Series(dtype=float), None))
    out.update(t4_eval_shuffled=sb(fr[0], "module_eval_accuracy").mean(),
               t4_eval_sorted=sb(fr[-1], "module_eval_accuracy").mean(),
               t4_train_shuffled=curve[0], t4_train_half=curve[len(fr) // 2], t4_half=float(fr[len(fr) // 2]),
               **spread("t4_train_sorted", sb(fr[-1], "module_train_accuracy")),
               t4_monotone=bool(all(bool((sb(q, "module_train_accuracy") <= sb(p, "module_train_accuracy")).all())
                                    for p, q in zip(fr, fr[1:]))),
               t4_first_flagged=float(min(flagged)) if flagged else float("nan"),
               t4_dep_first_flagged=sb(min(flagged), "label_dependence").mean() if flagged else float("nan"),
               t4_dep_shuffled=sb(fr[0], "label_dependence").mean(),
               t4_shuffled_clean=bool((sb(fr[0], "sorted_lint") == 0).all()),
               t4_flagged_every_seed=bool(bool(flagged) and (sb(min(flagged), "sorted_lint") == 1).all()),
               t4_after_sorted=sb(fr[-1], "module_eval_accuracy_after_pass").mean(),
               t4_train_vs_eval_shuffled=ci(t4d(fr[0])), t4_train_vs_eval_half=ci(t4d(fr[len(fr) // 2])),
               t4_train_vs_eval_sorted=ci(t4d(fr[-1])), t4_lint_max_dependence=LINT_MAX_DEPENDENCE,
               t4_tol_after=TOL_AFTER)
    # trap 5's training arm: batch statistics minus pinned (the reference), per training batch
    bt, below = _batch_training_findings(df, src)
    out.update(bt)
    tests += [(f"t5t_reest_b{b}", d, None) for b, d in below["reest"].items()]
    # trap 6: trained on shuffled or class-sorted batches
    st = lambda case, q: v("sorted_training", case, q)
    tests.append(("t6_meter_gap", st("class_sorted", "train_meter_accuracy")
                  - st("class_sorted", "heldout_eval_accuracy"), TOL_TIE))
    out.update(t6_meter_shuffled=st("shuffled", "train_meter_accuracy").mean(),
               t6_meter_sorted=st("class_sorted", "train_meter_accuracy").mean(),
               t6_eval_shuffled=st("shuffled", "heldout_eval_accuracy").mean(),
               **spread("t6_eval_sorted", st("class_sorted", "heldout_eval_accuracy")),
               t6_batch_stats_sorted=st("class_sorted", "heldout_batch_stats_accuracy").mean(),
               t6_gap_shuffled=ci(st("shuffled", "train_meter_accuracy") - st("shuffled", "heldout_eval_accuracy")),
               t6_sorted_vs_shuffled=ci(st("class_sorted", "heldout_eval_accuracy")
                                        - st("shuffled", "heldout_eval_accuracy")),
               t6_tie_margin=TOL_TIE)
    # the family: every test above and the two safe-batch rules
    family = Family(m=len(tests) + len(RULES), alpha=ALPHA)
    words = lambda key: CLAIMS["t5t_reest" if key.startswith("t5t_reest_b") else key][1]
    decided = [decide(d, key, margin=margin, family=family, higher=words(key)[0], lower=words(key)[1])
               for key, d, margin in tests]
    # trap 5 at inference: train mode minus eval mode per batch; the safe batch by one-sided tests at the family's level
    t5 = df[df["trap"] == "tiny_batch"]
    bs = sorted(int(b) for b in t5["device_batch_size"].unique())
    tb = lambda b, q: v("tiny_batch", f"batch_{b}", q)
    t5d = lambda b: tb(b, "module_train_accuracy") - tb(b, "module_eval_accuracy")
    train_acc = {b: tb(b, "module_train_accuracy").mean() for b in bs}
    ok = [b for b in bs if train_acc[b] >= tb(b, "module_eval_accuracy").mean() - TOL_CURVE]
    lint_off = pd.concat([tb(b, "small_batch_lint") - float(b < min_batch) for b in bs])
    claims = claims_table([*decided, *checks, exact_check(lint_off, 0.0, "t5_lint_matches")])
    has_counts = "min_values_per_channel" in t5 and not t5["min_values_per_channel"].isna().all()
    count = {b: (float(tb(b, "min_values_per_channel").iloc[0]) if has_counts else float("nan")) for b in bs}
    safe, safe_p = _safe_from(bs, t5d, family)
    out.update(t5_train={f"b{b}": float(a) for b, a in train_acc.items()}, t5_smallest=bs[0],
               t5_eval=tb(bs[0], "module_eval_accuracy").mean(),
               t5_first_ok=float(min(ok)) if ok else float("nan"),
               t5_train_vs_eval={f"b{b}": ci(t5d(b)) for b in bs}, t5_count={f"b{b}": c for b, c in count.items()},
               t5_safe_batch=safe, t5_safe_p=safe_p, t5_safe_count=count[int(safe)] if safe == safe else float("nan"),
               t5_tol=TOL_LOSS)
    tbs = below["batches"]
    rsafe, rsafe_p = _safe_from(tbs, below["reest_all"], family)
    asafe, _ = _safe_from(tbs, below["as_trained_all"], family)
    # the book's counts rule (Holm directions, printed kinds otherwise) over the training arm's rows of the family
    reest_rows = claims[claims["key"].isin([f"t5t_reest_b{b}" for b in below["reest"]])]
    out.update(t5t_safe_batch=rsafe, t5t_safe_p=rsafe_p, t5t_safe_batch_as_trained=asafe,
               t5t_threshold_word=("nowhere in the grid tried: no batch is safe by this rule," if rsafe != rsafe else
                                   "below" if rsafe < min_batch else "at" if rsafe == min_batch else "above"),
               t5t_n_below=len(below["reest"]), t5t_costs_n=count_verdicts(reest_rows, ALPHA)["lower"],
               t5t_costs_n_as_trained=sum(bool(t_interval(d, family.confidence).high < 0)
                                          for d in below["as_trained"].values()),
               family_m=family.m, family_confidence=100 * family.confidence)
    hyp = (claims.set_index("key")["verdict"].get("t3d_growth_raw") == "cost grows with the rate"
           and claims.set_index("key")["verdict"].get("t3d_std_vs_raw") == "standardized costs less")
    out.update(t3d_hypothesis=bool(hyp), t3d_hypothesis_words=hypothesis_words(
        claims.set_index("key")["verdict"]["t3d_growth_raw"], claims.set_index("key")["verdict"]["t3d_std_vs_raw"]),
        stage1_lr=STAGE1_LR, t5t_reest_batches=REESTIMATE_BATCHES)
    numbers = Numbers(**{k: (float(x) if isinstance(x, (np.floating, np.integer)) else
                             bool(x) if isinstance(x, np.bool_) else x) for k, x in out.items()})
    return Findings(claims=claims, numbers=numbers)


def _tuned_trap1_findings(df: pd.DataFrame, tu: pd.DataFrame, lr_pinned: float, tw: pd.DataFrame
                          ) -> tuple[dict, pd.Series]:
    """Trap 1 at tuned rates: the drifting head (``train_call_tuned``) at its validation-chosen rate against the
    pinned one (trap 3's ``whole_model`` sweep, at its own chosen rate ``lr_pinned``; rows ``tw`` by seed).
    Returns its numbers and the per-seed test difference drifting minus pinned (the claim ``t1_tuned_price``)."""
    dr = df[df["trap"] == "train_call_tuned"]
    if dr.empty:
        raise KeyError("no rows of trap='train_call_tuned' (trap 1's learning-rate sweep)")
    lr_d = float(dr.groupby("lr")["val_main"].mean().idxmax())  # ties: the smaller rate (idxmax's first)
    td = dr[dr["lr"] == lr_d].set_index("seed")
    grid = sorted(float(x) for x in dr["lr"].unique())
    price = (td["task_b_main"] - tw["task_b_main"]).dropna()  # drifting minus pinned
    pw = tu[(tu["setup"] == "whole_model") & (tu["lr"] == lr_d)].set_index("seed")["task_b_main"]
    same = t_interval((td["task_b_main"] - pw).dropna()) if len(pw) else Interval(*(float("nan"),) * 3, 0)
    sp = lambda name, s: {name: float(s.mean()), f"{name}_min": float(s.min()), f"{name}_max": float(s.max())}
    half = (td["task_b_main_half"] - tw["task_b_main_half"]).dropna()
    return dict(t1_tuned_lr_drifting=lr_d, t1_tuned_lr_pinned=lr_pinned,
                t1_tuned_lr_interior=bool(grid[0] < lr_d < grid[-1]), t1_tuned_n_lrs=len(grid),
                t1_tuned_lr_min=grid[0], t1_tuned_lr_max=grid[-1],
                **sp("t1_tuned_b_drifting", td["task_b_main"]), **sp("t1_tuned_b_pinned", tw["task_b_main"]),
                t1_tuned_price_b_pos_seeds=int((price > 0).sum()), t1_tuned_price_b_neg_seeds=int((price < 0).sum()),
                t1_tuned_price_b_same_rate=same,
                t1_tuned_gain_drifting=t_interval(td["task_b_main"] - td["task_b_main_half"]),
                t1_tuned_loss_last_drifting=float(td["main_loss_last"].mean()),
                t1_tuned_loss_last_pinned=float(tw["main_loss_last"].mean()),
                t1_tuned_gain_pinned=t_interval(tw["task_b_main"] - tw["task_b_main_half"]),
                t1_tuned_price_b_half=t_interval(half),
                t1_tuned_price_change=t_interval((price - half).dropna())), price


def _pkey(p: float) -> str:
    """A dropout rate as a glue-safe key: 0.1 -> ``p10``, 0 -> ``off``."""
    return "off" if p == 0 else f"p{round(p * 100):02d}"


def _dropout_mechanism_findings(df: pd.DataFrame, tu: pd.DataFrame, lr_f: float) -> tuple[dict, pd.Series, pd.Series]:
    """Trap 3's dropout mechanism (``dropout_mechanism`` rows, referee ch2c N5), paired within seed.

    Per feature kind (``raw``, ``std``) and dropout rate p, the main head's test accuracy of the fix (``t3d_acc``,
    keys ``<kind>_p10`` ..., ``<kind>_off`` for dropout pinned off) and dropout's effect ``t3d_effect`` = fix at p
    minus fix with dropout off (negative: dropout costs), both at the kind's rate (mean [95% interval] over seeds).
    Raw features run at the fix's rate chosen in ``whole_eval_tuned`` (``lr_f``; its p = :data:`P_DROP` run and its
    dropout-off partner, the whole-model run at ``lr_f``, are taken from ``tu``); standardized ones at the rate the
    standardized fix (p = :data:`P_DROP`) chose on validation over its grid (``t3d_lr_std``; ``t3d_std_lr_interior``:
    not at an end of that grid). ``t3d_std_vs_raw_at``: per p, standardized effect minus raw effect;
    ``t3d_growth_std``: the standardized effect at the highest p minus at the lowest. ``t3d_rel_effect``: per kind,
    the effect at the page's p as a share of the same kind's no-dropout accuracy (per seed), and
    ``t3d_rel_std_vs_raw`` standardized minus raw share: standardizing also raises the no-dropout head, so the
    absolute effects alone could shrink by scale. Returns the numbers and the two claims' per-seed differences:
    the raw effect at the highest p minus at the lowest (``t3d_growth_raw``) and, at the page's p, standardized
    minus raw effect (``t3d_std_vs_raw``). Raises ``KeyError`` when rows are missing.
    """
    dm = df[df["trap"] == "dropout_mechanism"]
    if dm.empty:
        raise KeyError("no rows of trap='dropout_mechanism' (trap 3's dropout mechanism)")
    parsed = dm["case"].map(parse_dropout_case)
    dm = dm.assign(kind=parsed.str[0], p=parsed.str[1])
    std_fix = dm[(dm["kind"] == "std") & (dm["p"] == P_DROP)]
    grid = sorted(float(x) for x in std_fix["lr"].unique())
    lr_s = float(std_fix.groupby("lr")["val_main"].mean().idxmax())

    def acc(kind, p):
        if kind == "raw" and p == P_DROP:
            rows = tu[(tu["setup"] == "backbone_only") & (tu["lr"] == lr_f)]
        elif kind == "raw" and p == 0:
            rows = tu[(tu["setup"] == "whole_model") & (tu["lr"] == lr_f)]  # the fix with dropout off, exactly
        else:
            rows = dm[(dm["kind"] == kind) & (dm["p"] == p) & (dm["lr"] == (lr_f if kind == "raw" else lr_s))]
        if rows.empty:
            raise KeyError(f"no dropout_mechanism rows for kind={kind!r}, p={p:g}")
        return rows.set_index("seed")["task_b_main"].astype(float)

    ps = sorted(float(p) for p in dm.loc[dm["p"] > 0, "p"].unique())
    ps = sorted(set(ps) | {P_DROP})
    effect = {(k, p): acc(k, p) - acc(k, 0) for k in FEATURE_KINDS for p in ps}
    growth = {k: effect[(k, ps[-1])] - effect[(k, ps[0])] for k in FEATURE_KINDS}
    svr = {p: effect[("std", p)] - effect[("raw", p)] for p in ps}
    rel = {k: effect[(k, P_DROP)] / acc(k, 0) for k in FEATURE_KINDS}
    return dict(t3d_rel_effect={k: t_interval(x) for k, x in rel.items()},
                t3d_rel_std_vs_raw=t_interval(rel["std"] - rel["raw"]),
                t3d_ps=", ".join(f"{p:g}" for p in ps), t3d_p_low=ps[0], t3d_p_high=ps[-1], t3d_p_page=P_DROP,
                t3d_lr_raw=lr_f, t3d_lr_std=lr_s, t3d_std_n_lrs=len(grid),
                t3d_std_lr_interior=bool(grid[0] < lr_s < grid[-1]),
                t3d_acc={f"{k}_{_pkey(p)}": float(acc(k, p).mean()) for k in FEATURE_KINDS for p in [0.0] + ps},
                t3d_effect={f"{k}_{_pkey(p)}": t_interval(x) for (k, p), x in effect.items()},
                t3d_std_vs_raw_at={_pkey(p): t_interval(x) for p, x in svr.items()},
                t3d_growth_std=t_interval(growth["std"])), growth["raw"], svr[P_DROP]


def hypothesis_words(growth: str, std_vs_raw: str) -> str:
    """Trap 3's dropout hypothesis read from its two claims' verdicts (``t3d_growth_raw``, ``t3d_std_vs_raw``): a
    whole sentence, capitalized, with its full stop. The hypothesis needs both directions shown ("cost grows with
    the rate", "standardized costs less"); the sentence says which part is missing otherwise."""
    parts = []
    if growth != "cost grows with the rate":
        parts.append("these data do not show that the dropout cost grows with the dropout rate on raw features")
    if std_vs_raw != "standardized costs less":
        parts.append("these data do not show that standardizing the features shrinks the dropout cost")
    if not parts:
        return ("The data are consistent with it: the cost grows with the dropout rate on raw features, and "
                "standardizing the features shrinks it. They do not single it out: most accounts of dropout predict "
                "growth with the rate, and standardizing changes offset and scale together.")
    return "It is not shown as stated: " + "; ".join(parts) + "."


def _batch_training_findings(df: pd.DataFrame, src: pd.Series) -> tuple[dict, dict]:
    """Trap 5's training arm (``batch_training``), per training batch m (paired per seed, same batches).

    Two comparisons of held-out eval-mode accuracy, batch statistics minus pinned (the reference): ``t5t_bs_vs_pinned``
    *as trained* (each arm with the running statistics it ended with: the pinned arm's are task A's, stale for its
    new weights) and ``t5t_reest_bs_vs_pinned`` *after re-estimating* each arm's running statistics with the weights
    fixed (which leaves only what training did to the weights; referee ch2c N1), descriptive 95% intervals.
    ``t5t_change``: change from the source network (``src``, by seed) per arm, keys ``<mode>_b<m>`` (as trained)
    and ``<mode>_reest_b<m>``; ``t5t_reest_gain``: the batch-statistics arm re-estimated minus as trained;
    ``t5t_samples``: samples seen per run at m (the step count is fixed, so the sample count grows with m);
    ``t5t_pinned_reest_below_n``: batches where the pinned arm, re-estimated, has a 95% interval below the source.
    Returns the numbers and, for :func:`findings`, ``{"batches", "reest": {m: diff} below min_batch, "as_trained":
    {m: diff} below min_batch, "reest_all": m -> diff, "as_trained_all": m -> diff}``."""
    bt = df[df["trap"] == "batch_training"]
    if bt.empty:
        raise KeyError("no rows of trap='batch_training' (trap 5's training arm)")
    bs = sorted(int(b) for b in bt["device_batch_size"].unique())
    q = lambda mode, b, col: _values(df, "batch_training", f"{mode}_b{b}", col)
    ev, re_ = "heldout_eval_accuracy", "heldout_reestimated_accuracy"
    diff = lambda b, col: q("batch_stats", b, col) - q("pinned", b, col)
    min_batch = int(df["min_batch"].iloc[0])
    below = [b for b in bs if b < min_batch]
    change = lambda mode, b, col: t_interval(q(mode, b, col) - src.reindex(q(mode, b, col).index))
    steps = int(bt["steps"].iloc[0])
    nums = dict(t5t_steps=steps, t5t_largest=bs[-1], t5t_smallest=bs[0],
                t5t_samples={f"b{b}": steps * b for b in bs},
                t5t_eval={f"{mode}_b{b}": float(q(mode, b, ev).mean()) for mode in BATCH_TRAINING_MODES for b in bs},
                t5t_reest={f"{mode}_b{b}": float(q(mode, b, re_).mean()) for mode in BATCH_TRAINING_MODES for b in bs},
                t5t_bs_vs_pinned={f"b{b}": t_interval(diff(b, ev)) for b in bs},
                t5t_reest_bs_vs_pinned={f"b{b}": t_interval(diff(b, re_)) for b in bs},
                t5t_change={**{f"{mode}_b{b}": change(mode, b, ev) for mode in BATCH_TRAINING_MODES for b in bs},
                            **{f"{mode}_reest_b{b}": change(mode, b, re_) for mode in BATCH_TRAINING_MODES
                               for b in bs}},
                t5t_reest_gain={f"b{b}": t_interval(q("batch_stats", b, re_) - q("batch_stats", b, ev)) for b in bs},
                t5t_loss_last={f"{mode}_b{b}": float(q(mode, b, "train_loss_last").mean())
                               for mode in BATCH_TRAINING_MODES for b in bs},
                t5t_pinned_reest_below_n=sum(bool(change("pinned", b, re_).high < 0) for b in bs))
    return nums, dict(batches=bs, reest={b: diff(b, re_) for b in below}, as_trained={b: diff(b, ev) for b in below},
                      reest_all=lambda b: diff(b, re_), as_trained_all=lambda b: diff(b, ev))


def _ci_text(iv) -> str:
    return f"{iv.mean:+.3f} [{iv.low:+.3f}, {iv.high:+.3f}]"


def batch_training_table(f: Findings) -> pd.DataFrame:
    """Trap 5's training arm as a display table (plain text), one row per per-device training batch m.

    Columns: samples seen (steps x m); held-out eval-mode accuracy of each mode as trained and after re-estimating
    its running statistics with the weights fixed (means over seeds); the paired difference batch statistics minus
    pinned as trained and re-estimated (mean [95% interval]; the re-estimated one is the headline, referee ch2c N1);
    each mode's re-estimated change from the source network; the last epoch's training loss of each mode (nats;
    measured in the mode it trained in). Indexed by ``training batch``.
    """
    bs = sorted(int(k[1:]) for k in f.t5t_bs_vs_pinned)
    rows = [{"training batch": b, "samples seen": f"{f.t5t_samples[f'b{b}']:d}",
             "as trained (batch stats / pinned)": f"{f.t5t_eval[f'batch_stats_b{b}']:.3f} / "
                                                  f"{f.t5t_eval[f'pinned_b{b}']:.3f}",
             "re-estimated (batch stats / pinned)": f"{f.t5t_reest[f'batch_stats_b{b}']:.3f} / "
                                                    f"{f.t5t_reest[f'pinned_b{b}']:.3f}",
             "batch stats minus pinned, as trained": _ci_text(f.t5t_bs_vs_pinned[f"b{b}"]),
             "batch stats minus pinned, re-estimated": _ci_text(f.t5t_reest_bs_vs_pinned[f"b{b}"]),
             "batch stats re-estimated minus source": _ci_text(f.t5t_change[f"batch_stats_reest_b{b}"]),
             "pinned re-estimated minus source": _ci_text(f.t5t_change[f"pinned_reest_b{b}"]),
             "last-epoch loss (batch stats / pinned)": f"{f.t5t_loss_last[f'batch_stats_b{b}']:.2f} / "
                                                       f"{f.t5t_loss_last[f'pinned_b{b}']:.2f}"} for b in bs]
    return pd.DataFrame(rows).set_index("training batch")


def dropout_mechanism_table(f: Findings) -> pd.DataFrame:
    """Trap 3's dropout mechanism as a display table (plain text), one row per head dropout rate p.

    Columns: the fix's main-head accuracy at p on raw / standardized features (means over seeds), dropout's effect
    (fix at p minus fix with dropout off) on raw and on standardized features, and standardized effect minus raw
    effect (mean [95% interval], paired within seed). Indexed by ``dropout p``.
    """
    ps = [float(x) for x in f.t3d_ps.split(", ")]
    rows = [{"dropout p": p, "accuracy (raw / standardized)": f"{f.t3d_acc[f'raw_{_pkey(p)}']:.3f} / "
                                                              f"{f.t3d_acc[f'std_{_pkey(p)}']:.3f}",
             "raw features": _ci_text(f.t3d_effect[f"raw_{_pkey(p)}"]),
             "standardized features": _ci_text(f.t3d_effect[f"std_{_pkey(p)}"]),
             "standardized minus raw": _ci_text(f.t3d_std_vs_raw_at[_pkey(p)])} for p in ps]
    return pd.DataFrame(rows).set_index("dropout p")


def multiplicity_table(f: Findings) -> pd.DataFrame:
    """The chapter's family (its claims that are tests, then :data:`RULES`) as a display table (plain text).

    Columns: what is compared (condition minus reference), the estimate with its family (Bonferroni) interval, the
    two-sided p, Holm's adjusted p over the claims table, and the verdict (:func:`bnstudy.inference.decide`); for a
    rule, its safe batch and its intersection-union p (one-sided tests at the family's level). Indexed by
    ``comparison``.
    """
    fmt = lambda p: "-" if p != p else "< 0.001" if p < 0.001 else f"{p:.3f}"
    rows = []
    for r in f.claims.itertuples(index=False):
        if r.kind in ("exact", "not exact"):
            continue
        stem = "t5t_reest" if r.key.startswith("t5t_reest_b") else r.key
        what = CLAIMS[stem][0].format(m=r.key[len("t5t_reest_b"):]) if stem == "t5t_reest" else CLAIMS[stem][0]
        est = (f"{r.estimate:+.3f}" if r.low != r.low else f"{r.estimate:+.3f} [{r.low:+.3f}, {r.high:+.3f}]")
        rows.append({"comparison": what, "estimate [family interval]": est, "p": fmt(r.p),
                     "Holm p": fmt(r.p_adjusted), "verdict": r.verdict})
    for key, what in RULES.items():
        b, p = getattr(f, key), getattr(f, "t5_safe_p" if key == "t5_safe_batch" else "t5t_safe_p")
        rows.append({"comparison": what, "estimate [family interval]": "-" if b != b else f"safe batch {b:.0f}",
                     "p": fmt(p), "Holm p": "-", "verdict": "-"})
    return pd.DataFrame(rows).set_index("comparison")


def checklist_table(f: Findings) -> pd.DataFrame:
    """The chapter's checklist (one row per trap: what the audit reported in this run, and the fix) from ``f``.

    A DataFrame indexed by ``trap``, with columns ``what the audit reported (this run)`` and ``fix``; plain text (no
    Markdown), for :func:`bnstudy.report.glue_table`. Means over seeds; ``[a, b]`` a 95% interval over seeds, or the
    family's interval beside a verdict; "per-seed largest" values are averaged over seeds with the range in
    brackets. Referee ch2 item 6.
    """
    ci = lambda iv: f"{iv.mean:.3f} [{iv.low:.3f}, {iv.high:.3f}]"
    cl = lambda key: (lambda r: f"{r['estimate']:+.3f} [{r['low']:+.3f}, {r['high']:+.3f}], {r['verdict']}")(
        f.claim(key))
    small = f"t5t_reest_b{f.t5t_smallest}"
    t5t = (f"batch statistics minus pinned at batch {f.t5t_smallest}: {cl(small)}"
           if small in set(f.claims["key"]) else f"no training batch below {f.min_batch}")
    rows = [
        ("1. model.train() every epoch undoes backbone.eval()",
         f"frozen_bn_in_train_mode on every backbone BN; BN in train mode for {f.t1_bn_train:.0%} of calls; running "
         f"means moved by a per-seed largest {f.t1_mean_shift:.2f} former running SDs (range {f.t1_mean_shift_min:.2f}"
         f"-{f.t1_mean_shift_max:.2f}); num_batches_tracked +{f.t1_nbt:.0f}; largest change of any backbone weight "
         f"{f.t1_param:.0f}; probe logits moved by a per-seed largest {f.t1_probe:.2f} (range {f.t1_probe_min:.2f}-"
         f"{f.t1_probe_max:.2f}); task A {f.t1_task_a_before:.3f} to {f.t1_task_a_after:.3f}",
         f"pin_eval(backbone) or freeze_batchnorm(backbone): every buffer and probe logit changed by "
         f"{f.t1_probe_pinned:.0f}"),
        ("2. no_grad teacher or validation pass left in train mode",
         f"train_mode_under_no_grad on every BN; {f.t2_nbt:.0f} batches moved running means by a per-seed largest "
         f"{f.t2_mean_shift:.2f} former running SDs (range {f.t2_mean_shift_min:.2f}-{f.t2_mean_shift_max:.2f}); the "
         f"same images' logits moved by a per-seed largest {f.t2_logit_mates:.2f} (range {f.t2_logit_mates_min:.2f}-"
         f"{f.t2_logit_mates_max:.2f}) with other batch mates",
         f"eval() before any forward pass without a loss: buffer change {f.t2_buffer_eval:.0f}, logits "
         f"bit-identical whatever the batch mates"),
        ("3. whole model in eval: dropout off, forward changes",
         f"forward_changes_with_mode (AuxOutputs in train, a tensor in eval); dropout_off_in_training on head.0; "
         f"auxiliary head moved {f.t3_aux_change_whole:.0f} (in the loss in {f.t3_aux_loss_whole:.0%} of steps)",
         f"pin only the frozen part (pin_eval(backbone) or pin_norm_eval): dropout on in {f.t3_dropout_fixed:.0%} of "
         f"calls, auxiliary loss in {f.t3_aux_loss_fixed:.0%} of steps. Main head with dropout at lr "
         f"{f.t3_lr_runline:g}: {ci(f.t3_fix_ci)}, against 1.5 times chance {f.verdict('t3_fix_chance')}. At rates "
         f"chosen on validation data: {ci(f.t3_tuned_fixed_ci)} with dropout against {f.t3_tuned_main_whole:.3f} "
         f"without, whole model minus fix {cl('t3_tuned_whole_vs_fix')}; the same run's auxiliary head (no dropout) "
         f"{ci(f.t3_tuned_aux)}. Tune the head's rate and decide whether to keep the dropout"),
        ("4. label-sorted batches",
         f"label_sorted_batches from a one-class share of {f.t4_first_flagged:.2f} on the grid tried (label "
         f"dependence {f.t4_dep_first_flagged:.3f}, lint threshold {f.t4_lint_max_dependence:g}); train-mode accuracy "
         f"{f.t4_train_shuffled:.3f} shuffled, {f.t4_train_sorted:.3f} sorted; eval mode on the same class-sorted "
         f"batches {f.t4_eval_sorted:.3f}",
         "shuffle the loader (or sample batches at random from every class)"),
        ("5. batches of 1 and 2",
         f"single_value_per_channel / single_sample_batch at 1, small_batch below {f.min_batch}; train-mode "
         f"inference: accuracy {f.t5_train['b1']:.3f} at batch 1 against {f.t5_eval:.3f} in eval mode, loss below "
         f"{f.t5_tol:.2f} from batch {f.t5_safe_batch:.0f}; training {f.t5t_steps} more steps, batch statistics "
         f"against pinned, both re-estimated afterwards: {t5t}; loss below {f.t5_tol:.2f} from batch "
         f"{f.t5t_safe_batch:.0f}; as trained, the pinned network's stale statistics cost it "
         f"{ci(f.t5t_change[f'pinned_b{f.t5t_smallest}'])} against the source at batch {f.t5t_smallest}; "
         f"last_batch_single for 17 samples at batch size 16",
         "drop_last=True; when the per-device batch is small, pin BN in eval (pin_eval or FrozenBatchNorm) for "
         "training, then re-estimate its statistics with the weights fixed (bnstudy.update_bn_stats) before "
         "evaluating; after a domain shift, the same: re-estimate, then freeze"),
        ("6. training on class-sorted batches",
         f"label_sorted_batches from lint_loader; held-out accuracy {f.t6_eval_sorted:.3f} against "
         f"{f.t6_eval_shuffled:.3f} trained on shuffled batches; training meter {f.t6_meter_sorted:.3f}; meter minus "
         f"held-out {cl('t6_meter_gap')}",
         "shuffle"),
    ]
    return pd.DataFrame(rows, columns=["trap", "what the audit reported (this run)", "fix"]).set_index("trap")


# --- the page's sentences, chosen by the findings ------------------------------------------------------------------
# Every sentence of the page that states an outcome is one of these (glued by the notebook with glue_md), so that it
# stays true for any rows: the words follow the numbers and verdicts, never the other way round (issue 25).

#: What the page prints for a number that does not exist (a safe batch that no batch reached, a share never flagged).
NA = "n/a"


def _isnan(x) -> bool:
    return x is None or (isinstance(x, (float, np.floating)) and x != x)


def _change(before: float, after: float, spec: str = ".3f") -> str:
    """How a quantity moved, in words that follow its sign: "fell from a to b", "rose from a to b", "stayed at a"."""
    a, b = format(before, spec), format(after, spec)
    if a == b:
        return f"stayed at {a}"
    return f"{'fell' if after < before else 'rose'} from {a} to {b}"


def _claim_ci(f: "Findings", key: str, clip: tuple = (-1.0, 1.0)) -> str:
    """A claim's estimate and family interval (cut to ``clip``, what a difference of accuracies allows) and its bold
    verdict: ``"+0.123 (+0.010 to +0.236): **drifting higher**"``; without an interval, the estimate and verdict."""
    r = f.claim(key)
    iv = Interval(float(r["estimate"]), float(r["low"]), float(r["high"]), int(r["n"])).clipped(*clip)
    if _isnan(iv.low):
        return f"{iv.mean:+.3f}: **{r['verdict']}**"
    return f"{iv.mean:+.3f} ({iv.low:+.3f} to {iv.high:+.3f}): **{r['verdict']}**"


def _kind(f: "Findings", key: str) -> str:
    return str(f.claim(key)["kind"])


def trap1_sentence(f: "Findings") -> str:
    """Trap 1 in one sentence: whether ``model.train()`` undid ``backbone.eval()`` (BatchNorm in train mode in some
    share of its calls), what task A did, and whether any backbone weight moved."""
    weights = ("although no backbone weight moved" if f.t1_param == 0 else
               f"and the backbone's weights moved by up to {f.t1_param:.3g}")
    if f.t1_bn_train > 0:
        return (f"`model.backbone.eval()` is undone by the training loop's next `model.train()`: the backbone's "
                f"BatchNorm layers ran in train mode in {f.t1_bn_train:.0%} of their calls and rewrote their running "
                f"statistics, and task A {_change(f.t1_task_a_before, f.t1_task_a_after)}, {weights}.")
    return (f"Here `model.backbone.eval()` survived the training loop's `model.train()` (BatchNorm in train mode in "
            f"none of its calls), and task A {_change(f.t1_task_a_before, f.t1_task_a_after)}, {weights}.")


def trap2_sentence(f: "Findings") -> str:
    """Trap 2 in one sentence: a train-mode teacher under ``no_grad``, its statistics and its task-A accuracy."""
    if f.t2_nbt > 0:
        return (f"A teacher left in train mode under `torch.no_grad()` rewrote its running statistics in "
                f"{f.t2_nbt:.0f} batches, and its task-A accuracy {_change(f.t2_task_a_before, f.t2_task_a_after)}.")
    return (f"A teacher left in train mode under `torch.no_grad()` did not rewrite its running statistics here, and "
            f"its task-A accuracy {_change(f.t2_task_a_before, f.t2_task_a_after)}.")


_T3_WORDS = {
    "higher": "the whole-model run's main head scores higher than the fix's",
    "lower": "the fix's main head scores higher than the whole-model run's",
    "equivalent": "the two main heads are equivalent",
    "not decided": "these seeds do not tell the two main heads apart",
    "too few seeds": "there are too few seeds to compare the two main heads",
}


def trap3_sentence(f: "Findings") -> str:
    """Trap 3 in one sentence: what the whole model in eval mode switches off, and the tuned main heads' verdict."""
    off = f.t3_aux_loss_whole < f.t3_aux_loss_fixed or f.t3_dropout_whole < f.t3_dropout_fixed
    lead = ("Putting the whole model in eval mode instead switches off what is being trained" if off else
            "Putting the whole model in eval mode instead switched off nothing that is being trained here")
    return (f"{lead}: the auxiliary loss "
            f"entered {f.t3_aux_loss_whole:.0%} of the steps and dropout {f.t3_dropout_whole:.0%} of its calls, "
            f"against {f.t3_aux_loss_fixed:.0%} and {f.t3_dropout_fixed:.0%} with only the backbone pinned; at "
            f"learning rates tuned on validation data {_T3_WORDS[_kind(f, 't3_tuned_whole_vs_fix')]} (whole model "
            f"minus the fix {_claim_ci(f, 't3_tuned_whole_vs_fix')}).")


_T4_WORDS = {"lower": "Batches that follow the label cost train mode accuracy",
             "higher": "Batches that follow the label raise train-mode accuracy here",
             "equivalent": "Batches that follow the label leave train-mode accuracy within the margin",
             "not decided": "Whether batches that follow the label cost train-mode accuracy is not shown here",
             "too few seeds": "Whether batches that follow the label cost train-mode accuracy needs more seeds"}
_T6_WORDS = {"higher": "overstated", "lower": "understated", "equivalent": "matched",
             "not decided": "is not shown to differ from", "too few seeds": "cannot be compared with"}


def trap4_sentence(f: "Findings") -> str:
    """Trap 4 in one sentence: train mode minus eval mode on the same batches where the loader lint first fires."""
    if _isnan(f.t4_first_flagged):
        return "`lint_loader` flagged none of the label-sorted loaders tried."
    return (f"{_T4_WORDS[_kind(f, 't4_first_flagged')]}: where `lint_loader` first flags the loader (a one-class share "
            f"of {f.t4_first_flagged:.2f}), train mode minus eval mode on the same batches is "
            f"{_claim_ci(f, 't4_first_flagged')}.")


def trap6_sentence(f: "Findings") -> str:
    """Trap 6 in one sentence: a network trained on class-sorted batches, held out and by its training meter."""
    return (f"A network trained on class-sorted batches reached {f.t6_eval_sorted:.3f} on held-out data, against "
            f"{f.t6_eval_shuffled:.3f} trained on shuffled ones, and its training meter "
            f"{_T6_WORDS[_kind(f, 't6_meter_gap')]} that held-out accuracy (meter minus held-out "
            f"{_claim_ci(f, 't6_meter_gap')}).")


def trap6_seed_sentence(f: "Findings") -> str:
    """Trap 6 against seed article 002's warning that the training meter "can look healthy" under class-sorted
    batches: whether these data agree, by the meter's verdict."""
    if _kind(f, "t6_meter_gap") == "higher":
        return ("That is seed article 002's warning: under class-sorted batches the training meter looked better than "
                "held-out accuracy.")
    return (f"Seed article 002 warns that the meter \"can look healthy\" under class-sorted batches; here the meter "
            f"{_T6_WORDS[_kind(f, 't6_meter_gap')]} held-out accuracy, and both stood against the "
            f"{f.t6_meter_shuffled:.3f} the meter read on shuffled batches.")


def sorted_sentence(f: "Findings") -> str:
    """Traps 4 and 6: :func:`trap4_sentence` and :func:`trap6_sentence`."""
    return f"{trap4_sentence(f)} {trap6_sentence(f)}"


def safe_batch_text(batch: float, tol: float) -> str:
    """ "loses less than 0.02 from batch 8 on", or that no batch in the grid does (a NaN safe batch)."""
    if _isnan(batch):
        return f"loses less than {tol:.2f} at no batch size tried (no batch from which every larger one does)"
    return f"loses less than {tol:.2f} from batch {batch:.0f} on"


def small_batch_sentence(f: "Findings") -> str:
    """Trap 5 in one sentence: the smallest safe batch at inference in train mode and in training."""
    where = ("" if _isnan(f.t5t_safe_batch) else
             f", {'below' if f.t5t_safe_batch < f.min_batch else 'at' if f.t5t_safe_batch == f.min_batch else 'above'}"
             f" the `small_batch` lint's threshold of {f.min_batch}")
    return (f"With BatchNorm on batch statistics at inference the network {safe_batch_text(f.t5_safe_batch, f.t5_tol)}"
            f" (at batch {f.t5_smallest} it scores {f.t5_train['b' + str(f.t5_smallest)]:.3f} against "
            f"{f.t5_eval:.3f} in eval mode), and trained further on batch statistics, then re-estimated, it "
            f"{safe_batch_text(f.t5t_safe_batch, f.t5_tol)}{where}.")


def answer(f: "Findings") -> str:
    """The answer box's outcome sentences (Markdown, one paragraph), each chosen by the findings so that it is true
    for any rows: traps 1 and 2 (:func:`trap1_sentence`, :func:`trap2_sentence`), trap 3 (:func:`trap3_sentence`),
    trap 4 (:func:`trap4_sentence`) and trap 5 (:func:`small_batch_sentence`); trap 6 is on the page."""
    return " ".join(fn(f) for fn in (trap1_sentence, trap2_sentence, trap3_sentence, trap4_sentence,
                                     small_batch_sentence))


def page_sentences(f: "Findings") -> dict:
    """Every findings-chosen sentence of the page, ``{glue key suffix: Markdown}``: the answer and one summary per
    trap (the notebook glues each as ``ch02_<key>``)."""
    return {"answer": answer(f), "t1_summary": trap1_sentence(f), "t2_summary": trap2_sentence(f),
            "t3_summary": trap3_sentence(f), "sorted_summary": sorted_sentence(f),
            "t5_summary": small_batch_sentence(f), "t5_safe_text": safe_batch_text(f.t5_safe_batch, f.t5_tol),
            "t5t_safe_text": safe_batch_text(f.t5t_safe_batch, f.t5_tol),
            "t5_safe_p_text": "n/a (no batch is safe by this rule)" if _isnan(f.t5_safe_p) else f"{f.t5_safe_p:.1e}",
            "t5_safe_count_text": (NA if _isnan(f.t5_safe_count) else
                                   f"{f.t5_safe_count:.0f} at the safe batch ({f.t5_safe_batch:.0f})"),
            "t3_tuned_whole_vs_fix_text": _claim_ci(f, "t3_tuned_whole_vs_fix"), "t4_summary": trap4_sentence(f), "t6_summary": trap6_sentence(f), "t6_seed": trap6_seed_sentence(f)}
