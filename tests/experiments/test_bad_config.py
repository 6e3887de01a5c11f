"""Bad configs end in a short message and a non-zero exit, never a traceback (issue 16)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException

import experiments  # noqa: F401 - registers the schemas
from edbatch.errors import ConfigError, DeviceError
from edbatch.executor.device import check_device, check_dtype
from experiments._schema import validate

ROOT = Path(__file__).resolve().parents[2]
CONF = str(ROOT / "conf")


def _compose(name: str, overrides: list[str]):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose(config_name=name, overrides=overrides)


@pytest.mark.parametrize(("entry", "override", "words"), [
    ("train", "batch_size=abc", ["batch_size", "'abc'", "Integer"]),
    ("train", "seed=abc", ["seed", "'abc'", "Integer"]),
    ("train", "shuffle=maybe", ["shuffle", "'maybe'", "bool"]),
    ("evaluate", "limit=abc", ["limit", "'abc'", "Integer"]),
    ("compare", "seeds=[0,x]", ["seeds", "'x'", "Integer"]),
    ("train_model", "lr=fast", ["lr", "'fast'", "Float"]),
    ("train_model", "epochs=1.5", ["epochs", "1.5", "Integer"]),
    ("train_model", "gc_freeze=sometimes", ["gc_freeze", "'sometimes'", "bool"]),
    ("train", "bacth_size=3", ["bacth_size"]),
    ("compare", "eval_limt=3", ["eval_limt", "CompareConfig"]),
])
def test_wrong_type_or_unknown_key_fails_at_compose(entry: str, override: str,
                                                    words: list[str]) -> None:
    with pytest.raises(ConfigCompositionException) as err:
        _compose(entry, [override])
    text = f"{err.value} {err.value.__cause__}"
    for w in words:
        assert w in text, text


@pytest.mark.parametrize(("entry", "override", "key"), [
    ("train", "batch_size=0", "batch_size"),
    ("train", "num_train_graphs=-2", "num_train_graphs"),
    ("train", "num_val_graphs=0", "num_val_graphs"),
    ("train", "resume=maybe", "resume"),
    ("evaluate", "limit=-3", "limit"),
    ("evaluate", "granularities=[cell,atoms]", "granularities"),
    ("compare", "seeds=[]", "seeds"),
    ("compare", "seeds=[0,-1]", "seeds"),
    ("train", "seed=-1", "seed"),
    ("train", "seed=4294967296", "seed"),
    ("evaluate", "seed=-3", "seed"),
    ("calibrate", "seed=-1", "seed"),
    ("train_model", "seed=-1", "seed"),
    ("compare", "eval_limit=0", "eval_limit"),
    ("compare", "n_jobs=0", "n_jobs"),
    ("compare", "one_graph_trainers=[ed_batc]", "one_graph_trainers"),  # was ignored
    ("train_model", "lr=-1", "lr"),
    ("train_model", "time_budget_s=0", "time_budget_s"),
    ("train_model", "strategy=fast", "strategy"),
    ("train_model", "max_steps=-1", "max_steps"),
    # NaN passed every "value < low" check (torch's Adam then raised a raw ValueError)
    ("train_model", "lr=nan", "lr"),
    ("train_model", "weight_decay=nan", "weight_decay"),
    ("train_model", "time_budget_s=nan", "time_budget_s"),
    ("train", "trainer=q_learning trainer.alpha=abc", "trainer.alpha"),
    ("train", "trainer=q_learning trainer.max_episodes=-5", "trainer.max_episodes"),
    ("train", "trainer=q_learning trainer.eps_decay=1.5", "trainer.eps_decay"),
    ("train", "env.reward=bogus", "env.reward"),
    ("compare", "trainers.fsm.max_episodes=0", "trainers.fsm.max_episodes"),
    # a device this machine lacks failed deep in the run (torch's AssertionError); names of
    # the policy group the default trainer does not read, and the logger's mode, were ignored
    ("evaluate", "device=cuda:99", "device"),
    ("evaluate", "device=gpu", "device"),
    ("calibrate", "device=cuda:99", "device"),
    ("train", "policy.encoding=nope", "policy.encoding"),
    ("train", "policy.fallback=nope", "policy.fallback"),
    ("train", "trainer=dqn trainer.fallback=zzz", "trainer.fallback"),
    ("compare", "policy.encoding=hint", "policy.encoding"),
    ("train", "logger=wandb logger.mode=ofline", "logger.mode"),
    ("train_model", f"model_path={ROOT / 'conf'}", "model_path"),  # a folder
    ("calibrate", f"output={ROOT / 'conf'}", "output"),  # (IsADirectoryError after the run)
    ("evaluate", f"results_file={ROOT / 'conf'}", "results_file"),
    ("train", f"artifact={ROOT / 'conf'}", "artifact"),
    ("train_model", f"plot={ROOT / 'conf'}", "plot"),
])
def test_out_of_range_value_is_a_config_error_naming_key_and_value(entry: str, override: str,
                                                                   key: str) -> None:
    cfg = _compose(entry, override.split())  # q_learning's keys: trainer=q_learning first
    with pytest.raises(ConfigError, match=f"config key {key}=") as err:
        validate(cfg)
    assert err.value.key == key and "Fix:" in str(err.value)


@pytest.mark.parametrize("entry", ["train", "evaluate", "compare", "calibrate", "train_model"])
def test_a_key_added_with_plus_is_refused_not_ignored(entry: str) -> None:
    validate(_compose(entry, []))  # every entry's own keys pass
    with pytest.raises(ConfigError, match="config key bacth_size=3") as err:
        validate(_compose(entry, ["+bacth_size=3"]))  # Hydra appends it past the schema
    assert "Did you mean 'batch_size'" in str(err.value) or entry == "calibrate"


def test_sb3_trainer_budget_is_checked_and_env_choices_match_the_env() -> None:
    from envs.batching import REWARDS
    from experiments._group_rules import ENV_CHOICES

    with pytest.raises(ConfigError, match="trainer.total_timesteps=-5"):
        validate(_compose("train", ["trainer=maskable_ppo", "trainer.total_timesteps=-5"]))
    assert ENV_CHOICES["reward"] == REWARDS


@pytest.mark.parametrize("trainer", ["afterstate", "priority", "priority_dagger", "priority_fsm"])
@pytest.mark.parametrize("override", ["step_weight=abc", "iterations=abc", "population=1",
                                      "sigma=-1", "hidden_units=2.5"])
def test_priority_trainers_numbers_are_checked_before_the_trainer_is_built(
        trainer: str, override: str) -> None:
    key = override.split("=")[0]
    node = _compose("train", [f"trainer={trainer}"]).trainer
    if key not in node:  # not every priority trainer has every key
        pytest.skip(f"trainer={trainer} has no {key}")
    with pytest.raises(ConfigError, match=f"trainer.{key}="):
        validate(_compose("train", [f"trainer={trainer}", f"trainer.{override}"]))


def test_every_number_a_trainer_config_sets_has_a_rule() -> None:
    from pathlib import Path

    import yaml

    from experiments._group_rules import TRAINER_RULES, check_group

    for path in sorted((Path(__file__).parents[2] / "conf" / "trainer").glob("*.yaml")):
        node = yaml.safe_load(path.read_text())
        numbers = [k for k, v in node.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)]
        assert numbers
        assert [k for k in numbers if k not in TRAINER_RULES] == [], path.name
        check_group(path.stem, node, TRAINER_RULES)  # the defaults pass their own rules
    with pytest.raises(ConfigError, match="trainer.guard_check='x'"):
        validate(_compose("train", ["trainer=q_learning", "trainer.guard_check=x"]))


def test_every_switch_a_trainer_config_sets_must_be_true_or_false() -> None:
    """A switch given a non-bool (``trainer.far=abc``) was read as true by the trainer."""
    from pathlib import Path

    import yaml

    from experiments._group_rules import TRAINER_FLAGS

    for path in sorted((Path(__file__).parents[2] / "conf" / "trainer").glob("*.yaml")):
        node = yaml.safe_load(path.read_text())
        flags = [k for k, v in node.items() if isinstance(v, bool)]
        assert [k for k in flags if k not in TRAINER_FLAGS] == [], path.name
        for key in flags:
            with pytest.raises(ConfigError, match=f"trainer.{key}='abc'"):
                validate(_compose("train", [f"trainer={path.stem}", f"trainer.{key}=abc"]))
            with pytest.raises(ConfigError, match=f"trainer.{key}=2"):
                validate(_compose("train", [f"trainer={path.stem}", f"trainer.{key}=2"]))
            validate(_compose("train", [f"trainer={path.stem}", f"trainer.{key}=false"]))


def test_expert_teacher_is_checked_and_the_choices_match_the_trainer() -> None:
    from experiments._group_rules import TRAINER_CHOICES
    from policies.expert import TEACHERS

    with pytest.raises(ConfigError, match="trainer.teacher='oracle'"):
        validate(_compose("train", ["trainer=expert", "trainer.teacher=oracle"]))
    validate(_compose("train", ["trainer=expert", "trainer.teacher=search"]))
    assert TRAINER_CHOICES["teacher"] == TEACHERS


def test_afterstate_target_is_checked_and_the_choices_match_the_trainer() -> None:
    from experiments._group_rules import TRAINER_CHOICES
    from policies.afterstate_train import IMITATE_TARGETS

    with pytest.raises(ConfigError, match="trainer.imitate_target='oracle'"):
        validate(_compose("train", ["trainer=afterstate", "trainer.imitate_target=oracle"]))
    validate(_compose("train", ["trainer=afterstate", "trainer.imitate_target=choices"]))
    assert TRAINER_CHOICES["imitate_target"] == IMITATE_TARGETS


@pytest.mark.parametrize("entry", ["train", "evaluate", "compare", "train_model"])
def test_default_configs_validate(entry: str) -> None:
    validate(_compose(entry, []))
    validate(_compose(entry, ["limit=null"] if entry == "evaluate" else []))


@pytest.mark.parametrize("device", ["tpu", "cuda:x", "cpu:1", "gpu", "", 3, None])
def test_malformed_device_is_refused_naming_it(device: object) -> None:
    with pytest.raises(DeviceError, match=repr(device).replace("[", r"\[")):
        check_device(device)


def test_devices_this_machine_lacks_are_refused() -> None:
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(DeviceError, match=f"cuda:{n}"):
        check_device(f"cuda:{n}")
    assert check_device("cpu") == torch.device("cpu")
    assert check_device(torch.device("cpu")).type == "cpu"
    if n:
        assert check_device("cuda:0") == torch.device("cuda", 0)
    else:
        with pytest.raises(DeviceError, match="'cuda'"):
            check_device("cuda")


def test_dynamic_batch_and_executor_check_device_and_dtype() -> None:
    import torch

    from edbatch.api import DynamicBatch
    from edbatch.executor.torch_executor import TorchExecutor

    with pytest.raises(DeviceError, match="'tpu'"):
        DynamicBatch(device="tpu")
    with pytest.raises(DeviceError, match="'cuda:99'"):
        TorchExecutor("cuda:99")
    with pytest.raises(DeviceError, match="int32"):
        TorchExecutor("cpu", dtype=torch.int32)
    assert check_dtype("float64") is torch.float64


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=300)


@pytest.mark.parametrize(("args", "words"), [
    (["experiments.train", "batch_size=abc"], ["batch_size", "abc"]),
    (["experiments.train", "batch_size=0", "workload=lattice_lstm"], ["batch_size=0"]),
    (["experiments.train", "workload=lattice_lstm", "train_split=nope", "batch_size=16"],
     ["nope"]),
    (["experiments.train", "workload=tree_lstm", "eval_split=tset", "trainer.iterations=0"],
     ["'tset'"]),  # (was: trained, then reported on the default split)
    (["experiments.evaluate", "limit=-3"], ["limit=-3"]),
    (["experiments.evaluate", "workload=[tree_lstm]", "scheduler=[depth]", "split=nope"],
     ["nope"]),
    (["experiments.train_model", "device=tpu"], ["'tpu'"]),
    (["experiments.train_model", "fsm=/no/such/policy.json", "train_limit=4",
      "eval_limit=4"], ["/no/such/policy.json"]),
    (["experiments.evaluate", "workload=[ggnn_molecules]", "scheduler=[depth]", "limit=1",
      "granularities=[cell]", "workload.ggnn_molecules.data_dir=/no/such/dir"],
     ["/no/such/dir/esol/", "no such file or directory", "Fix: check the path"]),
])
def test_cli_user_error_is_short_and_without_traceback(tmp_path: Path, args: list[str],
                                                       words: list[str]) -> None:
    out = [f"hydra.run.dir={tmp_path}"] if "train" not in args[0] else [f"run_dir={tmp_path}"]
    r = _run(*args, *out)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr, r.stderr
    for w in words:
        assert w in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) <= 8, r.stderr


def test_hydra_full_error_keeps_the_traceback_for_developers(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HYDRA_FULL_ERROR": "1"}
    r = subprocess.run([sys.executable, "-m", "experiments.evaluate", "limit=-3",
                        f"hydra.run.dir={tmp_path}"], cwd=ROOT, env=env, text=True,
                       capture_output=True, timeout=300)
    assert r.returncode != 0 and "Traceback" in r.stderr and "ConfigError" in r.stderr
