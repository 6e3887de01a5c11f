"""Every config option composes and instantiates; bad keys fail clearly."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from hydra.utils import instantiate

import experiments  # noqa: F401 - registers the config schemas
from edbatch.schedule import Schedule
from edbatch.workloads import Workload
from edbatch.workloads.synthetic import random_binary_trees

CONF = str(Path(__file__).resolve().parents[2] / "conf")
WORKLOADS = sorted(p.stem for p in (Path(CONF) / "workload").glob("*.yaml"))
SCHEDULERS = sorted(p.stem for p in (Path(CONF) / "scheduler").glob("*.yaml"))


def _compose(overrides: list[str]):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose(config_name="evaluate", overrides=overrides)


@pytest.mark.parametrize("name", WORKLOADS)
def test_every_workload_config_instantiates(name: str) -> None:
    cfg = _compose([f"workload=[{name}]"])
    node = dict(cfg.workload[name])
    node.pop("eval", None)
    wl = instantiate(node)
    assert isinstance(wl, Workload) and wl.name == name


@pytest.mark.parametrize("name", SCHEDULERS)
def test_every_scheduler_config_instantiates_and_schedules(name: str, tmp_path: Path) -> None:
    import numpy as np

    from policies import FSMPolicy

    graph = random_binary_trees(np.random.default_rng(0), 3, 5)
    overrides = [f"scheduler=[{name}]"]
    if name == "fsm":  # needs a trained artifact
        path = FSMPolicy({}, "base", graph.vocab.names).save(tmp_path / "p.json")
        overrides.append(f"scheduler.fsm.path={path}")
    cfg = _compose(overrides)
    scheduler = instantiate(cfg.scheduler[name])
    schedule = scheduler(graph)
    assert isinstance(schedule, Schedule) and schedule.scheduler == name
    schedule.validate(graph)


def test_unknown_key_and_unknown_option_fail() -> None:
    with pytest.raises(ConfigCompositionException, match="bacth_size"):
        _compose(["bacth_size=3"])
    with pytest.raises(ConfigCompositionException, match="tree_lstn"):
        _compose(["workload=[tree_lstn]"])
