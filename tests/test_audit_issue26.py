"""Issue 26: the audit on the models people ship (compiled, scripted, functional, low-precision, other libraries'
frozen layers). Each kind's handed case is a test with its right value, beside neighbouring instances of the kind."""

import copy
import io
import pickle
import warnings

import pytest
import torch
from torch import nn

from bnstudy import freeze, norms
from bnstudy.audit import BNLintWarning, FreezeAudit, layer_kind, lint_model
from bnstudy.freeze import (FrozenBatchNorm, UnfrozenBatchNorm2d, batch_stats_report, convert_sync_batchnorm,
                            eval_after_train, freeze_batchnorm, freeze_modules, is_pinned, pin_dropped, pin_eval,
                            pin_norm_eval, unfreeze_batchnorm, unfreeze_modules)
from bnstudy.running_stats import compare_statistics, precise_bn_statistics, update_bn_stats
from bnstudy.study.vision import import_torchvision


def _codes(lints, severity=None):
    return {(x.code, x.layer) for x in lints if severity is None or x.severity == severity}


def _flat(text) -> str:
    """``text`` with its line wrapping undone (the summary wraps at 100 characters)."""
    return " ".join(str(text).split())


def _x(n=16, seed=1, mean=2.0, d=4):
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed)) + mean


def _net(seed=0, warm=40):
    """A small net whose BatchNorm has estimated statistics (``warm`` train-mode batches)."""
    torch.manual_seed(seed)
    model = nn.Sequential()
    model.backbone = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU())
    model.head = nn.Linear(8, 2)
    model.train()
    with torch.no_grad():
        for i in range(warm):
            model(_x(seed=100 + i))
    return model


def _step(model, opt, x):
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


# --- Kind 1: models that are not plain module trees ------------------------------------------------------------------

def test_handed_case_compiled_model_with_a_training_step_inside_the_audit_does_not_crash_dynamo():
    """FreezeAudit around a torch.compile'd model with the training step inside: was AssertionError ('... is already
    tracked for mutation') raised by dynamo under the audit's global hooks. Right value: the steps run, compiled, and
    give bit for bit what the same steps give without the audit; the naive freeze is caught in the compiled model."""
    torch._dynamo.reset()
    model = _net()
    model.backbone.requires_grad_(False)
    twin = copy.deepcopy(model)
    compiled, compiled_twin = torch.compile(model), torch.compile(twin)
    opt = torch.optim.SGD(model.head.parameters(), lr=0.1)
    opt_twin = torch.optim.SGD(twin.head.parameters(), lr=0.1)
    xs = [_x(seed=i) for i in range(3)]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*global hooks on modules.*")  # torch's note on OptimizedModule
        with FreezeAudit(compiled, probe=_x(8, seed=9), warn=False) as a:
            for x in xs:
                _step(compiled, opt, x)
        for x in xs:
            _step(compiled_twin, opt_twin, x)
    sd, sd_twin = model.state_dict(), twin.state_dict()
    assert all(torch.equal(sd[k], sd_twin[k]) for k in sd)  # the audit changed nothing in the user's step
    assert a.model is model and a.wrapper is compiled and a.model_calls == 3
    row = a.modes().set_index("module").loc["backbone.1"]
    assert (row["calls"], row["hidden_calls"], row["hidden_writes"], row["mode"]) == (0, 3, 3, "train")
    assert ("frozen_bn_in_train_mode", "backbone.1") in _codes(a.lints)
    assert ("hidden_calls", "") in _codes(a.lints, "info")
    for name in ("backbone", "_orig_mod.backbone"):  # the wrapper's names are accepted too
        with pytest.raises(AssertionError, match=r"backbone\.1\.running_mean"):
            a.assert_frozen(name, outputs=False)
    assert "compiled: audited through torch.compile's _orig_mod" in _flat(a)

    # the same compiled model, audited through the original module: calls are seen at the wrapper's boundary
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*global hooks on modules.*")
        with FreezeAudit(model, warn=False) as b:
            _step(compiled, opt, xs[0])
    assert b.model_calls == 1 and b.modes().set_index("module").loc["backbone.1", "hidden_writes"] == 1


def test_a_model_compiled_in_place_is_noted_and_its_step_runs():
    torch._dynamo.reset()
    model = _net()
    model.compile(backend="eager")
    opt = torch.optim.SGD(model.head.parameters(), lr=0.1)
    with FreezeAudit(model, warn=False) as a:
        _step(model, opt, _x())
    assert any("compiled in place" in n for n in a.notes) and "compiled in place" in _flat(a)
    assert set(a.moved()["module"]) >= {"backbone.1"}  # what moved still comes from the snapshots


def test_a_compiled_submodule_is_read_at_its_boundary_and_a_compiled_function_is_noted():
    torch._dynamo.reset()
    model = _net()
    model.backbone = torch.compile(model.backbone, backend="eager")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*global hooks on modules.*")
        with FreezeAudit(model, warn=False) as a:
            model.train()(_x())
    row = a.modes().set_index("module").loc["backbone._orig_mod.1"]
    assert (row["hidden_calls"], row["hidden_writes"]) == (1, 1)
    with pytest.raises(AssertionError, match=r"backbone\._orig_mod\.1\.running_mean"):
        a.assert_frozen("backbone", outputs=False)
    model = _net()
    step = torch.compile(lambda x: model(x), backend="eager")  # a compiled function: no module boundary
    with FreezeAudit(model, warn=False) as b:
        step(_x())
    assert b.model_calls == 0 and "changed with no call of theirs seen" in _flat(b)
    assert "'backbone.1'" in b.notes[0]


def test_a_torch_export_module_is_refused_at_once_saying_to_audit_before_exporting():
    exported = torch.export.export(_net().eval(), (_x(4),)).module()
    for fn in (lambda: FreezeAudit(exported), lambda: lint_model(exported), lambda: batch_stats_report(exported)):
        with pytest.raises(TypeError, match=r"train\(\) is not supported .*before exporting it"):
            fn()


def _pinned_scripted():
    model = _net()
    model.backbone.requires_grad_(False)
    pin_eval(model.backbone)
    return model, torch.jit.script(model)


def test_handed_case_torchscript_assert_frozen_lint_model_and_layer_modes_work_on_a_scripted_model():
    """assert_frozen("backbone") raised 'get_submodule is not supported on ScriptModules'; lint_model and the
    layer-mode listing saw no norm layer. Right value: all three work, naming backbone.1 like the Python model."""
    model, scripted = _pinned_scripted()
    report = batch_stats_report(scripted)
    assert list(report["layer"]) == ["backbone.1"] and report.loc[0, "type"] == "RecursiveScriptModule"
    assert report.loc[0, "stats_after_train"] == "batch"  # the pin did not survive scripting (below)
    lints = lint_model(scripted, warn=False)
    assert ("frozen_bn_in_train_mode", "backbone.1") in _codes(lints)
    assert layer_kind(dict(scripted.named_modules())["backbone.1"]) == "batchnorm"
    opt = torch.optim.SGD(scripted.head.parameters(), lr=0.1)
    with FreezeAudit(scripted, probe=_x(8, seed=9), warn=False) as a:
        for i in range(3):
            scripted.train()
            _step(scripted, opt, _x(seed=i))
    row = a.modes().set_index("module").loc["backbone.1"]
    assert (row["type"], row["hidden_calls"], row["hidden_writes"], row["mode"]) == ("BatchNorm1d", 3, 3, "train")
    with pytest.raises(AssertionError, match=r"'backbone' is not frozen; 3 moved"):
        a.assert_frozen("backbone")
    a.assert_frozen("backbone.0")  # the frozen Linear's tensors did not move
    assert a.module_outputs("backbone") is None  # no hook runs inside TorchScript: only tensors are judged


def test_handed_case_scripting_a_pinned_model_drops_the_pin_and_it_is_reported_where_it_is_lost():
    """Scripting a pin_eval'ed model worked and silently dropped the pin. Right value: every pinned module of the
    scripted model is named by lint_model and by the audit (pin_lost), the layer really trains after .train(),
    pin_eval on the scripted module restores the pin, and a FrozenBatchNorm conversion scripts and stays frozen."""
    model, scripted = _pinned_scripted()
    assert is_pinned(model.backbone[1])
    bn = dict(scripted.named_modules())["backbone.1"]
    assert pin_dropped(bn) and not is_pinned(bn)
    pins = {layer for code, layer in _codes(lint_model(scripted, warn=False)) if code == "pin_lost"}
    assert pins == {"backbone", "backbone.0", "backbone.1", "backbone.2"}
    scripted.train()
    assert bn.training  # the pin is gone: model.train() reached the BatchNorm
    with pytest.warns(BNLintWarning, match=r"\[pin_lost\] 4 layers \(backbone, backbone\.0, backbone\.1, backbone\.2\)"):
        with FreezeAudit(scripted):
            pass
    buf = io.BytesIO()
    torch.jit.save(scripted, buf)
    buf.seek(0)
    loaded = torch.jit.load(buf)
    assert pin_dropped(dict(loaded.named_modules())["backbone.1"])  # jit.save/load: mark kept, pin dropped
    pin_eval(scripted.backbone)  # re-pinning works on the scripted module, in Python
    scripted.train()
    assert not bn.training and is_pinned(bn) and not pin_dropped(bn)
    with FreezeAudit(scripted, warn=False) as a:
        scripted(_x())
    a.assert_frozen("backbone")
    # the conversion pin_eval's docstring recommends scripts (it failed to compile before) and stays frozen
    frozen = freeze_batchnorm(copy.deepcopy(_net()))
    s2 = torch.jit.script(frozen)
    x = _x()
    assert torch.equal(s2(x), frozen(x))
    s2.train()
    with FreezeAudit(s2, warn=False) as b:
        s2(x)
    assert b.moved().empty


def test_pin_eval_docstring_lists_exactly_the_transformations_that_keep_and_drop_pins():
    torch._dynamo.reset()
    doc = " ".join(pin_eval.__doc__.split())
    kept, dropped = doc.split("* dropped:")
    for name in ("copy.deepcopy", "torch.save(model)", "model.to()", "torch.compile(model)", "model.compile()",
                 "torch.fx.symbolic_trace", "_replicate_for_data_parallel", ":func:`convert_sync_batchnorm`"):
        assert name in kept
    for name in ("torch.nn.SyncBatchNorm. convert_sync_batchnorm", "torch.jit.script", "torch.jit.save",
                 "torch.jit.trace", "torch.export", "load_state_dict"):
        assert name.replace(". ", ".") in dropped.replace(". ", ".")

    def pinned():
        m = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Dropout(0.1))
        pin_eval(m[1])
        return m

    def bn_trains(m, name="1"):
        m.train()
        return dict(m.named_modules())[name].training

    keeps = {
        "deepcopy": copy.deepcopy(pinned()),
        "pickle": pickle.loads(pickle.dumps(pinned())),
        "to": pinned().to(torch.float64),
        "compile": torch.compile(pinned(), backend="eager"),
        "compile_in_place": pinned(),
        "fx": torch.fx.symbolic_trace(pinned()),
        "ours": convert_sync_batchnorm(pinned()),
    }
    keeps["compile_in_place"].compile(backend="eager")
    buf = io.BytesIO()
    torch.save(pinned(), buf)
    buf.seek(0)
    keeps["torch.save"] = torch.load(buf, weights_only=False)
    for label, m in keeps.items():
        assert not bn_trains(m, "_orig_mod.1" if label == "compile" else "1"), label
    source = pinned()
    replica = source._replicate_for_data_parallel()
    assert not replica[1].training  # a replica copies the eval flag the pin keeps
    drops = {"torch's sync": nn.SyncBatchNorm.convert_sync_batchnorm(pinned()), "script": torch.jit.script(pinned()),
             "trace": torch.jit.trace(pinned(), torch.randn(4, 4))}
    fresh = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Dropout(0.1))
    fresh.load_state_dict(pinned().state_dict())
    drops["load_state_dict"] = fresh
    for label, m in drops.items():
        assert bn_trains(m), label
    assert pin_dropped(dict(drops["script"].named_modules())["1"])       # reported (lint_model, the audit)
    assert not pin_dropped(dict(drops["trace"].named_modules())["1"])    # trace keeps neither: nothing to report
    exported = torch.export.export(pinned().eval(), (torch.randn(4, 4),)).module()
    with pytest.raises(Exception, match="train"):
        exported.train()


class _ThirdPartyNorm(nn.modules.batchnorm._NormBase):
    """A third-party ``_NormBase`` layer with torch's BatchNorm semantics."""

    def forward(self, x):
        return nn.functional.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                                        self.training, 0.1, self.eps)


def test_a_scripted_third_party_norm_layer_is_read_by_its_source_class():
    model = nn.Sequential(nn.Linear(4, 3), _ThirdPartyNorm(3))
    model[1].requires_grad_(False)
    scripted = torch.jit.script(model)
    assert norms.script_source_class(dict(scripted.named_modules())["1"]) is _ThirdPartyNorm
    assert ("frozen_bn_in_train_mode", "1") in _codes(lint_model(scripted, warn=False))


def test_conversions_and_estimators_refuse_a_torchscript_model_at_once_saying_what_to_do():
    _, scripted = _pinned_scripted()
    for fn in (lambda: freeze_modules(scripted, ["backbone"]), lambda: unfreeze_modules(scripted, ["backbone"]),
               lambda: freeze_batchnorm(scripted), lambda: unfreeze_batchnorm(scripted),
               lambda: convert_sync_batchnorm(scripted), lambda: update_bn_stats(scripted, [_x()]),
               lambda: precise_bn_statistics(scripted, [_x()]), lambda: freeze.shared_weight_copy(scripted)):
        with pytest.raises(TypeError, match=r"is a TorchScript module.*on the Python model and script the result"):
            fn()
    # reading its buffers works: compare_statistics against the Python model it came from
    model, scripted = _pinned_scripted()
    assert compare_statistics(scripted, model, tol=0.0).agrees.all()


def _copies_run(own: bool, steps=100):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 1)).train()
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers()) if own else {k: v.clone() for k, v in model.named_buffers()}
    opt = torch.optim.SGD(params.values(), lr=0.05)
    g = torch.Generator().manual_seed(1)

    def batch():
        x = torch.randn(64, 4, generator=g) * 5 + 10
        return x, x.sum(1, keepdim=True) / 10

    with FreezeAudit(model, probe=batch()[0][:8], warn=False) as a:
        for _ in range(steps):
            x, y = batch()
            loss = (torch.func.functional_call(model, {**params, **buffers}, (x,)) - y).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    x, y = batch()
    model.eval()
    with torch.no_grad():
        err = float((model(x) - y).pow(2).mean())
        loaded = copy.deepcopy(model)
        loaded.load_state_dict(buffers, strict=False)
        err_loaded = float((loaded(x) - y).pow(2).mean())
    return model, buffers, a, err, err_loaded


def test_handed_case_functional_call_with_buffer_copies_says_the_writes_went_to_the_copies():
    """functional_call with copies of the buffers: the audit printed 'WROTE running stats (100x)' beside 'no buffer
    moved' and nothing joined them (eval error 276 against 0.42). Right value: 100 writes, all 100 into the copies;
    the module keeps mean 0 / variance 1, which the summary, modes(), elsewhere() and a lint say."""
    model, buffers, a, err, err_loaded = _copies_run(own=False)
    bn = model[1]
    assert torch.equal(bn.running_mean, torch.zeros(8)) and torch.equal(bn.running_var, torch.ones(8))
    assert int(bn.num_batches_tracked) == 0 and int(buffers["1.num_batches_tracked"]) == 100
    row = a.modes().set_index("module").loc["1"]
    assert (row["writes"], row["writes_elsewhere"], row["elsewhere"]) == (
        100, 100, "torch.func.functional_call copies (100)")
    assert a.report().query("kind == 'buffer'")["changed"].sum() == 0
    assert ("stats_written_elsewhere", "1") in _codes(a.lints, "warning")
    text = _flat(a)
    assert "writes not in the model: '1': all 100 writes went into torch.func.functional_call copies" in text
    assert "WROTE running stats (100x; all into torch.func.functional_call copies, not its buffers)" in text
    assert a.elsewhere().to_dict("records") == [dict(layer="1", type="BatchNorm1d", where=
                                                     "torch.func.functional_call copies", writes=100, in_model=False)]
    assert err > 100 * err_loaded  # what the lost writes cost in eval mode (here about 141 against 0.056)
    # the module's own buffers passed to functional_call: every write lands, nothing is reported elsewhere
    model, _, a, err, _ = _copies_run(own=True)
    row = a.modes().set_index("module").loc["1"]
    assert (row["writes"], row["writes_elsewhere"]) == (100, 0) and int(model[1].num_batches_tracked) == 100
    assert "stats_written_elsewhere" not in {x.code for x in a.lints} and a.elsewhere().empty


def _replica(module, share_buffers):
    """What torch.nn.parallel.replicate builds for one device: a replica per module, parameters shared as on
    device_ids[0], buffers shared (device_ids[0]) or copied (every other device)."""
    r = module._replicate_for_data_parallel()
    for k, c in module._modules.items():
        r._modules[k] = _replica(c, share_buffers)
    for k, b in module._buffers.items():
        if b is not None:
            r._buffers[k] = b if share_buffers else b.clone()
    for k, p in module._parameters.items():
        if p is not None:
            r._parameters[k] = p
    return r


def test_dataparallel_replica_writes_are_counted_and_those_into_copies_are_reported_lost():
    model = _net()
    before = model.backbone[1].running_mean.clone()
    with FreezeAudit(model, warn=False) as a:
        _replica(model, True)(_x())     # device_ids[0]: shares the buffers
        _replica(model, False)(_x())    # another device: its own copies
    row = a.modes().set_index("module").loc["backbone.1"]
    assert (row["calls"], row["writes"], row["writes_elsewhere"]) == (2, 2, 1)
    assert row["elsewhere"] == "DataParallel replica copies (1)"
    assert ("stats_written_elsewhere", "backbone.1") in _codes(a.lints)
    assert not torch.equal(before, model.backbone[1].running_mean)  # the shared replica's write landed
    assert int(model.backbone[1].num_batches_tracked) == 41


def test_an_ema_copy_run_in_train_mode_writes_its_own_buffers_and_the_audit_says_where():
    model = _net()
    ema = torch.optim.swa_utils.AveragedModel(model)
    with FreezeAudit(model, warn=False) as a:
        ema(_x())
        ema(_x(seed=3))
    assert a.moved().empty
    assert a.elsewhere().to_dict("records") == [dict(
        layer="module.backbone.1", type="BatchNorm1d", writes=2, in_model=False,
        where="outside the model: AveragedModel (a copy of the model's 'backbone.1': deepcopy, an EMA or AveragedModel)")]
    assert "norm layers outside the model wrote running statistics: AveragedModel (2 writes)" in _flat(a)


# --- Kind 2: numerics of running statistics ---------------------------------------------------------------------------

def test_handed_case_one_inf_batch_leaves_nonfinite_statistics_and_every_tool_says_nan():
    """One batch with an inf: NaN/inf running statistics for good (skipping the optimizer step cannot undo the write);
    the summary showed 'max |change| inf' and compare_statistics called the layer 'disagreeing'. Right value: the
    layer is named at the call that did it, the report says non-finite, compare_statistics says NaN, and
    update_bn_stats refuses to write non-finite estimates back."""
    model = _net()
    ref = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with pytest.warns(BNLintWarning, match=r"\[nonfinite_stats\] backbone\.1: .*written at model call 2 \(its input "
                                           r"held inf/NaN\)"):
        with FreezeAudit(model, probe=_x(8, seed=9)) as a:
            for i in range(3):
                x = _x(seed=i)
                if i == 1:
                    x[0, 0] = float("inf")
                loss = model(x).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                if torch.isfinite(loss):
                    opt.step()  # GradScaler skips such a step; the buffer write happened anyway
    assert not torch.isfinite(model.backbone[1].running_var).any()
    rep = a.report().set_index("tensor")
    assert rep.loc["backbone.1.running_var", "status"] == "non-finite"
    assert rep.loc["backbone.1.running_var", "nonfinite_after"] == 8
    text = _flat(a)
    assert "max |change| inf" not in text
    assert "NON-FINITE: 2 tensors hold NaN or inf" in text and "probe outputs: NON-FINITE" in text
    with pytest.raises(AssertionError, match=r"running_var' \(NaN/inf: 8 of its values non-finite"):
        a.assert_frozen("backbone")
    with pytest.warns(RuntimeWarning, match=r"backbone\.1: model running_mean: 8 of 8 channels non-finite"):
        df = compare_statistics(model, ref)
    assert not df.agrees.any() and df.max_mean_shift.isna().all()
    assert "NaN" in df.attrs["nonfinite"]["backbone.1"]
    bad = copy.deepcopy(ref)
    saved = bad.backbone[1].running_mean.clone()
    with pytest.raises(ValueError, match=r"refusing to write non-finite.*backbone\.1 running_mean: 8 of 8 channels "
                                         r"non-finite \(the inputs it received hold inf or NaN\)"):
        update_bn_stats(bad, [_x(), torch.full((16, 4), float("inf"))])
    assert torch.equal(bad.backbone[1].running_mean, saved)  # nothing written, everything restored


def test_a_negative_running_var_is_linted_as_a_nan_source():
    model = _net()
    with torch.no_grad():
        model.backbone[1].running_var[2] = -0.5
    (lint,) = [x for x in lint_model(model, warn=False) if x.code == "nonfinite_stats"]
    assert lint.layer == "backbone.1" and "negative in 1 of 8 channels" in lint.message


def test_float16_statistics_that_overflow_are_named_with_the_cause():
    bn = nn.Sequential(nn.BatchNorm1d(4)).half()
    with FreezeAudit(bn, warn=False) as a:
        bn(torch.randn(32, 4).half() * 1000)  # variance about 1e6 > 65504
    lint = next(x for x in a.lints if x.code == "nonfinite_stats")
    assert lint.layer == "0" and "its input was finite: the batch statistics overflowed float16" in lint.message
    assert ("low_precision_stats", "0") in _codes(a.lints)
    assert bool(torch.isinf(bn[0].running_var).all())


def test_bfloat16_statistics_lose_updates_and_the_audit_names_the_layer_at_the_call():
    m = nn.Sequential(nn.BatchNorm1d(3)).bfloat16()
    with torch.no_grad():
        m[0].running_mean.fill_(100.0)
    lint = next(x for x in lint_model(m, warn=False) if x.code == "low_precision_stats")
    assert "within about 3.91% of the running value" in lint.message
    x = torch.full((16, 3), 100.5).bfloat16()
    with FreezeAudit(m, warn=False) as a:
        for _ in range(10):
            m(x)
    assert torch.equal(m[0].running_mean.float(), torch.full((3,), 100.0))  # every update rounded away
    ref = nn.BatchNorm1d(3)
    ref.running_mean.fill_(100.0)
    for _ in range(10):
        ref(torch.full((16, 3), 100.5))
    assert abs(float(ref.running_mean[0]) - (100 + 0.5 * (1 - 0.9 ** 10))) < 1e-4  # float32 moves: 100.33
    lint = next(x for x in a.lints if x.code == "stats_update_lost")
    assert "at model call 1" in lint.message and "3 of 3 channels" in lint.message


def test_statistics_barely_updated_since_a_reset_are_linted_with_the_weight_left_on_mean_0_variance_1():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8))
    for i in range(5):
        model.train()(_x(seed=i))
    model.eval()
    (lint,) = [x for x in lint_model(model, warn=False) if x.code == "stats_near_init"]
    assert lint.layer == "1" and "(1 - 0.1)^5 = 59%" in lint.message and "29 updates" in lint.message
    model.train()  # training on (batch statistics now): the next model.eval() uses the 59%-reset statistics
    (lint,) = [x for x in lint_model(model, warn=False) if x.code == "stats_near_init"]
    assert "(1 - 0.1)^5 = 59%" in lint.message and "will normalise with them after model.eval()" in lint.message
    for i in range(30):
        model(_x(seed=10 + i))
    model.eval()
    assert "stats_near_init" not in {x.code for x in lint_model(model, warn=False)}  # 0.9^35 = 2.5% < 5%
    fresh = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8))
    with FreezeAudit(fresh, warn=False) as a:
        for i in range(3):
            fresh.train()(_x(seed=i))
        fresh.eval()  # then evaluated: it normalises with statistics that are 73% mean 0 / variance 1
    (lint,) = [x for x in a.lints if x.code == "stats_near_init"]
    assert "entered the block holding the reset statistics" in lint.message and "= 73%" in lint.message


def test_cumulative_average_whose_loaded_statistics_carry_no_weight_is_linted_when_the_batch_replaces_them():
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8, momentum=None))
    trained = copy.deepcopy(model)
    trained[1].momentum = 0.1
    for i in range(40):
        trained(_x(seed=i))
    state = {k: v for k, v in trained.state_dict().items() if not k.endswith("num_batches_tracked")}
    x = _x(seed=99)
    with pytest.warns(BNLintWarning, match=r"\[cumulative_overwrites_loaded\] 1: .*this train-mode batch \(model call "
                                           r"1\) gets weight 1/1 and replaces them entirely"):
        with FreezeAudit(model) as a:
            model.load_state_dict(state, strict=False)  # loaded inside the block, without num_batches_tracked
            model.train()(x)
    assert torch.allclose(model[1].running_mean, model[0](x).mean(0), atol=1e-6)  # the loaded values are gone
    assert ("cumulative_overwrites_loaded", "1") in _codes(a.lints)


# --- Kind 3: frozen layers of other libraries ------------------------------------------------------------------------

class _D2FrozenBatchNorm2d(nn.Module):
    """Stands in for detectron2's FrozenBatchNorm2d: buffers, variance initialised to 1 - eps, and a forward that
    switches between a scale-shift formula (input requiring grad) and F.batch_norm (written for this test)."""

    def __init__(self, num_features, eps=1e-5):
        super().__init__()
        self.num_features, self.eps = num_features, eps
        for n, v in (("weight", torch.ones(num_features)), ("bias", torch.zeros(num_features)),
                     ("running_mean", torch.zeros(num_features)), ("running_var", torch.ones(num_features) - eps)):
            self.register_buffer(n, v)

    def forward(self, x):
        if x.requires_grad:
            scale = self.weight * (self.running_var + self.eps).rsqrt()
            return x * scale.reshape(1, -1, 1, 1) + (self.bias - self.running_mean * scale).reshape(1, -1, 1, 1)
        return nn.functional.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False,
                                        eps=self.eps)


_D2FrozenBatchNorm2d.__name__ = _D2FrozenBatchNorm2d.__qualname__ = "FrozenBatchNorm2d"
_D2FrozenBatchNorm2d.__module__ = "detectron2.layers.batch_norm"


class _TimmFrozenBatchNormAct2d(_D2FrozenBatchNorm2d):
    """A frozen layer with an activation inside, as timm's FrozenBatchNormAct2d: not rebuilt here."""

    def __init__(self, num_features):
        super().__init__(num_features)
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(super().forward(x))


_TimmFrozenBatchNormAct2d.__name__ = "FrozenBatchNormAct2d"


def _random_stats(model):
    g = torch.Generator().manual_seed(5)
    for m in model.modules():
        if norms.is_frozen_batchnorm(m):
            with torch.no_grad():
                for n, lo, hi in (("running_mean", -2, 2), ("running_var", 0.3, 3), ("weight", 0.5, 1.5),
                                  ("bias", -1, 1)):
                    t = getattr(m, n)
                    t.copy_(torch.rand(t.shape, generator=g) * (hi - lo) + lo)
    return model


def test_handed_case_torchvision_frozen_batchnorm_unfreezes_instead_of_silently_staying_frozen():
    """A model holding torchvision's FrozenBatchNorm2d, 'unfrozen' with unfreeze_modules / unfreeze_batchnorm, stayed
    frozen (timm's own unfreeze converts them). Right value: every one becomes a trainable BatchNorm2d whose eval
    outputs equal the frozen model's bit for bit, and which updates its statistics in train mode."""
    tv = import_torchvision()
    torch.manual_seed(0)
    model = _random_stats(tv.models.resnet18(weights=None, norm_layer=tv.ops.FrozenBatchNorm2d)).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        before = model(x)
    assert layer_kind(model.bn1) == "frozen_batchnorm"
    n_frozen = sum(isinstance(m, tv.ops.FrozenBatchNorm2d) for m in model.modules())
    by_name = unfreeze_modules(copy.deepcopy(model), ["layer1"])
    assert all(isinstance(m, UnfrozenBatchNorm2d) for n, m in by_name.named_modules() if n.startswith("layer1")
               and "bn" in n.split(".")[-1])
    assert isinstance(by_name.bn1, tv.ops.FrozenBatchNorm2d)  # outside the named module: untouched
    whole = unfreeze_batchnorm(copy.deepcopy(model))
    assert sum(isinstance(m, UnfrozenBatchNorm2d) for m in whole.modules()) == n_frozen
    assert all(isinstance(m, nn.BatchNorm2d) and m.weight.requires_grad for m in whole.modules()
               if isinstance(m, UnfrozenBatchNorm2d))
    with torch.no_grad():
        assert torch.equal(whole.eval()(x), before)             # bit for bit
        assert torch.equal(by_name.eval()(x), before)
    plain = nn.BatchNorm2d(64).eval()
    plain.load_state_dict({k: v for k, v in whole.bn1.state_dict().items()})
    y = torch.randn(2, 64, 8, 8) * 4
    assert not torch.equal(plain(y), whole.bn1(y))  # why not a plain BatchNorm2d: its eval kernel rounds otherwise
    mean0 = whole.bn1.running_mean.clone()
    whole.train()(x)
    assert not torch.equal(whole.bn1.running_mean, mean0)      # unfrozen for real
    refrozen = freeze_batchnorm(unfreeze_batchnorm(copy.deepcopy(model)))
    assert isinstance(refrozen.bn1, tv.ops.FrozenBatchNorm2d)  # back to torchvision's class
    with torch.no_grad():
        assert torch.equal(refrozen.eval()(x), before)


@pytest.mark.parametrize("requires_grad", [False, True])
def test_detectron2_style_frozen_batchnorm_is_recognized_by_duck_typing_and_unfrozen_bit_exactly(requires_grad):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), _D2FrozenBatchNorm2d(4), nn.ReLU())
    assert norms.is_frozen_batchnorm(model[1]) and layer_kind(model[1]) == "frozen_batchnorm"
    assert ("reset_stats_pinned", "1") in _codes(lint_model(model, warn=False))  # variance 1 - eps is reset too
    _random_stats(model)
    x = torch.randn(2, 3, 8, 8, requires_grad=requires_grad)
    before = model(x)
    unfreeze_batchnorm(model)
    assert isinstance(model[1], UnfrozenBatchNorm2d) and model[1].frozen_class is _D2FrozenBatchNorm2d
    assert torch.equal(model.eval()(x), before)
    with torch.no_grad():
        model[1].running_var.fill_(float("nan"))
    freeze_batchnorm(model)
    assert type(model[1]) is _D2FrozenBatchNorm2d
    assert ("nonfinite_stats", "1") in _codes(lint_model(model, warn=False))


def test_a_frozen_layer_this_package_cannot_rebuild_is_refused_before_anything_is_converted():
    model = nn.Sequential(nn.BatchNorm2d(3), _TimmFrozenBatchNormAct2d(3))
    freeze_batchnorm(model)
    assert isinstance(model[0], FrozenBatchNorm)
    with pytest.raises(ValueError, match=r"FrozenBatchNormAct2d '1' .* convert it with its own library"):
        unfreeze_batchnorm(model)
    with pytest.raises(ValueError, match=r"FrozenBatchNormAct2d '1'"):
        unfreeze_modules(model, whole_model=True)
    assert isinstance(model[0], FrozenBatchNorm)  # nothing converted


def test_the_audit_watches_other_libraries_frozen_layers_as_frozen():
    tv = import_torchvision()
    model = nn.Sequential(nn.Conv2d(3, 4, 3), tv.ops.FrozenBatchNorm2d(4), nn.Flatten(), nn.LazyLinear(2))
    model(torch.randn(2, 3, 6, 6))
    assert ("reset_stats_pinned", "1") in _codes(lint_model(model, warn=False))
    _random_stats(model)
    with FreezeAudit(model, warn=False) as a:
        model.train()(torch.randn(2, 3, 6, 6))
    row = a.modes().set_index("module").loc["1"]
    assert (row["kind"], row["stats"], row["updated_running_stats"]) == ("frozen_batchnorm", "running", False)
    a.assert_frozen("1")


# --- Kind 5: freezes that look complete and are not ------------------------------------------------------------------

def test_a_non_affine_batchnorm_left_in_train_mode_in_a_frozen_backbone_is_linted():
    model = nn.Sequential()
    model.backbone = nn.Sequential(nn.Conv1d(3, 3, 1), nn.BatchNorm1d(3, affine=False))
    model.head = nn.Sequential(nn.Flatten(), nn.Linear(15, 8), nn.BatchNorm1d(8, affine=False))
    model.backbone.requires_grad_(False)
    lints = lint_model(model, warn=False)
    (lint,) = [x for x in lints if x.code == "frozen_bn_in_train_mode"]
    assert lint.layer == "backbone.1" and "no affine parameters" in lint.message and "'backbone'" in lint.message
    with FreezeAudit(model, warn=False) as a:
        model.train()(torch.randn(4, 3, 5))
    assert set(a.moved("backbone")["name"]) == {"running_mean", "running_var", "num_batches_tracked"}
    pin_norm_eval(model.backbone)
    assert "frozen_bn_in_train_mode" not in {x.code for x in lint_model(model, warn=False)}


class _StayEvalBatchNorm1d(nn.BatchNorm1d):
    """A BatchNorm pinned by its class: train() ignores its argument (mqbench's FrozenBatchNorm2d habit)."""

    def train(self, mode=True):
        return super().train(False)


class _NormEvalBackbone(nn.Module):
    """mmdetection's norm_eval: the parent's train() puts its BatchNorm layers back in eval."""

    def __init__(self):
        super().__init__()
        self.fc, self.bn = nn.Linear(4, 8), nn.BatchNorm1d(8)

    def forward(self, x):
        return self.bn(self.fc(x))

    def train(self, mode=True):
        super().train(mode)
        for m in self.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.eval()
        return self


def _pin_kind(kind):
    """(model, name of its pinned norm layer, whether torch's SyncBatchNorm conversion loses the pin)."""
    torch.manual_seed(0)
    if kind == "class_override":
        model = nn.Sequential(nn.Linear(4, 8), _StayEvalBatchNorm1d(8))
        return model, "1", True
    if kind == "parent_override":
        return nn.Sequential(_NormEvalBackbone()), "0.bn", False
    if kind == "instancenorm":
        model = nn.Sequential(nn.Conv1d(4, 4, 1), nn.InstanceNorm1d(4, track_running_stats=True))
        freeze_modules(model, ["1"])
        return model, "1", False
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Dropout(0.1))
    if kind == "pin_eval_layer":
        pin_eval(model[1])
    elif kind == "pin_eval_block":  # the pinned parent survives torch's conversion and keeps its new child in eval
        pin_eval(model)
        return model, "1", False
    elif kind == "pin_norm_eval":
        pin_norm_eval(model)
    elif kind == "frozen_batchnorm":
        freeze_batchnorm(model)
        return model, "1", False
    return model, "1", True


PIN_KINDS = ["pin_eval_layer", "pin_eval_block", "pin_norm_eval", "class_override", "parent_override",
             "instancenorm", "frozen_batchnorm"]


@pytest.mark.parametrize("kind", PIN_KINDS)
def test_every_pin_kind_survives_convert_sync_batchnorm_and_torchs_conversion_is_reported_at_the_next_call(kind):
    model, name, torch_loses = _pin_kind(kind)
    x = torch.randn(16, 4) if kind != "instancenorm" else torch.randn(4, 4, 5)
    kept = convert_sync_batchnorm(copy.deepcopy(model))
    if kind != "frozen_batchnorm":  # a FrozenBatchNorm follows train() and computes the same in both modes
        assert name in eval_after_train(model) and name in eval_after_train(kept), kind
    with FreezeAudit(kept, warn=False) as a:
        kept.train()(x)
    assert a.report().query("kind == 'buffer'")["changed"].sum() == 0, kind
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with FreezeAudit(model) as b:
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
            model.train()(x)
            at_call = [str(w.message) for w in seen if "[pin_lost]" in str(w.message)]
    assert bool(at_call) == torch_loses, kind      # warned at the model call, before the block ended
    assert (("pin_lost", name) in _codes(b.lints)) == torch_loses, kind
    if torch_loses:
        assert "seen at model call 1" in at_call[0]
        row = b.modes().set_index("module").loc[name]
        assert row["replaced"].endswith("-> SyncBatchNorm") and row["writes"] == 1


def test_a_statistics_reset_by_update_bn_is_linted_when_it_happens():
    model = _net()
    with torch.no_grad():
        model.backbone[1].weight.mul_(1.5)
    pin_eval(model.backbone[1])
    loader = [_x(seed=i) for i in range(3)]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with FreezeAudit(model) as a:
            torch.optim.swa_utils.update_bn(loader, model)
            during = [str(w.message) for w in seen if "[reset_stats_pinned]" in str(w.message)]
            model(_x())  # a later call: no second warning
    assert len(during) == 1 and "reset during the block (seen at model call 1)" in during[0]
    assert ("reset_stats_pinned", "backbone.1") in _codes(a.lints, "warning")
    update_bn_stats(model, loader, modules=model)
    assert "reset_stats_pinned" not in {x.code for x in lint_model(model, warn=False)}


def test_an_unpinned_layer_is_linted_at_the_next_model_call():
    model = _net()
    pin_eval(model.backbone[1])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with FreezeAudit(model):
            freeze.unpin(model.backbone[1])
            model.train()(_x())
            during = [str(w.message) for w in seen if "[pin_lost]" in str(w.message)]
    assert len(during) == 1 and "unpinned during the block (seen at model call 1)" in during[0]


# --- no audit breaks the user's step ---------------------------------------------------------------------------------

def test_an_error_inside_the_audit_hooks_is_recorded_and_the_step_runs_on(monkeypatch):
    model = _net()
    import bnstudy.audit.live as live
    monkeypatch.setattr(live, "_in_backward", lambda: 1 / 0)
    with pytest.warns(RuntimeWarning, match="its hook failed"):
        with FreezeAudit(model, warn=False) as a:
            out = model(_x())
    assert out.shape == (16, 2) and a.hook_errors and a.hook_errors[0].startswith("ZeroDivisionError")


@pytest.mark.parametrize("steps, verb", [(1, "1 layer call was read"), (3, "3 layer calls were read")])
def test_the_summary_counts_hidden_calls_in_grammatical_english(steps, verb):
    """A fresh user's report: one call through a scripted model read '1 layer call were read'."""
    _, scripted = _pinned_scripted()
    opt = torch.optim.SGD(scripted.head.parameters(), lr=0.1)
    with FreezeAudit(scripted, warn=False) as a:
        for i in range(steps):
            scripted.train()
            _step(scripted, opt, _x(seed=i))
    text = " ".join(a.summary().split())
    assert f"{verb} at the boundary" in text
