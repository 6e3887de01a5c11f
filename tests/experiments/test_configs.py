"""Every config option composes and instantiates; bad keys fail clearly."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from hydra.utils import instantiate

import experiments  # noqa: F401 - registers the config schemas
from edbatch.schedule import Schedule
from edbatch.workloads import REAL_WORKLOADS, WORKLOADS, Workload
from edbatch.workloads.synthetic import random_binary_trees

CONF = str(Path(__file__).resolve().parents[2] / "conf")
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
    if name == "priority":  # a priority-policy artifact (any op types)
        from policies.priority import PriorityPolicy, critical_path_weights

        path = PriorityPolicy(critical_path_weights()).save(tmp_path / "w.json")
        overrides.append(f"scheduler.priority.path={path}")
    cfg = _compose(overrides)
    scheduler = instantiate(cfg.scheduler[name])
    schedule = scheduler(graph)
    assert isinstance(schedule, Schedule) and schedule.scheduler == name
    schedule.validate(graph)


def test_workload_configs_come_from_the_registry_and_the_constructors() -> None:
    import inspect

    assert not list((Path(CONF) / "workload").glob("*.yaml"))  # no yaml repeats a default
    cfg = _compose([])
    assert list(cfg.workload) == list(REAL_WORKLOADS)  # evaluate's default: every real one
    for name, cls in WORKLOADS.items():
        node = _compose([f"workload=[{name}]"]).workload[name]
        params = {k: p.default for k, p in inspect.signature(cls.__init__).parameters.items()
                  if p.default is not inspect.Parameter.empty}
        for key, value in node.items():
            if key == "_target_":
                assert value == f"{cls.__module__}.{cls.__qualname__}"
            elif key in cls.config_defaults:
                assert value == cls.config_defaults[key]
            else:
                assert value == params[key], (name, key)
        assert ("granularity" in node) == (len(cls.granularities) > 1)


def test_workload_keys_are_typed_and_closed() -> None:
    cfg = _compose(["workload=[tree_gru]", "workload.tree_gru.hidden_dim=64"])
    assert cfg.workload.tree_gru.hidden_dim == 64
    with pytest.raises(ConfigCompositionException) as err:
        _compose(["workload=[tree_gru]", "workload.tree_gru.hidden_dim=abc"])
    assert "hidden_dim" in str(err.value) and "abc" in f"{err.value} {err.value.__cause__}"
    with pytest.raises(ConfigCompositionException, match="hiden_dim"):
        _compose(["workload=[tree_gru]", "workload.tree_gru.hiden_dim=3"])
    # the synthetic generators' options stay open (the constructor takes **kwargs)
    cfg = _compose(["workload=[synthetic]", "++workload.synthetic.num_nodes=40"])
    assert cfg.workload.synthetic.num_nodes == 40


def test_a_workload_defined_outside_the_package_gets_a_config() -> None:
    from experiments._workload_schema import register_workload_configs

    class Toy(Workload):
        name = "toy_outside"
        real_data = True

        def __init__(self, width: int = 3, granularity: str = "cell") -> None:
            super().__init__(granularity)

        splits = ("train",)  # type: ignore[assignment]

        def _load(self, split):  # type: ignore[no-untyped-def]
            return []

        def emit(self, instance, builder):  # type: ignore[no-untyped-def]
            return []

        def param_shapes(self):  # type: ignore[no-untyped-def]
            return {}

    try:
        assert WORKLOADS["toy_outside"] is Toy
        register_workload_configs()
        cfg = _compose(["workload=[toy_outside]", "workload.toy_outside.width=5"])
        assert dict(cfg.workload.toy_outside) == {
            "_target_": f"{Toy.__module__}.{Toy.__qualname__}", "width": 5,
            "granularity": "cell"}
        assert "toy_outside" in _compose(["workload=[real_data]"]).workload
        with pytest.raises(Exception, match="taken by"):
            type("Other", (Toy,), {"name": "toy_outside"})
    finally:
        del WORKLOADS["toy_outside"]
        register_workload_configs()


def test_unknown_key_and_unknown_option_fail() -> None:
    with pytest.raises(ConfigCompositionException, match="bacth_size"):
        _compose(["bacth_size=3"])
    with pytest.raises(ConfigCompositionException, match="tree_lstn"):
        _compose(["workload=[tree_lstn]"])


@pytest.mark.parametrize("name", REAL_WORKLOADS)
def test_every_real_workload_declares_a_validation_split_it_has(name: str) -> None:
    """``experiments.train`` validates on ``default_val_split`` unless ``val_split`` is set
    (module_net has train/val/test, ggnn_molecules train/valid/test: no ``dev``)."""
    node = dict(_compose([f"workload=[{name}]"]).workload[name])
    node.pop("eval", None)
    workload = instantiate(node)
    assert workload.default_val_split in workload.splits
