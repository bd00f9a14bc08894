"""What FreezeAudit (and the audit functions that run or copy a user's model) refuse at the door, found by a new
user outside the repository: a probe the model cannot take, a snapshot device this machine does not have, a model
on the 'meta' device, a forward with keyword-only arguments. Each is refused with a TypeError/ValueError naming the
function and the parameter, before any hook is registered and with the model as it was; the probe's verdict is
checked against what torch itself does with the same input."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from torch import nn
from torch.nn.modules import module as torch_module

from bnstudy.audit import FreezeAudit, lint_forward_modes, lint_model, probe_outputs, snapshot


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 2))


def _state(model):
    return ({k: v.clone() for k, v in model.state_dict().items()}, [m.training for m in model.modules()],
            [p.requires_grad for p in model.parameters()])


def _same(a, b):
    return (a[0].keys() == b[0].keys() and all(torch.equal(a[0][k], b[0][k]) for k in a[0]) and a[1:] == b[1:])


def _global_hooks():
    return len(torch_module._global_forward_pre_hooks), len(torch_module._global_forward_hooks)


DTYPES = [torch.float32, torch.float64, torch.float16, torch.int64]


@settings(max_examples=60, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(rows=st.integers(1, 5), cols=st.integers(1, 6), extra=st.sampled_from([(), (3,)]),
       dtype=st.sampled_from(DTYPES), train=st.booleans())
def test_a_probe_is_refused_exactly_when_torch_refuses_it_naming_probe_and_leaving_the_model(rows, cols, extra,
                                                                                               dtype, train):
    """The verdict is torch's: the audit enters when the model (in eval mode, as the probe runs) takes the probe,
    and otherwise raises TypeError (a floating dtype other than the model's) or ValueError naming FreezeAudit and
    probe, with the model unchanged and no global hook left behind."""
    model = _model().train(train)
    probe = (torch.randn((rows, cols) + extra) * 3).to(dtype)
    try:
        copy.deepcopy(model).eval()(probe)
        torch_ok = True
    except Exception:  # noqa: BLE001 - whatever torch raises, the audit must refuse the same probe
        torch_ok = False
    before, hooks = _state(model), _global_hooks()
    audit = FreezeAudit(model, probe=probe, warn=False)
    if torch_ok:
        with audit:
            pass
        assert audit.outputs_before is not None and audit.outputs_after is not None
    else:
        with pytest.raises((TypeError, ValueError)) as err:
            with audit:
                raise AssertionError("the block must not run")
        msg = str(err.value)
        assert msg.startswith("FreezeAudit: probe must be an input"), msg
        assert f"got a {str(dtype).removeprefix('torch.')} tensor of shape {tuple(probe.shape)}" in msg
        assert "float32 on cpu" in msg  # what the model holds
        if dtype in (torch.float64, torch.float16):
            assert isinstance(err.value, TypeError)  # a floating dtype other than the model's
        elif dtype == torch.float32:
            assert isinstance(err.value, ValueError)  # the right dtype: its shape is wrong
        assert err.value.__cause__ is not None  # torch's own error is chained
        assert audit.before is None  # not entered: a second try with a good probe is a fresh audit
    assert _same(before, _state(model)) and _global_hooks() == hooks


def test_the_reported_probes_wrong_dtype_and_wrong_shape():
    for probe, kind, words in ((torch.randn(8, 4, dtype=torch.float64), TypeError, "float64 tensor of shape (8, 4)"),
                               (torch.randn(8, 5), ValueError, "float32 tensor of shape (8, 5)")):
        with pytest.raises(kind, match=r"^FreezeAudit: probe must be an input Sequential.forward runs in eval mode "
                                       r"\(its parameters are float32 on cpu\), got a " + words.replace("(", r"\(")
                                       .replace(")", r"\)")):
            with FreezeAudit(_model(), probe=probe, warn=False):
                pass


def test_probe_outputs_and_lint_forward_modes_refuse_an_input_the_model_cannot_take_naming_it():
    model = _model()
    before = _state(model)
    with pytest.raises(ValueError, match=r"^probe_outputs: probe must be an input"):
        probe_outputs(model, torch.randn(8, 5))
    with pytest.raises(TypeError, match=r"^lint_forward_modes: example must be an input Sequential.forward runs in "
                                        r"train mode"):
        lint_forward_modes(model, torch.randn(8, 4, dtype=torch.float64), warn=False)
    # a batch of one: torch's train-mode BatchNorm refuses it, and the lint says so naming example
    with pytest.raises(ValueError, match=r"^lint_forward_modes: example .* train mode .*Expected more than 1 value"):
        lint_forward_modes(model, torch.randn(1, 4), warn=False)
    assert _same(before, _state(model))


def test_a_snapshot_device_this_machine_lacks_or_meta_is_refused_at_construction():
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"^FreezeAudit: snapshot_device='cuda' is not available on this machine "
                                             r".*give 'cpu' or a device this machine has"):
            FreezeAudit(_model(), snapshot_device="cuda")
        with pytest.raises(ValueError, match=r"^snapshot: device='cuda:0' is not available"):
            snapshot(_model(), torch.device("cuda:0"))
    with pytest.raises(ValueError, match=r"^FreezeAudit: snapshot_device='meta' holds no values"):
        FreezeAudit(_model(), snapshot_device="meta")
    for ok in ("cpu", torch.device("cpu"), None):  # still accepted
        model = _model()
        with FreezeAudit(model, snapshot_device=ok, warn=False) as audit:
            model(torch.randn(4, 4))
        assert audit.after is not None


def test_a_model_on_the_meta_device_is_refused_naming_the_model_and_its_tensors():
    model = _model().to("meta")
    with pytest.raises(ValueError, match=r"^FreezeAudit: model must hold its values, got a Sequential with tensors "
                                         r"on the 'meta' device \('0.weight', '0.bias', '1.weight' and \d+ more\)"):
        FreezeAudit(model)
    with pytest.raises(ValueError, match=r"^FreezeAudit: model must hold its values"):
        FreezeAudit(torch.compile(model))  # through the compiled wrapper too
    with pytest.raises(ValueError, match=r"^lint_model: model must hold its values"):
        lint_model(model)
    with pytest.raises(ValueError, match=r"^snapshot: model must hold its values"):
        snapshot(model)
    # materialised, the same model audits
    real = model.to_empty(device="cpu")
    with torch.no_grad():
        for p in real.parameters():
            p.normal_()
        real[1].reset_running_stats()
    with FreezeAudit(real, probe=torch.randn(4, 4), warn=False):
        pass


class _Scaled(nn.Module):
    """A forward with a keyword-only argument: ``model(x, scale=2.0)``."""

    def __init__(self):
        super().__init__()
        self.net = _model()

    def forward(self, x, *, scale):
        return self.net(x) * scale


def test_a_forward_with_required_keyword_only_arguments_is_refused_with_a_probe_and_audited_through_forward():
    model = _Scaled()
    with pytest.raises(TypeError, match=r"^FreezeAudit: probe cannot be run through _Scaled.forward, which requires "
                                        r"the keyword-only argument 'scale'.*forward=lambda x: model\(x, scale=\.\.\.\)"):
        FreezeAudit(model, probe=torch.randn(4, 4))
    with pytest.raises(TypeError, match=r"^lint_forward_modes: example cannot be run through _Scaled.forward"):
        lint_forward_modes(model, torch.randn(4, 4), warn=False)
    with pytest.raises(TypeError, match=r"^probe_outputs: probe cannot be run through _Scaled.forward"):
        probe_outputs(model, torch.randn(4, 4))
    # without a probe nothing calls the forward: the audit watches the block as usual
    with FreezeAudit(model, warn=False) as audit:
        model(torch.randn(4, 4), scale=2.0)
    assert audit.model_calls == 1
    # the way the message gives: a forward that supplies the keyword; the probe's outputs are what torch computes
    x = torch.randn(4, 4)
    with FreezeAudit(model, probe=x, forward=lambda v: model(v, scale=2.0), warn=False) as audit:
        model.train()(torch.randn(8, 4), scale=2.0)
    expected = copy.deepcopy(model).eval()(x, scale=2.0).detach()
    assert torch.equal(audit.outputs_after[""], expected)
    # a keyword-only argument with a default needs nothing
    class Defaulted(_Scaled):
        def forward(self, x, *, scale=1.0):
            return self.net(x) * scale
    with FreezeAudit(Defaulted(), probe=x, warn=False):
        pass


def test_a_dict_probe_still_reaches_a_forward_that_takes_a_dict():
    class DictIn(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = _model()

        def forward(self, batch):
            return self.net(batch["x"])
    model = DictIn()
    x = torch.randn(4, 4)
    with FreezeAudit(model, probe={"x": x}, warn=False) as audit:
        pass
    assert torch.equal(audit.outputs_before[""], copy.deepcopy(model).eval()({"x": x}).detach())
