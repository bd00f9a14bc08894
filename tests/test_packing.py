"""Packed runs (several seeds in one grouped network) equal unpacked runs of the same seeds."""

import pytest
import torch

from bnstudy import train
from bnstudy.models import ConvBackbone, make_head, pack_states, unpack_state

SMALL = dict(widths=(4, 8), stage1_steps=25, steps=30, n_eval=50, batch_size=16, stage1_batch_size=16)


def test_packed_backbone_replicas_are_independent():
    singles = []
    for s in range(3):
        torch.manual_seed(s)
        singles.append(ConvBackbone(3, (4, 8)))
    packed = ConvBackbone(3, (4, 8), replicas=3)
    packed.load_state_dict(pack_states([m.state_dict() for m in singles]))
    xs = [torch.randn(5, 3, 16, 16) for _ in range(3)]
    out = packed(torch.cat(xs, 1)).reshape(5, 3, 8)
    for r, (m, x) in enumerate(zip(singles, xs)):
        torch.testing.assert_close(out[:, r], m(x), rtol=1e-5, atol=1e-5)
    # BN statistics of each replica come from its own data only
    for r, m in enumerate(singles):
        torch.testing.assert_close(packed.blocks[0].norm.running_mean[r * 4:(r + 1) * 4], m.blocks[0].norm.running_mean)


def test_pack_unpack_round_trip_is_exact():
    heads = [make_head("mlp_bn", 8, 10) for _ in range(2)]
    states = [h.state_dict() for h in heads]
    back = unpack_state(pack_states(states), 2)
    for a, b in zip(states, back):
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_packed_and_unpacked_stage1_give_the_same_backbones():
    # Grouped and plain convolutions sum in different orders, so the two agree to float rounding
    # (~1e-7) per step; Adam then amplifies rounding chaotically over tens of steps, so we compare
    # after a few steps, where any real coupling between replicas would show at full size.
    cfgs = [dict(SMALL, seed=s, stage1_steps=5) for s in (0, 1, 2)]
    packed = train.train_source(cfgs)
    for c, p in zip(cfgs, packed):
        [s] = train.train_source([c])
        assert s["task_a_accuracy"] == p["task_a_accuracy"]
        for k in s["backbone"]:
            torch.testing.assert_close(s["backbone"][k], p["backbone"][k], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["train_mode", "backbone_eval", "all_eval", "separate_stats"])
def test_packed_and_unpacked_stage2_give_the_same_results(mode):
    cfgs = [dict(SMALL, seed=s, mode=mode) for s in (0, 1, 2)]
    sources = train.train_source(cfgs)
    packed = train.transfer(cfgs, sources)
    for c, src, p in zip(cfgs, sources, packed):
        [s] = train.transfer([c], [src])
        for k in ("task_a_before", "task_a_after", "task_b"):
            assert s[k] == p[k], k
        for k in ("max_param_change", "max_buffer_change", "max_old_logit_change"):
            assert s[k] == pytest.approx(p[k], rel=1e-5, abs=1e-6), k
        assert s["old_logit_change_q"] == pytest.approx(p["old_logit_change_q"], rel=1e-4, abs=1e-5)


def test_modes_in_lockstep_equal_modes_run_alone_exactly():
    """Lockstep shares the task-B batches between modes; it must not change a single number."""
    from bnstudy.freeze import MODE_NAMES
    cfgs = [dict(SMALL, seed=4, mode=m, brightness=1.0, contrast=2.0) for m in MODE_NAMES]
    [src] = train.train_source([cfgs[0]])
    together = train.transfer(cfgs, [src] * len(cfgs))
    for c, t in zip(cfgs, together):
        [alone] = train.transfer([c], [src])
        assert t["mode"] == c["mode"]
        for k in ("task_a_before", "task_a_after", "task_b", "max_param_change", "max_buffer_change",
                  "max_old_logit_change", "old_logit_change_q", "drift_weight_l0", "drift_mean_l1"):
            assert t[k] == alone[k], (c["mode"], k)


def test_transfer_packs_keep_every_mode_of_a_stream_together():
    from bnstudy.experiments.common import transfer_packs
    cfgs = [train.complete_config(dict(seed=s, mode=m, brightness=b))
            for b in (0.0, 1.0) for s in (0, 1, 2) for m in ("train_mode", "all_eval")]
    packs = transfer_packs(cfgs, 1)
    assert len(packs) == 6 and all(len(p) == 2 for p in packs)
    for p in packs:
        assert len({(cfgs[i]["seed"], cfgs[i]["brightness"]) for i in p}) == 1
    assert sorted(i for p in transfer_packs(cfgs, 4) for i in p) == list(range(len(cfgs)))
    with pytest.raises(ValueError, match="pack_size"):
        transfer_packs(cfgs, 0)
