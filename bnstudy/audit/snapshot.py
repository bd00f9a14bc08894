"""Snapshots and diffs of every parameter and buffer, and outputs on a fixed probe batch.

The first two of the audit's three checks (see :mod:`bnstudy.audit`): every
tensor by name (:func:`snapshot`, :func:`diff`) and the model's eval-mode
outputs on the same inputs before and after (:func:`probe_outputs`,
:func:`compare_outputs`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from .._checks import check_callable, check_device, check_materialized, check_model_input, check_module, describe
from .._checks import LazyPandas

from .forward_lints import output_signature  # noqa: F401  (re-exported: bnstudy.audit.snapshot.output_signature)

pd = LazyPandas()  # pandas is imported only when a table is asked for


# ---------------------------------------------------------------------------
# 1. Snapshots and diffs of every parameter and buffer
# ---------------------------------------------------------------------------


@dataclass
class Snapshot:
    """Copies of a model's tensors at one moment.

    ``tensors`` maps each qualified name (``"backbone.blocks.0.norm.running_mean"``)
    to a detached copy; ``kinds`` maps it to ``"param"`` or ``"buffer"``;
    ``modules`` to the qualified name of the module that owns it (``""`` for the
    model itself). A tensor reachable under several names (a shared submodule,
    a tied weight, a shared buffer, a module reused at several places) appears
    under *every* name, as in torch's ``state_dict()``, all names holding the
    same copy (one copy in memory); ``aliases`` maps each such name to all of
    the tensor's names, in ``named_modules(remove_duplicate=False)`` order
    (names of unshared tensors are absent).
    """

    tensors: dict[str, torch.Tensor]
    kinds: dict[str, str]
    modules: dict[str, str]
    aliases: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self):
        for param in ("tensors", "kinds", "modules", "aliases"):
            if not isinstance(getattr(self, param), dict):
                raise TypeError(f"Snapshot: {param} must be a dict keyed by qualified tensor name (build snapshots "
                                f"with bnstudy.audit.snapshot(model)), got {describe(getattr(self, param))}")

    def __len__(self) -> int:
        return len(self.tensors)


def snapshot(model: nn.Module, device: str | torch.device | None = "cpu") -> Snapshot:
    """Copy every parameter and buffer of ``model`` (``num_batches_tracked`` included).

    ``device``: where the copies live (``"cpu"`` by default, so a snapshot of
    a GPU model costs host memory, not device memory; ``None`` keeps each on its
    own device). A tensor reachable under several names is listed under each
    (see :class:`Snapshot`), so a query by any of its names sees it. Uninitialised lazy tensors and ``None`` buffers (e.g.
    BatchNorm with ``track_running_stats=False``) are skipped. Raises
    ``TypeError`` if ``model`` is not an ``nn.Module`` or ``device`` not a
    device, ``ValueError`` for an unknown device string, a device this machine
    does not have (``'cuda'`` on a CPU-only torch) or ``'meta'``, and for a
    model with tensors on the ``'meta'`` device (no values to copy).
    """
    check_module("snapshot", "model", model)
    check_device("snapshot", "device", device, holds_values=True)
    check_materialized("snapshot", "model", model)
    tensors, kinds, owners, copies, names_of = {}, {}, {}, {}, {}
    for mod_name, m in model.named_modules(remove_duplicate=False):
        for kind, store in (("param", m._parameters), ("buffer", m._buffers)):
            for local, t in store.items():
                if t is None or nn.parameter.is_lazy(t):
                    continue
                name = f"{mod_name}.{local}" if mod_name else local
                if name in tensors:  # cannot happen in a tree; guards odd containers
                    continue
                if id(t) not in copies:
                    copy_ = t.detach()
                    copies[id(t)] = copy_.to(device, copy=True) if device is not None else copy_.clone()
                names_of.setdefault(id(t), []).append(name)
                tensors[name], kinds[name], owners[name] = copies[id(t)], kind, mod_name
    aliases = {n: tuple(names) for names in names_of.values() if len(names) > 1 for n in names}
    return Snapshot(tensors, kinds, owners, aliases)


def _max_abs_change(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest |b - a| (0 when equal; NaN in both places counts as equal; inf for NaN against a number)."""
    if a.numel() == 0:
        return 0.0
    if a.dtype == torch.bool:
        return float((a != b).any())
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    if a.is_floating_point() or b.is_floating_point():
        a64, b64 = a.double(), b.double()
        both_nan = a64.isnan() & b64.isnan()
        d = (b64 - a64).abs().masked_fill(both_nan, 0.0).nan_to_num(nan=math.inf)
        return float(d.max())
    return float((b.long() - a.long()).abs().max())


_DIFF_COLUMNS = ["tensor", "module", "name", "kind", "shape", "max_abs_change", "changed", "status", "before", "after",
                 "shared_with", "nonfinite_before", "nonfinite_after"]


def _nonfinite(t: torch.Tensor | None) -> int:
    """How many values of ``t`` are NaN or infinite (0 for integer and boolean tensors, and for None)."""
    if t is None or not (t.is_floating_point() or t.is_complex()) or t.numel() == 0:
        return 0
    return int((~torch.isfinite(t)).sum())


def _newly_nonfinite(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``b`` is NaN or infinite somewhere ``a`` was finite (same shape)."""
    if not (b.is_floating_point() or b.is_complex()) or b.numel() == 0:
        return False
    fa = torch.isfinite(a) if (a.is_floating_point() or a.is_complex()) else torch.ones_like(a, dtype=torch.bool)
    return bool((fa & ~torch.isfinite(b)).any())


def diff_rows(before: Snapshot, after: Snapshot, where: str = "diff_rows") -> list[dict]:
    """:func:`diff`'s rows as plain dicts, one per tensor with the columns :func:`diff` documents (keys
    :data:`_DIFF_COLUMNS`); no pandas needed. Raises ``TypeError`` if an argument is not a :class:`Snapshot`
    (naming ``where``, the function the user called)."""
    for pname, s in (("before", before), ("after", after)):
        if not isinstance(s, Snapshot):
            raise TypeError(f"{where}: {pname} must be a Snapshot (from bnstudy.audit.snapshot), got {describe(s)}")
    rows = []
    names = list(before.tensors) + [n for n in after.tensors if n not in before.tensors]
    for n in names:
        a, b = before.tensors.get(n), after.tensors.get(n)
        src = before if a is not None else after
        ref = a if a is not None else b
        names = (before.aliases.get(n) or after.aliases.get(n) or (n,))
        row = dict(tensor=n, module=src.modules[n], name=n.rsplit(".", 1)[-1], kind=src.kinds[n],
                   shape=tuple(ref.shape), before=None, after=None, shared_with=tuple(a_ for a_ in names if a_ != n),
                   nonfinite_before=_nonfinite(a), nonfinite_after=_nonfinite(b))
        if a is None or b is None:
            row.update(max_abs_change=math.nan, changed=True, status="added" if a is None else "removed")
        elif a.shape != b.shape:
            row.update(max_abs_change=math.nan, changed=True, status="reshaped")
        else:
            b = b.to(a.device)
            d = _max_abs_change(a, b)
            status = ("non-finite" if row["nonfinite_after"] and _newly_nonfinite(a, b) else
                      "changed" if d != 0 else "unchanged")
            row.update(max_abs_change=d, changed=d != 0, status=status)
            if a.dim() == 0:
                row.update(before=a.item(), after=b.item())
        rows.append(row)
    return rows


def diff_frame(rows: list[dict]):
    """:func:`diff_rows`' rows as :func:`diff`'s DataFrame (``before``, ``after``, ``shared_with`` kept as objects:
    ints stay ints and None stays None)."""
    df = pd.DataFrame(rows, columns=_DIFF_COLUMNS)
    for col in ("before", "after", "shared_with"):  # keep ints as ints and None as None (not float NaN)
        df[col] = pd.Series([r[col] for r in rows], index=df.index, dtype=object)
    return df


def diff(before: Snapshot, after: Snapshot) -> pd.DataFrame:
    """One row per tensor: how much it moved between two snapshots.

    Columns: ``tensor`` (qualified name), ``module``, ``name`` (local name),
    ``kind`` (``param``/``buffer``), ``shape``, ``max_abs_change`` (largest
    absolute element-wise change, in the tensor's own units; exact, computed in
    float64), ``changed`` (bool), ``status`` (``unchanged``, ``changed``,
    ``added``, ``removed``, ``reshaped``, ``non-finite``: NaN or inf where the
    value was finite before, e.g. a running_var after one overflowing batch), and
    ``before``/``after`` for 0-d tensors such as ``num_batches_tracked``
    (``None`` otherwise), ``shared_with`` (the tensor's other names, a tuple,
    empty when it has one name), and ``nonfinite_before``/``nonfinite_after``
    (how many of its values are NaN or inf; 0 for integer tensors). A NaN
    against a number counts as a change of ``inf`` in ``max_abs_change``; the
    ``non-finite`` status and counts say which it was. A tensor reachable under several names has one row per name (as in
    torch's ``state_dict()``), so it is reported under every name it has. Rows follow
    the model's order. Raises ``TypeError`` if an argument is not a
    :class:`Snapshot`.
    """
    return diff_frame(diff_rows(before, after, "diff"))


# ---------------------------------------------------------------------------
# 2. Outputs on a fixed probe batch
# ---------------------------------------------------------------------------


def _flatten(out: Any, path: str = "") -> dict[str, torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return {path: out}
    if isinstance(out, dict):
        res = {}
        for k, v in out.items():
            res.update(_flatten(v, f"{path}[{k!r}]"))
        return res
    if isinstance(out, tuple) and hasattr(out, "_fields"):
        res = {}
        for k in out._fields:
            res.update(_flatten(getattr(out, k), f"{path}.{k}"))
        return res
    if isinstance(out, (tuple, list)):
        res = {}
        for i, v in enumerate(out):
            res.update(_flatten(v, f"{path}[{i}]"))
        return res
    return {}


def _set_all_eval(model: nn.Module) -> list[tuple[nn.Module, bool]]:
    saved = [(m, m.training) for m in model.modules()]
    for m, _ in saved:
        m.training = False  # direct assignment: bypasses pinned/overridden train() methods
    return saved


def _restore(saved: list[tuple[nn.Module, bool]]) -> None:
    for m, flag in saved:
        m.training = flag


@torch.no_grad()
def probe_outputs(model: nn.Module, probe: Any, forward: Callable | None = None) -> dict[str, torch.Tensor]:
    """The model's outputs on ``probe`` in eval mode, as CPU copies keyed by output path.

    ``forward`` (default ``model``) is called as ``forward(probe)`` (or
    ``forward(*probe)`` when ``probe`` is a tuple) under ``torch.no_grad()``,
    with every module of ``model`` temporarily in eval mode and the global RNG
    state forked, so the probe neither writes running statistics nor shifts a
    training run's random stream; every train/eval flag is restored exactly.
    Paths: ``""`` for a tensor output, ``"['logits']"``, ``"[0]"``, ``".aux_logits"``
    for dicts, sequences and named tuples. Non-tensor leaves are ignored.
    Raises ``TypeError`` naming ``model``, ``probe`` (not a tensor, or a tuple,
    list or dict of tensors) or ``forward`` (not callable); naming ``probe``, when
    the forward requires keyword-only arguments a probe cannot supply, or refuses
    the probe: ``TypeError`` for a floating dtype other than the model's,
    ``ValueError`` otherwise (a shape or device it cannot take; torch's error
    chained), with every flag restored.
    """
    check_module("probe_outputs", "model", model)
    check_model_input("probe_outputs", "probe", probe)
    check_callable("probe_outputs", "forward", forward, "a callable of the probe (a module or a function)")
    return _probe_outputs(model, probe, forward, "probe_outputs")


@torch.no_grad()
def _probe_outputs(model: nn.Module, probe: Any, forward: Callable | None, where: str) -> dict[str, torch.Tensor]:
    """:func:`probe_outputs` with its refusals naming ``where`` (the function the user called)."""
    from .forward_lints import refuse_keyword_only, run_input
    fn = model if forward is None else forward
    refuse_keyword_only(where, "probe", fn)
    saved = _set_all_eval(model)
    try:
        with torch.random.fork_rng(devices=[]):
            out = run_input(where, "probe", fn, probe, model)
    finally:
        _restore(saved)
    return {k: v.detach().to("cpu", copy=True) for k, v in _flatten(out).items()}


def compare_outputs_rows(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> list[dict]:
    """:func:`compare_outputs`' rows as plain dicts (no pandas needed). One row per output path: ``output``, ``shape``, ``max_abs_change`` (output units, e.g. logits),
    ``changed``, ``status`` (``unchanged``/``changed``/``added``/``removed``/``reshaped``/``non-finite``: NaN
    or inf where the output was finite before), ``nonfinite_after`` (how many values are NaN or inf).
    ``before``/``after``: ``{path: tensor}`` as :func:`probe_outputs` returns (``TypeError`` otherwise)."""
    for pname, d in (("before", before), ("after", after)):
        if not isinstance(d, dict) or not all(isinstance(t, torch.Tensor) for t in d.values()):
            raise TypeError(f"compare_outputs: {pname} must be a dict {{output path: tensor}} as probe_outputs "
                            f"returns, got {describe(d)}")
    rows = []
    for k in list(before) + [k for k in after if k not in before]:
        a, b = before.get(k), after.get(k)
        ref = a if a is not None else b
        if a is None or b is None:
            rows.append(dict(output=k, shape=tuple(ref.shape), max_abs_change=math.nan, changed=True,
                             status="added" if a is None else "removed", nonfinite_after=_nonfinite(b)))
        elif a.shape != b.shape:
            rows.append(dict(output=k, shape=tuple(ref.shape), max_abs_change=math.nan, changed=True,
                             status="reshaped", nonfinite_after=_nonfinite(b)))
        else:
            d = _max_abs_change(a, b)
            k_bad = _nonfinite(b)
            status = "non-finite" if k_bad and _newly_nonfinite(a, b) else "changed" if d != 0 else "unchanged"
            rows.append(dict(output=k, shape=tuple(a.shape), max_abs_change=d, changed=d != 0, status=status,
                             nonfinite_after=k_bad))
    return rows


OUTPUT_COLUMNS = ["output", "shape", "max_abs_change", "changed", "status", "nonfinite_after"]


def compare_outputs(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> pd.DataFrame:
    """One row per output path: ``output``, ``shape``, ``max_abs_change`` (output units, e.g. logits),
    ``changed``, ``status`` (``unchanged``/``changed``/``added``/``removed``/``reshaped``/``non-finite``: NaN
    or inf where the output was finite before), ``nonfinite_after`` (how many values are NaN or inf).
    ``before``/``after``: ``{path: tensor}`` as :func:`probe_outputs` returns (``TypeError`` otherwise)."""
    return pd.DataFrame(compare_outputs_rows(before, after), columns=OUTPUT_COLUMNS)
