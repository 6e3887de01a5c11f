"""Fixtures shared by the benchmark tests."""

from __future__ import annotations

import sys
from typing import Any

import pytest


@pytest.fixture(scope="module")
def dy() -> Any:
    """DyNet, imported once with autobatch 1 unless something imported it before."""
    config = pytest.importorskip("dynet_config")
    if "dynet" not in sys.modules:
        config.set(autobatch=1, mem="256", random_seed=1)
    return pytest.importorskip("dynet")
