"""The freeze audit on real architectures: every torchvision classification model with a norm layer.

For each model (``weights=None``, small inputs, batch 2) one training step of the classifier's last
linear layer runs under :class:`bnstudy.audit.FreezeAudit` twice, from the same initial state:

* naive freeze: every other parameter ``requires_grad_(False)``, model left in train mode;
* correct freeze: the same, with every norm layer pinned in eval mode (:func:`bnstudy.freeze.pin_norm_eval`;
  for the dozen also :func:`bnstudy.freeze.freeze_batchnorm`, which keeps train mode). ``pin_eval`` on the
  whole model would also switch off the dropout in front of the trained classifier (MNASNet, MobileNet,
  EfficientNet, ...), which the audit rightly flags (``dropout_off_in_training``).

Checked: no crash; with running statistics (BatchNorm) the naive freeze is caught
(``assert_frozen`` raises on the frozen part, buffers moved, a warning lint fired); without them
(LayerNorm-only ConvNeXt, ViT, Swin) nothing is caught; the correct freeze raises no alarm (nothing
in the frozen part moved, no warning lint). The dozen runs in ``make test``; every model runs with
``make test-torchvision-all`` (marker ``torchvision_all``, skipped unless selected).
"""

from __future__ import annotations

import csv
import gc
import os
import resource
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from bnstudy.audit import FreezeAudit
from bnstudy.study.experiments.real_data.findings import AUDIT_OUTCOMES, audit_counts
from bnstudy.freeze import freeze_batchnorm, pin_norm_eval
from bnstudy.study.vision import audit_model, classification_model_names, has_batchnorm, has_norm_layer, logits_only

#: The representative dozen: plain BN (ResNet, DenseNet, ShuffleNet, MNASNet), auxiliary heads (GoogLeNet,
#: Inception v3), squeeze-and-excitation and stochastic depth (EfficientNet, MobileNetV3, RegNetY), LayerNorm
#: only (ConvNeXt with stochastic depth, ViT, Swin).
DOZEN = ("resnet18", "densenet121", "shufflenet_v2_x0_5", "mnasnet0_5", "googlenet", "inception_v3",
         "efficientnet_b0", "mobilenet_v3_small", "regnet_y_400mf", "convnext_tiny", "vit_b_16", "swin_t")


def head_name(model: nn.Module) -> str:
    """The qualified name of the model's last ``nn.Linear`` (its classifier)."""
    names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    return names[-1]


def frozen_cover(module: nn.Module, head: str, prefix: str = "") -> list[str]:
    """Module names whose subtrees cover every module except ``head`` (and the modules on the path to it)."""
    out = []
    for n, c in module.named_children():
        full = f"{prefix}.{n}" if prefix else n
        if full == head:
            continue
        out += frozen_cover(c, head, full) if head.startswith(full + ".") else [full]
    return out


def one_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, correct: str | None) -> FreezeAudit:
    """One SGD step of the head under a FreezeAudit; ``correct``: None (naive), ``"pin_norm_eval"`` or ``"freeze_bn"``."""
    head = model.get_submodule(head_name(model))
    if correct == "freeze_bn":
        model = freeze_batchnorm(model)
    model.requires_grad_(False)
    head.requires_grad_(True)
    model.train()
    if correct == "pin_norm_eval":
        pin_norm_eval(model)
    opt = torch.optim.SGD(head.parameters(), lr=0.1)
    with FreezeAudit(model, probe=x, warn=False) as audit:
        model.train()  # what every training loop does
        loss = nn.functional.cross_entropy(logits_only(model(x)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    audit.frozen = frozen_cover(model, head_name(model))
    return audit


#: Models above this many parameters are not run by default: the audit keeps two snapshots of every tensor, so
#: a 640M-parameter model (ViT-H/14, RegNetY-128GF) needs about 8 GB, more than a shared test machine spares.
#: Set BNSTUDY_AUDIT_MAX_PARAMS to run them.
MAX_PARAMS = int(os.environ.get("BNSTUDY_AUDIT_MAX_PARAMS", 400_000_000))


def _build(name: str):
    torch.manual_seed(0)  # the same initial model for every variant, rebuilt (a deepcopy would double the memory)
    return audit_model(name)


#: ``num_batches_tracked`` of :func:`pretrained_standin`'s statistics: as after a long pretraining.
PRETRAINED_BATCHES = 10_000


@torch.no_grad()
def pretrained_standin(model: nn.Module, x: torch.Tensor) -> None:
    """Stand-in for pretrained weights: every BatchNorm's running statistics become those of one train-mode pass
    over ``x`` (weight 1: the pass runs with ``momentum=None`` from zero batches), with ``num_batches_tracked`` set
    to :data:`PRETRAINED_BATCHES` and the momentum restored. Freezing reset statistics (mean 0 / variance 1), or
    statistics one update old that still carry 90% of those values, is itself a trap the audit rightly lints
    (``reset_stats_pinned``, ``stats_near_init``); pretrained statistics are neither."""
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats
           and m.num_batches_tracked is not None]
    saved = [m.momentum for m in bns]
    for m in bns:
        m.reset_running_stats()
        m.momentum = None
    model.train()
    model(x)
    for m, momentum in zip(bns, saved):
        m.momentum = momentum
        m.num_batches_tracked.fill_(PRETRAINED_BATCHES)


def audit_outcome(name: str, variants=("pin_norm_eval",)) -> str:
    """``"caught"`` (BN model: naive freeze caught, correct ones clean), ``"clean"`` (no running statistics:
    nothing to catch, no alarm), ``"no norm"``, ``"too large"`` (over :data:`MAX_PARAMS`); raises
    AssertionError on a misjudgement."""
    model, size = _build(name)
    if sum(p.numel() for p in model.parameters()) > MAX_PARAMS:
        return "too large"
    if not has_norm_layer(model):
        return "no norm"
    tracked = has_batchnorm(model)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(2, 3, size, size, generator=g), torch.tensor([0, 1])
    probe_warmup = torch.randn(2, 3, size, size, generator=g)

    def warmed():
        model, _ = _build(name)
        pretrained_standin(model, probe_warmup)
        return model

    pretrained_standin(model, probe_warmup)  # the first build, warmed as warmed() warms each rebuild

    naive = one_step(model, x, y, None)
    warnings = [l for l in naive.lints if l.severity == "warning"]
    if tracked:
        with pytest.raises(AssertionError, match="(is|are) not frozen"):
            naive.assert_frozen(naive.frozen, outputs=False)
        assert naive.moved(naive.frozen)["kind"].eq("buffer").all()
        assert warnings, f"{name}: naive freeze moved buffers but no warning lint fired"
    else:
        naive.assert_frozen(naive.frozen, outputs=False)  # nothing to catch: no false alarm
    del naive
    for variant in variants:
        del model
        gc.collect()
        model = warmed()
        good = one_step(model, x, y, variant)
        good.assert_frozen(good.frozen, outputs=False)
        alarms = [l for l in good.lints if l.severity == "warning"]
        assert not alarms, f"{name} ({variant}): false alarm {[(l.code, l.layer) for l in alarms]}"
        del good
    del model
    gc.collect()
    return "caught" if tracked else "clean"


#: Models of the dozen whose norm layers keep no running statistics (LayerNorm): nothing to catch.
LAYERNORM_ONLY = ("convnext_tiny", "vit_b_16", "swin_t")


@pytest.mark.parametrize("name", DOZEN)
def test_audit_catches_naive_freeze_and_clears_correct_freeze_on_torchvision_model(name):
    expected = "clean" if name in LAYERNORM_ONLY else "caught"
    assert audit_outcome(name, variants=("pin_norm_eval", "freeze_bn")) == expected


def test_dozen_covers_aux_heads_stochastic_depth_se_and_layernorm():
    assert {"googlenet", "inception_v3"} <= set(DOZEN)
    assert {"convnext_tiny", "vit_b_16"} <= set(DOZEN)
    assert {"efficientnet_b0", "mobilenet_v3_small", "regnet_y_400mf"} <= set(DOZEN)
    assert set(DOZEN) <= set(classification_model_names())


@pytest.mark.torchvision_all
def test_audit_on_every_torchvision_classification_model(request, capsys):
    """Every model; prints the counts (caught, clean, failed, no norm) for the closing note."""
    if "torchvision_all" not in (request.config.getoption("markexpr") or "").replace("not torchvision_all", ""):
        pytest.skip("select with -m torchvision_all (make test-torchvision-all)")
    outcomes, failures = {}, {}
    for name in classification_model_names():
        try:
            outcomes[name] = audit_outcome(name)
        except Exception as e:  # noqa: BLE001  (recorded, then failed below)
            outcomes[name] = "failed"
            failures[name] = f"{type(e).__name__}: {str(e)[:300]}"
        with capsys.disabled():
            print(f"{name}: {outcomes[name]}", flush=True)
    write_outcomes(outcomes)
    counts = {k: sum(v == k for v in outcomes.values()) for k in ("caught", "clean", "failed", "no norm", "too large")}
    with capsys.disabled():
        print(f"\ncounts over {len(outcomes)} models: {counts}")
        for n, f in failures.items():
            print(f"FAILED {n}: {f}")
    assert not failures, failures


def outcome_word(outcome: str) -> str:
    """The outcomes file's word for :func:`audit_outcome`'s result (``"too large"`` -> ``"not run (...)"``)."""
    return f"not run (skipped by default: over {MAX_PARAMS:,} parameters)" if outcome == "too large" else outcome


def write_outcomes(outcomes: dict, path=AUDIT_OUTCOMES) -> Path:
    """Write ``{model: outcome}`` into the outcomes CSV (``model, outcome``, sorted by model) that chapter 7's
    counts are read from (:func:`bnstudy.study.experiments.real_data.findings.audit_counts`). Rows of models not in
    ``outcomes`` are kept, so a run over some models (``python tests/test_audit_torchvision.py NAME ...``)
    updates only theirs. Returns the path."""
    path = Path(path)
    rows = {}
    if path.exists():
        with path.open() as f:
            rows = {r["model"]: r["outcome"] for r in csv.DictReader(f)}
    rows.update({k: outcome_word(v) for k, v in outcomes.items()})
    with path.open("w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["model", "outcome"])
        w.writerows(sorted(rows.items()))
    return path


def test_outcomes_file_covers_every_torchvision_classification_model_once():
    """The committed outcomes file (written by write_outcomes) names every model of list_models() exactly once,
    with an outcome audit_counts accepts, and the counts add up."""
    with AUDIT_OUTCOMES.open() as f:
        models = [r["model"] for r in csv.DictReader(f)]
    assert len(models) == len(set(models))
    assert set(models) == set(classification_model_names())
    c = audit_counts()
    assert c["models"] == len(models) == c["run"] + c["no_norm"] + c["not_run"]


def test_write_outcomes_updates_only_the_given_models(tmp_path):
    p = tmp_path / "o.csv"
    write_outcomes({"b": "caught", "a": "no norm", "c": "too large"}, p)
    write_outcomes({"c": "clean"}, p)
    assert p.read_text().splitlines() == ["model,outcome", "a,no norm", "b,caught", "c,clean"]


def _main(names: list[str], limit_s: int = 900) -> None:
    """Audit ``names`` one after another and record each outcome with :func:`write_outcomes`. A model that does
    not finish within ``limit_s`` seconds is recorded as not run, with the time and the process's peak memory."""
    import signal

    def _timeout(signum, frame):
        raise TimeoutError

    signal.signal(signal.SIGALRM, _timeout)
    for name in names:
        t0 = time.perf_counter()
        signal.alarm(limit_s)
        try:
            out = audit_outcome(name)
        except TimeoutError:
            out = None
        except Exception as e:  # noqa: BLE001
            out = "failed"
            print(f"FAILED {name}: {type(e).__name__}: {str(e)[:300]}", flush=True)
        finally:
            signal.alarm(0)
        wall = time.perf_counter() - t0
        peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        cpu = resource.getrusage(resource.RUSAGE_SELF)
        cpu_s = cpu.ru_utime + cpu.ru_stime
        if out is None:
            out = (f"not run (the audit did not finish in {wall:.0f} s on the shared 2-core machine at nice 19: "
                   f"{cpu_s:.0f} s of CPU, peak memory {peak_gb:.1f} GB)")
        print(f"{name}: {out} ({wall:.0f} s wall, {cpu_s:.0f} s CPU, peak resident memory of this process so far "
              f"{peak_gb:.1f} GB)", flush=True)
        gc.collect()
        write_outcomes({name: out})


if __name__ == "__main__":  # python tests/test_audit_torchvision.py NAME ...: audit these models, record the outcomes
    _main(sys.argv[1:], int(os.environ.get("BNSTUDY_AUDIT_LIMIT_S", 900)))
