"""Typed schemas of the entry points' configs, registered in Hydra's ConfigStore.

Each ``conf/<entry>.yaml`` lists its schema first in its defaults (``- <entry>_schema``), the
Hydra-docs "structured config as schema" pattern: OmegaConf then refuses, at compose time,
a value of the wrong type (``batch_size=abc``: key, value and expected type in the message)
and any key the schema does not declare. Config groups (``workload``, ``trainer``,
``scheduler``...) are typed ``Any``: their own constructors check their options.

Ranges (``batch_size >= 1``, ``limit`` positive or null, known granularities...) are checked
by :func:`validate`, which each entry point calls first: it builds the dataclass from the
composed config, so ``__post_init__`` runs, and raises :class:`~edbatch.errors.ConfigError`
naming the key, the value and the fix.

Importing :mod:`experiments` registers the schemas (the entry points do; a test composing
the configs with Hydra's compose API must ``import experiments`` first).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from edbatch.errors import ConfigError, did_you_mean
from experiments._group_rules import check_groups

__all__ = ["SCHEMAS", "AutoConfig", "CalibrateConfig", "CompareConfig", "EvaluateConfig",
           "TrainConfig", "TrainModelConfig", "is_seed", "validate"]


def _at_least(cfg: Any, key: str, low: float, *, nullable: bool = False,
              null_means: str = "") -> None:
    value = getattr(cfg, key)
    if value is None and nullable:
        return
    if value is None or not value >= low:  # (NaN too: every comparison with it is False)
        fix = f"pass {key}=N with N >= {low:g}"
        if nullable:
            fix += f", or {key}=null ({null_means})"
        raise ConfigError(key, value, f"a number >= {low:g}" + (" or null" if nullable else ""),
                          fix)


def is_seed(value: Any) -> bool:
    """Whether ``value`` is a seed numpy's legacy ``RandomState`` takes: an int in [0, 2**32)
    (the rule of the configs and the training CLIs; ``benchmarks/_args.seed`` states the same
    bound without importing experiments, which would add Hydra to every benchmark's start)."""
    return type(value) is int and 0 <= value < 2**32


def _seeds(key: str, value: Any) -> None:
    for v in value if isinstance(value, list) else [value]:
        if not is_seed(v):
            raise ConfigError(key, value, "an int in [0, 2**32)", f"pass e.g. {key}="
                              + ("[0,1,2]" if isinstance(value, list) else "0"))


def _one_of(cfg: Any, key: str, choices: tuple[str, ...]) -> None:
    value = getattr(cfg, key)
    values = value if isinstance(value, list) else [value]
    for v in values:
        if v not in choices:
            raise ConfigError(key, value, f"one of {list(choices)}",
                              f"pass e.g. {key}={choices[0]}")


def _device(cfg: Any) -> None:
    """``device``: one this machine has (``cuda:7`` on a CPU machine failed deep in the
    run with torch's ``AssertionError``); torch is imported only for a non-CPU value."""
    if cfg.device != "cpu":
        from edbatch.errors import DeviceError
        from edbatch.executor.device import check_device

        try:
            check_device(cfg.device)
        except DeviceError as e:
            raise ConfigError("device", cfg.device, "cpu, cuda or cuda:N of a GPU here",
                              f"pass device=cpu ({e})") from None


def _not_a_folder(cfg: Any, key: str, example: str) -> None:
    """A path ``key`` the run writes at its end: refused up front if it is a folder (the
    results would be lost when the write fails)."""
    value = getattr(cfg, key)
    if value and not str(value).startswith("${") and os.path.isdir(value):
        raise ConfigError(key, value, "a file to write, not a folder",
                          f"pass e.g. {key}={str(value).rstrip('/')}/{example}")


@dataclass
class TrainConfig:
    """``experiments.train``: train one batching policy (see conf/train.yaml)."""

    workload: Any = None
    trainer: Any = None
    env: Any = None
    policy: Any = None
    logger: Any = None
    seed: int = 0
    batch_size: int = 64
    train_split: str = "train"
    val_split: str | None = None         # None: the workload's default_val_split
    num_train_graphs: int | None = 4
    num_val_graphs: int | None = 2
    eval_split: str | None = "test"      # unseen mini-batches of the final report
    num_eval_graphs: int | None = 8      # 0: no report on unseen mini-batches
    shuffle: bool = True
    progress: bool = True
    resume: str = "auto"
    run_dir: str = "runs"
    artifact: str = "policy.json"
    checkpoint: str = "checkpoint.json"
    learning_curve: str = "learning_curve.png"

    def __post_init__(self) -> None:
        _seeds("seed", self.seed)
        _at_least(self, "batch_size", 1)
        _at_least(self, "num_train_graphs", 1, nullable=True, null_means="the whole split")
        _at_least(self, "num_val_graphs", 1, nullable=True, null_means="the whole split")
        _one_of(self, "resume", ("auto", "restart"))
        for key, example in (("artifact", "policy.json"), ("checkpoint", "checkpoint.json"),
                             ("learning_curve", "learning_curve.png")):
            _not_a_folder(self, key, example)


@dataclass
class EvaluateConfig:
    """``experiments.evaluate``: compare schedulers (see conf/evaluate.yaml)."""

    workload: Any = None
    scheduler: Any = None
    granularities: list[str] = field(default_factory=lambda: ["cell", "primitive"])
    split: str | None = None
    batch_size: int = 64
    limit: int | None = 4
    seed: int = 0
    progress: bool = True
    output_dir: str = "."
    results_file: str = "results.jsonl"
    summary_file: str = "summary.csv"
    cost_model: str | None = None   # null | calibrate | path of a calibrated cost model
    measure_reps: int = 0           # executor runs per schedule for measured_ms (0: none)
    device: str = "cpu"

    def __post_init__(self) -> None:
        _seeds("seed", self.seed)
        _at_least(self, "batch_size", 1)
        _at_least(self, "limit", 1, nullable=True, null_means="the whole split")
        _at_least(self, "measure_reps", 0)
        _one_of(self, "granularities", ("cell", "primitive"))
        _device(self)
        _not_a_folder(self, "results_file", "results.jsonl")
        _not_a_folder(self, "summary_file", "summary.csv")


@dataclass
class CalibrateConfig:
    """``experiments.calibrate``: time the kernels, fit a cost model (conf/calibrate.yaml)."""

    workload: Any = None
    granularity: str = "primitive"
    batch_sizes: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128, 256])
    reps: int = 5
    backward: bool = False
    device: str = "cpu"
    dtype: str = "float32"
    num_threads: int = 1
    sample_split: str = "train"
    sample_batch_size: int = 16
    launch_reps: int = 3
    stat: str = "median"
    seed: int = 0
    run_dir: str = "runs"
    output: str = "cost_model.json"

    def __post_init__(self) -> None:
        _seeds("seed", self.seed)
        for key in ("reps", "num_threads", "sample_batch_size", "launch_reps"):
            _at_least(self, key, 1)
        _one_of(self, "granularity", ("cell", "primitive"))
        _one_of(self, "stat", ("median", "min"))
        _device(self)
        _not_a_folder(self, "output", "cost_model.json")  # (was IsADirectoryError at the end)
        sizes = list(self.batch_sizes)
        if not sizes or any(not isinstance(n, int) or n < 1 for n in sizes) or \
                sizes != sorted(set(sizes)):
            raise ConfigError("batch_sizes", sizes, "a non-empty increasing list of ints >= 1",
                              "pass e.g. batch_sizes=[1,4,16,64]")


@dataclass
class CompareConfig:
    """``experiments.compare``: the main job (see conf/compare.yaml)."""

    workload: Any = None
    trainers: Any = None
    env: Any = None
    policy: Any = None
    scheduler: Any = None
    seeds: list[int] = field(default_factory=lambda: [0])
    batch_size: int = 64
    train_split: str = "train"
    num_train_graphs: int = 4
    one_graph_trainers: list[str] = field(default_factory=lambda: ["ed_batch"])
    val_from_train: int = 2
    eval_split: str | None = None
    eval_limit: int | None = 4
    n_jobs: int = 1
    seed: int = 0
    output_dir: str = "."
    results_file: str = "results.jsonl"
    summary_file: str = "summary.csv"
    plot_file: str = "batches.png"

    def __post_init__(self) -> None:
        if not self.seeds:
            raise ConfigError("seeds", self.seeds, "a non-empty list of ints",
                              "pass e.g. seeds=[0,1,2]")
        _seeds("seeds", list(self.seeds))
        _at_least(self, "batch_size", 1)
        _at_least(self, "num_train_graphs", 1)
        _at_least(self, "val_from_train", 1)
        _at_least(self, "eval_limit", 1, nullable=True, null_means="the whole split")
        if self.n_jobs == 0 or self.n_jobs < -1:
            raise ConfigError("n_jobs", self.n_jobs, "a number >= 1, or -1 (every core)",
                              "pass n_jobs=2 (both cores), n_jobs=1 (one process) or -1")
        for key, example in (("results_file", "results.jsonl"), ("summary_file",
                                                                 "summary.csv"),
                             ("plot_file", "batches.png")):
            _not_a_folder(self, key, example)


@dataclass
class AutoConfig:
    """``batching=auto``: the candidates timed on the first mini-batches, and how often."""

    schedulers: list[str] = field(default_factory=lambda: [
        "critical_path", "typewise_greedy", "depth", "dynet_agenda"])
    strategies: list[str] = field(default_factory=lambda: ["aligned", "naive"])
    trials: int = 3


@dataclass
class TrainModelConfig:
    """``experiments.train_model``: train the tree sentiment model (conf/train_model.yaml)."""

    workload: Any = None
    logger: Any = None
    seed: int = 0
    batching: str = "auto"
    fsm: str | None = None
    fsm_lookahead: str = "none"
    strategy: str = "aligned"
    auto: AutoConfig = field(default_factory=AutoConfig)
    device: str = "cpu"
    cuda_graphs: bool = True
    num_threads: int = 1
    batch_size: int = 64
    lr: float = 0.002
    weight_decay: float = 0.0
    adam: str = "fused"
    gc_freeze: bool = True
    epochs: int = 2
    max_steps: int | None = None
    time_budget_s: float | None = 150.0
    train_split: str = "train"
    train_limit: int | None = None
    eval_split: str = "dev"
    eval_limit: int | None = None
    eval_batch_size: int = 256
    log_every: int = 10
    eval_every: int | None = 34
    run_dir: str = "runs"
    summary: str = "summary.json"
    plot: str = "curves.png"
    model_path: str | None = None      # the data-parallel helper's keys
    dist_backend: str | None = None
    resume: str = "auto"

    def __post_init__(self) -> None:
        _seeds("seed", self.seed)
        for key in ("num_threads", "batch_size", "eval_batch_size", "log_every"):
            _at_least(self, key, 1)
        _at_least(self, "epochs", 0)
        _at_least(self, "weight_decay", 0)
        if not self.lr > 0:  # (NaN too)
            raise ConfigError("lr", self.lr, "a number > 0", "pass e.g. lr=0.002")
        for key in ("max_steps", "train_limit", "eval_limit", "eval_every"):
            _at_least(self, key, 1, nullable=True, null_means="no limit")
        if self.time_budget_s is not None and not self.time_budget_s > 0:
            raise ConfigError("time_budget_s", self.time_budget_s, "a number > 0 or null",
                              "pass e.g. time_budget_s=150, or time_budget_s=null (no limit)")
        _one_of(self, "strategy", ("planned", "aligned", "naive"))
        _one_of(self, "resume", ("auto", "restart"))
        _one_of(self, "fsm_lookahead", ("none", "artifact"))
        _one_of(self, "adam", ("fused", "foreach", "for_loop"))
        for key, example in (("model_path", "model.pt"), ("summary", "summary.json"),
                             ("plot", "curves.png")):  # (was: the run folder refused)
            _not_a_folder(self, key, example)
        if self.batching == "fsm" and not self.fsm:
            raise ConfigError("fsm", self.fsm, "the path of a trained FSM artifact with "
                              "batching=fsm", "pass fsm=runs/<workload>/<trainer>/seed<N>/"
                              "policy.json, or another batching (auto, typewise_greedy, ...)")
        auto = self.auto if isinstance(self.auto, dict) else vars(self.auto)
        if auto.get("trials", 1) < 1:
            raise ConfigError("auto.trials", auto["trials"], "an int >= 1",
                              "pass e.g. auto.trials=3")
        for key in ("schedulers", "strategies"):
            if not auto.get(key, [None]):
                raise ConfigError(f"auto.{key}", auto[key], "a non-empty list",
                                  f"pass e.g. auto.{key}=[aligned]" if key == "strategies"
                                  else f"pass e.g. auto.{key}=[typewise_greedy,depth]")
        bad = [s for s in auto.get("strategies", []) if s not in ("planned", "aligned", "naive")]
        if bad:
            raise ConfigError("auto.strategies", auto["strategies"],
                              "a list of planned, aligned, naive",
                              "pass e.g. auto.strategies=[aligned,naive]")


#: ConfigStore name -> schema; ``conf/<entry>.yaml`` lists ``<entry>_schema`` first.
SCHEMAS: dict[str, type] = {"train_schema": TrainConfig, "evaluate_schema": EvaluateConfig,
                            "compare_schema": CompareConfig,
                            "train_model_schema": TrainModelConfig,
                            "calibrate_schema": CalibrateConfig}

_store = ConfigStore.instance()
for _name, _node in SCHEMAS.items():
    _store.store(name=_name, node=_node)


def validate(cfg: DictConfig) -> Any:
    """Range-check a composed config through its schema's ``__post_init__``.

    Returns the typed dataclass instance (the entry points keep using ``cfg``). Interpolated
    values (paths, ``seed: ${seeds.0}``) are not checked. Raises ConfigError.
    """
    schema = OmegaConf.get_type(cfg)
    if schema not in SCHEMAS.values():
        raise ConfigError("<config>", schema, f"one of {[s.__name__ for s in SCHEMAS.values()]}",
                          "list the entry's schema first in its defaults")
    known = {f.name for f in fields(schema)}
    for key in cfg:  # a key added with "+" bypasses the schema's struct check
        if key not in known and key != "hydra":
            value = "{...}" if OmegaConf.is_config(cfg[key]) else cfg[key]
            raise ConfigError(str(key), value, f"a key of {schema.__name__}",
                              f"drop '+{key}=...' (it would be ignored)."
                              + did_you_mean(str(key), known))
    names = [f.name for f in fields(schema) if f.type != "Any"]  # groups check themselves
    values = {k: OmegaConf.to_container(cfg[k], resolve=True) if OmegaConf.is_config(cfg[k])
              else cfg[k] for k in names
              if k in cfg and not OmegaConf.is_interpolation(cfg, k)}  # paths keep defaults
    typed = schema(**values)
    check_groups(cfg)
    return typed
