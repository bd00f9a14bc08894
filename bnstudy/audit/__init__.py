"""The freeze audit: what moved, what the model computes now, and which mode each layer ran in.

"Frozen" has to mean more than ``requires_grad=False``. A BatchNorm layer in
train mode overwrites its buffers on every forward pass (``running_mean``,
``running_var``, ``num_batches_tracked``), with or without gradients, and
``model.train()`` at the top of a training loop puts it there. This package
checks a freeze the three ways that catch every failure of that kind, one idea
per module:

1. :mod:`~bnstudy.audit.snapshot`: **every tensor, by name** (:func:`snapshot`,
   :func:`diff`) and **outputs on a fixed probe batch** (:func:`probe_outputs`).
2. :mod:`~bnstudy.audit.inspect`: **each layer's mode** as seen by hooks
   (:func:`layer_kind`, :class:`LayerRecord`), decided by :mod:`bnstudy.norms`
   the way torch's own forward decides.
3. :mod:`~bnstudy.audit.lints`: **known traps** by layer name (:func:`lint_model`;
   :func:`lint_loader` in :mod:`~bnstudy.audit.loader_lints`, :func:`lint_forward_modes`
   in :mod:`~bnstudy.audit.forward_lints`; one layer's findings in
   :mod:`~bnstudy.audit.layer_lints`; codes, :class:`Lint` and thresholds in
   :mod:`~bnstudy.audit.codes`, :data:`LINT_CODES`).
4. :mod:`~bnstudy.audit.freeze_audit`: :class:`FreezeAudit`, all of the above
   around a block of code, one idea per module: :mod:`~bnstudy.audit.results`
   (what moved: the tables and ``assert_frozen``), :mod:`~bnstudy.audit.live` (live
   hooks and live lints), :mod:`~bnstudy.audit.elsewhere` (writes that land outside
   the model), :mod:`~bnstudy.audit.boundaries` (compiled and scripted calls),
   :mod:`~bnstudy.audit.display` (the summary and notebook views).

Covered layers: BatchNorm1d/2d/3d, SyncBatchNorm, lazy variants, InstanceNorm
(tracked or not), third-party ``_NormBase`` subclasses, FrozenBatchNorm (this
package's, torchvision's, detectron2's, timm's, by duck typing); stateless norms
(LayerNorm, GroupNorm, RMSNorm, LocalResponseNorm) are listed as ``per-sample``.
Covered models: plain module trees, ``torch.compile`` wrappers (audited through
the module they wrap, read at each compiled call's boundary), TorchScript
modules (layers judged by the class they were compiled from), models run through
``torch.func.functional_call`` (writes into the copies are reported), and
DataParallel replicas.
"""

from .freeze_audit import FreezeAudit
from .inspect import LAYER_KINDS, LayerRecord, layer_kind
from .lints import (LINT_CODES, MAX_INIT_WEIGHT, MAX_MOMENTUM, MIN_BATCH, SEVERITIES, BNLintWarning, Lint,
                    batch_label_dependence,
                    call_forward, format_lints, group_lints, lint_forward_modes, lint_loader, lint_model,
                    lints_frame, resolve_forward)
from .snapshot import Snapshot, compare_outputs, diff, output_signature, probe_outputs, snapshot

__all__ = ["FreezeAudit", "LAYER_KINDS", "LayerRecord", "layer_kind", "LINT_CODES", "MAX_INIT_WEIGHT", "MAX_MOMENTUM",
           "MIN_BATCH",
           "SEVERITIES", "BNLintWarning", "Lint", "batch_label_dependence", "call_forward", "format_lints",
           "group_lints", "lint_forward_modes", "lint_loader", "lint_model", "lints_frame", "resolve_forward",
           "Snapshot", "compare_outputs", "diff", "output_signature", "probe_outputs", "snapshot"]
