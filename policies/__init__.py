"""Batching policies: the learned FSM (tabular Q-learning) and deep-RL baselines."""

from policies.fsm import FALLBACKS, FSMPolicy, make_fallback
from policies.q_learning import QLearningConfig, TrainResult, evaluate_policy, train_q_table

__all__ = ["FALLBACKS", "FSMPolicy", "QLearningConfig", "TrainResult", "evaluate_policy",
           "make_fallback", "train_q_table"]
