"""Chapter 5: what small batches do to BatchNorm, and which fine-tuning strategy survives them.

Measurements on the book's backbone, paired within a seed: (1) the noise of batch statistics per BN layer against
batch size, beside the prediction for ``m x H x W`` independent values (:func:`noise_records`); (2) how much data
precise BN needs on chapter 1's shifted task A, in batches of 2 and 32 (:func:`precise_records`); (3) fine-tuning
backbone and a new head on task B, close or shifted, at batch sizes 2..256 under every strategy of
:data:`bnstudy.study.config.FINETUNE_STRATEGIES`, the samples seen fixed and the rate scaled linearly (``lr = base_lr
* batch_size / lr_batch``; Goyal et al., 2017), with a per-sample-norm control, a learning-rate check on separate
tuning seeds and the :data:`CONTENDERS` at their tuned rates; (4) the batch-size-2 decision (issue 34,
:func:`decision_tables`): every arm of :data:`DECISION_STRATEGIES` at its own tuned rate under both :data:`BUDGETS`,
the rate grid extended past an edge the best rate sits at (:func:`best_factors`).
"""

from __future__ import annotations

import math
import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from ...config import FINETUNE_STRATEGIES, STRATEGY_NORM, Execution, FinetuneConfig, SourceConfig, RunConfig, \
    check_choice, check_int, check_seeds, check_sequence, from_profile
from ...design import ChapterConfig, Rule
from ...engine import accuracy, ensure_sources, finetune, load_source, logits_of, source_version
from ...models import ConvBackbone, make_head
from ....running_stats import bn_input_statistics, statistics_mismatch, update_bn_stats
from ...sweep import default_cache_dir, run_sweep
from ...tasks import BatchStream, eval_set, generator, make_task

NAMESPACE = "ch05_finetune"
DIAG_NAMESPACE = "ch05_diagnostics"
#: The two targets: ``(brightness, contrast)`` of task B. ``shifted`` is chapter 1's shift.
TARGETS = {"close": (0.0, 1.0), "shifted": (RunConfig.brightness, RunConfig.contrast)}
BN_STRATEGIES = ("bn_frozen", "stats_frozen", "adabn", "bn_train")
PER_SAMPLE_STRATEGIES = ("to_group", "to_layer", "group_pretrained", "layer_pretrained")
STRATEGIES = FINETUNE_STRATEGIES
#: Readable names for figures and tables.
STRATEGY_LABELS = {"bn_frozen": "BN frozen (stats + affine)", "stats_frozen": "BN stats frozen, affine trained",
                   "adabn": "AdaBN, then stats frozen", "bn_train": "BN in train mode",
                   "to_group": "BN -> GroupNorm", "to_layer": "BN -> LayerNorm",
                   "group_pretrained": "GroupNorm from pretraining", "layer_pretrained": "LayerNorm from pretraining"}
#: Batch sizes of the precise-BN data experiment (the issue's 2 and 32).
PRECISE_BATCH_SIZES = (2, 32)

#: The profiles' sizes (the only place they are set). A cold full chapter is about 40 wall-min (issue 9).
PROFILES = {
    "quick": dict(seeds=3, batch_sizes=(2, 8, 32), samples=128, stage1_steps=200, noise_pool=2048,
                  precise_samples=(4, 8, 16, 32, 128, 512, 2048), precise_pool=4096,
                  tune_seeds=2, tune_batch_sizes=(2, 32), lr_factors=(0.5, 1.0, 2.0),
                  budget_steps=16, decision_batch_sizes=(2, 32), grid_extensions=1),
    "full": dict(seeds=10, batch_sizes=(2, 4, 8, 16, 32, 64, 128, 256), samples=4096, stage1_steps=400,
                 noise_pool=8192,
                 precise_samples=(4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384),
                 precise_pool=32768, tune_seeds=2, tune_batch_sizes=(2, 32, 256),
                 lr_factors=(0.25, 0.5, 1.0, 2.0, 4.0), budget_steps=128, decision_batch_sizes=(2, 256),
                 grid_extensions=3),
}
#: Tuning seeds given as a count ``n`` are ``TUNE_SEED_BASE .. TUNE_SEED_BASE + n - 1``: never a reported seed.
TUNE_SEED_BASE = 1000
#: BN with batch statistics and the pretrained per-sample norms: at the smallest batch size each also runs on the
#: reported seeds at the rate the tuning seeds chose for it (B1).
CONTENDERS = ("bn_train", "group_pretrained", "layer_pretrained")

#: The decision's budgets: ``Config.samples`` labelled samples at every batch size (the main grid's protocol), or
#: ``Config.budget_steps`` optimizer steps (samples grow with the batch).
BUDGETS = ("samples", "steps")
#: Wu & Johnson (2021)'s recipe as a decision arm: the ``bn_train`` runs scored after precise BN (``target_restat``).
PRECISE_AFTER = "bn_train_precise"
#: The decision's strategies (``arm``): every fine-tuning strategy and :data:`PRECISE_AFTER`.
DECISION_STRATEGIES = STRATEGIES + (PRECISE_AFTER,)
STRATEGY_LABELS[PRECISE_AFTER] = "BN in train mode, then precise BN"

#: Config fields only the analysis reads: a page analysing an earlier run's tables (``rows``) may change them.
ANALYSIS_PARAMETERS = ("break_margin", "equivalence_margin")
#: Parameters added after the release's rows were computed, with the value they were computed with: none yet.
READ_DEFAULTS: dict = {}
#: The tables a run saves beside ``05_batch_size.csv`` (``05_batch_size_<suffix>.csv``).
SIBLING_TABLES = ("lr_check", "noise", "precise_bn", "tuned", "decision_check", "decision")


def run_strategy(arm: str) -> str:
    """The fine-tuning strategy whose runs score decision arm ``arm``."""
    return "bn_train" if arm == PRECISE_AFTER else arm


def score_column(arm: str) -> str:
    """The accuracy column that scores decision arm ``arm``."""
    return "target_restat" if arm == PRECISE_AFTER else "target"


def _choices(name, allowed):
    return lambda v: check_sequence(name, v, lambda n, x: check_choice(n, x, allowed), 1)


def _tune_seeds(v) -> tuple:
    """``tune_seeds`` as a tuple: a count ``n >= 0`` means ``TUNE_SEED_BASE + 0..n-1``; a list names them."""
    if isinstance(v, int) and not isinstance(v, bool):
        if v < 0:
            raise ValueError(f"tune_seeds must be a count >= 0 or a list of seeds, got {v}")
        v = tuple(range(TUNE_SEED_BASE, TUNE_SEED_BASE + v))
    return tuple(check_sequence("tune_seeds", v, lambda n, x: check_int(n, x, 0), 0)) if len(v) else ()


def _increasing(v) -> bool:
    return bool(v) and list(v) == sorted(v) and v[0] >= 2


class Config(ChapterConfig):
    """Chapter 5's parameters (the notebook's parameters cell explains most). ``adabn_samples``: AdaBN's unlabelled
    samples; ``noise_batch_sizes``: the noise measurement's; ``mismatch_batches``: target batches of 64 for the
    statistics mismatch. Raises ``ValueError`` naming the parameter for any bad value (:data:`RULES`)."""

    PARAMETERS = dict(profile="quick", seeds=(0, 1, 2), strategies=STRATEGIES, targets=tuple(TARGETS),
                      batch_sizes=(2, 8, 32, 128), samples=1024, base_lr=0.01, lr_batch=32, stage1_steps=400,
                      adabn_samples=2048, noise=3.0, break_margin=0.02,
                      noise_batch_sizes=(2, 4, 8, 16, 32, 64, 128, 256), noise_pool=2048,
                      precise_samples=(32, 128, 512, 2048), precise_pool=4096, equivalence_margin=0.01,
                      mismatch_batches=8, adabn_batch_size=256, tune_seeds=(), lr_factors=(0.5, 1.0, 2.0),
                      tune_batch_sizes=(2, 32), budget_steps=16, decision_batch_sizes=(2, 32), grid_extensions=1)

    PROFILES = PROFILES
    NORMALIZE = {"seeds": check_seeds, "strategies": _choices("strategies", STRATEGIES),
                 "targets": _choices("targets", tuple(TARGETS)), "tune_seeds": _tune_seeds}
    RULES = (
        Rule("batch_sizes", "even integers >= 2 (batches are built from 2-sample draws), increasing",
             lambda c: _increasing(c.batch_sizes) and not any(b % 2 for b in c.batch_sizes)),
        Rule("samples", "an integer >= 2, a multiple of every batch size",
             lambda c: c.samples >= 2 and all(c.samples % b == 0 for b in c.batch_sizes)),
        Rule("base_lr", "> 0", lambda c: c.base_lr > 0),
        Rule("lr_batch", "one of batch_sizes (the reference of the break criterion)",
             lambda c: c.lr_batch in c.batch_sizes),
        Rule("stage1_steps", "an integer >= 1", lambda c: c.stage1_steps >= 1),
        Rule("adabn_samples", "an integer >= 2", lambda c: c.adabn_samples >= 2),
        Rule("noise", ">= 0", lambda c: c.noise >= 0),
        Rule("break_margin", "in [0, 1]", lambda c: 0 <= c.break_margin <= 1),
        Rule("noise_batch_sizes", "increasing integers >= 2", lambda c: _increasing(c.noise_batch_sizes)),
        Rule("noise_pool", "an even integer, at least 2 batches of the largest noise batch size",
             lambda c: c.noise_pool >= 2 * max(c.noise_batch_sizes) and c.noise_pool % 2 == 0),
        Rule("precise_samples", f"increasing multiples of {min(PRECISE_BATCH_SIZES)}, at least one of "
             f"{max(PRECISE_BATCH_SIZES)} (each batch size uses the counts it divides)",
             lambda c: _increasing(c.precise_samples) and not any(n % min(PRECISE_BATCH_SIZES) for n in c.precise_samples)
             and any(n % max(PRECISE_BATCH_SIZES) == 0 for n in c.precise_samples)),
        Rule("precise_pool", "an even integer >= 2 (drawn two samples at a time)",
             lambda c: c.precise_pool >= 2 and c.precise_pool % 2 == 0),
        Rule("equivalence_margin", "in (0, 1]", lambda c: 0 < c.equivalence_margin <= 1),
        Rule("mismatch_batches", "an integer >= 1", lambda c: c.mismatch_batches >= 1),
        Rule("adabn_batch_size", "an integer >= 2", lambda c: c.adabn_batch_size >= 2),
        Rule("tune_seeds", "none or at least 2 seeds (an interval needs two)", lambda c: len(c.tune_seeds) != 1),
        Rule("tune_seeds", "seeds other than the reported ones", lambda c: not set(c.tune_seeds) & set(c.seeds)),
        Rule("lr_factors", "increasing factors > 0 that contain 1.0 (the reported rate)",
             lambda c: 1.0 in c.lr_factors and list(c.lr_factors) == sorted(c.lr_factors) and c.lr_factors[0] > 0),
        Rule("tune_batch_sizes", "increasing even divisors of samples",
             lambda c: _increasing(c.tune_batch_sizes) and all(b % 2 == 0 and c.samples % b == 0 for b in c.tune_batch_sizes)),
        Rule("tune_batch_sizes", "batch sizes that contain lr_batch (the break reference)",
             lambda c: c.lr_batch in c.tune_batch_sizes),
        Rule("budget_steps", "an integer >= 1 (optimizer steps at every batch size of the steps budget)",
             lambda c: c.budget_steps >= 1),
        Rule("decision_batch_sizes", "increasing even divisors of samples, or empty (no decision runs)",
             lambda c: not c.decision_batch_sizes or (_increasing(c.decision_batch_sizes)
                                                      and all(b % 2 == 0 and c.samples % b == 0
                                                              for b in c.decision_batch_sizes))),
        Rule("grid_extensions", "an integer >= 0 (times the rate grid may be extended past an edge)",
             lambda c: c.grid_extensions >= 0),
        Rule("tune_seeds", "at least 2 seeds where decision_batch_sizes is set (each rate is tuned on them)",
             lambda c: len(c.tune_seeds) >= 2 or not c.decision_batch_sizes),
    )

    def __post_init__(self):
        super().__post_init__()
        self.run_configs()  # every run checked with the engine's own messages

    def lr_for(self, batch_size: int) -> float:
        """The linear scaling rule: ``base_lr * batch_size / lr_batch``."""
        return self.base_lr * batch_size / self.lr_batch

    def source(self, seed: int) -> SourceConfig:
        return SourceConfig(seed=seed, norm="batch", noise=self.noise, stage1_steps=self.stage1_steps)

    def _finetune_config(self, s, t, b, st, factor=1.0) -> FinetuneConfig:
        return FinetuneConfig(seed=s, noise=self.noise, stage1_steps=self.stage1_steps, norm=STRATEGY_NORM[st],
                              strategy=st, batch_size=b, samples=self.samples, lr=self.lr_for(b) * factor,
                              brightness=TARGETS[t][0], contrast=TARGETS[t][1], adabn_samples=self.adabn_samples,
                              adabn_batch_size=self.adabn_batch_size)

    def run_configs(self) -> list[FinetuneConfig]:
        """One :class:`FinetuneConfig` per (seed, target, batch size, strategy), seeds outermost."""
        return [self._finetune_config(s, t, b, st)
                for s in self.seeds for t in self.targets for b in self.batch_sizes for st in self.strategies]

    def tune_configs(self) -> list[FinetuneConfig]:
        """The learning-rate check: per tuning seed, target, tuning batch size, strategy and factor ``f``."""
        return [self._finetune_config(s, t, b, st, f) for s in self.tune_seeds for t in self.targets
                for b in self.tune_batch_sizes for st in self.strategies for f in self.lr_factors]

    def tuned_configs(self, factors: dict) -> list[FinetuneConfig]:
        """Per reported seed, target and contender, a run at the smallest batch size at ``factors[(target,
        strategy)]`` times its rate (:func:`chosen_factors`). Raises ``ValueError`` naming a missing one."""
        missing = [(t, st) for t in self.targets for st in CONTENDERS if st in self.strategies and (t, st) not in factors]
        if missing:
            raise ValueError(f"factors has no rate for target {missing[0][0]!r}, strategy {missing[0][1]!r}")
        return [self._finetune_config(s, t, min(self.batch_sizes), st, factors[(t, st)])
                for s in self.seeds for t in self.targets for st in CONTENDERS if st in self.strategies]

    def budget_samples(self, budget: str, batch_size: int) -> int:
        """Labelled samples of a run under ``budget`` at ``batch_size``; ``ValueError`` for another budget."""
        check_choice("budget", budget, BUDGETS)
        return self.samples if budget == "samples" else self.budget_steps * batch_size

    def decision_cells(self) -> list[tuple]:
        """The decision's cells ``(budget, batch_size, target, arm)``, arms whose runs are in ``strategies``."""
        arms = [a for a in DECISION_STRATEGIES if run_strategy(a) in self.strategies]
        return [(bu, b, t, a) for bu in BUDGETS for b in self.decision_batch_sizes for t in self.targets for a in arms]

    def decision_config(self, cell: tuple, seed: int, factor: float) -> FinetuneConfig:
        """The run of ``cell`` (:meth:`decision_cells`) for ``seed`` at ``factor * lr_for(batch_size)``."""
        bu, b, t, a = cell
        return dataclasses.replace(self._finetune_config(seed, t, b, run_strategy(a), factor),
                                   samples=self.budget_samples(bu, b))

    def diag_configs(self) -> list["DiagConfig"]:
        return [DiagConfig(seed=s, noise=self.noise, stage1_steps=self.stage1_steps, noise_batch_sizes=self.noise_batch_sizes,
                           noise_pool=self.noise_pool, precise_samples=self.precise_samples,
                           precise_pool=self.precise_pool, targets=self.targets,
                           mismatch_batches=self.mismatch_batches) for s in self.seeds]


def make_config(profile: str = "quick", **overrides) -> Config:
    """A :class:`Config` from :data:`PROFILES` with ``overrides`` (``None``: the profile's value)."""
    return from_profile(Config, PROFILES, profile, **overrides)


@dataclass(frozen=True)
class DiagConfig(SourceConfig):
    """The per-seed measurements without fine-tuning: noise, precise BN, mismatch (one cached row)."""

    noise_batch_sizes: tuple = (2, 4, 8, 16, 32, 64, 128, 256)
    noise_pool: int = 2048
    precise_samples: tuple = (16, 64, 256, 1024, 4096)
    precise_pool: int = 8192
    targets: tuple = tuple(TARGETS)
    mismatch_batches: int = 8

    @property
    def source(self) -> SourceConfig:
        return SourceConfig(**{k: getattr(self, k) for k in SourceConfig.__dataclass_fields__})


# --- 1. noise of batch statistics ---------------------------------------------------------------------------------

@torch.no_grad()
def per_sample_moments(backbone: torch.nn.Module, x: torch.Tensor) -> dict[str, dict]:
    """Per BN layer of ``backbone`` (eval mode): per-sample, per-channel means of ``v`` and ``v^2`` over the
    ``H x W`` positions, ``s1, s2 (N, C)`` float64, the pooled central 2nd and 4th moments ``(C,)`` and ``hw``."""
    from ....freeze import batchnorm_layers
    layers = batchnorm_layers(backbone)
    acc: dict = {}

    def hook_for(name):
        def hook(_m, inputs):
            v = inputs[0].detach().double()
            a = acc.setdefault(name, dict(s1=[], s2=[], hw=v[0, 0].numel()))
            a["s1"].append(v.mean((2, 3)))
            a["s2"].append((v * v).mean((2, 3)))
        return hook

    handles = [m.register_forward_pre_hook(hook_for(n)) for n, m in layers.items()]
    was = backbone.training
    backbone.eval()
    try:
        for i in range(0, len(x), 512):
            backbone(x[i:i + 512])
        # central 4th moment needs the values themselves: a second pass
        mu = {n: torch.cat(a["s1"]).mean(0) for n, a in acc.items()}
        m2 = {n: torch.zeros_like(mu[n]) for n in acc}
        m4 = {n: torch.zeros_like(mu[n]) for n in acc}
        cnt = {n: 0 for n in acc}

        def hook4(name):
            def hook(_m, inputs):
                d = inputs[0].detach().double() - mu[name].view(1, -1, 1, 1)
                m2[name] += (d ** 2).sum((0, 2, 3))
                m4[name] += (d ** 4).sum((0, 2, 3))
                cnt[name] += d.shape[0] * d.shape[2] * d.shape[3]
            return hook
        for h in handles:
            h.remove()
        handles = [m.register_forward_pre_hook(hook4(n)) for n, m in layers.items()]
        for i in range(0, len(x), 512):
            backbone(x[i:i + 512])
    finally:
        for h in handles:
            h.remove()
        backbone.train(was)
    return {n: dict(s1=torch.cat(a["s1"]), s2=torch.cat(a["s2"]), hw=a["hw"], var=m2[n] / cnt[n],
                    mu4=m4[n] / cnt[n]) for n, a in acc.items()}


def noise_records(moments: dict, batch_sizes) -> list[dict]:
    """Spread of batch statistics across ``K = N // m`` disjoint batches per layer and batch size ``m``, averaged
    over channels: ``var_mean_rel = Var_K(batch mean) / sigma^2`` against ``pred_mean_rel = 1 / (m H W)`` and
    ``var_var_rel = Var_K(batch var) / sigma^4`` (biased batch variance, as train mode) against ``pred_var_rel =
    (kurtosis - 1) / (m H W)``; ``n_eff_frac = pred_mean_rel / var_mean_rel``, the effective fraction of ``m H W``."""
    recs = []
    for li, (name, a) in enumerate(moments.items()):
        s1, s2, hw, var = a["s1"], a["s2"], a["hw"], a["var"]
        kurt = a["mu4"] / var ** 2
        for m in batch_sizes:
            k = len(s1) // m
            if k < 2:
                continue
            bm = s1[:k * m].view(k, m, -1).mean(1)
            bv = s2[:k * m].view(k, m, -1).mean(1) - bm ** 2
            vm = (bm.var(0, unbiased=True) / var).mean().item()
            vv = (bv.var(0, unbiased=True) / var ** 2).mean().item()
            pm = 1.0 / (m * hw)
            pv = ((kurt - 1) / (m * hw)).mean().item()
            recs.append(dict(layer=li, layer_name=name, hw=hw, channels=s1.shape[1], batch_size=m, n_batches=k,
                             var_mean_rel=vm, pred_mean_rel=pm, var_var_rel=vv, pred_var_rel=pv,
                             n_eff_frac=pm / vm if vm > 0 else math.nan))
    return recs


# --- 2. how much data precise BN needs ----------------------------------------------------------------------------

def _stream(task, n: int, batch_size: int, gen: torch.Generator):
    """``n`` samples of ``task`` in batches of ``batch_size`` built from 2-sample draws (same images for any even
    batch size)."""
    unit = BatchStream(task, 2, gen)
    for _ in range(n // batch_size):
        xs = [unit.next()[0] for _ in range(batch_size // 2)]
        yield torch.cat(xs)


def _pool(task, n: int, gen: torch.Generator) -> torch.Tensor:
    """``n`` samples (``n`` even) of ``task`` as one tensor ``(n, 3, H, W)``: the images of :func:`_stream` with the
    same generator, in the same order, with no batch size that must divide ``n``."""
    unit = BatchStream(task, 2, gen)
    return torch.cat([unit.next()[0] for _ in range(n // 2)])


@torch.no_grad()
def exact_population_statistics(backbone: torch.nn.Module, x: torch.Tensor) -> dict[str, tuple]:
    """Population mean and (biased) variance of every BN layer's input on ``x``, layer by layer (layers ``< l``
    already exact, eval mode); written into ``backbone`` and returned as ``{name: (mean (C,), var (C,))}``."""
    from ....freeze import batchnorm_layers
    layers = batchnorm_layers(backbone)
    out = {}
    for name, layer in layers.items():
        st = bn_input_statistics(backbone, [x[i:i + 1024] for i in range(0, len(x), 1024)], "eval")[name]
        layer.running_mean.copy_(st[0].to(layer.running_mean.dtype))
        layer.running_var.copy_(st[1].to(layer.running_var.dtype))
        out[name] = st
    return out


def _stat_errors(backbone, exact: dict) -> tuple[float, float]:
    """Mean over layers and channels of ``|m - m*| / sqrt(v* + eps)`` and ``|log((v + eps)/(v* + eps))|``."""
    from ....freeze import batchnorm_layers
    me, ve = [], []
    for name, layer in batchnorm_layers(backbone).items():
        m0, v0 = exact[name]
        m, v = layer.running_mean.double(), layer.running_var.double()
        # rsqrt, not / sqrt: torch's float32 sqrt differs in the last bits between CPUs (bnstudy.study.numerics)
        me.append(((m - m0).abs() * (v0 + layer.eps).rsqrt()).mean().item())
        ve.append(((v + layer.eps) / (v0 + layer.eps)).log().abs().mean().item())
    return float(np.mean(me)), float(np.mean(ve))


def precise_records(cfg: DiagConfig, state: dict) -> list[dict]:
    """Precise BN on task A shifted as in chapter 1: rows ``kind, batch_size, n_samples, mean_err, var_err,
    accuracy`` (head A), with ``n_samples = 0`` rows for the exact and the source statistics (``kind``)."""
    b, c = TARGETS["shifted"]
    task = make_task(cfg.seed, "A", cfg.n_classes, cfg.noise, b, c)
    xe, ye = eval_set(task, cfg.n_eval, cfg.seed, "A")

    def model():
        bb = ConvBackbone(3, cfg.widths, cfg.norm, cfg.momentum)
        bb.load_state_dict(state["backbone"])
        head = make_head("linear", bb.out_features, cfg.n_classes)
        head.load_state_dict(state["head_a"])
        return bb.eval(), head.eval()

    def acc(bb, head):
        return accuracy(logits_of(lambda x: head(bb(x)), xe, "cpu"), ye)

    ref = _pool(task, cfg.precise_pool, generator(cfg.seed, "precise", "reference"))
    bb, head = model()
    recs = [dict(kind="source", batch_size=0, n_samples=0, mean_err=math.nan, var_err=math.nan, accuracy=acc(bb, head))]
    exact = exact_population_statistics(bb, ref)
    recs.append(dict(kind="exact", batch_size=0, n_samples=0, mean_err=0.0, var_err=0.0, accuracy=acc(bb, head)))
    for m in PRECISE_BATCH_SIZES:
        for n in (n for n in cfg.precise_samples if n >= m and n % m == 0):
            bb, head = model()
            update_bn_stats(bb, _stream(task, n, m, generator(cfg.seed, "precise", "estimate")))
            me, ve = _stat_errors(bb, exact)
            recs.append(dict(kind="precise", batch_size=m, n_samples=n, mean_err=me, var_err=ve, accuracy=acc(bb, head)))
    return recs


def _diag_group(configs: list[DiagConfig], cache_root: str, version: str) -> list[dict]:
    """One row per seed: noise records, precise-BN records, mismatch per target (a run_sweep group)."""
    rows = []
    for cfg in configs:
        state = load_source(cfg.source, cache_root, version)
        bb = ConvBackbone(3, cfg.widths, cfg.norm, cfg.momentum)
        bb.load_state_dict(state["backbone"])
        task_a = make_task(cfg.seed, "A", cfg.n_classes, cfg.noise)
        x = _pool(task_a, cfg.noise_pool, generator(cfg.seed, "noise", "A"))
        row = dict(seed=cfg.seed, noise_records=noise_records(per_sample_moments(bb, x), cfg.noise_batch_sizes),
                   precise_records=precise_records(cfg, state))
        for t in cfg.targets:
            task_b = make_task(cfg.seed, "B", cfg.n_classes, cfg.noise, *TARGETS[t])
            stream = BatchStream(task_b, 64, generator(cfg.seed, "mismatch", "B"))
            kl = statistics_mismatch(bb.eval(), [stream.next()[0] for _ in range(cfg.mismatch_batches)], "kl")
            row[f"mismatch_kl_{t}"] = float(np.mean(list(kl.values())))
        rows.append(row)
    return rows


# --- the experiment -----------------------------------------------------------------------------------------------

#: Share a seed and target's draws among its runs (:class:`bnstudy.study.engine.FinetuneData`); ``False``: the tests' reference.
SHARE_DATA = True


def _finetune_group(configs: list[FinetuneConfig], cache_root: str, version: str) -> list[dict]:
    """Fine-tuning rows for configs of one seed and target (a run_sweep group), sources loaded and draws made once."""
    from ...engine import FinetuneData
    sources: dict = {}
    data = FinetuneData() if SHARE_DATA else None
    rows = []
    for c in configs:
        if c.source not in sources:
            sources[c.source] = load_source(c.source, cache_root, version)
        rows.append(finetune(c, sources[c.source], data=data))
    return rows



def run(config: Config, execution: Execution | None = None) -> tuple[pd.DataFrame, ...]:
    """Run chapter 5: ``(runs, diag, tune, tuned, decision_check, decision)``: one row per fine-tuning run
    (:func:`bnstudy.study.engine.finetune`'s columns, ``target_name``, the seed's ``mismatch_kl``); one row per seed
    with the list-valued ``noise_records`` / ``precise_records`` and ``mismatch_kl_<target>``; the learning-rate
    check's and the tuned-rate runs (with ``lr_factor``; empty without tuning seeds or contenders); the decision's
    tuning and reported runs (:func:`decision_tables`; empty without ``decision_batch_sizes``)."""
    if not isinstance(config, Config):
        raise TypeError(f"run needs a batch_size.Config (see make_config), got {type(config).__name__}")
    ex = execution or Execution()
    version = source_version()  # stage 1's code version (the sweeps read the backbones with it)
    root = str(ex.cache_dir if ex.cache_dir is not None else default_cache_dir())
    cfgs, tcfgs = config.run_configs(), config.tune_configs()
    ensure_sources(list(dict.fromkeys([config.source(s) for s in config.seeds] + [c.source for c in cfgs + tcfgs])),
                   ex, version)
    kw = dict(cache_dir=root, execution=ex, group_kwargs={"cache_root": root, "version": version})
    diag = run_sweep(config.diag_configs(), _diag_group, namespace=DIAG_NAMESPACE, desc="noise, precise BN, mismatch",
                     **kw)
    names = {v: k for k, v in TARGETS.items()}

    def sweep(cfgs, desc, factor=True):  # one group per seed and target: every batch size shares the draws
        groups: dict = {}
        for i, c in enumerate(cfgs):
            groups.setdefault((c.seed, c.brightness, c.contrast), []).append(i)
        out = run_sweep(cfgs, _finetune_group, namespace=NAMESPACE, groups=list(groups.values()), desc=desc, **kw)
        out["target_name"] = [names[(b, c)] for b, c in zip(out["brightness"], out["contrast"])]
        if factor:
            out["lr_factor"] = [round(lr / config.lr_for(b), 6) for lr, b in zip(out["lr"], out["batch_size"])]
        return out

    df = sweep(cfgs, "fine-tuning", factor=False)
    tune = sweep(tcfgs, "learning-rate check") if tcfgs else pd.DataFrame()
    tuned = pd.DataFrame()
    sb = min(config.batch_sizes)
    if tcfgs and sb in config.tune_batch_sizes and set(CONTENDERS) & set(config.strategies):
        tuned = sweep(config.tuned_configs(chosen_factors(tune, sb)), "tuned rates, reported seeds")
    dcheck, dec = decision_tables(config, sweep) if config.decision_batch_sizes else (pd.DataFrame(), pd.DataFrame())
    mm = diag.melt(id_vars="seed", value_vars=[f"mismatch_kl_{t}" for t in config.targets],
                   var_name="target_name", value_name="mismatch_kl")
    mm["target_name"] = mm["target_name"].str.replace("mismatch_kl_", "", regex=False)
    df = df.merge(mm, on=["seed", "target_name"], how="left", validate="many_to_one")
    return df, diag, tune, tuned, dcheck, dec


# --- tidy tables --------------------------------------------------------------------------------------------------

def results_table(df: pd.DataFrame) -> pd.DataFrame:
    """The fine-tuning results without list-valued columns."""
    return df[[c for c in df.columns if not df[c].map(lambda v: isinstance(v, (list, tuple, dict))).any()]]


def _records(diag: pd.DataFrame, column: str) -> pd.DataFrame:
    """The list-valued ``column`` of ``diag``, one row per record with its ``seed``."""
    return pd.DataFrame([dict(seed=r["seed"], **rec) for _, r in diag.iterrows() for rec in r[column]])


def noise_table(diag: pd.DataFrame) -> pd.DataFrame:
    """Tidy noise table: ``seed`` and :func:`noise_records`' columns."""
    return _records(diag, "noise_records")


def precise_table(diag: pd.DataFrame) -> pd.DataFrame:
    """Tidy precise-BN table, with ``acc_vs_exact`` (minus the seed's exact-statistics accuracy)."""
    t = _records(diag, "precise_records")
    t["acc_vs_exact"] = t["accuracy"] - t["seed"].map(t[t.kind == "exact"].set_index("seed")["accuracy"])
    return t


def run_tables(config: Config, execution: Execution | None = None) -> tuple[pd.DataFrame, dict]:
    """:func:`run` as the tables a page saves: the results and ``{suffix: table}`` of :data:`SIBLING_TABLES`."""
    df, diag, tune, tuned, dcheck, dec = run(config, execution)
    return results_table(df), dict(lr_check=results_table(tune), noise=noise_table(diag),
                                   precise_bn=precise_table(diag), tuned=results_table(tuned),
                                   decision_check=results_table(dcheck), decision=results_table(dec))


def diag_from_tables(noise: pd.DataFrame, precise: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """:func:`run`'s ``diag`` rebuilt from the saved tables (``mismatch_kl_<target>`` from the ``runs``)."""
    out = []
    for s in sorted(set(noise["seed"]) | set(precise["seed"])):
        row = dict(seed=s, noise_records=noise[noise.seed == s].drop(columns="seed").to_dict("records"),
                   precise_records=precise[precise.seed == s].drop(columns=["seed", "acc_vs_exact"]).to_dict("records"))
        for t, g in runs[runs.seed == s].groupby("target_name", sort=True):
            row[f"mismatch_kl_{t}"] = g["mismatch_kl"].iloc[0]
        out.append(row)
    return pd.DataFrame(out)


def best_rate_table(tune: pd.DataFrame) -> pd.DataFrame:
    """The learning-rate check's rows at each cell's best ``lr_factor`` (highest mean target accuracy over the
    tuning seeds; ties to the factor nearest 1), with ``best_factor``."""
    cell = ["target_name", "strategy", "batch_size"]
    m = tune.groupby(cell + ["lr_factor"])["target"].mean().reset_index()
    m["dist"] = np.abs(np.log(m.lr_factor))
    best = m.sort_values(["target", "dist"], ascending=[False, True]).groupby(cell).head(1)[cell + ["lr_factor"]]
    return tune.merge(best, on=cell + ["lr_factor"]).assign(best_factor=lambda d: d["lr_factor"])


def chosen_factors(tune: pd.DataFrame, batch_size: int) -> dict:
    """``{(target, strategy): best lr_factor}`` at ``batch_size`` of the :data:`CONTENDERS` in ``tune``. Raises
    ``ValueError`` if ``batch_size`` is not one of ``tune``'s."""
    if batch_size not in set(tune.batch_size):
        raise ValueError(f"batch_size={batch_size} is not a batch size of the learning-rate check "
                         f"{sorted(set(tune.batch_size))}")
    best = best_rate_table(tune[tune.batch_size == batch_size]).drop_duplicates(["target_name", "strategy"])
    return {(r.target_name, r.strategy): float(r.best_factor) for r in best.itertuples() if r.strategy in CONTENDERS}


# --- 4. the batch-size-2 decision (issue 34) -----------------------------------------------------------------------

#: The columns naming a decision cell in :func:`decision_tables`' tables.
DECISION_CELL = ["budget", "batch_size", "target_name", "arm"]


def best_factors(check: pd.DataFrame) -> pd.DataFrame:
    """Per decision cell of the tuning runs ``check``: the ``lr_factor`` with the highest mean ``score`` (ties: the
    factor nearest 1, then the smaller), ``grid_low`` / ``grid_high`` (the factors tried) and ``at_edge``. A diverged
    seed scores its chance-level accuracy. Raises ``ValueError`` naming a missing column."""
    missing = [c for c in DECISION_CELL + ["lr_factor", "score"] if c not in check]
    if missing:
        raise ValueError(f"best_factors: the tuning table has no column {missing[0]!r}")
    m = check.groupby(DECISION_CELL + ["lr_factor"])["score"].mean().reset_index()
    m["dist"] = np.abs(np.log(m.lr_factor))
    best = (m.sort_values(["score", "dist", "lr_factor"], ascending=[False, True, True])
            .groupby(DECISION_CELL, sort=True).head(1).set_index(DECISION_CELL))
    span = check.groupby(DECISION_CELL)["lr_factor"].agg(grid_low="min", grid_high="max")
    out = best[["lr_factor", "score"]].join(span).reset_index()
    out["at_edge"] = (out.lr_factor == out.grid_low) | (out.lr_factor == out.grid_high)
    return out.sort_values(DECISION_CELL).reset_index(drop=True)


def _decision_rows(rows: pd.DataFrame, cells: list, seeds_factors: list) -> pd.DataFrame:
    """The decision runs ``rows`` with their cells' columns, ``lr_factor`` and ``score``."""
    rows = rows.reset_index(drop=True).copy()
    rows["budget"] = [c[0] for c in cells]
    rows["arm"] = [c[3] for c in cells]
    rows["lr_factor"] = [f for _, f in seeds_factors]
    rows["score"] = [r[score_column(c[3])] for c, (_, r) in zip(cells, rows.iterrows())]
    return rows


def decision_tables(config: Config, sweep) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The batch-size-2 decision's runs ``(check, reported)``, with :data:`DECISION_CELL`, ``lr_factor`` and
    ``score``. ``check``: every cell on every tuning seed at every factor; then up to ``grid_extensions`` rounds
    that add ``factor / 2`` (``* 2``) to the grid of every cell whose best factor is its smallest (largest).
    ``reported``: every cell on the reported seeds at its final best factor. ``sweep(configs, desc)``: :func:`run`'s
    cached sweep; a run shared between cells (``bn_train`` and :data:`PRECISE_AFTER`) is computed once."""
    cells = config.decision_cells()
    grid = {c: list(config.lr_factors) for c in cells}
    # configs this run has already computed (the main grid, the learning-rate check, earlier rounds): swept apart
    # from the new ones, so that a (seed, target) group with one new config does not recompute its cached mates
    seen = set(config.run_configs()) | set(config.tune_configs())

    def runs(todo, desc):  # each distinct config once, its row copied to every cell it scores
        cfgs = [config.decision_config(c, s, f) for c, s, f in todo]
        unique = list(dict.fromkeys(cfgs))
        parts = [[c for c in unique if c in seen], [c for c in unique if c not in seen]]
        out = pd.concat([sweep(p, desc, factor=False) for p in parts if p], ignore_index=True)
        seen.update(unique)
        at = {c: i for i, c in enumerate(parts[0] + parts[1])}
        return _decision_rows(out.iloc[[at[c] for c in cfgs]], [c for c, _, _ in todo], [(s, f) for _, s, f in todo])

    def run_check():
        return runs([(c, s, f) for c in cells for f in sorted(grid[c]) for s in config.tune_seeds],
                    "decision: rate tuning")

    check = run_check()
    for _ in range(config.grid_extensions):
        best = best_factors(check)
        grew = False
        for r in best.itertuples(index=False):
            c = (r.budget, r.batch_size, r.target_name, r.arm)
            if r.lr_factor == min(grid[c]):
                grid[c].append(min(grid[c]) / 2)
                grew = True
            elif r.lr_factor == max(grid[c]):
                grid[c].append(max(grid[c]) * 2)
                grew = True
        if not grew:
            break
        check = run_check()
    best = best_factors(check)
    chosen = {(r.budget, r.batch_size, r.target_name, r.arm): float(r.lr_factor) for r in best.itertuples(index=False)}
    return check, runs([(c, s, chosen[c]) for s in config.seeds for c in cells], "decision: reported seeds")
