"""Property test (issue 11): random small models from torch's norm layers with random flags, momentum, affine,
tracking, train/eval and pins; one training step under the audit; every verdict checked against what happened."""

import time

import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from torch import nn

from bnstudy import audit, norms
from bnstudy.freeze import is_pinned, pin_eval

LAYERS = (nn.BatchNorm1d, nn.InstanceNorm1d)


@st.composite
def layer_specs(draw):
    return dict(cls=draw(st.sampled_from(LAYERS)), affine=draw(st.booleans()), built_tracked=draw(st.booleans()),
                flag=draw(st.booleans()), momentum=draw(st.sampled_from([0.1, 0.0, None, 0.99, 1.0])),
                training=draw(st.booleans()), pinned=draw(st.booleans()), frozen=draw(st.booleans()))


def _build(specs, seed):
    torch.manual_seed(seed)
    mods = []
    for s in specs:
        mods.append(nn.Conv1d(3, 3, 1))
        layer = s["cls"](3, affine=s["affine"], track_running_stats=s["built_tracked"], momentum=s["momentum"])
        layer.track_running_stats = s["flag"]
        if s["frozen"]:
            layer.requires_grad_(False)
        mods.append(layer)
    model = nn.Sequential(*mods)
    model.train()
    for s, layer in zip(specs, mods[1::2]):
        if s["pinned"]:
            pin_eval(layer)
        elif not s["training"]:
            layer.training = False
    return model


_RUN = {"n": 0, "t": 0.0}


@settings(max_examples=500, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(specs=st.lists(layer_specs(), min_size=1, max_size=3), seed=st.integers(0, 2 ** 16))
def test_audit_and_lint_verdicts_match_what_actually_happened(specs, seed):
    t0 = time.perf_counter()
    model = _build(specs, seed)
    layers = list(model)[1::2]
    # eval-mode InstanceNorm with the tracked flag but no buffers makes torch raise: not a state to audit
    if any(isinstance(m, nn.InstanceNorm1d) and m.track_running_stats and not norms.has_running_stats(m)
           and not m.training for m in layers):
        return
    x = torch.randn(8, 3, 5, generator=torch.Generator().manual_seed(seed)) * 2 + 1
    lints = audit.lint_model(model, warn=False)
    with audit.FreezeAudit(model, warn=False) as a:
        model.train()                                   # what every training loop does
        after_train = [m.training for m in layers]
        out = model(x)
        loss = out.pow(2).mean()
        if loss.requires_grad:
            loss.backward()
    rep = a.report()
    modes = a.modes().set_index("module")
    for i, m in enumerate(layers):
        name = str(2 * i + 1)
        moved_buffers = rep[(rep["module"] == name) & (rep["kind"] == "buffer") & rep["changed"]]
        # 1. did a buffer change? The audit's record and norms' rule say the same as the diff.
        assert bool(len(moved_buffers)) == norms.changes_buffers(m, after_train[i])
        assert bool(modes.loc[name, "updated_running_stats"]) == (
            norms.updates_running_stats(m, after_train[i]) or norms.counts_batches(m, after_train[i]))
        # 2. did a pin hold?
        if is_pinned(m):
            assert not after_train[i] and not m.training
        # 3. frozen affine whose statistics moved <=> the lint
        frozen_affine = m.affine and not any(p.requires_grad for p in m.parameters(recurse=False))
        writes = norms.updates_running_stats(m, after_train[i])
        assert (("frozen_bn_in_train_mode", name) in {(l.code, l.layer) for l in lints}) == (frozen_affine and writes)
        # 4. eval output depends on batch mates <=> batch_dependent_in_eval lint
        m_eval = m.training
        try:
            m.training = False
            xi = torch.randn(4, 3, 5)
            y_all = m(xi)[:1]
            y_one = m(torch.cat([xi[:1], xi[:1] * 5 + 3]))[:1]
            depends = not torch.allclose(y_all, y_one, atol=1e-5)
        except (RuntimeError, ValueError):
            depends = None
        finally:
            m.training = m_eval
        if depends is not None:
            assert depends == (("batch_dependent_in_eval", name) in {(l.code, l.layer) for l in lints})
        # 5. momentum lints name the convention
        if m.momentum is not None and m.momentum > audit.MAX_MOMENTUM and norms.has_running_stats(m):
            assert ("momentum_high", name) in {(l.code, l.layer) for l in lints}
    _RUN["n"] += 1
    _RUN["t"] += time.perf_counter() - t0
