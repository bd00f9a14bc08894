"""Chapter 4, what is trained: ``Config`` -> :func:`run_tables` (the learning-rate search, the sweep at each mode's
chosen rate, the step-count check, the feature geometry) -> the tables the release saves; and the buffer audit."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from ...config import Execution, RunConfig, SourceConfig, check_choice, check_int, check_seeds, from_profile, \
    seeds_label
from ...design import ChapterConfig, Rule
from ...engine import seeded, train_source, transfer_sweep
from ...models import ConvBackbone, make_head
from ...modes import MODE_NAMES, TransferModel, get_mode
from ...sweep import reset_sweep_counts, run_sweep, sweep_counts
from ...tasks import BatchStream, eval_set, generator, make_task
from ..shift_strength.run import shift_of

NAMESPACE, SEARCH_NAMESPACE, STEPS_NAMESPACE, FEATURE_NAMESPACE = "ch04_heads", "ch04_lr_search", "ch04_steps", \
    "ch04_features"
STEPS_SEARCH_NAMESPACE = "ch04_steps_search"
#: Parameters that only change the analysis (a page given ``rows`` may differ from their run in these only).
ANALYSIS_PARAMETERS = ("margin",)
#: Parameters added after the release's rows were computed, with the value those rows had: none yet.
READ_DEFAULTS: dict = {}
#: The tables saved beside ``04_heads.csv`` (``04_heads_<suffix>.csv``) that the page analyses.
SIBLING_TABLES = ("search_runs", "steps", "steps_search_runs", "features", "units")
#: How the run went, not what it computed: a verification (rebuilt from cached units) skips them.
RUN_STATE_COLUMNS = {"units": ("computed",)}
#: Heads that normalize the backbone's 64 features before one linear layer (:func:`bnstudy.study.models.make_head`).
INPUT_NORM_HEADS = ("std_linear", "bn_linear", "ln_linear")
HEADS = ("linear", "mlp", "mlp2", "mlp_bn", "mlp_ln", *INPUT_NORM_HEADS)
OPTIMIZERS = ("sgd", "sgd_plain", "adam")
PINNED_MODES = ("backbone_eval", "all_eval")
#: Chapter 1's shift (RunConfig's defaults).
REFERENCE_SHIFT = (RunConfig.brightness, RunConfig.contrast)
#: The reference of every freeze-mode comparison: a gap is ``task_b(separate_stats) - task_b(backbone_eval)``.
REFERENCE_MODE = "backbone_eval"
#: The heads every configuration includes: the seed's linear head and the head with its own BatchNorm.
PAGE_HEADS = ("linear", "mlp_bn")
#: The heads and modes of the longer budget (``steps_check`` steps, chapter 1's shift, rates tuned at that budget).
LONG_HEADS, STEPS_CHECK_MODES = ("linear", *INPUT_NORM_HEADS, "mlp_bn"), ("backbone_eval", "separate_stats")
#: Learning-rate grids, half a decade apart (plain SGD steps about 10 times shorter than with momentum 0.9).
LR_GRIDS = {"sgd": (0.005, 0.016, 0.05, 0.16), "sgd_plain": (0.05, 0.16, 0.5, 1.6),
            "adam": (0.001, 0.003, 0.01, 0.03)}
#: full: grids wider where an earlier full run chose a rate at an end (c40bf27, 4ea75c0).
PROFILES = {
    "quick": dict(seeds=2, steps=150, heads=("linear", "mlp_bn", "std_linear"), tuning_seeds=(1000,),
                  feature_seeds=2, steps_check=300, steps_check_seeds=2),
    "full": dict(seeds=10, steps=800, heads=HEADS, tuning_seeds=(1000, 1001, 1002), feature_seeds=10,
                 lr_sgd=(0.0016, *LR_GRIDS["sgd"], 0.5), lr_sgd_plain=(0.0016, 0.005, 0.016, *LR_GRIDS["sgd_plain"]),
                 lr_adam=(0.0003, *LR_GRIDS["adam"], 0.1, 0.3), steps_check=3200, steps_check_seeds=10),
}


def _increasing(v: tuple) -> bool:
    return bool(v) and min(v) > 0 and list(v) == sorted(v)


class Config(ChapterConfig):
    """Chapter 4's parameters (the notebook's parameters cell and the run sizes): ``mid_strength`` is the middle
    shift's strength on chapter 3's ``both`` line, ``lr_<optimizer>`` a grid, ``feature_seeds`` the first seeds
    :func:`feature_geometry` measures. Raises ``ValueError`` naming the parameter for any bad value."""

    PARAMETERS = dict(profile="quick", seeds=(0, 1), steps=150, heads=PAGE_HEADS, tuning_seeds=(1000,),
                      feature_seeds=2, optimizers=OPTIMIZERS, mid_strength=0.25, lr_sgd=LR_GRIDS["sgd"],
                      lr_sgd_plain=LR_GRIDS["sgd_plain"], lr_adam=LR_GRIDS["adam"], margin=0.02, steps_check=3200,
                      steps_check_seeds=3, hidden=RunConfig.hidden, noise=RunConfig.noise,
                      momentum=RunConfig.momentum, batch_size=RunConfig.batch_size, n_eval=RunConfig.n_eval,
                      stage1_steps=RunConfig.stage1_steps)

    PROFILES = PROFILES
    NORMALIZE = {"seeds": check_seeds}
    RULES = (
        Rule("steps", "an integer >= 1", lambda c: c.steps >= 1),
        Rule("heads", f"one or more of {list(HEADS)} including 'linear' and 'mlp_bn' (the page reads finding 3 from "
             f"the linear head and its BatchNorm section from mlp_bn)", lambda c: set(PAGE_HEADS) <= set(c.heads)
             <= set(HEADS)),
        Rule("tuning_seeds", "one or more seeds >= 0, disjoint from seeds (a rate chosen on a reported seed biases "
             "it)", lambda c: c.tuning_seeds and min(c.tuning_seeds) >= 0 and not set(c.tuning_seeds) & set(c.seeds)),
        Rule("feature_seeds", "an integer >= 1", lambda c: c.feature_seeds >= 1),
        Rule("optimizers", f"all of {list(OPTIMIZERS)} (the page reports each; the order sets the tables' order)",
             lambda c: sorted(c.optimizers) == sorted(OPTIMIZERS)),
        Rule("mid_strength", "a number > 0 and < 1 (between no shift and chapter 1's)",
             lambda c: 0 < c.mid_strength < 1),
        *(Rule(f"lr_{o}", "one or more increasing learning rates > 0", lambda c, o=o: _increasing(c.lr_grid(o)))
          for o in OPTIMIZERS),
        Rule("margin", "a number > 0 and <= 1", lambda c: 0 < c.margin <= 1),
        Rule("steps_check", "larger than steps (it checks a longer budget)", lambda c: c.steps_check > c.steps),
        Rule("steps_check_seeds", "from 2 (an interval needs two seeds) to the number of seeds",
             lambda c: 2 <= c.steps_check_seeds <= len(c.seeds)),
        Rule("hidden", "an integer >= 1", lambda c: c.hidden >= 1),
    )

    def __post_init__(self):
        super().__post_init__()
        RunConfig(**self._base())  # the run sizes, checked with the engine's own messages

    def _base(self) -> dict:
        return dict(noise=self.noise, momentum=self.momentum, batch_size=self.batch_size, n_eval=self.n_eval,
                    hidden=self.hidden, steps=self.steps, stage1_steps=self.stage1_steps)

    def shifts(self) -> dict[str, tuple[float, float]]:
        """``{name: (brightness, contrast)}`` of ``none``, ``mid`` and ``ref`` (chapter 1's)."""
        return {"none": (0.0, 1.0), "mid": shift_of("both", self.mid_strength), "ref": REFERENCE_SHIFT}

    def lr_grid(self, optimizer: str) -> tuple:
        return getattr(self, f"lr_{optimizer}")

    def search_configs(self) -> list[RunConfig]:
        """The search: tuning seeds x shifts x heads x optimizers x grid x modes, on the validation set."""
        return [RunConfig(seed=s, head=h, optimizer=o, lr=lr, mode=m, brightness=b, contrast=c,
                          eval_split="validation", **self._base())
                for s in self.tuning_seeds for (b, c) in self.shifts().values() for h in self.heads
                for o in self.optimizers for lr in self.lr_grid(o) for m in MODE_NAMES]

    def _per_shift(self, lrs: dict) -> dict:
        names = set(self.shifts())
        return lrs if lrs and set(lrs) == names else {n: lrs for n in names}

    def run_configs(self, lrs: dict) -> list[RunConfig]:
        """The sweep: seeds x shifts x heads x optimizers x modes at ``lrs`` (:func:`chosen_lrs_by_shift`'s, or one
        :func:`lr_of` mapping for every shift)."""
        per = self._per_shift(lrs)
        return [RunConfig(seed=s, head=h, optimizer=o, lr=lr_of(per[n], h, o, m), mode=m, brightness=b,
                          contrast=c, **self._base())
                for s in self.seeds for n, (b, c) in self.shifts().items() for h in self.heads
                for o in self.optimizers for m in MODE_NAMES]

    def long_heads(self) -> tuple:
        return tuple(h for h in self.heads if h in LONG_HEADS)

    def steps_search_configs(self) -> list[RunConfig]:
        """The longer budget's own search (a rate tuned for 800 steps need not suit 3,200), on the validation set."""
        b, c = REFERENCE_SHIFT
        return [RunConfig(seed=s, head=h, optimizer=o, lr=lr, mode=m, brightness=b, contrast=c,
                          eval_split="validation", **{**self._base(), "steps": self.steps_check})
                for s in self.tuning_seeds for h in self.long_heads() for o in self.optimizers
                for lr in self.lr_grid(o) for m in STEPS_CHECK_MODES]

    def steps_check_configs(self, lrs: dict) -> list[RunConfig]:
        """The longer budget's runs on the first ``steps_check_seeds`` seeds, at ``lrs`` (read at ``ref``)."""
        b, c = REFERENCE_SHIFT
        ref = self._per_shift(lrs)["ref"]
        return [RunConfig(seed=s, head=h, optimizer=o, lr=lr_of(ref, h, o, m), mode=m, brightness=b, contrast=c,
                          **{**self._base(), "steps": self.steps_check})
                for s in self.seeds[:self.steps_check_seeds] for h in self.long_heads() for o in self.optimizers
                for m in STEPS_CHECK_MODES]

    def describe(self) -> str:
        b, c = self.shifts()["mid"]
        grids = "; ".join(f"{o} " + "/".join(f"{v:g}" for v in self.lr_grid(o)) for o in self.optimizers)
        return (f"profile={self.profile}, {seeds_label(self.seeds)}, steps={self.steps}, heads={'/'.join(self.heads)}, "
                f"optimizers={'/'.join(self.optimizers)}, shifts none/(b={b:g}, c={c:g})/(b={REFERENCE_SHIFT[0]:g}, "
                f"c={REFERENCE_SHIFT[1]:g}), tuning seeds {'/'.join(map(str, self.tuning_seeds))}, lr grids {grids}, "
                f"hidden={self.hidden}, margin={self.margin:g}, steps check {self.steps_check} steps on "
                f"{self.steps_check_seeds} seeds (heads {'/'.join(self.long_heads())}, rates tuned at that budget), "
                f"noise={self.noise:g}")


def make_config(profile: str = "quick", **overrides) -> Config:
    return from_profile(Config, PROFILES, profile, **overrides)


# --- the learning-rate search, the sweep and the step-count check -----------------------------------------------

def lr_search(config: Config, execution: Execution | None = None) -> pd.DataFrame:
    return annotate(transfer_sweep(config.search_configs(), SEARCH_NAMESPACE, execution,
                                   desc="stage 2 (learning-rate search)"), config)


def search_table(search: pd.DataFrame) -> pd.DataFrame:
    """``[shift,] head, optimizer, lr, mode, val_accuracy`` (mean over tuning seeds), plus ``mode="mean"``."""
    by = (["shift"] if "shift" in search.columns else []) + ["head", "optimizer", "lr"]
    t = search.groupby(by + ["mode"], sort=False)["task_b"].mean().rename("val_accuracy").reset_index()
    crit = t.groupby(by, sort=False)["val_accuracy"].mean().reset_index().assign(mode="mean")
    return pd.concat([t, crit[t.columns]], ignore_index=True)


def search_at(search: pd.DataFrame, shift: str | None) -> pd.DataFrame:
    """The search's rows at ``shift`` (``None``: the only one), without the column; ``ValueError`` otherwise."""
    if "shift" not in search.columns:
        return search
    present = list(dict.fromkeys(search["shift"]))
    if shift is None:
        if len(present) > 1:
            raise ValueError(f"the search covers shifts {present}; give shift= (one of them) or use "
                             f"chosen_lrs_by_shift")
        return search.drop(columns="shift")
    if shift not in present:
        raise ValueError(f"shift must be one of the searched shifts {present}, got {shift!r}")
    return search[search["shift"] == shift].drop(columns="shift")


def lr_of(lrs: dict, head: str, optimizer: str, mode: str) -> float:
    for k in ((head, optimizer, mode), (head, optimizer)):
        if k in lrs:
            return float(lrs[k])
    raise KeyError(f"no learning rate for head={head!r}, optimizer={optimizer!r}, mode={mode!r}")


def chosen_lrs(search: pd.DataFrame, rule: str = "per_mode", shift: str | None = None) -> dict:
    """The rates chosen on the search (mean validation accuracy; ties: the smaller rate): ``"per_mode"``
    ``{(head, optimizer, mode): lr}`` or ``"mean"`` ``{(head, optimizer): lr}`` (best on the mean over the modes).
    Raises ``ValueError`` for another rule or a search not scored on the validation set."""
    check_choice("rule", rule, ("per_mode", "mean"))
    search = search_at(search, shift)
    if set(search.get("eval_split", pd.Series(["validation"]))) != {"validation"}:
        raise ValueError("chosen_lrs: the search must be scored on the validation set (eval_split='validation')")
    t = search_table(search)
    t, keys = (t[t["mode"] == "mean"], ["head", "optimizer"]) if rule == "mean" else \
        (t[t["mode"] != "mean"], ["head", "optimizer", "mode"])
    return {tuple(k): float(g[g["val_accuracy"] == g["val_accuracy"].max()]["lr"].min())
            for k, g in t.sort_values("lr").groupby(keys, sort=False)}


def chosen_lrs_by_shift(search: pd.DataFrame, rule: str = "per_mode") -> dict:
    if "shift" not in search.columns:
        raise ValueError("chosen_lrs_by_shift needs the search's shift column (lr_search adds it)")
    return {s: chosen_lrs(search, rule, s) for s in dict.fromkeys(search["shift"])}


def run(config: Config, execution: Execution | None, lrs: dict) -> pd.DataFrame:
    """The sweep (cached) at ``lrs`` (:func:`chosen_lrs_by_shift` of :func:`lr_search`), with ``shift``."""
    return annotate(transfer_sweep(config.run_configs(lrs), NAMESPACE, execution), config)


def steps_search(config: Config, execution: Execution | None = None) -> pd.DataFrame:
    return annotate(transfer_sweep(config.steps_search_configs(), STEPS_SEARCH_NAMESPACE, execution,
                                   desc="stage 2 (longer budget: learning-rate search)"), config)


def steps_check(config: Config, execution: Execution | None, lrs: dict) -> pd.DataFrame:
    return annotate(transfer_sweep(config.steps_check_configs(lrs), STEPS_NAMESPACE, execution,
                                   desc="stage 2 (longer budget)"), config)


def annotate(df: pd.DataFrame, config: Config) -> pd.DataFrame:
    names = {v: k for k, v in config.shifts().items()}
    return df.assign(shift=[names[(float(b), float(c))] for b, c in zip(df["brightness"], df["contrast"])])


def results_table(df: pd.DataFrame) -> pd.DataFrame:
    """The results without list-valued columns."""
    return df[[c for c in df.columns if not df[c].map(lambda v: isinstance(v, (list, tuple))).any()]]


def units_table(counts: dict) -> pd.DataFrame:
    return pd.DataFrame([dict(namespace=k, computed=int(c), total=int(t)) for k, (c, t) in counts.items()],
                        columns=["namespace", "computed", "total"])


def units_counts(table: pd.DataFrame) -> dict:
    return {str(r.namespace): (int(r.computed), int(r.total)) for r in table.itertuples(index=False)}


def run_tables(config: Config, execution: Execution | None = None) -> tuple[pd.DataFrame, dict]:
    """``(runs, {name: table})``: everything the page analyses, as the tables it saves (:data:`SIBLING_TABLES`)."""
    reset_sweep_counts()
    search = lr_search(config, execution)
    df = run(config, execution, chosen_lrs_by_shift(search))
    long_search = steps_search(config, execution)
    long = steps_check(config, execution, chosen_lrs(long_search, shift="ref"))
    geom = feature_geometry(config, execution)
    return results_table(df), dict(search_runs=results_table(search), steps=results_table(long),
                                   steps_search_runs=results_table(long_search), features=geom,
                                   units=units_table(sweep_counts()))


# --- why: what the pinned features look like to the head ---------------------------------------------------------

@dataclass(frozen=True)
class FeatureConfig(SourceConfig):
    """One feature-geometry measurement: a source backbone (:class:`SourceConfig`) at task-B shifts
    ``shifts`` (``((brightness, contrast), ...)``), ``n_features`` samples per set, ``population_batches``
    batches of ``batch_size`` for task B's own statistics."""

    shifts: tuple = (REFERENCE_SHIFT,)
    n_features: int = 2000
    population_batches: int = 20
    batch_size: int = RunConfig.batch_size

    def __post_init__(self):
        super().__post_init__()
        self._set("shifts", tuple(tuple(float(v) for v in s) for s in self.shifts))
        self._set("n_features", check_int("n_features", self.n_features, 2))
        self._set("population_batches", check_int("population_batches", self.population_batches, 1))
        self._set("batch_size", check_int("batch_size", self.batch_size, 2))

    @property
    def source(self) -> SourceConfig:
        return SourceConfig(**{k: getattr(self, k) for k in SourceConfig.__dataclass_fields__})


@torch.no_grad()
def _features(backbone, x: torch.Tensor) -> torch.Tensor:
    return torch.cat([backbone(x[i:i + 500]) for i in range(0, len(x), 500)]).double()


def _ridge_probe(f_train, y_train, f_test, y_test, n_classes: int, ridge: float = 1e-3) -> float:
    """Accuracy of a least-squares one-hot classifier on z-scored features (train statistics): what a linear
    head could reach with exact optimization, invariant to each feature's scale and offset."""
    mu, sd = f_train.mean(0), f_train.std(0).clamp_min(1e-12)
    z = lambda f: torch.cat([(f - mu) / sd, torch.ones(len(f), 1, dtype=f.dtype)], 1)
    X, Y = z(f_train), torch.nn.functional.one_hot(y_train, n_classes).double()
    W = torch.linalg.solve(X.T @ X + ridge * len(X) * torch.eye(X.shape[1], dtype=X.dtype), X.T @ Y)
    return float(((z(f_test) @ W).argmax(1) == y_test).double().mean())


def geometry_rows(cfg: FeatureConfig, source: dict) -> list[dict]:
    """Feature geometry of ``source``'s backbone on task B under pinned (task A's) and separate (task B's
    precise-BN) statistics, per shift. One row per (shift, statistics); see :func:`feature_geometry`."""
    from ....running_stats import update_bn_stats
    pinned = ConvBackbone(3, cfg.widths, cfg.norm, cfg.momentum)
    pinned.load_state_dict(source["backbone"])
    pinned.eval()
    rows = []
    for b, c in cfg.shifts:
        task = make_task(cfg.seed, "B", cfg.n_classes, cfg.noise, b, c)
        stream = BatchStream(task, cfg.batch_size, generator(cfg.seed, "features", "population"))
        separate = copy.deepcopy(pinned)
        update_bn_stats(separate, [stream.next()[0] for _ in range(cfg.population_batches)])
        separate.eval()
        xtr, ytr = eval_set(task, cfg.n_features, cfg.seed, "B/features-train")
        xte, yte = eval_set(task, cfg.n_features, cfg.seed, "B/features-test")
        F = {name: (_features(m, xtr), _features(m, xte)) for name, m in (("pinned", pinned), ("separate", separate))}
        s_mu, s_sd = F["separate"][0].mean(0), F["separate"][0].std(0)
        live = s_sd > 1e-9
        for name, (ftr, fte) in F.items():
            mu, sd = ftr.mean(0), ftr.std(0)
            cov = torch.cov(ftr.T)
            second = ftr.T @ ftr / len(ftr)
            xs = F["separate"][0]
            r2 = []
            for j in torch.nonzero(live).flatten().tolist():  # affine fit of this feature on the separate one
                if sd[j] <= 1e-12:
                    r2.append(0.0)
                    continue
                r = torch.corrcoef(torch.stack([ftr[:, j], xs[:, j]]))[0, 1]
                r2.append(float(r ** 2))
            rows.append(dict(seed=cfg.seed, brightness=b, contrast=c, statistics=name,
                             scale_ratio=float((sd[live] / s_sd[live]).median()),
                             offset_sd=float(((mu[live] - s_mu[live]).abs() / s_sd[live]).median()),
                             dead_fraction=float((sd <= 1e-9).double().mean()),
                             affine_r2=float(np.median(r2)) if r2 else math.nan,
                             curvature=float(torch.linalg.eigvalsh(second)[-1]),
                             curvature_centered=float(torch.linalg.eigvalsh(cov)[-1]),
                             mean_share=float((mu @ mu) / torch.trace(second)),
                             probe_accuracy=_ridge_probe(ftr, ytr, fte, yte, cfg.n_classes)))
    return rows


def _feature_group(configs: list[FeatureConfig]) -> list[dict]:
    out = []
    for cfg in configs:
        rows = geometry_rows(cfg, train_source(cfg.source))
        out.append(dict(rows=rows))
    return out


def feature_geometry(config: Config, execution: Execution | None = None) -> pd.DataFrame:
    """The backbone's 64 features on task B under pinned and separate statistics (cached), a row per (seed, shift,
    statistics): medians over features of ``scale_ratio`` and ``offset_sd`` (in separate-statistics SDs) and
    ``affine_r2`` (1: a per-feature affine change one linear layer undoes); ``curvature`` (top eigenvalue of E[f
    f^T], which bounds gradient descent's stable step on a linear head), ``curvature_centered`` (of the covariance),
    ``mean_share`` (||E f||^2 / E||f||^2), ``dead_fraction`` and ``probe_accuracy`` (closed-form least squares)."""
    src = RunConfig(**config._base()).source
    cfgs = [FeatureConfig(**{**src.asdict(), "seed": s}, shifts=tuple(config.shifts().values()),
                          batch_size=config.batch_size) for s in config.seeds[:config.feature_seeds]]
    res = run_sweep(cfgs, _feature_group, namespace=FEATURE_NAMESPACE, execution=execution,
                    cache_dir=None if execution is None else execution.cache_dir, desc="feature geometry")
    return annotate(pd.DataFrame([r for rows in res["rows"] for r in rows]), config)


# --- the audit: which buffers each mode lets move, with a head that has its own BatchNorm ---------------------------

#: The parts audited: the backbone, separate_stats' copy of it and the new head.
PARTS = ("backbone", "backbone_b", "head_b")


def audit_buffers(seed: int = 0, head: str = "mlp_bn", steps: int = 5, brightness: float = REFERENCE_SHIFT[0],
                  contrast: float = REFERENCE_SHIFT[1], stage1_steps: int = 50) -> tuple[pd.DataFrame, dict]:
    """``steps`` stage-2 steps in each freeze mode inside a :class:`bnstudy.audit.FreezeAudit`: ``(table, {mode:
    audit})``, the table ``mode, part, declared, moved, max_change`` per :data:`PARTS` (``declared``: in the mode's
    ``buffers_may_change``; ``moved``: a running_mean/running_var there changed)."""
    from ....audit import FreezeAudit
    src_cfg = SourceConfig(seed=seed, stage1_steps=stage1_steps)
    source = train_source(src_cfg)
    task = make_task(seed, "B", src_cfg.n_classes, src_cfg.noise, brightness, contrast)
    rows, audits = [], {}
    for name in MODE_NAMES:
        mode = get_mode(name)
        backbone = ConvBackbone(3, src_cfg.widths, src_cfg.norm, src_cfg.momentum)
        backbone.load_state_dict(source["backbone"])
        head_a = make_head("linear", backbone.out_features, src_cfg.n_classes)
        head_a.load_state_dict(source["head_a"])
        head_b = seeded((seed, "init", "audit_head", head), lambda: make_head(head, backbone.out_features,
                                                                              src_cfg.n_classes))
        model = mode.apply(TransferModel(backbone, head_a, head_b))
        opt = torch.optim.SGD(model.head_b.parameters(), lr=0.01)
        stream = BatchStream(task, 64, generator(seed, "audit", "B"))
        with FreezeAudit(model, warn=False) as a:
            for _ in range(steps):
                model.train()
                x, y = stream.next()
                loss = torch.nn.functional.cross_entropy(model.forward_b(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
        audits[name] = a
        rep = a.report()
        stats = rep[rep["tensor"].str.endswith(("running_mean", "running_var"))] if "tensor" in rep else rep
        for part in PARTS:
            inside = stats[stats["module"].map(lambda m, p=part: m == p or m.startswith(p + "."))]
            if part == "backbone_b" and not len(inside):
                continue
            ch = inside["max_abs_change"].fillna(0)
            rows.append(dict(mode=name, part=part, declared=part in mode.buffers_may_change,
                             moved=bool((ch > 0).any()), max_change=float(ch.max()) if len(ch) else 0.0))
    return pd.DataFrame(rows), audits
