"""Scheduling: frontier bookkeeping, policies, heuristics, bounds and the exact optimum."""

from edbatch.schedule.bounds import (
    heights,
    lower_bound,
    remaining_lower_bound,
    type_chain_lengths,
    typewise_graph,
)
from edbatch.schedule.frontier import Frontier, FrontierView
from edbatch.schedule.heuristics import (
    AgendaPolicy,
    CompleteLevelAgendaPolicy,
    CriticalPathPolicy,
    DynetAgendaPolicy,
    MaxFrontierPolicy,
    RandomPolicy,
    TypewiseGreedyPolicy,
    depth_schedule,
    typewise_greedy_backward,
)
from edbatch.schedule.memo import MemoScheduler
from edbatch.schedule.path_bound import PathBound, path_lower_bound
from edbatch.schedule.policy import Policy, PolicyScheduler, Scheduler, run_policy
from edbatch.schedule.reverse import reverse_graph
from edbatch.schedule.rollout import RolloutScheduler, rollout_schedule
from edbatch.schedule.schedule import Batch, Schedule
from edbatch.schedule.zoo import COMPILED, HEURISTICS, SCHEDULERS, NamedScheduler, make_scheduler

__all__ = [
    "AgendaPolicy",
    "Batch",
    "COMPILED",
    "CompleteLevelAgendaPolicy",
    "CriticalPathPolicy",
    "DynetAgendaPolicy",
    "Frontier",
    "FrontierView",
    "HEURISTICS",
    "MaxFrontierPolicy",
    "MemoScheduler",
    "NamedScheduler",
    "PathBound",
    "Policy",
    "PolicyScheduler",
    "RandomPolicy",
    "RolloutScheduler",
    "SCHEDULERS",
    "Schedule",
    "Scheduler",
    "TypewiseGreedyPolicy",
    "depth_schedule",
    "heights",
    "lower_bound",
    "make_scheduler",
    "path_lower_bound",
    "remaining_lower_bound",
    "reverse_graph",
    "rollout_schedule",
    "run_policy",
    "type_chain_lengths",
    "typewise_graph",
    "typewise_greedy_backward",
]
