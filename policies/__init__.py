"""Batching policies: the learned FSM (tabular Q-learning) and deep-RL baselines."""

from policies.fsm import FALLBACKS, FSMPolicy, FSMScheduler, make_fallback
from policies.q_learning import (
    QLearningConfig,
    QLearningTrainer,
    TrainResult,
    evaluate_policy,
    train_q_table,
)
from policies.user import TRAINERS, load_policy, train_policy

__all__ = ["FALLBACKS", "TRAINERS", "FSMPolicy", "FSMScheduler", "QLearningConfig",
           "QLearningTrainer", "TrainResult", "evaluate_policy", "load_policy", "make_fallback",
           "train_policy", "train_q_table"]
