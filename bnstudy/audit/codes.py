"""The lint vocabulary: every code a finding can carry, the :class:`Lint` record, its thresholds with their
reasons, and how findings are grouped, formatted and warned (one warning per finding, however many layers).
Which lints exist and what fires them lives in :mod:`~bnstudy.audit.lints` (models),
:mod:`~bnstudy.audit.loader_lints` (data loaders), :mod:`~bnstudy.audit.forward_lints` (a forward in both modes)
and :class:`~bnstudy.audit.FreezeAudit` (live)."""

from __future__ import annotations

import textwrap
import warnings
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from .._checks import check_int, check_iterable, check_str, describe, user_stacklevel
from .._checks import LazyPandas

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
#: MobileNetV3 0.01). Why 5%: the reset share biases the running mean towards 0 by ``share * mean``, which
#: shifts every eval-mode output by ``share * mean / std`` standard deviations; the moving average has noise
#: of its own, ``sqrt(m / (2 - m) / N)`` standard deviations at batch N (the steady-state spread of an
#: exponential moving average of batch means), 0.057 at m = 0.1 and N = :data:`MIN_BATCH`. At 5% the bias of
#: a channel whose |mean| is up to one standard deviation is below that noise; above it the reset values
#: (mean 0, variance 1) are a visible error and the running statistics are not yet an estimate of the data
#: (five updates at 0.1 leave 59%: a data mean of 5.0 reads 2.05). 5% is also e^-3, three time constants
#: of the moving average, where an exponential average is conventionally taken as warmed up.
MAX_INIT_WEIGHT = 0.05

#: Every lint code, with what it flags.
LINT_CODES = {
    "frozen_bn_in_train_mode": "a norm layer that keeps running statistics (BatchNorm, tracked InstanceNorm) whose "
                               "affine is frozen (requires_grad=False), or that has no affine and sits in a frozen "
                               "part (its block, the model, or every layer registered before it frozen), will write "
                               "its running statistics after model.train(): a frozen backbone whose statistics "
                               "still move",
    "train_bn_drift": "a BatchNorm whose affine parameters train (requires_grad=True) in an otherwise frozen part "
                      "of the model (its block, the model, or every layer registered before it frozen, BatchNorm "
                      "affine parameters left out) will normalise with batch statistics and write its "
                      "running statistics after model.train(): the affine trains while the statistics drift with "
                      "every batch (train_bn=True in fastai's freeze and PyTorch Lightning's BaseFinetuning.freeze); "
                      "pin the statistics (pin_norm_eval) if only the affine should train, or freeze the affine too",
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
                       "its running statistics, and it normalises with them (eval mode, pinned) or will after "
                       "model.eval() (train mode now)",
    "eval_undone_by_train": "a norm layer that keeps running statistics is in eval mode inside a parent in train "
                            "mode, but nothing keeps it there: the next model.train() puts it in train mode and its "
                            "statistics move (a layer set to eval by hand, or a pin a conversion dropped: torch's "
                            "nn.SyncBatchNorm.convert_sync_batchnorm copies the mode, not pin_eval's pin)",
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
