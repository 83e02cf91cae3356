import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("GLOG_v", "3")  # keep MindSpore's C++ logging to errors


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: multi-minute end-to-end tests (run with -m slow)")
    config.addinivalue_line("markers", "msrun: launches several MindSpore workers with msrun")


@pytest.fixture
def rng():
    return np.random.RandomState(1234)
