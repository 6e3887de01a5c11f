"""The cheap variant of every documented command, for ``tests/test_docs_commands.py``'s slow
part: the same entry point on a tiny budget. A new command in README.md or docs/*.md needs
one here (the test names the command that lacks it)."""

from __future__ import annotations

__all__ = ["CHEAP", "PY", "THROUGHPUT_CHEAP"]

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
        "trainers.priority.iterations=2 "
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
    # the default run and the small size (docs/throughput.md)
    "python benchmarks/throughput.py --seed 0":
        f"{PY} benchmarks/throughput.py --sizes 8x6 --minibatches 1 --repeats 1 --warmup 1 "
        "--no-dynet --fsm-episodes 2 --seed 0 --out results/throughput.json "
        "--plot results/throughput.png",
    "python benchmarks/throughput.py --sizes 64x64 --seed 0 --contenders dynet_agenda fsm "
    "pytorch_hand floor dynet_autobatch1":
        f"{PY} benchmarks/throughput.py --workloads tree_lstm --sizes 8x6 --minibatches 1 "
        "--repeats 1 --warmup 1 --no-dynet --fsm-episodes 2 --seed 0 --contenders "
        "dynet_agenda fsm pytorch_hand floor --out results/throughput.json "
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
        f"{PY} -m experiments.train workload=lattice_lstm trainer=q_learning seed=1 "
        "num_train_graphs=1 num_val_graphs=1 trainer.max_episodes=2 progress=false "
        "policy.lookahead=none resume=restart && "
        f"{PY} -m experiments.evaluate 'workload=[lattice_lstm]' 'scheduler=[fsm,critical_path]' "
        "scheduler.fsm.path=runs/lattice_lstm/q_learning/seed1/policy.json limit=1 "
        "granularities=[cell] progress=false",
    "python -m experiments.compare seeds=[0,1,2,3,4]":
        f"{PY} -m experiments.compare seeds=[0,1] 'workload=[tree_lstm]' eval_limit=1 "
        "num_train_graphs=1 val_from_train=1 trainers.fsm.max_episodes=2 "
        "trainers.priority.iterations=2 "
        "trainers.ed_batch.max_episodes=2 policy.lookahead=none",
    # runs/tree_lstm/priority/seed0 (the default trainer); the fsm= entry below writes
    # runs/tree_lstm/q_learning/seed0: each starts its folder over
    "python -m experiments.train -m seed=0,1,2,3,4 hydra/launcher=joblib":
        f"{PY} -m experiments.train -m seed=0,1 hydra/launcher=joblib workload=tree_lstm "
        "num_train_graphs=1 num_val_graphs=1 trainer.iterations=2 progress=false resume=restart",
    "python -m experiments.train -m seed=0,1,2,3,4 hydra/launcher=slurm":
        f"{PY} -c 'import hydra_plugins.hydra_submitit_launcher.submitit_launcher' && "
        f"{PY} -m experiments.train seed=0 hydra/launcher=slurm --cfg hydra",  # no SLURM here
    "python -m experiments.train workload=dumps workload.dumps.folder=bilstm_B1 batch_size=1 "
    "train_split=first:1 val_split=first:1":
        f"{PY} -m experiments.train workload=dumps workload.dumps.folder=bilstm_B1 "
        "batch_size=1 train_split=first:1 val_split=first:1 trainer.iterations=2 "
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
        f"{PY} -m experiments.train workload=tree_lstm trainer=q_learning seed=0 "
        "num_train_graphs=1 num_val_graphs=1 trainer.max_episodes=2 progress=false "
        "policy.lookahead=none resume=restart && "
        f"{PY} -m experiments.train_model batching=fsm "
        "fsm=runs/tree_lstm/q_learning/seed0/policy.json epochs=1 max_steps=2 train_limit=64 "
        "eval_limit=64 eval_every=null batch_size=32 run_dir=runs/docs_model_7",
}
