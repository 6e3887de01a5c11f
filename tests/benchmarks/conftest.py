"""Fixtures shared by the benchmark tests."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import pytest


@pytest.fixture(scope="module")
def dy() -> Any:
    """DyNet, imported once with autobatch 1 unless something imported it before."""
    config = pytest.importorskip("dynet_config")
    if "dynet" not in sys.modules:
        config.set(autobatch=1, mem="256", random_seed=1)
    return pytest.importorskip("dynet")


@pytest.fixture(scope="module")
def dy_autobatch(dy: Any) -> int:
    """The autobatch mode DyNet runs with in this process: fixed at its first import (by
    ``dy``, or by whatever test imported it before), so a test that hands a mode to code
    calling ``init_dynet`` must pass this one, whatever ran first."""
    import dynet_config

    conf = dynet_config.get()
    return int(conf["autobatch"]) if conf else 0


def assert_dynet_grads(peer: dict[str, Any], want: dict[str, Any], label: str) -> None:
    """Every DyNet parameter's gradient after ``loss.backward()`` equals ``want[name]``
    (a torch tensor of the reference's gradient) in shape and value."""
    for key, param in peer.items():
        got = param.grad_as_array()
        assert got.shape == tuple(want[key].shape), key
        np.testing.assert_allclose(got, want[key].numpy(), rtol=2e-3, atol=2e-5,
                                   err_msg=f"{label}DyNet gradient of {key}")
