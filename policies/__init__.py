"""Batching policies: the learned FSM (tabular Q-learning) and deep-RL baselines."""

from policies.fsm import FALLBACKS, FSMPolicy, FSMScheduler, make_fallback
from policies.q_learning import (
    QLearningConfig,
    QLearningTrainer,
    TrainResult,
    evaluate_policy,
    train_q_table,
)

__all__ = ["FALLBACKS", "FSMPolicy", "FSMScheduler", "QLearningConfig", "QLearningTrainer",
           "TrainResult", "evaluate_policy", "make_fallback", "train_q_table"]
