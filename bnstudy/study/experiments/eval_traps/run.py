"""Chapter 2: the everyday calls that undo a freeze, each caught by the audit and then fixed.

Five traps, each run on a small conv network trained on task A (stage 1 of the engine,
:func:`bnstudy.study.engine.train_source`, cached like every chapter's) or on a single BatchNorm
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

``Config`` -> :func:`run` (one row per (seed, trap, case), cached by :mod:`bnstudy.study.sweep`; this module: what is
trained) -> :func:`bnstudy.study.experiments.eval_traps.findings.findings` (a claims table from :mod:`bnstudy.study.inference`,
every verdict the page prints, and the descriptive numbers its prose cites) -> :mod:`.figures`. Here ``module_mode``
is a module's train/eval flag; "train mode" in prose means that flag, never chapter 1's freeze mode ``train_mode``.
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

from .... import audit

from ...config import Execution, SourceConfig, _Frozen, check_choice, check_float, check_int, check_seeds, \
    check_sequence, from_profile, seeds_label
from ...engine import accuracy, ensure_sources, load_source, logits_of, make_optimizer, seeded, source_version, \
    train_step
from ....freeze import pin_eval
from ...models import Classifier, ConvBackbone, make_head
from ...modes import TransferModel
from ...sweep import default_cache_dir, run_sweep
from ...tasks import BatchStream, derive_seed, eval_set, generator, make_task

NAMESPACE = "ch02_eval_traps"
#: Parameters that only change the analysis: none (every field of :class:`Config` decides runs), so a page given
#: ``rows`` (an earlier run's tables) must be given every parameter as that run was.
ANALYSIS_PARAMETERS = ()
#: Parameters this design added after rows of the release were computed, with the value those older rows were
#: computed with: rows that do not record one read as that value (bnstudy.study.report.load_rows), so a new axis
#: costs a recompute of its new cells, never a broken page (docs/chapter-code.md). Empty: none yet.
READ_DEFAULTS: dict = {}
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
AUX_WEIGHT = 0.4  # the auxiliary head's loss weight (trap 3)
P_DROP = 0.3  # the main head's dropout rate in trap 3's model (AuxHeadNet's default)
#: Trap 3's dropout mechanism (``dropout_mechanism``, referee ch2c N5): the fix's main head on ``raw`` features or on
#: ``std`` features (standardized per feature with the mean and SD of the pinned backbone's task-B features, as
#: chapter 1's standardized heads), at head dropout p (0: the dropout pinned off).
FEATURE_KINDS = ("raw", "std")
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
        """Stage 1 of ``seed`` (BatchNorm backbone, Adam at 3e-3, see :func:`bnstudy.study.engine.train_source`)."""
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
        """The engine's loop (:func:`bnstudy.study.engine.train_step`): ``model.train()`` every epoch, SGD on ``params``."""
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
        # rsqrt, not / sqrt: torch's float32 sqrt differs in the last bits between CPUs (bnstudy.study.numerics)
        shift.append(float(((m.running_mean - mu0).abs() * (var0 + m.eps).rsqrt()).max()))
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
    from the test and validation sets (chapter 1's :func:`~bnstudy.study.experiments.freeze_modes.run._feature_standardizer`),
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
        from ..freeze_modes.run import _feature_standardizer
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
    mode throughout) with :class:`bnstudy.study.tasks.BatchStream`'s sampler set to ``case``. Records the
    loop's accuracy meter over the last ``n_classes`` steps (train mode, on the batches it trained
    on, before each update), held-out accuracy in eval mode (running statistics) and, on the same
    held-out set, in train mode on shuffled batches of ``stage1_batch_size`` (batch statistics).
    """
    c, (xa, ya) = ctx.c, ctx.eval_a
    model = ctx.seeded("sorted_training_init", lambda: Classifier(
        ConvBackbone(3, c.widths, "batch", c.momentum), make_head("linear", c.widths[-1], c.n_classes)))
    stream = BatchStream(ctx.task_a, c.stage1_batch_size, generator(c.seed, "ch02", "sorted_training", case), case)
    opt = torch.optim.Adam(model.parameters(), lr=STAGE1_LR, fused=True)  # fused: engine.make_optimizer says why
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
    from ....running_stats import update_bn_stats  # local: running_stats imports nothing from here, but keep the trap self-contained

    c, (xa, ya), m = ctx.c, ctx.eval_a, ctx.c.device_batch_size
    mode = case.rsplit("_b", 1)[0]
    check_choice("mode", mode, BATCH_TRAINING_MODES)
    model = ctx.classifier()
    if mode == "pinned":
        pin_eval(model.backbone)  # flags only: every weight stays trainable
    stream = BatchStream(ctx.task_a, m, generator(c.seed, "ch02", "batch_training", m))
    opt = torch.optim.Adam(model.parameters(), lr=c.lr, fused=True)  # fused: engine.make_optimizer says why
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
    for probe outputs). Stage 1 and every case are cached (:mod:`bnstudy.study.sweep`). Two passes: every run of
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
    :func:`~bnstudy.study.experiments.freeze_modes.run.thread_check` on this chapter's network.

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
    from ...sweep import torch_threads
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
