"""Chapter 8, what is run (issue 38): a source network meets shifted test streams; each method predicts every test
sample once, in stream order, a batch of ``test_batch`` samples at a time.

Source: the book's stage 1 (:func:`bnstudy.study.engine.load_source`), a backbone and head A trained on task A. Test
data: task A's images under chapter 6's three shifted domains ``B``, ``C``, ``D`` of one shift family
(:data:`FAMILIES`; :func:`domain_task`) at strength ``t``, in three streams (:data:`STREAMS`, :func:`streams`):
``single`` (one domain, random order), ``mixed`` (the three domains interleaved: Döbler & Marsden's mixed-domain
setting) and ``class_sorted`` (one domain sorted by label: Niu et al. 2023's class-correlated stream).

Methods (:data:`METHODS`), all with head A and the source weights: ``source`` (the stored statistics); ``prior``
(:func:`bnstudy.adapt_bn_statistics` at prior ``N``, Schneider et al. 2020; ``N = 0`` is test-batch statistics, not
run at a test batch of one); ``dua`` (one train-mode update of the stored statistics per test batch at Mirza et al.
2022's decaying momentum, :data:`DUA_SCHEDULE`, then an eval-mode prediction); ``tent`` (test-batch statistics, the
prediction, then one SGD step on every BatchNorm's affine parameters against the prediction entropy; Wang et al.
2021); ``routed`` (chapter 6's per-sample router among the source statistics and a precise-BN bank per domain,
estimated on ``bank_samples`` unlabelled images of it) and ``oracle`` (each sample's own domain bank). ``source``,
``routed`` and ``oracle`` decide per sample; ``dua`` and ``tent`` start afresh for each stream. One unit is one
(seed, family, strength), paired within the seed.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from ....adapt import adapt_bn_statistics
from ....running_stats import statistics_mismatch, update_bn_stats
from ...banks import StatisticBank
from ...config import Execution, SourceConfig, _Frozen, check_seeds, from_profile
from ...design import ChapterConfig, Rule
from ...engine import accuracy, ensure_sources, load_source
from ...models import ConvBackbone, make_head
from ...routing import NearestStatistics
from ...sweep import default_cache_dir, run_sweep
from ...tasks import BatchStream, eval_set, generator, make_task
from ..unknown_task.run import CorruptedTask, corruption_of, shift_of

NAMESPACE = "ch08_test_time"
FAMILIES = ("affine", "noise", "blur")
DOMAINS = ("B", "C", "D")
STREAMS = ("single", "mixed", "class_sorted")
METHODS = ("source", "prior", "dua", "tent", "routed", "oracle")
#: Mirza et al. 2022's momentum schedule: ``max(start * decay ** i, floor)`` at the ``i``-th test batch.
DUA_SCHEDULE = dict(start=0.1, decay=0.94, floor=0.005)
#: Unlabelled images per forward pass when a domain bank is estimated.
BANK_BATCH = 256

PROFILES = {
    "quick": dict(seeds=2, tuning_seeds=(100,), families=("affine", "noise"), strengths=(1.0,),
                  test_batches=(1, 8, 64), n_eval=128, bank_samples=256, priors=(0.0, 1.0, 16.0),
                  tent_lrs=(1e-2,)),
    "full": dict(seeds=10, tuning_seeds=(100, 101, 102), families=FAMILIES, strengths=(0.25, 1.0),
                 test_batches=(1, 2, 4, 8, 16, 32, 64, 128), n_eval=512, bank_samples=1024,
                 priors=(0.0, 0.125, 1.0, 8.0, 64.0, 512.0), tent_lrs=(1e-3, 1e-2, 1e-1, 1.0)),
}


@dataclass(frozen=True)
class UnitConfig(_Frozen):
    """One cached unit: one seed, shift family and strength (every stream, test batch, method and setting)."""

    seed: int
    family: str
    strength: float
    test_batches: tuple
    n_eval: int
    bank_samples: int
    priors: tuple
    tent_lrs: tuple
    noise: float = 3.0
    momentum: float = 0.1
    n_classes: int = 10

    @property
    def source(self) -> SourceConfig:
        return SourceConfig(seed=self.seed, n_classes=self.n_classes, noise=self.noise, momentum=self.momentum)


class Config(ChapterConfig):
    """Chapter 8's parameters, checked by :class:`bnstudy.study.design.ChapterConfig` (``ValueError`` naming the
    parameter; :data:`RULES` says what each allows). ``tuning_seeds`` choose the prior and TENT's rate and are never
    reported."""

    PARAMETERS = dict(profile="quick", seeds=(0, 1), tuning_seeds=(100,), families=("affine", "noise"),
                      strengths=(1.0,), test_batches=(1, 8, 64), n_eval=128, bank_samples=256,
                      priors=(0.0, 1.0, 16.0), tent_lrs=(1e-2,))

    PROFILES = PROFILES
    NORMALIZE = {"seeds": check_seeds}
    RULES = (
        Rule("tuning_seeds", "one or more seeds >= 0 disjoint from seeds (a setting is never judged on the seeds "
             "it was chosen on)", lambda c: bool(c.tuning_seeds) and min(c.tuning_seeds) >= 0
             and not set(c.tuning_seeds) & set(c.seeds)),
        Rule("families", f"one or more of {list(FAMILIES)}", lambda c: bool(c.families) and set(c.families) <= set(FAMILIES)),
        Rule("strengths", "one or more strictly increasing strengths > 0",
             lambda c: bool(c.strengths) and list(c.strengths) == sorted(set(c.strengths)) and c.strengths[0] > 0),
        Rule("test_batches", "one or more strictly increasing batch sizes >= 1, each dividing n_eval",
             lambda c: bool(c.test_batches) and list(c.test_batches) == sorted(set(c.test_batches))
             and c.test_batches[0] >= 1 and all(c.n_eval % b == 0 for b in c.test_batches)),
        Rule("bank_samples", f"a positive multiple of {BANK_BATCH}",
             lambda c: c.bank_samples >= BANK_BATCH and c.bank_samples % BANK_BATCH == 0),
        Rule("priors", "one or more distinct priors >= 0", lambda c: bool(c.priors) and min(c.priors) >= 0),
        Rule("tent_lrs", "one or more rates > 0", lambda c: bool(c.tent_lrs) and min(c.tent_lrs) > 0),
    )

    def units(self, seeds: tuple | None = None) -> list[UnitConfig]:
        """One :class:`UnitConfig` per (seed, family, strength), seeds outermost (``seeds``: default the reported
        ones)."""
        return [UnitConfig(seed=s, family=f, strength=t, test_batches=self.test_batches, n_eval=self.n_eval,
                           bank_samples=self.bank_samples, priors=self.priors, tent_lrs=self.tent_lrs)
                for s in (self.seeds if seeds is None else seeds) for f in self.families for t in self.strengths]


def make_config(profile: str = "quick", **overrides) -> Config:
    """A :class:`Config` from :data:`PROFILES` with ``overrides`` (``None``: the profile's value)."""
    return from_profile(Config, PROFILES, profile, **overrides)


# --- the test data ------------------------------------------------------------------------------------------------

def domain_task(u: UnitConfig, domain: str):
    """Task A's images under ``domain`` (``B``/``C``/``D``) of the unit's family at its strength."""
    if u.family == "affine":
        return make_task(u.seed, "A", u.n_classes, u.noise, *shift_of(domain, u.strength))
    base = make_task(u.seed, "A", u.n_classes, u.noise)
    blur, extra = corruption_of(domain, u.family, u.strength)
    return CorruptedTask(base.templates, base.noise, blur=blur, extra_noise=extra)


def streams(u: UnitConfig) -> dict[tuple[str, str], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """``{(stream, domain): (x, y, d)}``: images ``(N, 3, 32, 32)``, labels ``(N,)`` and each sample's domain bank
    index ``(N,)`` (1..3), in stream order. ``single`` and ``class_sorted`` per domain; ``mixed`` (domain ``all``)
    interleaves the three domains' ``n_eval`` samples each."""
    sets = {d: eval_set(domain_task(u, d), u.n_eval, u.seed, f"ch08_{u.family}_{d}") for d in DOMAINS}
    out = {}
    for k, (d, (x, y)) in enumerate(sets.items(), 1):
        dom = torch.full((len(y),), k, dtype=torch.long)
        order = torch.randperm(len(y), generator=generator(u.seed, "ch08_order", u.family, d))
        out["single", d] = (x[order], y[order], dom)
        by_label = torch.sort(y[order], stable=True).indices  # a random order within each class
        out["class_sorted", d] = (x[order][by_label], y[order][by_label], dom)
    x = torch.cat([s[0] for s in sets.values()])
    y = torch.cat([s[1] for s in sets.values()])
    dom = torch.cat([torch.full((u.n_eval,), k, dtype=torch.long) for k in range(1, len(DOMAINS) + 1)])
    order = torch.randperm(len(y), generator=generator(u.seed, "ch08_order", u.family, "mixed"))
    out["mixed", "all"] = (x[order], y[order], dom[order])
    return out


# --- the methods ---------------------------------------------------------------------------------------------------

def _batches(x: torch.Tensor, b: int):
    return (x[i:i + b] for i in range(0, len(x), b))


@torch.no_grad()
def _predict(backbone, head, x: torch.Tensor, b: int) -> torch.Tensor:
    return torch.cat([head(backbone(xb)).argmax(1) for xb in _batches(x, b)])


def _prior_predictions(backbone, head, x, b: int, prior: float) -> torch.Tensor:
    with adapt_bn_statistics(backbone, prior=prior):
        return _predict(backbone, head, x, b)


def _norm_layers(model):
    return [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]


@torch.no_grad()
def _dua_predictions(backbone, head, x, b: int) -> torch.Tensor:
    bb = copy.deepcopy(backbone)
    s = DUA_SCHEDULE
    preds = []
    for i, xb in enumerate(_batches(x, b)):
        m = max(s["start"] * s["decay"] ** i, s["floor"])
        for bn in _norm_layers(bb):
            bn.momentum = m
        bb.train()(xb)  # updates the running statistics only (no parameter is trained)
        preds.append(head(bb.eval()(xb)).argmax(1))
    return torch.cat(preds)


def _tent_predictions(backbone, head, x, b: int, lr: float) -> torch.Tensor:
    bb = copy.deepcopy(backbone).requires_grad_(False)
    affine = [p for bn in _norm_layers(bb) for p in (bn.weight, bn.bias) if p is not None]
    for p in affine:
        p.requires_grad_(True)
    opt = torch.optim.SGD(affine, lr=lr, momentum=0.9)
    preds = []
    with adapt_bn_statistics(bb, prior=0.0):
        for xb in _batches(x, b):
            logits = head(bb(xb))
            preds.append(logits.argmax(1).detach())
            entropy = -(logits.softmax(1) * logits.log_softmax(1)).sum(1).mean()
            opt.zero_grad(set_to_none=True)
            entropy.backward()
            opt.step()
    return torch.cat(preds)


def _bank(u: UnitConfig, backbone) -> StatisticBank:
    """Bank 0: the source statistics; bank ``k``: a precise-BN estimate on domain ``DOMAINS[k-1]``'s unlabelled
    images (fresh draws, not the test samples)."""
    bank = StatisticBank(backbone, len(DOMAINS) + 1)
    for k, d in enumerate(DOMAINS, 1):
        stream = BatchStream(domain_task(u, d), BANK_BATCH, generator(u.seed, "ch08_bank", u.family, d))
        with bank.use(k):
            update_bn_stats(backbone, [stream.next()[0] for _ in range(u.bank_samples // BANK_BATCH)])
    return bank


def run_unit(u: UnitConfig, source: dict) -> dict:
    """Every stream, test batch, method and setting of one unit: one record per (stream, domain, test_batch,
    method, setting) with ``accuracy`` (head A) and ``routing_accuracy`` (``routed``: the share sent to their own
    domain's bank), plus one ``mismatch`` record per domain (chapter 3's mean KL over layers before adapting)."""
    t0 = time.perf_counter()
    backbone = ConvBackbone(3, SourceConfig.widths, "batch", u.momentum)
    backbone.load_state_dict(source["backbone"])
    backbone.requires_grad_(False).eval()
    head = make_head("linear", backbone.out_features, u.n_classes)
    head.load_state_dict(source["head_a"])
    head.requires_grad_(False)
    bank = _bank(u, backbone)
    router = NearestStatistics(bank, "first")
    records = []

    def add(stream, domain, b, method, setting, acc, route=math.nan):
        records.append(dict(stream=stream, domain=domain, test_batch=b, method=method, setting=setting,
                            accuracy=acc, routing_accuracy=route))

    for (stream, domain), (x, y, dom) in streams(u).items():
        if stream == "single":
            kl = statistics_mismatch(backbone, [x[:BANK_BATCH]], "kl", "eval")
            add(stream, domain, 0, "mismatch", math.nan, float(sum(kl.values()) / len(kl)))
        with torch.no_grad():
            feats = []
            for k in range(bank.n_banks):
                with bank.use(k):
                    feats.append(torch.cat([backbone(xb) for xb in _batches(x, BANK_BATCH)]))
            route = router.route(x, batch_size=1)
        pick = lambda r: head(torch.stack(feats)[r, torch.arange(len(r))])  # noqa: E731
        per_sample = dict(source=(head(feats[0]), math.nan), routed=(pick(route), float((route == dom).double().mean())),
                          oracle=(pick(dom), math.nan))
        for b in u.test_batches:
            for method, (logits, r) in per_sample.items():
                add(stream, domain, b, method, math.nan, accuracy(logits, y), r)
            for prior in u.priors:
                if not (prior == 0 and b == 1):
                    add(stream, domain, b, "prior", prior, _acc(_prior_predictions(backbone, head, x, b, prior), y))
            add(stream, domain, b, "dua", math.nan, _acc(_dua_predictions(backbone, head, x, b), y))
            if b > 1:
                for lr in u.tent_lrs:
                    add(stream, domain, b, "tent", lr, _acc(_tent_predictions(backbone, head, x, b, lr), y))
    return dict(records=records, source_task_a_accuracy=source["task_a_accuracy"], wall_s=time.perf_counter() - t0)


def _acc(pred: torch.Tensor, y: torch.Tensor) -> float:
    return int((pred == y).sum()) / len(y)


def _unit_group(units: list[UnitConfig], cache_root: str, version: str) -> list[dict]:
    return [run_unit(u, load_source(u.source, cache_root, version)) for u in units]


#: The tables beside the main one (``08_test_time_<name>.csv``): the tuning seeds' rows, from which every setting is
#: chosen (:func:`run_tables`).
SIBLING_TABLES = ("tuning",)
#: Parameters that only change the analysis of given rows (none: every parameter is the run's).
ANALYSIS_PARAMETERS = ()

#: The table's columns.
COLUMNS = ("seed", "family", "strength", "stream", "domain", "test_batch", "method", "setting", "accuracy",
           "routing_accuracy", "source_task_a_accuracy", "unit_wall_s")


def run(config: Config, execution: Execution | None = None, seeds: tuple | None = None) -> pd.DataFrame:
    """Run chapter 8's units (resumable through the run cache; ``seeds``: default the reported ones, pass
    ``config.tuning_seeds`` for the tuning runs): one row per record of :func:`run_unit`, columns
    :data:`COLUMNS`."""
    ex = execution or Execution()
    root = str(Path(ex.cache_dir) if ex.cache_dir is not None else default_cache_dir())
    from ...engine import source_version
    version = source_version()
    units = config.units(seeds)
    ensure_sources([u.source for u in units], ex, version)
    rows = run_sweep(units, _unit_group, namespace=NAMESPACE, cache_dir=root, execution=ex,
                     group_kwargs={"cache_root": root, "version": version}, desc="chapter 8 units")
    out = [dict(seed=u.seed, family=u.family, strength=u.strength, **rec,
                source_task_a_accuracy=row["source_task_a_accuracy"], unit_wall_s=row["wall_s"])
           for u, (_, row) in zip(units, rows.iterrows()) for rec in row["records"]]
    return pd.DataFrame(out, columns=list(COLUMNS))


def run_tables(config: Config, execution: Execution | None = None) -> tuple[pd.DataFrame, dict]:
    """What the page will analyse: ``(run(config), {"tuning": run(config, seeds=config.tuning_seeds)})``."""
    return run(config, execution), dict(tuning=run(config, execution, config.tuning_seeds))
