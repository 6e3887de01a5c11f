"""Docs that cannot rot: every fenced command in README.md and docs/*.md is checked.

Fast part (default run): every ``python -m X`` module and script path a command shows
exists, Hydra entry points compose with the command's overrides (unknown keys, options and
config groups fail), argparse scripts define the flags shown, install commands name files
and extras that exist.

Slow part: every command runs from a copy of the repository, as written or as the cheap
variant in :data:`CHEAP` (a tiny budget of the same command); a command without a variant
fails, so a new documented command must come with one. Self-contained ``python`` blocks
run too (:data:`FRAGMENTS` lists the markers of blocks that need the reader's own data).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PY = "{python}"  # the test's interpreter in CHEAP variants

#: documented command -> the command the slow test runs (same entry point, tiny budget).
#: A tiny throughput run (no DyNet; an 8x6 model; the policy trained in 2 episodes).
THROUGHPUT_CHEAP = (f"{PY} benchmarks/throughput.py --workloads tree_lstm --sizes 8x6 "
                    "--minibatches 1 --repeats 1 --warmup 1 --no-dynet --fsm-episodes 2 "
                    "--contenders depth fsm pytorch_hand floor --out results/throughput.json "
                    "--plot results/throughput.png")

CHEAP: dict[str, str] = {
    # README: the main job and the test suite (the venv and install use this interpreter)
    "python3 -m venv .venv && .venv/bin/pip install -q -c constraints.txt -e . && "
    "WANDB_MODE=offline .venv/bin/python -m experiments.compare":
        f"WANDB_MODE=offline {PY} -m experiments.compare 'workload=[tree_lstm]' eval_limit=1 "
        "num_train_graphs=1 val_from_train=1 trainers.fsm.max_episodes=2 "
        "trainers.ed_batch.max_episodes=2 policy.lookahead=none",
    "python3 -m venv .venv && .venv/bin/pip install -q -c constraints.txt -e \".[dev,peers]\" "
    "&& WANDB_MODE=disabled .venv/bin/python -m pytest -q -m \"not slow\"":
        f"WANDB_MODE=disabled {PY} -m pytest -q -m \"not slow\" tests/test_api.py",
    "python examples/own_model.py --epochs 3":
        f"{PY} examples/own_model.py --trees 64 --batch-size 32 --epochs 1 --episodes 5",
    # the expert learner (README) and the throughput benchmark (docs/benchmarks.md, results.md)
    "python -m experiments.train workload=lattice_lstm trainer=expert policy.lookahead=none":
        f"{PY} -m experiments.train workload=lattice_lstm trainer=expert policy.lookahead=none "
        "num_train_graphs=1 num_val_graphs=1 batch_size=8 trainer.rounds=1 trainer.budget=2000 "
        "progress=false",
    # the neural route (docs/learning.md, last section)
    "python -m experiments.train workload=lattice_lstm trainer=imitation policy.lookahead=none":
        f"{PY} -m experiments.train workload=lattice_lstm trainer=imitation policy.lookahead=none "
        "num_train_graphs=1 num_val_graphs=1 batch_size=8 trainer.dagger_rounds=1 "
        "trainer.budget=2000 trainer.label_budget=2000 trainer.epochs=3 trainer.augment=2 "
        "progress=false",
    "python benchmarks/dump_protocol.py --trainer imitation --lookahead none --seeds 0 1":
        f"{PY} benchmarks/dump_protocol.py --trainer imitation --lookahead none --seeds 0 "
        "--graphs 3 --batch-size 8 --extra trainer.dagger_rounds=1 trainer.budget=2000 "
        "trainer.label_budget=2000 trainer.epochs=3 trainer.augment=2",
    "python benchmarks/throughput.py --workloads tree_lstm --minibatches 2":
        THROUGHPUT_CHEAP,
    "python benchmarks/throughput.py --workloads tree_lstm lattice_lstm bilstm_tagger --sizes "
    "300x150 --minibatches 2 --repeats 3 --out results/throughput.json --plot "
    "results/throughput.png":
        THROUGHPUT_CHEAP,
    "python benchmarks/throughput.py --workloads tree_lstm lattice_lstm bilstm_tagger --sizes "
    "300x150 --minibatches 2 --repeats 3 --seed 0 --contenders depth dynet_agenda fsm "
    "fsm+fastbuild fsm+cse auto pytorch_hand floor dynet_autobatch1 dynet_autobatch2":
        THROUGHPUT_CHEAP,
    "python benchmarks/throughput.py --workloads tree_lstm lattice_lstm bilstm_tagger --sizes "
    "300x150 --minibatches 2 --repeats 3 --seed 0 --contenders depth dynet_agenda fsm "
    "fsm+unhoisted auto pytorch_hand floor dynet_autobatch1":
        f"{PY} benchmarks/throughput.py --workloads lattice_lstm --sizes 8x6 --minibatches 1 "
        "--repeats 1 --warmup 1 --no-dynet --fsm-episodes 2 --seed 0 --contenders depth "
        "dynet_agenda fsm fsm+unhoisted auto pytorch_hand floor --out results/throughput.json "
        "--plot results/throughput.png",
    # fused cell bodies against the unfused path (docs/throughput.md)
    "python benchmarks/throughput.py --workloads tree_lstm lattice_lstm bilstm_tagger --sizes "
    "300x150 --minibatches 2 --repeats 3 --seed 0 --no-dynet --contenders fsm fsm+unfused "
    "pytorch_hand floor":
        f"{PY} benchmarks/throughput.py --workloads tree_lstm --sizes 8x6 --minibatches 1 "
        "--repeats 1 --warmup 1 --no-dynet --fsm-episodes 2 --seed 0 --contenders fsm "
        "fsm+unfused pytorch_hand floor --out results/throughput.json "
        "--plot results/throughput.png",
    # the inference host cuts, hand-batched peer and floor (docs/throughput.md)
    "python -m benchmarks.throughput --workloads tree_lstm bilstm_tagger --modes infer "
    "--contenders fsm pytorch_hand floor --no-dynet --seed 0":
        f"{PY} -m benchmarks.throughput --workloads tree_lstm bilstm_tagger --modes infer "
        "--sizes 8x6 --minibatches 1 --repeats 1 --warmup 1 --fsm-episodes 2 --contenders fsm "
        "pytorch_hand floor --no-dynet --seed 0 --out results/throughput.json "
        "--plot results/throughput.png",
    # input-projection hoisting (docs/benchmarks.md)
    "python benchmarks/throughput.py --workloads bilstm_tagger --sizes 300x150 --minibatches 2 "
    "--repeats 1 --contenders dynet_agenda fsm fsm+unhoisted pytorch_hand floor":
        f"{PY} benchmarks/throughput.py --workloads bilstm_tagger --sizes 8x6 --minibatches 1 "
        "--repeats 1 --warmup 1 --no-dynet --fsm-episodes 2 --contenders fsm fsm+unhoisted "
        "pytorch_hand floor --out results/throughput.json --plot results/throughput.png",
    # the run-time path's phases (docs/runtime.md)
    "python benchmarks/runtime_phases.py --workloads tree_lstm lattice_lstm --minibatches 4":
        f"{PY} benchmarks/runtime_phases.py --workloads tree_lstm --size 8x6 --minibatches 1 "
        "--out results/runtime_phases.json",
    # data-parallel training (docs/distributed.md)
    "torchrun --nproc_per_node=2 -m experiments.train_model":
        f"{PY} -m torch.distributed.run --standalone --nproc_per_node=2 -m experiments.train_model "
        "epochs=1 max_steps=2 train_limit=64 eval_limit=64 eval_every=null batch_size=32 "
        "run_dir=runs/docs_model_1",
    "torchrun --nproc_per_node=2 -m experiments.train_model batch_size=128 max_steps=200 "
    "time_budget_s=null":
        f"{PY} -m torch.distributed.run --standalone --nproc_per_node=2 -m experiments.train_model "
        "batch_size=128 max_steps=2 time_budget_s=null train_limit=256 eval_limit=64 "
        "eval_every=null run_dir=runs/docs_model_2",
    "torchrun --nnodes=2 --nproc_per_node=2 --rdzv_backend=c10d --rdzv_endpoint=node001:29400 "
    "--rdzv_id=sst -m experiments.train_model batch_size=128":
        f"({PY} -m torch.distributed.run --nnodes=2 --nproc_per_node=1 --rdzv_backend=c10d "
        "--rdzv_endpoint=127.0.0.1:29431 --rdzv_id=sst -m experiments.train_model batch_size=32 "
        "max_steps=2 train_limit=64 eval_limit=64 eval_every=null "
        "run_dir=runs/docs_model_3) & p=$!; "
        f"{PY} -m torch.distributed.run --nnodes=2 --nproc_per_node=1 --rdzv_backend=c10d "
        "--rdzv_endpoint=127.0.0.1:29431 --rdzv_id=sst -m experiments.train_model batch_size=32 "
        "max_steps=2 train_limit=64 eval_limit=64 eval_every=null "
        "run_dir=runs/docs_model_3 && wait $p",
    "python -m experiments.train_model -m hydra/launcher=slurm hydra.launcher.nodes=2 "
    "hydra.launcher.tasks_per_node=2 batch_size=128":
        f"{PY} -c 'import hydra_plugins.hydra_submitit_launcher.submitit_launcher' && "
        f"{PY} -m experiments.train_model hydra/launcher=slurm hydra.launcher.nodes=2 "
        "hydra.launcher.tasks_per_node=2 batch_size=128 --cfg hydra",
    "python benchmarks/ddp_scaling.py --steps 40 --per-rank-batch 32":
        f"{PY} benchmarks/ddp_scaling.py --steps 3 --warmup 1 --per-rank-batch 4 --repeats 1 "
        "--matmul-seconds 0.2 --override workload.tree_lstm.embed_dim=8 "
        "workload.tree_lstm.hidden_dim=8",
    "python benchmarks/ddp_scaling.py --steps 40 --per-rank-batch 32 --concurrent":
        f"{PY} benchmarks/ddp_scaling.py --steps 3 --warmup 1 --per-rank-batch 4 --repeats 1 "
        "--matmul-seconds 0.2 --concurrent --override workload.tree_lstm.embed_dim=8 "
        "workload.tree_lstm.hidden_dim=8",
    "python benchmarks/ddp_profile.py --steps 30 --per-rank-batch 32":
        f"{PY} benchmarks/ddp_profile.py --steps 3 --warmup 1 --per-rank-batch 4 "
        "--override workload.tree_lstm.embed_dim=8 workload.tree_lstm.hidden_dim=8",
    # training and evaluation (README, docs/training.md)
    "python -m experiments.train workload=lattice_lstm trainer=q_learning seed=1":
        f"{PY} -m experiments.train workload=lattice_lstm trainer=q_learning seed=1 "
        "num_train_graphs=1 num_val_graphs=1 trainer.max_episodes=2 progress=false "
        "policy.lookahead=none",
    "python -m experiments.train workload=module_net trainer=priority seed=0":
        f"{PY} -m experiments.train workload=module_net trainer=priority seed=0 "
        "num_train_graphs=1 num_val_graphs=1 batch_size=8 trainer.iterations=2 "
        "trainer.population=4 trainer.elite=2 progress=false",
    "python -m experiments.train workload=tree_lstm trainer=ed_batch num_train_graphs=1":
        f"{PY} -m experiments.train workload=tree_lstm trainer=ed_batch num_train_graphs=1 "
        "num_val_graphs=1 trainer.max_episodes=2 progress=false",
    "python -m experiments.train workload=lattice_lstm trainer=maskable_ppo":
        f"{PY} -m experiments.train workload=lattice_lstm trainer=maskable_ppo "
        "num_train_graphs=1 num_val_graphs=1 trainer.total_timesteps=64 progress=false "
        "policy.lookahead=none batch_size=8",
    "python -m experiments.train workload=lattice_lstm trainer=dqn":
        f"{PY} -m experiments.train workload=lattice_lstm trainer=dqn num_train_graphs=1 "
        "num_val_graphs=1 trainer.total_timesteps=64 progress=false policy.lookahead=none "
        "batch_size=8",
    "python -m experiments.evaluate":
        f"{PY} -m experiments.evaluate 'workload=[tree_lstm,lattice_lstm]' limit=1 "
        "'scheduler=[depth,critical_path]' progress=false",
    "python -m experiments.evaluate 'workload=[lattice_lstm]' 'scheduler=[fsm,critical_path]' "
    "scheduler.fsm.path=runs/lattice_lstm/q_learning/seed1/policy.json":
        f"{PY} -m experiments.train workload=lattice_lstm seed=1 num_train_graphs=1 "
        "num_val_graphs=1 trainer.max_episodes=2 progress=false policy.lookahead=none "
        "resume=restart && "
        f"{PY} -m experiments.evaluate 'workload=[lattice_lstm]' 'scheduler=[fsm,critical_path]' "
        "scheduler.fsm.path=runs/lattice_lstm/q_learning/seed1/policy.json limit=1 "
        "granularities=[cell] progress=false",
    "python -m experiments.compare seeds=[0,1,2,3,4]":
        f"{PY} -m experiments.compare seeds=[0,1] 'workload=[tree_lstm]' eval_limit=1 "
        "num_train_graphs=1 val_from_train=1 trainers.fsm.max_episodes=2 "
        "trainers.ed_batch.max_episodes=2 policy.lookahead=none",
    # this one and the fsm= entry below both write runs/tree_lstm/q_learning/seed0 with other
    # configs (one shared repo copy, order by doc): each starts the folder over
    "python -m experiments.train -m seed=0,1,2,3,4 hydra/launcher=joblib":
        f"{PY} -m experiments.train -m seed=0,1 hydra/launcher=joblib workload=tree_lstm "
        "num_train_graphs=1 num_val_graphs=1 trainer.max_episodes=2 progress=false resume=restart",
    "python -m experiments.train -m seed=0,1,2,3,4 hydra/launcher=slurm":
        f"{PY} -c 'import hydra_plugins.hydra_submitit_launcher.submitit_launcher' && "
        f"{PY} -m experiments.train seed=0 hydra/launcher=slurm --cfg hydra",  # no SLURM here
    "python -m experiments.train workload=dumps workload.dumps.folder=bilstm_B1 batch_size=1 "
    "train_split=first:1 val_split=first:1":
        f"{PY} -m experiments.train workload=dumps workload.dumps.folder=bilstm_B1 "
        "batch_size=1 train_split=first:1 val_split=first:1 trainer.max_episodes=2 "
        "progress=false",
    # the measured-cost objective (docs/learning.md, last section)
    "python -m experiments.calibrate workload=tree_lstm granularity=primitive":
        f"{PY} -m experiments.calibrate workload=tree_lstm granularity=primitive "
        "batch_sizes=[1,4] reps=1 launch_reps=1 sample_batch_size=2",
    "python -m experiments.evaluate 'workload=[tree_lstm]' 'granularities=[primitive]' "
    "'scheduler=[depth,critical_path]' cost_model=calibrate measure_reps=3":
        f"{PY} -m experiments.evaluate 'workload=[tree_lstm]' 'granularities=[primitive]' "
        "'scheduler=[depth,critical_path]' cost_model=calibrate measure_reps=1 limit=1 "
        "batch_size=2 progress=false",
    "python -m experiments.train workload=tree_lstm workload.tree_lstm.granularity=primitive "
    "trainer=maskable_ppo env=cost_model policy.lookahead=none":
        f"{PY} -m experiments.train workload=tree_lstm workload.tree_lstm.granularity=primitive "
        "trainer=maskable_ppo env=cost_model policy.lookahead=none num_train_graphs=1 "
        "num_val_graphs=1 trainer.total_timesteps=64 batch_size=2 progress=false",
    "python benchmarks/cost_objective.py --workloads tree_lstm lattice_lstm --batch-size 8 "
    "--graphs 3":
        f"{PY} benchmarks/cost_objective.py --workloads tree_lstm --batch-size 2 --graphs 1 "
        "--reps 1 --rounds 1 --budget 500",
    "python -m experiments.train_model epochs=2":
        f"{PY} -m experiments.train_model epochs=1 max_steps=2 train_limit=64 eval_limit=64 "
        "eval_every=null batch_size=32 run_dir=runs/docs_model_4",
    # batching=auto and a fixed FSM (docs/training.md)
    "python -m experiments.train_model batching=auto auto.trials=3":
        f"{PY} -m experiments.train_model batching=auto auto.trials=1 epochs=1 max_steps=9 "
        "train_limit=288 eval_limit=64 eval_every=null batch_size=32 run_dir=runs/docs_model_5",
    "python -m experiments.train_model batching=auto 'auto.schedulers=[typewise_greedy,depth]' "
    "'auto.strategies=[aligned]'":
        f"{PY} -m experiments.train_model batching=auto 'auto.schedulers=[typewise_greedy,depth]' "
        "'auto.strategies=[aligned]' epochs=1 max_steps=3 train_limit=96 eval_limit=64 "
        "eval_every=null batch_size=32 run_dir=runs/docs_model_6",
    "python -m experiments.train_model batching=fsm "
    "fsm=runs/tree_lstm/q_learning/seed0/policy.json":
        f"{PY} -m experiments.train workload=tree_lstm seed=0 num_train_graphs=1 "
        "num_val_graphs=1 trainer.max_episodes=2 progress=false policy.lookahead=none "
        "resume=restart && "
        f"{PY} -m experiments.train_model batching=fsm "
        "fsm=runs/tree_lstm/q_learning/seed0/policy.json epochs=1 max_steps=2 train_limit=64 "
        "eval_limit=64 eval_every=null batch_size=32 run_dir=runs/docs_model_7",
}

#: markers of ``python`` blocks that use the reader's own data (covered by examples/).
FRAGMENTS = ("chunks",)


def _blocks(lang: str) -> list[tuple[str, str]]:
    """(file, block text) of every fenced block of ``lang`` in the docs."""
    out = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for m in re.finditer(rf"^```{lang}\n(.*?)^```", text, re.S | re.M):
            out.append((str(path.relative_to(ROOT)), m.group(1)))
    return out


def commands() -> list[tuple[str, str]]:
    """(file, command) of every bash command (continuations joined, comments dropped)."""
    out = []
    for name, block in _blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                out.append((name, " ".join(line.split())))
    return out


COMMANDS = commands()
IDS = [f"{f}:{c}" for f, c in COMMANDS]


def _parts(command: str) -> list[list[str]]:
    """The simple commands of a ``&&`` chain, env assignments dropped."""
    out = []
    for part in re.split(r"\s*&&\s*|\s*;\s*", command):
        words = shlex.split(part)
        while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
            words = words[1:]
        out.append(words)
    return out


def _target(words: list[str]) -> tuple[str, str, list[str]] | None:
    """("module" | "script", name, args) of a python / torchrun invocation, else None."""
    if not words or not re.search(r"(python3?|torchrun)$", words[0]):
        return None
    rest = words[1:]
    for i, w in enumerate(rest):
        if w == "-m" and i + 1 < len(rest):
            return "module", rest[i + 1], rest[i + 2:]
        if w.endswith(".py"):
            return "script", w, rest[i + 1:]
    return None


def _hydra_config(module: str) -> str | None:
    """The entry point's config name; importing it registers any structured-config schemas
    (ConfigStore) it declares, as running it would."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None
    m = re.search(r"config_name=\"(\w+)\"", Path(spec.origin).read_text(encoding="utf-8"))
    if m:
        importlib.import_module(module)
    return m.group(1) if m else None


def _compose(config: str, args: list[str]) -> None:
    from hydra import compose, initialize_config_dir

    multirun = "-m" in args or "--multirun" in args
    overrides = []
    for a in args:
        if a.startswith("-") or "=" not in a:
            continue
        key, value = a.split("=", 1)
        if multirun and "," in value and not value.startswith("["):
            value = value.split(",")[0]  # a sweep: compose its first point
        overrides.append(f"{key}={value}")
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        compose(config_name=config, overrides=overrides, return_hydra_config=True)


def test_the_docs_show_commands() -> None:
    assert len(COMMANDS) >= 10
    assert any("experiments.compare" in c for _, c in COMMANDS)


@pytest.mark.parametrize(("doc", "command"), COMMANDS, ids=IDS)
def test_command_targets_exist_and_accept_their_arguments(doc: str, command: str) -> None:
    for words in _parts(command):
        if words[:1] == ["python3"] and words[1:3] == ["-m", "venv"]:
            continue
        if words and words[0].endswith("pip"):
            assert (ROOT / words[words.index("-c") + 1]).is_file()
            extras = re.findall(r"\[([\w,]+)\]", " ".join(words))
            project = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
            declared = project.split("[project.optional-dependencies]")[1].split("\n[")[0]
            for extra in (e for group in extras for e in group.split(",")):
                assert re.search(rf"^{extra}\s*=", declared, re.M), \
                    f"{doc}: extra {extra!r} is not in pyproject.toml"
            continue
        target = _target(words)
        if target is None:
            continue
        kind, name, args = target
        if kind == "script":
            path = ROOT / name
            assert path.is_file(), f"{doc}: {name} does not exist"
            source = path.read_text(encoding="utf-8")
            ast.parse(source)
            for flag in (a.split("=")[0] for a in args if a.startswith("--")):
                assert f'"{flag}"' in source, f"{doc}: {name} defines no option {flag}"
            continue
        if name == "pytest":
            project = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
            for m in re.findall(r"\b(slow|gpu)\b", " ".join(args)):
                assert f'"{m}:' in project, f"{doc}: pytest marker {m!r} is not declared"
            continue
        assert importlib.util.find_spec(name) is not None, f"{doc}: no module {name}"
        config = _hydra_config(name)
        if config is not None:
            _compose(config, args)


def _skip_in_copy(folder: str, names: list[str]) -> set[str]:
    """Environments, outputs and caches, except numba's compiled core: every command runs
    in a fresh process, and the first would spend a minute or more recompiling it (not what
    these tests check). The caches are valid in the copy: numba keys them by the source's
    mtime and size, which ``copytree`` keeps, and ``edbatch._numba_cache`` stamps each folder
    with a hash of the sources, so a stale cache is deleted there as it is here."""
    skip = set(shutil.ignore_patterns(".git", ".venv", "runs", "outputs", "multirun",
                                      "results", ".pytest_cache", ".ruff_cache",
                                      "*.egg-info")(folder, names))
    if Path(folder).name == "__pycache__":
        from edbatch._numba_cache import STAMP

        return skip | {n for n in names if not n.endswith((".nbi", ".nbc")) and n != STAMP}
    return skip


@pytest.fixture(scope="module")
def repo_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The working tree without environments, outputs and caches (numba's kept)."""
    dest = tmp_path_factory.mktemp("repo") / "edbatch"
    shutil.copytree(ROOT, dest, ignore=_skip_in_copy)
    return dest


def _env(repo: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(repo), WANDB_MODE="disabled", HYDRA_FULL_ERROR="1")
    env.pop("PYTEST_ADDOPTS", None)
    return env


@pytest.mark.slow
@pytest.mark.parametrize(("doc", "command"), COMMANDS, ids=IDS)
def test_documented_command_runs(doc: str, command: str, repo_copy: Path) -> None:
    if command not in CHEAP:
        pytest.fail(f"{doc}: no cheap variant for the documented command\n  {command}\nadd one "
                    f"to CHEAP in tests/test_docs_commands.py (same entry point, tiny budget)")
    cheap = CHEAP[command].replace(PY, shlex.quote(sys.executable))
    proc = subprocess.run(["bash", "-c", cheap], cwd=repo_copy, env=_env(repo_copy),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{doc}: `{cheap}` failed:\n{proc.stdout[-3000:]}\n" \
                                 f"{proc.stderr[-3000:]}"


PYTHON_BLOCKS = [(f, b) for f, b in _blocks("python") if not any(m in b for m in FRAGMENTS)]


@pytest.mark.slow
@pytest.mark.parametrize(("doc", "block"), PYTHON_BLOCKS,
                         ids=[f"{f}:{b.splitlines()[0][:40]}" for f, b in PYTHON_BLOCKS])
def test_documented_python_runs(doc: str, block: str, repo_copy: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", block], cwd=repo_copy, env=_env(repo_copy),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{doc}: block failed:\n{block}\n{proc.stderr[-3000:]}"


def test_every_cheap_variant_is_documented() -> None:
    shown = {c for _, c in COMMANDS}
    stale = [c for c in CHEAP if c not in shown]
    assert not stale, f"CHEAP has variants of commands no doc shows any more: {stale}"
