"""FreezeAudit with a probe when the block casts or moves the model (new user 6, item 3).

The probe is re-run on exit; it must follow the model's dtype and device, and the audit's results must be kept
whatever the re-run does. The property test compares the audit's verdicts with what torch actually did."""

import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from torch import nn

from bnstudy.audit import FreezeAudit
from bnstudy.audit.freeze_audit import _follow


def _runs(dtype):
    try:
        m = nn.Sequential(nn.Linear(5, 5), nn.BatchNorm1d(5)).to(dtype)
        m.train()(torch.randn(4, 5, dtype=dtype))
        m.eval()(torch.randn(4, 5, dtype=dtype))
        return True
    except (RuntimeError, NotImplementedError):
        return False


DTYPES = [d for d in (torch.float64, torch.bfloat16, torch.float16) if _runs(d)]


def _model(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 5), nn.BatchNorm1d(5), nn.ReLU(), nn.Linear(5, 3))


def test_dtype_change_given_case_does_not_crash_and_keeps_results():
    m = nn.Sequential(nn.Linear(5, 5), nn.BatchNorm1d(5))
    x = torch.randn(8, 5)
    with FreezeAudit(m, probe=x[:3]) as a:
        m.double()
    assert a.moved().empty  # float32 -> float64 is exact: no tensor changed value
    assert a.outputs_after is not None and a.outputs_after[""].dtype == torch.float64
    assert "float32 to cpu/float64" in a.probe_note and "probe was moved and cast" in str(a)
    assert a.module_outputs("1")["max_abs_change"].max() == 0.0  # the BN's own output, entry values cast alike
    a.assert_frozen("1")


@pytest.mark.skipif(not DTYPES, reason="no other floating dtype runs on this CPU")
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dtype=st.sampled_from(DTYPES or [torch.float64]), train_first=st.booleans(), wrap=st.sampled_from(
    ["tensor", "tuple", "list", "dict"]), seed=st.integers(0, 2**16))
def test_audit_follows_any_dtype_change_and_matches_torch(dtype, train_first, wrap, seed):
    m = _model(seed)
    x = torch.randn(6, 5, generator=torch.Generator().manual_seed(seed))
    probe, forward = {"tensor": (x, None), "tuple": ((x,), None), "list": ([x], lambda xs: m(xs[0])),
                      "dict": ({"x": x}, lambda d: m(d["x"]))}[wrap]
    before = {k: v.detach().clone() for k, v in m.state_dict().items()}
    m.eval()
    with torch.no_grad():
        y0 = m(x)
    with FreezeAudit(m, probe=probe, forward=forward, warn=False) as a:
        if train_first:
            m.train()
            m(torch.randn(6, 5))
        m.to(dtype)
    after = m.state_dict()
    # the tensor verdicts are torch's: a tensor moved iff its value (compared in float64) changed
    truth = {k for k in before if not torch.equal(before[k].double(), after[k].double())}
    assert set(a.moved()["tensor"]) == truth
    # the probe followed the model and its outputs compare with what torch computes now
    m.eval()
    with torch.no_grad():
        y1 = m(x.to(dtype))
    assert a.outputs_after[""].dtype == dtype
    assert a.outputs()["max_abs_change"].iloc[0] == pytest.approx(float((y1.double() - y0.double()).abs().max()))
    assert a.probe_note is not None and str(dtype).removeprefix("torch.") in a.probe_note


def test_a_probe_that_cannot_be_rerun_is_noted_and_the_other_results_are_kept():
    m = _model(0)
    x = torch.randn(6, 5)
    with pytest.warns(RuntimeWarning, match="probe could not be re-run"):
        with FreezeAudit(m, probe=x, warn=False) as a:
            m.train()
            m(x)
            m[3].double()  # mixed dtypes: no cast of the probe can run this model
    assert a.outputs_after is None and a.outputs().empty
    assert "could not be re-run" in a.probe_note and "not compared" in str(a)
    assert set(a.moved()["tensor"]) >= {"1.running_mean", "1.running_var", "1.num_batches_tracked"}
    assert a.module_outputs("1") is None
    with pytest.raises(AssertionError, match="running_mean"):
        a.assert_frozen("1")


def test_follow_moves_every_tensor_and_casts_only_floating_ones():
    """The device half, without a GPU: the meta device stands in for cuda."""
    probe = {"x": torch.randn(2, 3), "ids": torch.arange(3),
             "more": (torch.ones(1, dtype=torch.float64), [torch.zeros(2)])}
    out = _follow(probe, torch.device("meta"), torch.float16)
    assert out["x"].device.type == "meta" and out["x"].dtype == torch.float16
    assert out["ids"].device.type == "meta" and out["ids"].dtype == torch.long
    assert isinstance(out["more"], tuple) and isinstance(out["more"][1], list)
    assert out["more"][0].dtype == torch.float16 and out["more"][1][0].device.type == "meta"
    same = _follow(probe, torch.device("cpu"), None)
    assert same["more"][0].dtype == torch.float64


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("direction", ["to_cuda", "to_cpu"])
def test_audit_follows_a_device_change(direction):
    m = _model(0)
    x = torch.randn(6, 5)
    if direction == "to_cpu":
        m, x = m.cuda(), x.cuda()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with FreezeAudit(m, probe=x, warn=False) as a:
            m.to("cuda" if direction == "to_cuda" else "cpu")
    assert a.outputs_after is not None and "probe was moved" in a.probe_note
    assert a.moved().empty
    assert a.outputs()["max_abs_change"].iloc[0] < 1e-4  # same values, another device's kernels
    a.assert_frozen("1")
