"""Chapter 9, what is run (issue 39): BatchNorm momentum during fine-tuning, what to train, and Frankle et al.'s
BatchNorm-only training at digit scale. Three unit kinds, each cached in its own namespace; a unit is one seed's
paired comparison (every condition sees the same images in the same order). Accuracies are fractions 0..1.

Source: the book's stage 1 (:func:`bnstudy.study.engine.load_source`), a
:class:`~bnstudy.study.models.ConvBackbone` (BatchNorm momentum 0.1) and head A trained on task A. Task A's
retention is head A on the fine-tuned backbone, eval mode, on task A's held-out set.

**Part 1, momentum** (:func:`run_momentum_unit`; one unit per seed, target and batch size). The whole network
(backbone and a new head B) is fine-tuned on task B (:data:`TARGETS`) with SGD at the linear scaling rule's rate,
BatchNorm in train mode, on ``train_size`` images sampled as a shuffling loader does. A train-mode BatchNorm's output
does not depend on its running statistics, so one training run serves every momentum: :class:`StatisticsTracker`
keeps the statistics each setting would hold (``==`` a ``BatchNorm2d`` of that momentum), and the settings differ
only in the statistics used at evaluation. A budget is a checkpoint of the longest run. Settings
(:func:`momentum_settings`): ``m<value>`` per momentum (PyTorch's convention; ``m0`` keeps the source statistics),
``cma`` (``momentum=None``, counter reset), ``cma_loaded`` (counter loaded from the source) and ``kornblith``
(``min(10 / s, 0.1)``, ``s`` steps per epoch; Kornblith, Shlens & Le 2019); plus two re-estimates at each budget's
weights (:func:`bnstudy.precise_bn_statistics`): ``precise`` on ``precise_samples`` training images (Wu & Johnson
2021) and ``reference`` on ``reference_samples`` held-out images, against which :func:`statistics_error` is measured.

**Part 2, what to train** (:func:`run_train_unit`; one unit per seed, task-B classes and shift family, per rate
chunk). Task B under one shift family (:data:`SHIFTS`) with new classes or task A's (:data:`CLASSES`), trained with
Adam at every rate of ``train_lrs`` in every condition (:data:`TRAIN_CONDITIONS`): ``head`` (backbone pinned),
``head_train`` (head only, BatchNorm in train mode), ``affine_pinned`` (BatchNorm's affine + head, statistics
pinned), ``affine_train`` (the same in train mode: fastai's and Lightning's ``train_bn=True``), ``first_block``
(first block + head) and ``full``. Recorded: the trainable count and share, ``max_buffer_change`` (exactly 0 where
the statistics are pinned) and ``max_frozen_change`` (exactly 0 everywhere).

**Part 3, Frankle, Schwab & Morcos 2021** (:func:`run_frankle_unit`; one unit per seed and rate chunk). From the
seed's random initialisation, trained on task A with Adam, the output layer trained in every condition
(:data:`FRANKLE_CONDITIONS`): ``bn_affine`` (every gamma and beta), ``random_same`` (two random convolution weights
per output channel, :func:`random_masks`), ``head`` and ``all``.

The rate grids of parts 2 and 3 were widened upward after a first full run (:data:`FIRST_TRAIN_LRS`); the added
rates run in their own units on the same batches (:func:`_rate_chunks`). Smoke runs on seed 0 (part 1: 400 steps
at batch 64 on the shifted target; part 3: 150 steps at two rates) checked the pipeline before any profile was run;
nothing of parts 1 or 3 was changed after them.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F

from ....freeze import batchnorm_layers, pin_eval, pin_norm_eval
from ....running_stats import precise_bn_statistics
from ...config import Execution, SourceConfig, _Frozen, check_seeds, from_profile
from ...design import ChapterConfig, Rule
from ...engine import accuracy, build_backbone, ensure_sources, load_source, logits_of, make_optimizer, seeded
from ...models import Classifier, ConvBackbone, make_head
from ...sweep import default_cache_dir, run_sweep
from ...tasks import BatchStream, SetBatches, eval_set, generator, make_task, train_set
from ..unknown_task.run import CorruptedTask, corruption_of, shift_of

MOMENTUM_NAMESPACE = "ch09_momentum"
TRAIN_NAMESPACE = "ch09_train"
FRANKLE_NAMESPACE = "ch09_frankle"
#: The fine-tuning targets of part 1: ``(brightness, contrast)`` of task B (chapter 6's shift ``B`` at strength 0.25
#: and 1; the latter is chapter 1's shift).
TARGETS = {"close": shift_of("B", 0.25), "shifted": shift_of("B", 1.0)}
#: The shift families of part 2 (chapter 6's and 8's): brightness/contrast, extra pixel noise, blur.
SHIFTS = ("affine", "noise", "blur")
#: Part 2's task-B classes -> the :func:`bnstudy.study.tasks.make_task` tag of their templates: ``new``, task B's own;
#: ``same``, task A's (the source's classes seen through the shift).
CLASSES = {"new": "B", "same": "A"}
#: Part 2's optimizer (:func:`bnstudy.study.engine.make_optimizer`): Adam, fastai's default, so that one rate grid
#: serves parameter sets whose gradients differ in scale by orders of magnitude. SGD with momentum, tried first in a
#: 150-step smoke on seed 0, made the head-only condition diverge from a rate of 0.03 on the pinned backbone's large
#: shifted features. The grid's range was set from a 200-step smoke on seed 0 (Adam at 1e-4 to 0.1, a decade apart,
#: four of the twelve cells: the best rate was 1e-3 or 1e-2 in every condition and cell), before any profile was run.
TRAIN_OPTIMIZER = "adam"
#: Part 2's conditions (the module docstring); ``full`` is the reference of the questions.
TRAIN_CONDITIONS = ("head", "head_train", "affine_pinned", "affine_train", "first_block", "full")
#: Part 3's conditions; ``random_same`` is the reference of the question.
FRANKLE_CONDITIONS = ("bn_affine", "random_same", "head", "all")
#: Kornblith et al.'s rule: momentum ``min(KORNBLITH_STEPS / s, KORNBLITH_CAP)`` at ``s`` steps per epoch.
KORNBLITH_STEPS, KORNBLITH_CAP = 10.0, 0.1
#: Held-out images per forward pass of the reference estimate (every batch size's reference is the same images).
REF_BATCH = 256
#: The source's BatchNorm momentum (stage 1's, and the train-mode conditions' of parts 2 and 3: PyTorch's default).
SOURCE_MOMENTUM = 0.1
#: Momenta of part 1 (PyTorch's convention); both ends closed: 0 keeps the source statistics, 1 the last batch's alone
#: (1 added after a first full run chose 0.3, then the largest, in 7 of 12 tuning cells; :mod:`.claims`).
MOMENTA = (0.0, 0.001, 0.01, 0.03, 0.1, 0.3, 1.0)

#: ``quick``: the pipeline in about a minute on one core; ``full``: the page's.
PROFILES = {
    "quick": dict(seeds=2, tuning_seeds=(100,), targets=("close", "shifted"), batch_sizes=(8, 32),
                  budgets=(5, 10, 20), momenta=MOMENTA, base_lr=0.01, lr_batch=32, train_size=512, n_eval=200,
                  reference_samples=256, precise_samples=128, shifts=("affine", "noise"), train_classes=tuple(CLASSES),
                  shift_strength=1.0, train_steps=20, train_batch=32, train_lrs=(1e-3, 1e-2), frankle_steps=30,
                  frankle_lrs=(0.003, 0.03)),
    "full": dict(seeds=10, tuning_seeds=(100, 101, 102), targets=tuple(TARGETS), batch_sizes=(8, 64),
                 budgets=(100, 400, 1600), momenta=MOMENTA, base_lr=0.01, lr_batch=32, train_size=8192, n_eval=1000,
                 reference_samples=4096, precise_samples=2048, shifts=SHIFTS, train_classes=tuple(CLASSES),
                 shift_strength=1.0, train_steps=300,
                 train_batch=64, train_lrs=(3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1), frankle_steps=400,
                 frankle_lrs=(0.001, 0.003, 0.01, 0.03, 0.1, 0.3)),
}


def kornblith_momentum(train_size: int, batch_size: int) -> float:
    """Kornblith, Shlens & Le 2019's BatchNorm momentum in PyTorch's convention: ``min(10 / s, 0.1)`` with ``s =
    train_size / batch_size`` steps per epoch (their decay ``max(1 - 10 / s, 0.9)``). Raises ``ValueError`` naming the
    parameter for a size below 1 or a batch larger than the set."""
    if not (isinstance(train_size, int) and train_size >= 1):
        raise ValueError(f"train_size must be an integer >= 1, got {train_size!r}")
    if not (isinstance(batch_size, int) and 1 <= batch_size <= train_size):
        raise ValueError(f"batch_size must be an integer from 1 to train_size={train_size}, got {batch_size!r}")
    return min(KORNBLITH_STEPS * batch_size / train_size, KORNBLITH_CAP)


def setting_name(m: float) -> str:
    """The condition name of momentum ``m``: ``m0``, ``m0.001``, ..., ``m0.3`` (``:g``)."""
    return f"m{m:g}"


def momentum_settings(momenta, train_size: int, batch_size: int, loaded_count: int) -> dict[str, tuple]:
    """``{condition: (momentum, start_count)}`` of every tracked setting: ``momentum`` a float, or ``None`` for a
    cumulative average whose counter starts at ``start_count`` (``cma``: 0; ``cma_loaded``: ``loaded_count``, the
    source's ``num_batches_tracked``); ``kornblith`` at :func:`kornblith_momentum`."""
    out = {setting_name(m): (float(m), 0) for m in momenta}
    out.update(cma=(None, 0), cma_loaded=(None, int(loaded_count)),
               kornblith=(kornblith_momentum(train_size, batch_size), 0))
    return out


# --- configs -------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MomentumUnit(_Frozen):
    """Part 1's cached unit: one seed, target and batch size (every momentum setting and budget)."""

    seed: int
    target: str
    batch_size: int
    budgets: tuple
    momenta: tuple
    lr: float
    train_size: int
    n_eval: int
    reference_samples: int
    precise_samples: int
    noise: float = 3.0
    n_classes: int = 10

    @property
    def source(self) -> SourceConfig:
        return SourceConfig(seed=self.seed, n_classes=self.n_classes, noise=self.noise, momentum=SOURCE_MOMENTUM)


@dataclass(frozen=True)
class TrainUnit(_Frozen):
    """Part 2's cached unit: one seed, task-B classes and shift family (every condition and rate)."""

    seed: int
    classes: str
    shift: str
    strength: float
    steps: int
    batch_size: int
    lrs: tuple
    train_size: int
    n_eval: int
    noise: float = 3.0
    n_classes: int = 10

    @property
    def source(self) -> SourceConfig:
        return SourceConfig(seed=self.seed, n_classes=self.n_classes, noise=self.noise, momentum=SOURCE_MOMENTUM)


@dataclass(frozen=True)
class FrankleUnit(_Frozen):
    """Part 3's cached unit: one seed (every condition and rate), from the seed's random initialisation."""

    seed: int
    steps: int
    batch_size: int
    lrs: tuple
    n_eval: int
    noise: float = 3.0
    n_classes: int = 10

    @property
    def source(self) -> SourceConfig:
        """The stage-1 config whose initialisation the unit starts from (nothing of stage 1 is trained or read)."""
        return SourceConfig(seed=self.seed, n_classes=self.n_classes, noise=self.noise, momentum=SOURCE_MOMENTUM)


#: The rate grids of the first full run, which chose part 2's largest rate in 16 of 36 tuning cells: the full
#: profile's grids were widened upward, the added rates run in their own units (:func:`_rate_chunks`).
FIRST_TRAIN_LRS = (3e-4, 1e-3, 3e-3, 1e-2, 3e-2)
FIRST_FRANKLE_LRS = (0.001, 0.003, 0.01, 0.03, 0.1)


def _rate_chunks(lrs: tuple, first: tuple) -> list[tuple]:
    """``lrs`` split into the rates of ``first`` and the others (each part only if not empty), both in order."""
    a, b = tuple(r for r in lrs if r in first), tuple(r for r in lrs if r not in first)
    return [c for c in (a, b) if c]


def _increasing(v, low) -> bool:
    return bool(v) and list(v) == sorted(set(v)) and v[0] >= low


class Config(ChapterConfig):
    """Chapter 9's parameters, checked by :class:`bnstudy.study.design.ChapterConfig` (``ValueError`` naming the
    parameter; :data:`RULES` says what each allows). ``tuning_seeds`` choose every setting and are never reported;
    part 1's rate is ``base_lr * batch_size / lr_batch``; ``train_batch`` is also part 3's batch."""

    PARAMETERS = dict(profile="quick", seeds=(0, 1), tuning_seeds=(100,), targets=("close", "shifted"),
                      batch_sizes=(8, 32), budgets=(5, 10, 20), momenta=MOMENTA, base_lr=0.01, lr_batch=32,
                      train_size=512, n_eval=200, reference_samples=256, precise_samples=128,
                      shifts=("affine", "noise"), train_classes=("new", "same"), shift_strength=1.0, train_steps=20,
                      train_batch=32, train_lrs=(1e-3, 1e-2), frankle_steps=30, frankle_lrs=(0.003, 0.03))

    PROFILES = PROFILES
    NORMALIZE = {"seeds": check_seeds}
    RULES = (
        Rule("tuning_seeds", "one or more seeds >= 0 disjoint from seeds (a setting is never judged on the seeds "
             "it was chosen on)", lambda c: bool(c.tuning_seeds) and min(c.tuning_seeds) >= 0
             and not set(c.tuning_seeds) & set(c.seeds)),
        Rule("targets", f"one or more of {list(TARGETS)}",
             lambda c: bool(c.targets) and set(c.targets) <= set(TARGETS)),
        Rule("train_size", "an integer >= 2", lambda c: c.train_size >= 2),
        Rule("batch_sizes", "one or more strictly increasing integers >= 2 (train-mode BatchNorm needs two values), "
             "each dividing train_size (an epoch is whole steps)",
             lambda c: _increasing(c.batch_sizes, 2) and all(c.train_size % b == 0 for b in c.batch_sizes)),
        Rule("budgets", "one or more strictly increasing step counts >= 1", lambda c: _increasing(c.budgets, 1)),
        Rule("momenta", "strictly increasing momenta in [0, 1] that start at 0 (the source statistics, the grid's "
             "closed end)", lambda c: _increasing(c.momenta, 0) and c.momenta[0] == 0 and c.momenta[-1] <= 1),
        Rule("base_lr", "> 0", lambda c: c.base_lr > 0),
        Rule("lr_batch", "an integer >= 1", lambda c: c.lr_batch >= 1),
        Rule("n_eval", "an integer >= 1", lambda c: c.n_eval >= 1),
        Rule("reference_samples", f"a positive multiple of {REF_BATCH}",
             lambda c: c.reference_samples >= REF_BATCH and c.reference_samples % REF_BATCH == 0),
        Rule("precise_samples", "a positive multiple of every batch size, at most train_size",
             lambda c: 0 < c.precise_samples <= c.train_size
             and all(c.precise_samples % b == 0 for b in c.batch_sizes)),
        Rule("shifts", f"one or more of {list(SHIFTS)}", lambda c: bool(c.shifts) and set(c.shifts) <= set(SHIFTS)),
        Rule("train_classes", f"one or more of {list(CLASSES)}",
             lambda c: bool(c.train_classes) and set(c.train_classes) <= set(CLASSES)),
        Rule("shift_strength", "> 0", lambda c: c.shift_strength > 0),
        Rule("train_steps", "an integer >= 1", lambda c: c.train_steps >= 1),
        Rule("train_batch", "an integer from 2 to train_size", lambda c: 2 <= c.train_batch <= c.train_size),
        Rule("train_lrs", "one or more strictly increasing rates > 0", lambda c: _increasing(c.train_lrs, 0)
             and c.train_lrs[0] > 0),
        Rule("frankle_steps", "an integer >= 1", lambda c: c.frankle_steps >= 1),
        Rule("frankle_lrs", "one or more strictly increasing rates > 0", lambda c: _increasing(c.frankle_lrs, 0)
             and c.frankle_lrs[0] > 0),
    )

    @property
    def all_seeds(self) -> tuple:
        """The reported seeds, then the tuning seeds."""
        return tuple(self.seeds) + tuple(self.tuning_seeds)

    def role(self, seed: int) -> str:
        """``"report"`` for a reported seed, ``"tune"`` for a tuning seed; ``ValueError`` naming ``seed`` otherwise."""
        if seed in self.seeds:
            return "report"
        if seed in self.tuning_seeds:
            return "tune"
        raise ValueError(f"seed {seed!r} is neither a reported seed nor a tuning seed of this config")

    def lr_for(self, batch_size: int) -> float:
        """Part 1's rate at ``batch_size``: the linear scaling rule ``base_lr * batch_size / lr_batch``."""
        return self.base_lr * batch_size / self.lr_batch

    def momentum_units(self) -> list[MomentumUnit]:
        """One :class:`MomentumUnit` per (seed, target, batch size), reported seeds then tuning seeds."""
        return [MomentumUnit(seed=s, target=t, batch_size=b, budgets=self.budgets, momenta=self.momenta,
                             lr=self.lr_for(b), train_size=self.train_size, n_eval=self.n_eval,
                             reference_samples=self.reference_samples, precise_samples=self.precise_samples)
                for s in self.all_seeds for t in self.targets for b in self.batch_sizes]

    def train_units(self) -> list[TrainUnit]:
        """One :class:`TrainUnit` per (seed, classes, shift family) and rate chunk (:func:`_rate_chunks`: the first
        grid's rates, then the added ones), reported seeds then tuning seeds."""
        return [TrainUnit(seed=s, classes=k, shift=f, strength=self.shift_strength, steps=self.train_steps,
                          batch_size=self.train_batch, lrs=lrs, train_size=self.train_size, n_eval=self.n_eval)
                for s in self.all_seeds for k in self.train_classes for f in self.shifts
                for lrs in _rate_chunks(self.train_lrs, FIRST_TRAIN_LRS)]

    def frankle_units(self) -> list[FrankleUnit]:
        """One :class:`FrankleUnit` per seed and rate chunk (:func:`_rate_chunks`), reported seeds then tuning
        seeds."""
        return [FrankleUnit(seed=s, steps=self.frankle_steps, batch_size=self.train_batch, lrs=lrs,
                            n_eval=self.n_eval)
                for s in self.all_seeds for lrs in _rate_chunks(self.frankle_lrs, FIRST_FRANKLE_LRS)]


def make_config(profile: str = "quick", **overrides) -> Config:
    """A :class:`Config` from :data:`PROFILES` with ``overrides`` (``None``: the profile's value)."""
    return from_profile(Config, PROFILES, profile, **overrides)


# --- shared pieces -------------------------------------------------------------------------------------------------

def target_task(seed: int, target: str, n_classes: int = 10, noise: float = 3.0):
    """Part 1's task B of ``seed`` under ``target`` (:data:`TARGETS`)."""
    return make_task(seed, "B", n_classes, noise, *TARGETS[target])


def shifted_task(seed: int, classes: str, shift: str, strength: float, n_classes: int = 10, noise: float = 3.0):
    """Part 2's task B of ``seed``: the templates of ``classes`` (:data:`CLASSES`: ``new``, task B's own; ``same``,
    task A's) under shift family ``shift`` (:data:`SHIFTS`) at ``strength``: chapter 6's brightness/contrast task
    ``B`` (:func:`..unknown_task.run.shift_of`) or its blur / noise task ``B``
    (:func:`..unknown_task.run.corruption_of`)."""
    tag = CLASSES[classes]
    if shift == "affine":
        return make_task(seed, tag, n_classes, noise, *shift_of("B", strength))
    base = make_task(seed, tag, n_classes, noise)
    blur, extra = corruption_of("B", shift, strength)
    return CorruptedTask(base.templates, base.noise, blur=blur, extra_noise=extra)


def _source_parts(source: dict, n_classes: int):
    backbone = ConvBackbone(3, SourceConfig.widths, "batch", SOURCE_MOMENTUM)
    backbone.load_state_dict(source["backbone"])
    head_a = make_head("linear", backbone.out_features, n_classes)
    head_a.load_state_dict(source["head_a"])
    head_a.requires_grad_(False)
    return backbone, head_a


def _head_b(seed: int, features: int, n_classes: int):
    return seeded((seed, "init", "head_b", "linear"), lambda: make_head("linear", features, n_classes))


def _stats(backbone) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    return {n: (m.running_mean.detach().clone(), m.running_var.detach().clone())
            for n, m in batchnorm_layers(backbone).items()}


@torch.no_grad()
def _load_stats(backbone, stats: dict) -> None:
    for n, m in batchnorm_layers(backbone).items():
        m.running_mean.copy_(stats[n][0])
        m.running_var.copy_(stats[n][1])


def _max_change(a: dict, b: dict) -> float:
    return max(float((x.double() - y.double()).abs().max()) for n in a for x, y in zip(a[n], b[n]))


def _acc(backbone, head, data) -> float:
    backbone.eval()
    return accuracy(logits_of(Classifier(backbone, head), data[0], torch.device("cpu")), data[1])


def statistics_error(stats: dict, reference: dict) -> tuple[float, float]:
    """``(mean_error, var_error)`` of running statistics ``stats`` against ``reference`` (both ``{layer: (mean (C,),
    var (C,))}``): per layer ``|r - mu| / |sigma|`` and ``|v - sigma^2| / |sigma^2|`` (Euclidean norms over channels,
    float64), each averaged over the layers; ``stats_error`` is their mean. ``ValueError`` when the layers differ."""
    if set(stats) != set(reference):
        raise ValueError(f"stats and reference must name the same layers, got {sorted(stats)} and {sorted(reference)}")
    em, ev = [], []
    for n, (mu, var) in reference.items():
        r, v = stats[n][0].double(), stats[n][1].double()
        mu, var = mu.double(), var.double()
        em.append(float((r - mu).norm() / var.sqrt().norm()))
        ev.append(float((v - var).norm() / var.norm()))
    return sum(em) / len(em), sum(ev) / len(ev)


class StatisticsTracker:
    """The running statistics every setting of ``settings`` (:func:`momentum_settings`) would hold: while
    :attr:`active`, a forward pre-hook on each BatchNorm layer runs ``torch.batch_norm_update_stats`` (``BatchNorm2d``'s
    own train-mode update) once per setting at its momentum, or ``1 / n`` for a cumulative average (its counter ``n``
    incremented first, as ``momentum=None`` does); the layers' buffers are untouched. :meth:`stats`: one setting's
    ``{layer: (running_mean, running_var)}``."""

    def __init__(self, backbone: torch.nn.Module, settings: dict[str, tuple]):
        self.settings = dict(settings)
        self.active = False
        layers = batchnorm_layers(backbone)
        self.state = {s: {n: [m.running_mean.detach().clone(), m.running_var.detach().clone(), int(start)]
                          for n, m in layers.items()} for s, (_, start) in self.settings.items()}
        self._handles = [m.register_forward_pre_hook(self._hook(n)) for n, m in layers.items()]

    def _hook(self, name: str):
        def hook(_module, args):
            if not self.active:
                return
            x = args[0].detach()
            with torch.no_grad():
                for s, (m, _) in self.settings.items():
                    st = self.state[s][name]
                    st[2] += 1
                    f = m if m is not None else 1.0 / float(st[2])
                    torch.batch_norm_update_stats(x, st[0], st[1], f)
        return hook

    def stats(self, setting: str) -> dict:
        return {n: (st[0].clone(), st[1].clone()) for n, st in self.state[setting].items()}

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


# --- part 1: momentum ----------------------------------------------------------------------------------------------

def _chunks(x: torch.Tensor, size: int) -> list[torch.Tensor]:
    return [x[i:i + size] for i in range(0, len(x) - len(x) % size, size)]


def _finite(*modules) -> bool:
    return all(bool(torch.isfinite(p).all()) for m in modules for p in m.parameters())


def run_momentum_unit(u: MomentumUnit, source: dict) -> dict:
    """Part 1 for one seed, target and batch size: one record per (budget, condition) (every setting of
    :func:`momentum_settings`, ``precise`` and ``reference``) with ``accuracy`` (task B), ``task_a``, the
    :func:`statistics_error` parts, ``change_from_source`` (exactly 0 for ``m0``) and ``loss`` (last tenth of the
    steps); NaN scores where the weights are not finite."""
    t0 = time.perf_counter()
    backbone, head_a = _source_parts(source, u.n_classes)
    head_b = _head_b(u.seed, backbone.out_features, u.n_classes)
    source_stats = _stats(backbone)
    loaded = int(next(iter(batchnorm_layers(backbone).values())).num_batches_tracked)
    settings = momentum_settings(u.momenta, u.train_size, u.batch_size, loaded)
    task_b, task_a = target_task(u.seed, u.target, u.n_classes, u.noise), make_task(u.seed, "A", u.n_classes, u.noise)
    x_tr, y_tr = train_set(task_b, u.train_size, u.seed, "ch09_B")
    batches = SetBatches(x_tr, y_tr, u.batch_size, generator(u.seed, "ch09_order"))
    eval_b, eval_a = eval_set(task_b, u.n_eval, u.seed, "ch09_B_test"), eval_set(task_a, u.n_eval, u.seed, "A")
    ref_batches = _chunks(eval_set(task_b, u.reference_samples, u.seed, "ch09_reference")[0], REF_BATCH)
    precise_batches = _chunks(x_tr[:u.precise_samples], u.batch_size)
    tracker = StatisticsTracker(backbone, settings)
    model = Classifier(backbone, head_b)
    opt = make_optimizer("sgd", list(model.parameters()), u.lr)
    model.train()
    losses, records = [], []
    for step in range(1, max(u.budgets) + 1):
        x, y = batches.next()
        tracker.active = True
        loss = F.cross_entropy(model(x), y)
        tracker.active = False
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if step in u.budgets:
            tail = losses[-max(1, step // 10):]
            records += _momentum_records(u, step, backbone, head_a, head_b, tracker, settings, source_stats,
                                         ref_batches, precise_batches, eval_b, eval_a, sum(tail) / len(tail))
    tracker.close()
    return dict(records=records, lr=u.lr, steps_per_epoch=u.train_size // u.batch_size,
                kornblith=settings["kornblith"][0], diverged=not all(math.isfinite(v) for v in losses),
                source_task_a_accuracy=source["task_a_accuracy"], wall_s=time.perf_counter() - t0)


def _momentum_records(u, step, backbone, head_a, head_b, tracker, settings, source_stats, ref_batches,
                      precise_batches, eval_b, eval_a, loss) -> list[dict]:
    """The records of one budget: a hook-free copy of the network at this step scored with each condition's
    statistics."""
    work = ConvBackbone(3, backbone.widths, "batch", SOURCE_MOMENTUM)
    work.load_state_dict(backbone.state_dict())
    hb, ha = copy.deepcopy(head_b), head_a
    conditions = {s: tracker.stats(s) for s in settings}
    finite = _finite(work, hb)
    if finite:
        conditions["precise"] = precise_bn_statistics(work, precise_batches)
        conditions["reference"] = reference = precise_bn_statistics(work, ref_batches)
    out = []
    for name, stats in conditions.items():
        m = settings[name][0] if name in settings else None
        rec = dict(budget=step, condition=name, momentum=math.nan if m is None else m, loss=loss,
                   change_from_source=_max_change(stats, source_stats))
        if finite:
            _load_stats(work, stats)
            em, ev = statistics_error(stats, reference)
            rec.update(accuracy=_acc(work, hb, eval_b), task_a=_acc(work, ha, eval_a), mean_error=em, var_error=ev,
                       stats_error=(em + ev) / 2)
        else:
            rec.update(accuracy=math.nan, task_a=math.nan, mean_error=math.nan, var_error=math.nan,
                       stats_error=math.nan)
        out.append(rec)
    return out


# --- parts 2 and 3: what is trained ---------------------------------------------------------------------------------

class _Run:
    """One (condition, rate) inside a unit: its backbone (shared by a condition's rates where the backbone is not
    trained and its output per batch is the same for all of them), head, optimizer, gradient masks and losses."""

    def __init__(self, condition, lr, backbone, head, shared, masks=None, optimizer="sgd"):
        self.condition, self.lr, self.backbone, self.head, self.shared = condition, lr, backbone, head, shared
        self.masks = masks or {}
        self.params = [p for m in ((head,) if shared else (backbone, head)) for p in m.parameters() if p.requires_grad]
        self.opt = make_optimizer(optimizer, self.params, lr)
        self.losses: list[float] = []
        self.frozen0 = {n: p.detach().clone() for n, p in backbone.named_parameters()
                        if not p.requires_grad or n in self.masks}

    def counts(self) -> tuple[int, int]:
        """``(trainable, parameters)`` of backbone + head: a masked tensor counts its mask's ones."""
        total = trainable = 0
        named = list(self.backbone.named_parameters()) + [("head." + n, p) for n, p in self.head.named_parameters()]
        for n, p in named:
            total += p.numel()
            if n in self.masks:
                trainable += int(self.masks[n].sum())
            elif p.requires_grad:
                trainable += p.numel()
        return trainable, total

    def max_frozen_change(self) -> float:
        """Largest absolute change of a parameter that was not trained (a masked tensor: its entries outside the
        mask); 0.0 when there is none."""
        params = dict(self.backbone.named_parameters())
        out = 0.0
        for n, p0 in self.frozen0.items():
            d = (params[n].detach().double() - p0.double()).abs()
            if n in self.masks:
                d = d[~self.masks[n]]
            if d.numel():
                out = max(out, float(d.max()))
        return out

    def step(self, x, y, features=None) -> None:
        logits = self.head(features) if self.shared else self.head(self.backbone(x))
        loss = F.cross_entropy(logits, y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.losses.append(float(loss.detach()))

    def summary(self) -> dict:
        trainable, total = self.counts()
        tail = self.losses[-max(1, len(self.losses) // 10):]
        return dict(condition=self.condition, lr=self.lr, trainable=trainable, parameters=total,
                    trainable_share=trainable / total, max_frozen_change=self.max_frozen_change(),
                    final_loss=sum(tail) / len(tail), diverged=not all(math.isfinite(v) for v in self.losses))


def _affine(backbone):
    return [p for bn in batchnorm_layers(backbone).values() for p in (bn.weight, bn.bias)]


def configure_train(condition: str, backbone: torch.nn.Module) -> torch.nn.Module:
    """Prepare a copy of the source backbone for part 2's ``condition`` (:data:`TRAIN_CONDITIONS`): which parameters
    require a gradient and which layers are pinned in eval mode (module docstring); returns ``backbone``. Raises
    ``ValueError`` naming ``condition`` for another value."""
    if condition not in TRAIN_CONDITIONS:
        raise ValueError(f"condition={condition!r} is not allowed; choose one of {list(TRAIN_CONDITIONS)}")
    backbone.requires_grad_(condition == "full")
    if condition == "head":
        pin_eval(backbone)
    elif condition in ("affine_pinned", "affine_train"):
        for p in _affine(backbone):
            p.requires_grad_(True)
        if condition == "affine_pinned":
            pin_norm_eval(backbone)
    elif condition == "first_block":
        backbone.blocks[0].requires_grad_(True)
        for block in backbone.blocks[1:]:
            pin_eval(block)
    return backbone


def _step_all(runs: list[_Run], shared: dict, x, y) -> None:
    """One training step of every run on the batch ``(x, y)``: the shared backbones' forward once each (no gradient;
    train mode unless pinned), then every run's step."""
    feats = {}
    with torch.no_grad():
        for cond, bb in shared.items():
            feats[cond] = bb.train()(x)
    for r in runs:
        if not r.shared:
            r.backbone.train()
            r.head.train()
        r.step(x, y, feats.get(r.condition))


def run_train_unit(u: TrainUnit, source: dict) -> dict:
    """Part 2 for one unit: every condition of :data:`TRAIN_CONDITIONS` at every rate of ``u.lrs`` on the same
    batches, one record per (condition, rate) (:data:`TRAIN_COLUMNS`)."""
    t0 = time.perf_counter()
    backbone0, head_a = _source_parts(source, u.n_classes)
    source_stats = _stats(backbone0)
    task_b = shifted_task(u.seed, u.classes, u.shift, u.strength, u.n_classes, u.noise)
    task_a = make_task(u.seed, "A", u.n_classes, u.noise)
    x_tr, y_tr = train_set(task_b, u.train_size, u.seed, "ch09_B")
    batches = SetBatches(x_tr, y_tr, u.batch_size, generator(u.seed, "ch09_order"))
    eval_b, eval_a = eval_set(task_b, u.n_eval, u.seed, "ch09_B_test"), eval_set(task_a, u.n_eval, u.seed, "A")
    head0 = _head_b(u.seed, backbone0.out_features, u.n_classes) if u.classes == "new" else copy.deepcopy(head_a)
    head0.requires_grad_(True)
    shared = {c: configure_train(c, copy.deepcopy(backbone0)) for c in ("head", "head_train")}
    runs = []
    for c in TRAIN_CONDITIONS:
        for lr in u.lrs:
            bb = shared[c] if c in shared else configure_train(c, copy.deepcopy(backbone0))
            runs.append(_Run(c, lr, bb, copy.deepcopy(head0), shared=c in shared, optimizer=TRAIN_OPTIMIZER))
    for _ in range(u.steps):
        x, y = batches.next()
        _step_all(runs, shared, x, y)
    records = []
    for r in runs:
        finite = _finite(r.backbone, r.head)
        records.append(dict(r.summary(), accuracy=_acc(r.backbone, r.head, eval_b) if finite else math.nan,
                            task_a=_acc(r.backbone, head_a, eval_a) if finite else math.nan,
                            max_buffer_change=_max_change(_stats(r.backbone), source_stats)))
    return dict(records=records, source_task_a_accuracy=source["task_a_accuracy"], wall_s=time.perf_counter() - t0)


def random_masks(backbone: torch.nn.Module, seed: int, per_channel: int = 2) -> dict[str, torch.Tensor]:
    """``{parameter name: bool mask}`` over every convolution weight of ``backbone``: ``per_channel`` distinct
    entries per output channel, drawn uniformly from ``(seed, "ch09_mask", name)`` (part 3's ``random_same``; the
    count per layer equals BatchNorm's ``gamma`` and ``beta`` with ``per_channel = 2``)."""
    out = {}
    for name, p in backbone.named_parameters():
        if p.dim() != 4:
            continue
        rows = p.shape[0]
        per = p[0].numel()
        gen = generator(seed, "ch09_mask", name)
        mask = torch.zeros(rows, per, dtype=torch.bool)
        for c in range(rows):
            mask[c, torch.randperm(per, generator=gen)[:per_channel]] = True
        out[name] = mask.view_as(p)
    return out


def configure_frankle(condition: str, backbone: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """Prepare a freshly initialised backbone for part 3's ``condition`` (:data:`FRANKLE_CONDITIONS`); returns the
    gradient masks (``random_same``: :func:`random_masks`, applied by a gradient hook on each convolution weight, so
    the entries outside a mask never change under Adam; else none). Raises ``ValueError`` naming ``condition`` for
    another value."""
    if condition not in FRANKLE_CONDITIONS:
        raise ValueError(f"condition={condition!r} is not allowed; choose one of {list(FRANKLE_CONDITIONS)}")
    backbone.requires_grad_(condition == "all")
    masks = {}
    if condition == "bn_affine":
        for p in _affine(backbone):
            p.requires_grad_(True)
    elif condition == "random_same":
        masks = random_masks(backbone, seed)
        params = dict(backbone.named_parameters())
        for name, mask in masks.items():
            params[name].requires_grad_(True)
            params[name].register_hook(lambda g, m=mask: g * m)
    return masks


def run_frankle_unit(u: FrankleUnit) -> dict:
    """Part 3 for one unit: every condition of :data:`FRANKLE_CONDITIONS` at every rate of ``u.lrs`` from the seed's
    initialisation on the same task-A batches, one record per (condition, rate) (:data:`FRANKLE_COLUMNS`)."""
    t0 = time.perf_counter()
    init = build_backbone(u.source)
    head0 = seeded((u.seed, "init", "head_a"), lambda: make_head("linear", init.out_features, u.n_classes))
    task_a = make_task(u.seed, "A", u.n_classes, u.noise)
    stream = BatchStream(task_a, u.batch_size, generator(u.seed, "ch09_frankle", "A"))
    eval_a = eval_set(task_a, u.n_eval, u.seed, "A")
    shared = {"head": copy.deepcopy(init).requires_grad_(False)}
    runs = []
    for c in FRANKLE_CONDITIONS:
        for lr in u.lrs:
            if c in shared:
                runs.append(_Run(c, lr, shared[c], copy.deepcopy(head0), shared=True, optimizer="adam"))
                continue
            bb = copy.deepcopy(init)
            masks = configure_frankle(c, bb, u.seed)
            runs.append(_Run(c, lr, bb, copy.deepcopy(head0), shared=False, masks=masks, optimizer="adam"))
    for _ in range(u.steps):
        x, y = stream.next()
        _step_all(runs, shared, x, y)
    records = [dict(r.summary(), accuracy=_acc(r.backbone, r.head, eval_a) if _finite(r.backbone, r.head)
                    else math.nan) for r in runs]
    return dict(records=records, wall_s=time.perf_counter() - t0)


# --- the sweeps ----------------------------------------------------------------------------------------------------

def _momentum_group(units: list[MomentumUnit], cache_root: str, version: str) -> list[dict]:
    return [run_momentum_unit(u, load_source(u.source, cache_root, version)) for u in units]


def _train_group(units: list[TrainUnit], cache_root: str, version: str) -> list[dict]:
    return [run_train_unit(u, load_source(u.source, cache_root, version)) for u in units]


def _frankle_group(units: list[FrankleUnit]) -> list[dict]:
    return [run_frankle_unit(u) for u in units]


#: The tables beside the main one (``09_momentum_affine_<name>.csv``): part 2's and part 3's rows. Every table holds
#: the reported and the tuning seeds, told apart by ``role``.
SIBLING_TABLES = ("train", "frankle")
#: Parameters that only change the analysis of given rows (none: every parameter is the run's).
ANALYSIS_PARAMETERS = ()
#: Parameters added after rows of a release were computed (none yet).
READ_DEFAULTS: dict = {}

#: The tables' columns.
MOMENTUM_COLUMNS = ("seed", "role", "target", "batch_size", "budget", "condition", "momentum", "accuracy", "task_a",
                    "mean_error", "var_error", "stats_error", "change_from_source", "loss", "lr", "steps_per_epoch",
                    "kornblith", "diverged", "source_task_a_accuracy", "unit_wall_s")
TRAIN_COLUMNS = ("seed", "role", "classes", "shift", "strength", "condition", "lr", "accuracy", "task_a", "trainable",
                 "parameters", "trainable_share", "max_buffer_change", "max_frozen_change", "final_loss", "diverged",
                 "source_task_a_accuracy", "unit_wall_s")
FRANKLE_COLUMNS = ("seed", "role", "condition", "lr", "accuracy", "trainable", "parameters", "trainable_share",
                   "max_frozen_change", "final_loss", "diverged", "unit_wall_s")


def _sweep(units, group, namespace: str, desc: str, execution: Execution | None, sources: bool) -> tuple:
    ex = execution or Execution()
    root = str(Path(ex.cache_dir) if ex.cache_dir is not None else default_cache_dir())
    kwargs = {}
    if sources:
        from ...engine import source_version
        version = source_version()  # stage 1's code version: the units read the backbones with it
        ensure_sources([u.source for u in units], ex, version)
        kwargs = {"cache_root": root, "version": version}
    rows = run_sweep(units, group, namespace=namespace, cache_dir=root, execution=ex, group_kwargs=kwargs, desc=desc)
    return [row for _, row in rows.iterrows()]


def run(config: Config, execution: Execution | None = None) -> pd.DataFrame:
    """Part 1 (resumable through the run cache), reported and tuning seeds: one row per record of
    :func:`run_momentum_unit`, columns :data:`MOMENTUM_COLUMNS` (``role``: ``report`` or ``tune``)."""
    units = config.momentum_units()
    rows = _sweep(units, _momentum_group, MOMENTUM_NAMESPACE, "chapter 9 momentum", execution, True)
    keep = ("lr", "steps_per_epoch", "kornblith", "diverged", "source_task_a_accuracy")
    out = [dict(seed=u.seed, role=config.role(u.seed), target=u.target, batch_size=u.batch_size, **rec,
                **{k: row[k] for k in keep}, unit_wall_s=row["wall_s"])
           for u, row in zip(units, rows) for rec in row["records"]]
    return pd.DataFrame(out, columns=list(MOMENTUM_COLUMNS))


def run_train(config: Config, execution: Execution | None = None) -> pd.DataFrame:
    """Part 2, reported and tuning seeds: one row per record of :func:`run_train_unit`, columns
    :data:`TRAIN_COLUMNS`."""
    units = config.train_units()
    rows = _sweep(units, _train_group, TRAIN_NAMESPACE, "chapter 9 what to train", execution, True)
    out = [dict(seed=u.seed, role=config.role(u.seed), classes=u.classes, shift=u.shift, strength=u.strength, **rec,
                source_task_a_accuracy=row["source_task_a_accuracy"], unit_wall_s=row["wall_s"])
           for u, row in zip(units, rows) for rec in row["records"]]
    return pd.DataFrame(out, columns=list(TRAIN_COLUMNS))


def run_frankle(config: Config, execution: Execution | None = None) -> pd.DataFrame:
    """Part 3, reported and tuning seeds: one row per record of :func:`run_frankle_unit`, columns
    :data:`FRANKLE_COLUMNS`."""
    units = config.frankle_units()
    rows = _sweep(units, _frankle_group, FRANKLE_NAMESPACE, "chapter 9 Frankle", execution, False)
    out = [dict(seed=u.seed, role=config.role(u.seed), **rec, unit_wall_s=row["wall_s"])
           for u, row in zip(units, rows) for rec in row["records"]]
    return pd.DataFrame(out, columns=list(FRANKLE_COLUMNS))


def run_tables(config: Config, execution: Execution | None = None) -> tuple[pd.DataFrame, dict]:
    """What the page will analyse: ``(run(config), {"train": run_train(config), "frankle": run_frankle(config)})``.
    Raises ``TypeError`` for another config."""
    if not isinstance(config, Config):
        raise TypeError(f"run_tables needs a momentum_affine.Config (see make_config), got {type(config).__name__}")
    return run(config, execution), dict(train=run_train(config, execution), frankle=run_frankle(config, execution))
