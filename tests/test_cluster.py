"""The README's cluster recipes (issue 9): dask and ray sweeps give rows equal to a local run."""

import pandas as pd
import pytest

from bnstudy.study import engine
from bnstudy.study.config import Execution, RunConfig
from bnstudy.study.modes import MODE_NAMES

SMALL = dict(widths=(4, 8), stage1_steps=20, steps=15, n_eval=40, batch_size=16, stage1_batch_size=16,
             epoch_steps=10, train_size=64)
CFGS = [RunConfig(**SMALL, seed=s, mode=m) for s in (0, 1) for m in MODE_NAMES[:2]]


def _rows(tmp_path, name, **ex) -> pd.DataFrame:
    df = engine.transfer_sweep(CFGS, "cluster_test", Execution(cache_dir=str(tmp_path / name), progress=False, **ex))
    return df.drop(columns=["wall_s"])


def _assert_equal(a: pd.DataFrame, b: pd.DataFrame):
    assert list(a.columns) == list(b.columns)
    for col in a.columns:
        assert a[col].tolist() == b[col].tolist(), col


@pytest.mark.parametrize("processes,threads_per_worker", [(True, 1), (False, 2)], ids=["processes", "threads"])
def test_dask_local_cluster_rows_equal_a_local_run(tmp_path, processes, threads_per_worker):
    """Process workers, and (issue 32) thread workers, two threads each: runs in threads of one process execute one
    at a time (torch's state is process-wide), so rows are == a local run either way."""
    distributed = pytest.importorskip("distributed", reason='dask is an optional extra: pip install -e ".[dask]"')
    local = _rows(tmp_path, "local", backend="sequential")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=threads_per_worker, processes=processes,
                                  dashboard_address=None) as cl, distributed.Client(cl):
        remote = _rows(tmp_path, "dask", backend="dask", n_jobs=2 * threads_per_worker)
    _assert_equal(local, remote)


def test_ray_rows_equal_a_local_run(tmp_path):
    ray = pytest.importorskip("ray", reason='ray is an optional extra: pip install -e ".[ray]"')
    local = _rows(tmp_path, "local", backend="sequential")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        remote = _rows(tmp_path, "ray", backend="ray", n_jobs=2)
    finally:
        ray.shutdown()
    _assert_equal(local, remote)
