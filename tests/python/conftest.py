"""Shared fixtures for the Python tests.

Random inputs are fresh on every run; the run's seed is printed in the header and any run can be
repeated with SFMOE_TEST_SEED=<seed>. Each test draws from its own generator, derived from the
run's seed and the test's name, so one test's draws do not depend on which others ran.
"""

import os
import zlib

import numpy as np
import pytest

try:
    import sfmoe  # noqa: F401
except ImportError as error:
    raise pytest.UsageError(
        f"cannot import sfmoe ({error}); build the extension (docs/python.md) and run with PYTHONPATH=<build>/python"
    ) from error

RUN_SEED = int(os.environ.get("SFMOE_TEST_SEED", int.from_bytes(os.urandom(4), "little")))


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: runs on a GPU device of its own choosing")


def pytest_report_header(config):
    return f"sfmoe test seed: {RUN_SEED} (repeat with SFMOE_TEST_SEED={RUN_SEED})"


@pytest.fixture
def rng(request):
    return np.random.default_rng([RUN_SEED, zlib.crc32(request.node.nodeid.encode())])
