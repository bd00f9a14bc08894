"""Lints: known BatchNorm traps, flagged by layer name before (or while) they cost a run.

Static lints read a model (:func:`lint_model`), a data loader
(:func:`lint_loader`) or a forward pass in both modes (:func:`lint_forward_modes`);
:class:`bnstudy.audit.FreezeAudit` adds live lints from its hooks. Every finding
is a :class:`Lint` with a code from :data:`LINT_CODES`, and ``warning`` ones are
also raised as :class:`BNLintWarning`. What a layer does is decided by
:mod:`bnstudy.norms`, the way torch's own ``forward`` decides it (train/eval
flag, presence of ``running_mean``/``running_var``, ``momentum`` and
``track_running_stats`` together), so every message is true in every state the
buffers and flags can be in.
"""

from __future__ import annotations

import inspect
import math
import numbers
import textwrap
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import torch
from torch import nn
from torch.nn.modules.batchnorm import _NormBase

from .._checks import (check_bool, check_callable, check_int, check_iterable, check_model_input, check_module,
                       check_number, check_str, describe, user_stacklevel)
from .._checks import LazyPandas
from ..freeze import batch_stats_rows, is_pinned, pin_dropped, _refuse_fixed_mode
from ..norms import (compiled_original, holds_precise_estimate, counts_batches, has_running_stats, is_batch_norm, is_frozen_batchnorm,
                     is_instance_norm, is_norm_base, statistics_source, updates_running_stats)

pd = LazyPandas()  # pandas is imported only when a table is asked for

#: Per-device batch size below which a train-mode BatchNorm gets a ``small_batch`` lint.
#: Why 16: a batch mean of N i.i.d. values misses the population mean by
#: ``sigma / sqrt(N)`` (one standard error), so every sample in the batch is
#: shifted by that much after normalisation; at N = 16 the shift is a quarter
#: of a standard deviation, at N = 4 half of one, and at N = 2 every normalised
#: value is exactly +-1 (up to eps). Chapter 2 measures the train/eval gap this
#: causes as a function of N.
MIN_BATCH = 16

#: ``momentum`` above this gets ``momentum_high``: PyTorch's momentum is the weight of the *new* batch, and
#: values near 1 are almost always TensorFlow/Keras's convention (weight of the *old* value, default 0.99).
MAX_MOMENTUM = 0.5

#: ``stats_near_init`` fires when the values a BatchNorm held at its last reset (``num_batches_tracked == 0``)
#: still carry more than this share of its running statistics: after ``n`` updates with ``momentum`` m that
#: share is ``(1 - m) ** n``, 5% after 29 updates at PyTorch's default 0.1 (and 299 at torchvision's
#: MobileNetV3 0.01). Below it the reset values (mean 0, variance 1) are a small bias; above it the running
#: statistics are not yet an estimate of the data.
MAX_INIT_WEIGHT = 0.05

#: Every lint code, with what it flags.
LINT_CODES = {
    "frozen_bn_in_train_mode": "a norm layer that keeps running statistics (BatchNorm, tracked InstanceNorm) whose "
                               "affine is frozen (requires_grad=False) will write its running statistics after "
                               "model.train(): a frozen backbone whose statistics still move",
    "train_mode_under_no_grad": "a norm layer wrote its running statistics under torch.no_grad(): no gradient, but "
                                "its statistics were overwritten (a teacher or validation pass left in train mode)",
    "single_value_per_channel": "a BatchNorm using batch statistics saw one value per channel: PyTorch raises "
                                "ValueError",
    "single_sample_batch": "a BatchNorm using batch statistics saw a batch of one sample: it normalises with that "
                           "sample's own statistics (BN2d/3d: over its pixels), and BatchNorm1d on (N, C) raises",
    "small_batch": f"a BatchNorm using batch statistics saw a per-device batch below min_batch (default {MIN_BATCH}): "
                   "its batch statistics are noisy estimates and every output depends on the batch mates. The default "
                   "is a conservative one, from seed article 000's warning about training; chapter 2 measured smaller "
                   "safe batches for one small network, and a hint (not significant after correction) of weight damage "
                   "at a batch of 2 that re-estimating the statistics does not undo",
    "batch_dependent_in_eval": "a BatchNorm without running_mean/running_var buffers uses batch statistics even in "
                               "eval mode: its outputs depend on the batch mates at inference, and a batch of one "
                               "raises (whatever its track_running_stats flag says)",
    "stats_never_updated": "a norm layer holds running statistics that no forward pass in train mode updates "
                           "(track_running_stats=False set after construction), while eval mode uses them",
    "momentum_zero": "running_mean/running_var never change in any mode (momentum=0.0; on InstanceNorm also "
                     "momentum=None; on a BatchNorm without num_batches_tracked also momentum=None)",
    "momentum_high": f"momentum > {MAX_MOMENTUM}: PyTorch's momentum is the weight of the new batch "
                     "(running = (1 - m) * running + m * batch), TensorFlow/Keras's the weight of the old value; "
                     "Keras's 0.99 is PyTorch's 0.01",
    "momentum_invalid": "momentum outside [0, 1] or not a number: the running statistics are not an average",
    "momentum_cumulative": "momentum=None on a BatchNorm: running statistics are the cumulative (equal-weight) "
                           "average of the batches counted by num_batches_tracked (information)",
    "cumulative_overwrites_loaded": "momentum=None with num_batches_tracked=0 but statistics that are not the reset "
                                    "values (loaded without num_batches_tracked?): the next train-mode batch gets "
                                    "weight 1 and replaces them entirely",
    "reset_stats_pinned": "a norm layer that will normalise with its running statistics (pinned, eval mode or "
                          "frozen) holds the reset values mean 0 / variance 1 (never estimated, or reset by "
                          "torch.optim.swa_utils.update_bn, which cannot re-estimate a pinned layer)",
    "double_update": "a norm layer wrote its running statistics more than once per model call (activation "
                     "checkpointing recomputes the forward in backward; or the layer is reused)",
    "pin_lost": "a module that stayed in eval mode after model.train() (pinned by pin_eval, by a class whose "
                "train() ignores its argument, or by its parent) no longer does: a conversion such as "
                "SyncBatchNorm.convert_sync_batchnorm replaced it, it was unpinned, or it carries pin_eval's "
                "mark without the pin (torch.jit.script / jit.save / jit.load keep attributes, not methods)",
    "nonfinite_stats": "running_mean/running_var hold NaN or inf (or a negative variance): eval-mode outputs of "
                       "those channels are NaN, and no later update repairs them (one batch with an inf, e.g. an "
                       "fp16 overflow, is enough; skipping the optimizer step does not undo a buffer write)",
    "low_precision_stats": "running statistics kept in float16/bfloat16 by a layer that updates them: updates "
                           "smaller than half a unit in the last place are lost (the statistics stall short of the "
                           "data's), and float16 overflows above 65504",
    "stats_update_lost": "a train-mode write left some channels' running_mean exactly as it was although the "
                         "batch mean differs: the update rounded away in the buffer's low precision",
    "stats_near_init": f"a BatchNorm updated so few times since num_batches_tracked was 0 that the values it held "
                       f"then (mean 0 / variance 1 after a reset) still carry more than {MAX_INIT_WEIGHT:.0%} of "
                       "its running statistics, and it normalises with them",
    "stats_written_elsewhere": "a norm layer of the model wrote its running statistics into tensors that are not "
                               "its buffers (copies passed to torch.func.functional_call, a DataParallel replica's "
                               "copies): the model's buffers do not show those writes",
    "hidden_calls": "the model (or part of it) ran compiled (torch.compile) or as TorchScript: the layers inside "
                    "were not seen call by call; their modes are the flags at each call and their writes are read "
                    "from the buffers before and after it (information)",
    "dropout_off_in_training": "a dropout layer next to trainable parameters was in eval mode during a forward pass "
                               "with gradients on: dropout is off while training (model.eval() on the whole model)",
    "forward_changes_with_mode": "the model's forward returns a different structure in train and eval mode (e.g. "
                                 "auxiliary logits or a loss dictionary only in train mode)",
    "dropout_present": "dropout layers that model.eval() switches off (information)",
    "last_batch_single": "len(dataset) % batch_size == 1 without drop_last: the last batch of every epoch has one "
                         "sample",
    "small_last_batch": "without drop_last the last batch of every epoch is smaller than min_batch (information)",
    "label_sorted_batches": "batch composition depends on the label (not a random draw): the batch mean carries the "
                            "label, and train-mode outputs differ from eval-mode outputs",
}
SEVERITIES = ("warning", "info")
_INFO_CODES = {"momentum_cumulative", "dropout_present", "small_last_batch", "hidden_calls"}


class BNLintWarning(UserWarning):
    """Warning category of every lint from this module; filter it with ``warnings.simplefilter``."""


@dataclass(frozen=True)
class Lint:
    """One finding: ``code`` (a key of :data:`LINT_CODES`), ``layer`` (qualified module name,
    ``""`` for the model itself, ``"loader"`` for data-loader lints), ``message`` and ``severity``
    (``"warning"`` or ``"info"``)."""

    code: str
    layer: str
    message: str
    severity: str = "warning"

    def __post_init__(self):
        if not isinstance(self.code, str) or self.code not in LINT_CODES:
            raise ValueError(f"Lint: code={describe(self.code)} is not a lint code; choose one of {list(LINT_CODES)}")
        check_str("Lint", "layer", self.layer)
        check_str("Lint", "message", self.message)
        if self.severity not in SEVERITIES:
            raise ValueError(f"Lint: severity={describe(self.severity)} is not allowed; choose one of {list(SEVERITIES)}")

    def __str__(self) -> str:
        return f"[{self.code}] {_label(self.layer)}: {self.message}"


def _label(name: str) -> str:
    return name if name else "(model)"


def _lint(code: str, layer: str, message: str) -> Lint:
    return Lint(code, layer, message, "info" if code in _INFO_CODES else "warning")


#: Layer names a grouped warning spells out before "and K more".
WARN_MAX_LAYERS = 6


def grouped_message(lint: Lint, layers: Sequence[str], max_layers: int = WARN_MAX_LAYERS) -> str:
    """One line for a group of identical findings: ``[code] layer: message`` for one layer,
    ``[code] N layers (a, b, ... and K more): message`` for several."""
    if len(layers) == 1:
        return f"[{lint.code}] {_label(layers[0])}: {lint.message}"
    shown = ", ".join(_label(n) for n in layers[:max_layers])
    more = f" and {len(layers) - max_layers} more" if len(layers) > max_layers else ""
    return f"[{lint.code}] {len(layers)} layers ({shown}{more}): {lint.message}"


def _emit(lints: Iterable[Lint], warn: bool) -> None:
    """Warn the ``warning`` lints as :class:`BNLintWarning`, identical findings grouped into one warning (as
    :func:`format_lints` groups them in print), attributed to the user's line (:func:`user_stacklevel`)."""
    if not warn:
        return
    level = None
    for lint, layers in group_lints([x for x in lints if x.severity == "warning"]):
        level = level or user_stacklevel()
        warnings.warn(grouped_message(lint, layers), BNLintWarning, stacklevel=level)


def _check_lints(fn: str, lints: Any) -> list:
    check_iterable(fn, "lints", lints, "a list of Lint (as lint_model returns)")
    lints = list(lints)
    for x in lints:
        if not isinstance(x, Lint):
            raise TypeError(f"{fn}: lints must be a list of Lint (as lint_model returns), got an item {describe(x)}")
    return lints


def lints_frame(lints: Sequence[Lint]) -> pd.DataFrame:
    """``lints`` as a DataFrame with columns ``code``, ``layer``, ``severity``, ``message``."""
    lints = _check_lints("lints_frame", lints)
    return pd.DataFrame([dict(code=x.code, layer=x.layer, severity=x.severity, message=x.message) for x in lints],
                        columns=["code", "layer", "severity", "message"])


def group_lints(lints: Sequence[Lint]) -> list[tuple[Lint, list[str]]]:
    """Identical findings (same code, severity and message) grouped: ``[(first lint, [layer, ...]), ...]``
    in first-seen order, so 40 BatchNorm layers with the same problem read as one finding."""
    lints = _check_lints("group_lints", lints)
    groups: dict = {}
    for x in lints:
        groups.setdefault((x.code, x.severity, x.message), (x, []))[1].append(x.layer)
    return list(groups.values())


def format_lints(lints: Sequence[Lint], width: int = 100, max_layers: int = 6, indent: str = "  ") -> list[str]:
    """Grouped (:func:`group_lints`), wrapped text lines: ``[code] N layers (a, b, ... and K more): message``.

    ``width`` (characters, >= 20) and ``max_layers`` (>= 1) are positive integers; ``indent`` a string."""
    check_int("format_lints", "width", width, minimum=20)
    check_int("format_lints", "max_layers", max_layers)
    check_str("format_lints", "indent", indent)
    lines = []
    for lint, layers in group_lints(_check_lints("format_lints", lints)):
        lines += textwrap.wrap(grouped_message(lint, layers, max_layers), width=width, initial_indent=indent,
                               subsequent_indent=indent + "    ", break_on_hyphens=False)
    return lines


def _check_positive_int(name: str, value, fn: str = "") -> None:
    check_int(fn, name, value)


# ---------------------------------------------------------------------------
# Model lints
# ---------------------------------------------------------------------------


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


def _near_init_lint(name: str, m: nn.Module, n: int, when: str = "", known_reset: bool = False) -> Lint | None:
    """``stats_near_init`` when ``n`` updates with ``m.momentum`` leave the values at the last reset more than
    :data:`MAX_INIT_WEIGHT` of the statistics (None otherwise). ``known_reset``: the audit saw those values were
    mean 0 / variance 1."""
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
                 f"{_type_name(m)} {then}, and it normalises with them (eval mode or pinned). After a reset or a "
                 f"fresh build those values are mean 0 / variance 1, not the data's: re-estimate them with "
                 f"bnstudy.update_bn_stats (precise BN), or train on: {need} updates bring their share under "
                 f"{MAX_INIT_WEIGHT:.0%}{hedge}")


def _frozen_context(modules: dict, name: str) -> str | None:
    """For a norm layer without parameters of its own: the name of its nearest ancestor holding parameters, when
    every parameter there is frozen (``requires_grad=False``); None when that ancestor trains or none exists.
    ``modules``: ``dict(model.named_modules())``."""
    cur = name
    while cur:
        cur = cur.rpartition(".")[0]
        params = list(modules[cur].parameters()) if cur in modules else []
        if params:
            return cur if not any(p.requires_grad for p in params) else None
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


def lint_model(model: nn.Module, batch_size: int | None = None, min_batch: int = MIN_BATCH,
               warn: bool = True) -> list[Lint]:
    """Static lints for every norm layer of ``model`` that keeps (or should keep) running statistics.

    Covers every torch ``_NormBase`` layer: BatchNorm1d/2d/3d, SyncBatchNorm,
    the lazy variants, InstanceNorm (with or without tracking) and third-party
    subclasses, plus frozen BatchNorm layers (this package's FrozenBatchNorm,
    torchvision's, detectron2's and timm's FrozenBatchNorm2d:
    :func:`bnstudy.norms.is_frozen_batchnorm`) for ``reset_stats_pinned``,
    ``nonfinite_stats`` and ``stats_near_init``. Judging each
    layer the way torch's forward does (:mod:`bnstudy.norms`) and in the mode it
    will be in after the ``model.train()`` every training loop calls (measured by
    :func:`bnstudy.freeze.batch_stats_report`, flags restored), it checks:
    no running-statistics buffers (``batch_dependent_in_eval``), buffers that
    train mode never updates (``stats_never_updated``), momentum
    (``momentum_invalid``, ``momentum_high``, ``momentum_zero``,
    ``momentum_cumulative``, ``cumulative_overwrites_loaded``), a frozen affine
    whose statistics still move (``frozen_bn_in_train_mode``; a layer without
    affine parameters counts as frozen when every parameter of its nearest
    ancestor that has parameters is frozen: a non-affine BatchNorm in a frozen
    backbone), reset statistics in a layer that will use them
    (``reset_stats_pinned``), NaN/inf statistics (``nonfinite_stats``),
    statistics kept in float16/bfloat16 by a layer that updates them
    (``low_precision_stats``), statistics so few updates old that the values
    at their last reset still weigh more than :data:`MAX_INIT_WEIGHT`
    (``stats_near_init``, for layers in eval mode now or after ``model.train()``),
    and a pin that a transformation dropped (``pin_lost``: a module with
    :func:`bnstudy.freeze.pin_eval`'s mark and no pin, as ``torch.jit.script``
    leaves it). With ``batch_size`` (the per-device batch), layers using batch
    statistics get ``single_sample_batch`` at 1 and ``small_batch`` below
    ``min_batch``.

    TorchScript models (``torch.jit.script``/``trace``/``load``) are read the
    same way (each scripted layer is judged by the class it was compiled from);
    a ``torch.compile`` wrapper is linted through the module it wraps, with that
    module's layer names (no ``_orig_mod.`` prefix).

    Returns the lints (grouped display: :func:`format_lints`) and warns the
    ``warning`` ones. Raises ``ValueError`` naming ``batch_size`` or
    ``min_batch`` when it is not a positive integer, and ``TypeError`` when
    ``model`` is not an ``nn.Module`` or refuses ``train()`` (the module of a
    ``torch.export`` program: lint the model before exporting it).
    """
    check_module("lint_model", "model", model)
    check_int("lint_model", "batch_size", batch_size, allow_none=True)
    _check_positive_int("min_batch", min_batch, "lint_model")
    check_bool("lint_model", "warn", warn)
    model = compiled_original(model)
    _refuse_fixed_mode("lint_model", model)
    report = {r["layer"]: r for r in batch_stats_rows(model)}
    modules = dict(model.named_modules())
    lints = []
    for name, m in model.named_modules():
        kind = _type_name(m)
        if pin_dropped(m):
            lints.append(_lint("pin_lost", name, "carries pin_eval's mark but not its pin: it comes from a "
                               "transformation that keeps attributes and drops Python methods (torch.jit.script, torch.jit.save/load), so model.train() puts it in train mode "
                               "again; pin it again on this model (bnstudy.freeze.pin_eval works on a scripted "
                               "module, in Python only), or convert the BatchNorm layers before scripting "
                               "(bnstudy.freeze.freeze_batchnorm, whose FrozenBatchNorm scripts)"))
        if is_frozen_batchnorm(m):
            if has_running_stats(m) and not _finite_stats(m):
                lints.append(_nonfinite_lint(name, m))
            elif has_running_stats(m) and _at_reset_values(m):
                lints.append(_lint("reset_stats_pinned", name, f"{kind} holds the reset statistics mean 0 / "
                                   "variance 1: it normalises with them forever (it cannot re-estimate)"))
            elif isinstance(getattr(m, "num_batches_tracked", None), torch.Tensor) and hasattr(m, "momentum"):
                near = _near_init_lint(name, m, int(m.num_batches_tracked))
                if near is not None:
                    lints.append(near)
            continue
        if not is_norm_base(m):
            continue
        row = report[name]
        writes = bool(row["updates_running_stats_after_train"])
        if is_batch_norm(m) and statistics_source(m, False) == "batch":
            lints.append(_lint("batch_dependent_in_eval", name,
                               f"{kind} has no running_mean/running_var buffers (its track_running_stats flag is "
                               f"{m.track_running_stats}): it normalises with batch statistics in eval mode too, so a "
                               "sample's output depends on its batch mates at inference and a batch of one value per "
                               "channel raises"))
        elif has_running_stats(m) and not m.track_running_stats:
            if is_batch_norm(m):
                lints.append(_lint("stats_never_updated", name,
                                   f"{kind} has running statistics but track_running_stats=False: train mode never "
                                   "updates them, while eval mode normalises with them (stale statistics at "
                                   "inference)"))
            else:
                lints.append(_lint("stats_never_updated", name,
                                   f"{kind} has running statistics but track_running_stats=False: it normalises each "
                                   "sample with its own statistics in every mode, never uses the running ones, and "
                                   "still overwrites them on every forward pass"))
        if has_running_stats(m):
            lints.extend(_momentum_lints(name, m))
        own = list(m.parameters(recurse=False))
        frozen_affine = m.affine and bool(own) and not any(p.requires_grad for p in own)
        frozen_block = None if own else _frozen_context(modules, name)
        if frozen_affine and writes:
            lints.append(_lint("frozen_bn_in_train_mode", name,
                               f"{kind}'s weight and bias have requires_grad=False, but after model.train() it "
                               + ("normalises with batch statistics and " if is_batch_norm(m) else "")
                               + "overwrites running_mean/running_var on every forward pass (pin it: "
                               "bnstudy.freeze.pin_eval or pin_norm_eval, or convert it: freeze_batchnorm / "
                               "freeze_modules)"))
        elif frozen_block is not None and writes:
            lints.append(_lint("frozen_bn_in_train_mode", name,
                               f"{kind} has no affine parameters (affine=False) and sits in a frozen block (every "
                               f"parameter of {_label(frozen_block)!r} has requires_grad=False), but after "
                               "model.train() it " + ("normalises with batch statistics and " if is_batch_norm(m)
                                                      else "")
                               + "overwrites running_mean/running_var on every forward pass: requires_grad has "
                               "nothing to act on in this layer (pin it: bnstudy.freeze.pin_eval or pin_norm_eval, "
                               "or convert it: freeze_batchnorm / freeze_modules)"))
        uses_running = row["stats_after_train"] == "running" or row["stats_now"] == "running"
        if has_running_stats(m) and not _finite_stats(m):
            lints.append(_nonfinite_lint(name, m))
        elif has_running_stats(m) and row["stats_after_train"] == "running" and _at_reset_values(m):
            why = "pinned in eval mode" if is_pinned(m) else "in eval mode after model.train()"
            trained = m.affine and not (bool((m.weight == 1).all()) and bool((m.bias == 0).all()))
            msg = (f"{kind} is {why} and holds the reset statistics mean 0 / variance 1, so it normalises with "
                   "them and never re-estimates them (torch.optim.swa_utils.update_bn resets pinned layers this "
                   "way; re-estimate with bnstudy.update_bn_stats, which reaches pinned layers)")
            # Trained affine parameters next to reset statistics: the statistics were reset, not never estimated.
            # A freshly built layer (affine at 1/0 or absent) gets the same finding as information.
            lints.append(Lint("reset_stats_pinned", name, msg if trained else msg + " (information: the layer "
                              "looks freshly built)", "warning" if trained else "info"))
        elif has_running_stats(m) and is_batch_norm(m) and uses_running and isinstance(
                getattr(m, "num_batches_tracked", None), torch.Tensor):
            near = _near_init_lint(name, m, int(m.num_batches_tracked))
            if near is not None:
                lints.append(near)
        if has_running_stats(m) and writes and _low_precision(m.running_mean):
            lints.append(_low_precision_lint(name, m))
        if batch_size is not None and row["batch_stats_after_train"]:
            lints.extend(_batch_lints(name, m, batch_size, None, min_batch))
    _emit(lints, warn)
    return lints


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


# ---------------------------------------------------------------------------
# Loader lints
# ---------------------------------------------------------------------------

def batch_label_dependence(labels_per_batch: Sequence) -> dict[str, float]:
    """How much a loader's batch composition depends on the label: 0 for random batches, 1 for class-sorted.

    ``labels_per_batch``: one epoch's labels, one 1-D integer sequence (tensor,
    array or list) per batch. Builds the batch x class contingency table and its
    Pearson chi-square statistic, then rescales it between its expectation
    under random batching (``(B-1)(K-1) N/(N-1)``, exact for a random
    permutation of the same labels into batches of the same sizes) and its
    maximum (``N (min(B, K) - 1)``, reached when every batch holds one class
    and B >= K)::

        dependence = (chi2 - E0) / (chi2_max - E0)

    Returns ``dependence``, ``chi2``, ``df`` and ``p_value`` (chi-square
    survival function by the Wilson-Hilferty approximation, fine for the
    decision "is this a random draw?"). With one batch or one class the
    dependence is undefined and reported as NaN. Raises ``ValueError`` for an
    empty input or a label below 0.
    """
    check_iterable("batch_label_dependence", "labels_per_batch", labels_per_batch,
                   "one epoch's labels, one 1-D integer sequence per batch (a list of tensors or a 2-D tensor)"
                   ) if not isinstance(labels_per_batch, torch.Tensor) else None
    if hasattr(labels_per_batch, "ndim") and labels_per_batch.ndim != 2:
        raise ValueError("labels_per_batch must hold one sequence of labels per batch (a list of 1-D label "
                         "tensors, or a 2-D (batches, batch_size) tensor), got an array with shape "
                         f"{tuple(labels_per_batch.shape)}")
    ys = []
    for y in labels_per_batch:
        try:
            t = torch.as_tensor(y)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError("labels_per_batch must hold one 1-D integer sequence of labels per batch, got an item "
                            f"{describe(y)}") from None
        if t.dim() != 1 or t.dtype.is_floating_point or t.dtype == torch.bool:
            raise ValueError("labels_per_batch must hold 1-D integer class labels per batch (not one-hot, not "
                             f"floats), got a batch of dtype {t.dtype} and shape {tuple(t.shape)}")
        ys.append(t.long())
    ys = [y for y in ys if y.numel()]
    if not ys:
        raise ValueError("labels_per_batch must hold at least one non-empty batch of labels")
    all_y = torch.cat(ys)
    if int(all_y.min()) < 0:
        raise ValueError("labels_per_batch must hold non-negative integer labels")
    classes = torch.unique(all_y)
    n, b, k = all_y.numel(), len(ys), classes.numel()
    if b < 2 or k < 2 or n < 2:
        return dict(dependence=math.nan, chi2=math.nan, df=0.0, p_value=math.nan)
    index = torch.searchsorted(classes, all_y)
    batch_of = torch.repeat_interleave(torch.arange(b), torch.tensor([y.numel() for y in ys]))
    table = torch.zeros(b, k, dtype=torch.float64)
    table.index_put_((batch_of, index), torch.ones(n, dtype=torch.float64), accumulate=True)
    expected = table.sum(1, keepdim=True) * table.sum(0, keepdim=True) / n
    chi2 = float(((table - expected) ** 2 / expected).sum())
    df = (b - 1) * (k - 1)
    e0 = df * n / (n - 1)
    chi2_max = n * (min(b, k) - 1)
    dep = (chi2 - e0) / (chi2_max - e0) if chi2_max > e0 else math.nan
    # Wilson-Hilferty: (chi2/df)^(1/3) is close to normal with mean 1 - 2/(9 df) and variance 2/(9 df).
    z = ((chi2 / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
    return dict(dependence=dep, chi2=chi2, df=float(df), p_value=0.5 * math.erfc(z / math.sqrt(2)))




def _loader_labels(loader, label_fn: Callable | None) -> list:
    def default(batch):
        if isinstance(batch, (tuple, list)) and len(batch) >= 2:
            return batch[1]
        if isinstance(batch, dict):
            for k in ("label", "labels", "y", "target", "targets"):
                if k in batch:
                    return batch[k]
        raise TypeError("cannot find labels in a batch (need (x, y) pairs or a dict with 'label'/'labels'/'y'/"
                        "'target'); pass label_fn=")
    fn = label_fn or default
    return [torch.as_tensor(fn(b)).reshape(-1) for b in loader]


def lint_loader(dataset_len: Any, batch_size: int | None = None, drop_last: bool = False,
                labels_per_batch: Sequence | None = None, min_batch: int = MIN_BATCH,
                max_dependence: float = 0.05, warn: bool = True, *, scan_labels: bool = False,
                label_fn: Callable | None = None) -> list[Lint]:
    """Lints for a data loader's batches, before any BatchNorm sees them; layer name ``"loader"``.

    Pass a ``torch.utils.data.DataLoader`` as the first argument (its dataset
    length, ``batch_size`` and ``drop_last`` are read from it; with
    ``scan_labels=True`` one epoch is iterated to collect its labels, taken by
    ``label_fn(batch)``, default the second element of a tuple or the
    ``label``/``labels``/``y``/``target`` entry of a dict), or the numbers
    themselves: ``dataset_len`` (None: unknown) and ``batch_size`` (per device)
    with ``drop_last``.

    Gives ``last_batch_single`` when ``dataset_len % batch_size == 1`` (a
    train-mode BatchNorm1d on ``(N, C)`` input then raises at the end of every
    epoch) and ``small_last_batch`` (information) for a remainder below
    ``min_batch``. ``labels_per_batch`` (one epoch's labels, one sequence per
    batch) gives ``label_sorted_batches`` when :func:`batch_label_dependence`
    exceeds ``max_dependence`` with ``p_value < 1e-3``. Returns the lints and
    warns the ``warning`` ones. Raises ``ValueError`` naming the argument for a
    non-positive ``batch_size``/``min_batch``/``dataset_len``, a missing
    ``batch_size``, or ``max_dependence`` outside [0, 1]; ``TypeError`` naming
    an argument of the wrong type (a first argument that is neither a
    DataLoader nor a length, such as a list of batches or a model).
    """
    fn = "lint_loader"
    check_bool(fn, "drop_last", drop_last)
    check_bool(fn, "warn", warn)
    check_bool(fn, "scan_labels", scan_labels)
    check_callable(fn, "label_fn", label_fn, "a function from one batch to its labels")
    check_number(fn, "max_dependence", max_dependence, minimum=0.0, maximum=1.0)
    check_int(fn, "batch_size", batch_size, allow_none=True)
    _check_positive_int("min_batch", min_batch, fn)
    if not isinstance(dataset_len, (torch.utils.data.DataLoader, numbers.Integral, type(None))) or isinstance(
            dataset_len, bool):
        raise TypeError(f"{fn}: dataset_len (the first argument) must be a torch DataLoader, or the dataset's length "
                        f"(a positive integer; None: unknown) with batch_size=, got {describe(dataset_len)}"
                        + ("; for a list of batches, wrap the data in a DataLoader" if isinstance(
                            dataset_len, (list, tuple)) else ""))
    if isinstance(dataset_len, torch.utils.data.DataLoader):
        loader = dataset_len
        bs = loader.batch_size if loader.batch_size is not None else getattr(loader.batch_sampler, "batch_size", None)
        batch_size = bs if batch_size is None else batch_size
        drop_last = loader.drop_last or bool(getattr(loader.batch_sampler, "drop_last", False))
        try:
            dataset_len = len(loader.dataset)
        except TypeError:
            dataset_len = None
        if scan_labels and labels_per_batch is None:
            labels_per_batch = _loader_labels(loader, label_fn)
    elif scan_labels:
        raise ValueError("scan_labels=True needs a DataLoader as the first argument")
    if batch_size is None:
        given = ("a DataLoader without a batch_size (a batch_sampler of varying batches?)"
                 if isinstance(dataset_len, torch.utils.data.DataLoader) else f"dataset_len={dataset_len!r}")
        raise ValueError(f"{fn}: batch_size is required with {given}: pass batch_size= (a positive integer, per "
                         "device), or a DataLoader with a batch_size as the first argument")
    _check_positive_int("batch_size", batch_size, fn)
    if dataset_len is not None:
        _check_positive_int("dataset_len", dataset_len, fn)
    lints = []
    if dataset_len is not None and not drop_last:
        rem = dataset_len % batch_size
        if rem == 1:
            lints.append(_lint("last_batch_single", "loader",
                               f"len(dataset) = {dataset_len} and batch_size = {batch_size} leave a last batch of 1 "
                               "sample every epoch: a train-mode BatchNorm1d on (N, C) input raises ValueError, and "
                               "BatchNorm2d normalises that image with its own statistics; pass drop_last=True"))
        elif 1 < rem < min_batch:
            lints.append(_lint("small_last_batch", "loader",
                               f"the last batch of every epoch has {rem} samples (< {min_batch}); consider "
                               "drop_last=True"))
    if labels_per_batch is not None:
        dep = batch_label_dependence(labels_per_batch)
        if dep["dependence"] > max_dependence and dep["p_value"] < 1e-3:
            lints.append(_lint("label_sorted_batches", "loader",
                               f"batch composition depends on the label (dependence {dep['dependence']:.2f} on a 0 "
                               f"(random) to 1 (class-sorted) scale, chi2 = {dep['chi2']:.0f} on {dep['df']:.0f} df): "
                               "the batch mean carries the label; shuffle the loader"))
    _emit(lints, warn)
    return lints


# ---------------------------------------------------------------------------
# Forward in both modes
# ---------------------------------------------------------------------------


def _is_dropout(m: nn.Module) -> bool:
    return isinstance(m, nn.modules.dropout._DropoutNd)


def _required_positional(fn) -> int | None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    return sum(1 for p in sig.parameters.values()
               if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty)


def resolve_forward(model: nn.Module, forward: Callable | nn.Module | None, where: str) -> Callable:
    """The one ``forward`` convention of :class:`FreezeAudit` and :func:`lint_forward_modes`: ``None`` (call
    ``model``), a module or any callable taking the input (``model.backbone``, ``model.forward_a``,
    ``lambda x: ...``). The old ``lint_forward_modes`` form ``forward(model, example)`` (two required positional
    parameters) still works with a ``DeprecationWarning``. Raises ``TypeError`` for anything else."""
    check_str("resolve_forward", "where", where)
    check_module(where, "model", model)
    if forward is None:
        return model
    if isinstance(forward, nn.Module):
        return forward
    if not callable(forward):
        raise TypeError(f"{where}: forward must be None, an nn.Module or a callable taking the input, got "
                        f"{type(forward).__name__}")
    if _required_positional(forward) == 2:
        warnings.warn(f"{where}: forward(model, example) is deprecated; pass a callable of the input alone "
                      "(e.g. model.forward_a or lambda x: model(x)), as FreezeAudit takes it", DeprecationWarning,
                      stacklevel=3)
        return lambda x: forward(model, x)
    return forward


def call_forward(fn: Callable, x: Any) -> Any:
    """``fn(*x)`` for a tuple ``x`` (several inputs), else ``fn(x)``: how the audit calls a forward on a probe."""
    check_callable("call_forward", "fn", fn, "a callable (a module or a function of the input)", allow_none=False)
    return fn(*x) if isinstance(x, tuple) else fn(x)


def lint_forward_modes(model: nn.Module, example: Any, forward: Callable | nn.Module | None = None,
                       warn: bool = True) -> list[Lint]:
    """Run ``forward(example)`` once after ``model.train()`` and once after ``model.eval()``, and compare.

    Lints ``forward_changes_with_mode`` when the return value's structure
    (:func:`output_signature`) differs between the modes (torchvision's
    Inception v3 returns auxiliary logits only in train mode; its detection
    models return a loss dict in train mode), and ``dropout_present``
    (information) naming the dropout layers that ``model.eval()`` turns off.
    ``forward`` follows :class:`FreezeAudit`'s convention (:func:`resolve_forward`:
    None for ``model``, a submodule, or a callable of the input; the old
    ``forward(model, example)`` is deprecated). A tuple ``example`` is unpacked.
    ``model`` ends as it started: every buffer is copied back, every train/eval
    flag restored, the global RNG forked; the passes run under
    ``torch.no_grad()``. Costs a copy of the buffers and two forward passes.
    """
    from .snapshot import output_signature

    check_module("lint_forward_modes", "model", model)
    check_model_input("lint_forward_modes", "example", example)
    check_bool("lint_forward_modes", "warn", warn)
    call = resolve_forward(model, forward, "lint_forward_modes")
    flags = [(m, m.training) for m in model.modules()]
    buffers = [(b, b.detach().clone()) for b in model.buffers() if b is not None and not nn.parameter.is_lazy(b)]
    sigs = {}
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            for mode in (True, False):
                model.train(mode)
                sigs[mode] = output_signature(call_forward(call, example))
    finally:
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)
        for m, flag in flags:
            m.training = flag
    lints = []
    if sigs[True] != sigs[False]:
        lints.append(_lint("forward_changes_with_mode", "",
                           f"{type(model).__name__}.forward returns {sigs[True]} after model.train() but "
                           f"{sigs[False]} after model.eval(): a loop that puts the whole model in eval mode "
                           "trains on a different output (a missing term raises, or is silently dropped)"))
    drops = [n for n, m in model.named_modules() if _is_dropout(m) and not is_pinned(m)]
    if drops:
        lints.append(_lint("dropout_present", drops[0] if len(drops) == 1 else "",
                           f"model.eval() turns off dropout in {', '.join(map(_label, drops))}"))
    _emit(lints, warn)
    return lints
