
import pytest
import torch

# One thread per test process: the tests check exact equalities, and small nets gain nothing from more.
torch.set_num_threads(1)


@pytest.fixture
def cache_dir(tmp_path):
    return tmp_path / "cache"
