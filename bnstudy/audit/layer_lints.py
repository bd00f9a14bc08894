"""One layer's findings, shared by :func:`~bnstudy.audit.lint_model` and the audit's live and exit lints: the
state of its running statistics (reset values, non-finite, low precision, few updates since a reset), its
momentum, a frozen part it sits in (or a frozen block whose BatchNorm affine alone trains), and the batch it
sees."""

from __future__ import annotations

import math
import numbers

import torch
from torch import nn

from ..norms import counts_batches, holds_precise_estimate, is_batch_norm, is_frozen_batchnorm, is_instance_norm
from .codes import MAX_INIT_WEIGHT, MAX_MOMENTUM, Lint, _label, _lint


def _at_reset_values(m: nn.Module) -> bool:
    """Mean 0 and variance 1 (``reset_running_stats``), or variance ``1 - eps`` (detectron2's FrozenBatchNorm2d
    initialises it so); NaN is not a reset value."""
    rv = m.running_var
    if not bool((m.running_mean == 0).all()):
        return False
    if bool((rv == 1).all()):
        return True
    eps = getattr(m, "eps", None)
    return is_frozen_batchnorm(m) and isinstance(eps, float) and bool((rv == torch.ones_like(rv) - eps).all())


def _finite_stats(m: nn.Module) -> bool:
    """Finite running statistics with a variance that is not negative (a negative one makes sqrt(var + eps) NaN)."""
    rv = m.running_var
    return bool(torch.isfinite(m.running_mean).all() and torch.isfinite(rv).all() and (rv >= 0).all())


def _nonfinite_lint(name: str, m: nn.Module, when: str = "") -> Lint:
    """``nonfinite_stats`` for layer ``name``, counting NaN and inf per buffer; ``when`` says when it happened."""
    parts = []
    for stat in ("running_mean", "running_var"):
        t = getattr(m, stat)
        nan, inf = int(t.isnan().sum()), int(t.isinf().sum())
        if nan or inf:
            parts.append(f"{stat} has {nan + inf} of {t.numel()} values non-finite ("
                         + ", ".join(([f"{nan} NaN"] if nan else []) + ([f"{inf} inf"] if inf else [])) + ")")
    neg = int((m.running_var < 0).sum())
    if neg:
        parts.append(f"running_var is negative in {neg} of {m.running_var.numel()} channels (sqrt(var + eps) is "
                     "NaN there)")
    kind = _type_name(m)
    if len(parts) == 1 and neg:
        return _lint("nonfinite_stats", name,
                     f"{kind}'s {parts[0]}{when}: in eval mode it outputs NaN in those channels (a variance is never "
                     "negative: a corrupted checkpoint or a hand-set value?); re-estimate the statistics with "
                     "bnstudy.update_bn_stats, or restore them from a checkpoint")
    return _lint("nonfinite_stats", name,
                 f"{kind}'s {'; '.join(parts)}{when}: in eval mode it outputs NaN in those channels, and no later "
                 "update repairs them (NaN stays NaN under every momentum below 1). One batch holding inf or NaN "
                 "(an fp16 overflow) is enough, and skipping the optimizer step (GradScaler) does not undo a "
                 "buffer write: restore the statistics from a checkpoint, or re-estimate them on clean batches "
                 "with bnstudy.update_bn_stats (which refuses to write non-finite estimates)")


def _type_name(m: nn.Module) -> str:
    """The class name, or for a TorchScript module the class it was compiled from (``BatchNorm1d``)."""
    if isinstance(m, torch.jit.ScriptModule):
        return getattr(m, "original_name", None) or type(m).__name__
    return type(m).__name__


def _low_precision(t) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point() and torch.finfo(t.dtype).bits <= 16


def _low_precision_lint(name: str, m: nn.Module) -> Lint:
    dt = m.running_mean.dtype
    eps = torch.finfo(dt).eps
    mom = m.momentum
    nbt = getattr(m, "num_batches_tracked", None)
    if isinstance(mom, numbers.Real) and not isinstance(mom, bool) and mom > 0:
        w, how = float(mom), f"momentum {mom}"
    else:
        n = int(nbt) + 1 if nbt is not None else 1
        w, how = 1.0 / n, f"momentum=None, weight 1/{n} for the next batch and shrinking"
    stall = eps / (2 * w)
    overflow = (f"; float16 overflows above {torch.finfo(torch.float16).max:.0f}, so running_var of activations "
                "whose standard deviation exceeds 256 becomes inf" if dt == torch.float16 else "")
    return _lint("low_precision_stats", name,
                 f"{_type_name(m)} keeps running_mean/running_var in {str(dt).removeprefix('torch.')} and updates "
                 f"them after model.train(): each update rounds to {round(-math.log2(eps)) + 1} significant "
                 f"bits, so with {how} a batch whose statistic is within about {stall:.2%} of the "
                 f"running value (eps / (2 x weight) = {eps:.3g} / {2 * w:.3g}) changes nothing and the statistics "
                 f"stall short of the data's{overflow}; keep norm layers and their buffers in float32 "
                 "(torch.autocast does; model.half() and model.bfloat16() do not)")


def _near_init_lint(name: str, m: nn.Module, n: int, when: str = "", known_reset: bool = False,
                    training: bool = False) -> Lint | None:
    """``stats_near_init`` when ``n`` updates with ``m.momentum`` leave the values at the last reset more than
    :data:`MAX_INIT_WEIGHT` of the statistics (None otherwise). ``known_reset``: the audit saw those values were
    mean 0 / variance 1. ``training``: the layer uses batch statistics now and normalises with the running ones
    only after ``model.eval()`` (the message says so)."""
    mom = m.momentum
    if not (isinstance(mom, numbers.Real) and not isinstance(mom, bool) and 0 < mom < 1) or n < 1:
        return None
    if not known_reset and holds_precise_estimate(m):
        return None  # num_batches_tracked counts update_bn_stats's batches: an equal-weight estimate, no reset share
    w = (1 - float(mom)) ** n
    if w <= MAX_INIT_WEIGHT:
        return None
    need = math.ceil(math.log(MAX_INIT_WEIGHT) / math.log(1 - float(mom)))
    if known_reset:
        then = (f"entered the block holding the reset statistics mean 0 / variance 1 and was updated {n} "
                f"time{'s' if n != 1 else ''}{when}: with momentum {mom}, (1 - {mom})^{n} = {w:.0%} of its "
                "running statistics are still those values")
        hedge = ""
    else:
        then = (f"was updated {n} time{'s' if n != 1 else ''} since num_batches_tracked was 0 (momentum {mom}): "
                f"the values it held then still carry (1 - {mom})^{n} = {w:.0%} of its running statistics")
        hedge = "; if those were pretrained statistics loaded without num_batches_tracked, this is expected"
    return _lint("stats_near_init", name,
                 f"{_type_name(m)} {then}, and it "
                 + ("will normalise with them after model.eval() (it trains with batch statistics now)" if training
                    else "normalises with them (eval mode or pinned)") + ". After a reset or a "
                 f"fresh build those values are mean 0 / variance 1, not the data's: re-estimate them with "
                 f"bnstudy.update_bn_stats (precise BN), or train on: {need} updates bring their share under "
                 f"{MAX_INIT_WEIGHT:.0%}{hedge}")


def _frozen_context(modules: dict, name: str) -> str | None:
    """For a norm layer without parameters of its own: where the freeze it sits in shows, or None.

    Walking up from the layer (the model itself included) to the nearest ancestor that holds parameters: when
    every parameter there is frozen (``requires_grad=False``), that ancestor's quoted name (a frozen backbone,
    or the whole model); otherwise, when the modules registered before the layer inside that ancestor hold
    parameters and all of them are frozen (the layers that feed it in a ``Sequential``: the first stages of a
    flat model frozen, the rest trained), words naming them. None when the ancestor's parameters before the
    layer train, or there are none. ``modules``: ``dict(model.named_modules())``."""
    parts = name.split(".") if name else []
    for depth in range(len(parts) - 1, -1, -1):
        anc = ".".join(parts[:depth])
        params = list(modules[anc].parameters()) if anc in modules else []
        if not params:
            continue
        if not any(p.requires_grad for p in params):
            return f"every parameter of {_label(anc)!r} has requires_grad=False"
        layer, before = modules[name], []
        for n, sub in modules[anc].named_modules():
            if sub is layer:
                break
            if any(True for _ in sub.parameters(recurse=False)):
                before.append((f"{anc}.{n}" if anc and n else anc or n, list(sub.parameters(recurse=False))))
        if before and not any(p.requires_grad for _, ps in before for p in ps):
            shown = ", ".join(repr(_label(n)) for n, _ in before[-3:])
            return (f"every parameter registered before it in {_label(anc)!r} has requires_grad=False (the "
                    f"layers that feed it: ... {shown})")
        return None
    return None


def _bn_affine_ids(module: nn.Module) -> set[int]:
    """``id`` of every BatchNorm affine parameter inside ``module`` (itself included): the parameters registered by
    a layer that follows torch's BatchNorm rule (:func:`bnstudy.norms.is_batch_norm`), the ones fastai's and
    PyTorch Lightning's ``train_bn=True`` leave trainable in a frozen backbone."""
    return {id(p) for m in module.modules() if is_batch_norm(m) for p in m.parameters(recurse=False)}


def _frozen_block(modules: dict, name: str) -> tuple[str, bool] | None:
    """For a BatchNorm layer whose affine trains (``train_bn_drift``): the frozen part of the model it sits in, or None.

    The rule of :func:`_frozen_context` (the frozen part a layer without affine parameters sits in), with BatchNorm
    affine parameters (:func:`_bn_affine_ids`) left out wherever parameters are counted, since ``train_bn=True``
    leaves exactly those trainable. The layer's *block* is its nearest ancestor (walking up from its parent to the
    model itself, included) that holds parameters other than BatchNorm affine ones; a parent holding nothing but norm
    layers is passed over. ``(block name, True)`` (``""`` for the model) when every one of those parameters has
    ``requires_grad=False``: a frozen backbone, or a frozen residual block of one. Otherwise ``(block name, False)``
    when the modules registered before the layer inside the block hold such parameters and all of them are frozen
    (the layers that feed it in a ``Sequential``: the stem BatchNorm of a torchvision ResNet whose ``fc`` trains, the
    frozen first stages of a flat model). None when one of the parameters before it trains (plain fine-tuning), or
    there are none. ``modules``: ``dict(model.named_modules())``."""
    parts = name.split(".") if name else []
    for depth in range(len(parts) - 1, -1, -1):
        anc = ".".join(parts[:depth])
        if anc not in modules:
            continue
        affine = _bn_affine_ids(modules[anc])
        others = [p for p in modules[anc].parameters() if id(p) not in affine]
        if not others:
            continue
        if not any(p.requires_grad for p in others):
            return anc, True
        layer, before = modules[name], []
        for sub in modules[anc].modules():
            if sub is layer:
                break
            before += [p for p in sub.parameters(recurse=False) if id(p) not in affine]
        if before and not any(p.requires_grad for p in before):
            return anc, False
        return None
    return None


def _momentum_lints(name: str, m: nn.Module) -> list[Lint]:
    kind, mom = type(m).__name__, m.momentum
    if mom is not None and (not isinstance(mom, numbers.Real) or isinstance(mom, bool) or not 0 <= mom <= 1):
        return [_lint("momentum_invalid", name, f"{kind} has momentum={mom!r}: PyTorch needs a number in [0, 1] "
                      "(the weight of each new batch) or None (cumulative average)")]
    if mom is not None and mom > MAX_MOMENTUM:
        return [_lint("momentum_high", name,
                      f"{kind} has momentum={mom}: each train-mode batch gets weight {mom} and the old running "
                      f"statistics keep only {1 - mom:.3g} (PyTorch: running = (1 - momentum) * running + momentum * "
                      "batch). TensorFlow/Keras's momentum is the weight of the old value (moving = momentum * "
                      f"moving + (1 - momentum) * batch): Keras's {mom} is PyTorch's {1 - mom:.3g}")]
    if mom == 0:
        nbt = " (num_batches_tracked still counts)" if counts_batches(m, True) else ""
        return [_lint("momentum_zero", name, f"{kind} has momentum=0.0: running_mean/running_var never change in "
                      f"train mode{nbt}; use momentum=None on a BatchNorm for a cumulative average")]
    if mom is None:
        if is_instance_norm(m):
            return [_lint("momentum_zero", name, f"{kind} has momentum=None, which InstanceNorm treats as 0.0: "
                          "running_mean/running_var never change (it has no cumulative average)")]
        nbt = getattr(m, "num_batches_tracked", None)
        if nbt is None:
            return [_lint("momentum_zero", name, f"{kind} has momentum=None but no num_batches_tracked buffer: "
                          "torch then weights each batch by 0.0 and running_mean/running_var never change")]
        k = int(nbt)
        if k == 0 and not _at_reset_values(m):
            return [_lint("cumulative_overwrites_loaded", name,
                          f"{kind} has momentum=None and num_batches_tracked=0, but its running statistics are not "
                          "the reset values (mean 0, variance 1): they were set or loaded without "
                          "num_batches_tracked, and the next train-mode batch gets weight 1/1 and replaces them "
                          "entirely; load num_batches_tracked too, or set it to the number of batches they average")]
        if k == 0:
            return [_lint("momentum_cumulative", name,
                          f"{kind} has momentum=None: its statistics hold the reset values and num_batches_tracked=0; "
                          "the first train-mode batch replaces them and the n-th gets weight 1/n (an equal-weight "
                          "average, not an exponential moving average)")]
        return [_lint("momentum_cumulative", name,
                      f"{kind} has momentum=None: running statistics are the equal-weight average of the {k} "
                      f"batches counted by num_batches_tracked (since a reset, or as loaded); the next train-mode "
                      f"batch gets weight 1/{k + 1}")]
    return []


def _batch_lints(name: str, m: nn.Module, batch: int, values_per_channel: int | None, min_batch: int) -> list[Lint]:
    kind = type(m).__name__
    if values_per_channel == 1:
        return [_lint("single_value_per_channel", name,
                      f"{kind} normalises with batch statistics and saw 1 value per channel (batch of {batch}): "
                      "PyTorch raises ValueError ('Expected more than 1 value per channel when training')")]
    if batch == 1:
        how = ("raises on (N, C) input and, on (N, C, L) input, " if isinstance(m, nn.BatchNorm1d) else "")
        return [_lint("single_sample_batch", name,
                      f"{kind} normalises with batch statistics at a batch of 1: it {how}normalises each channel "
                      "with one sample's own statistics (its output no longer depends on the running statistics "
                      "and is a different function from eval mode)")]
    if batch < min_batch:
        return [_lint("small_batch", name,
                      f"{kind} normalises with batch statistics at a per-device batch of {batch} < {min_batch}: "
                      f"the batch mean misses the population mean by about 1/sqrt({batch}) = "
                      f"{1 / math.sqrt(batch):.2f} standard deviations, shifting every output"
                      + (" (at a batch of 2 every normalised value is +-1)" if batch == 2 else ""))]
    return []


def exported_train_words(model: nn.Module) -> str:
    """For the module of a ``torch.export`` program: words saying which running statistics its graph normalises
    past and overwrites at every call, when it was exported in train mode (a ``batch_norm`` call with
    ``training=True``: the graph uses batch statistics and writes ``running_mean``/``running_var`` at inference
    too, and no ``eval()`` can change it); ``""`` otherwise (eval-mode export, or not a graph module)."""
    graph = getattr(model, "graph", None)
    nodes = getattr(graph, "nodes", None)
    if nodes is None:
        return ""
    stats = []
    for node in nodes:
        args = getattr(node, "args", ())
        if (getattr(node, "op", None) == "call_function" and "batch_norm" in str(node.target) and len(args) > 5
                and args[5] is True):
            stats.append(str(getattr(args[3], "target", "?")))
    if not stats:
        return ""
    shown = ", ".join(repr(x) for x in stats[:4]) + (f" and {len(stats) - 4} more" if len(stats) > 4 else "")
    return (f". It was exported in train mode ({len(stats)} batch_norm call{'s' if len(stats) != 1 else ''} with "
            f"training=True): it normalises with batch statistics and overwrites {shown} and the matching "
            "running_var at every call, inference included, and no eval() changes that; export from model.eval()")
