"""Range checks of the config groups the typed schemas leave as ``Any`` (``trainer``,
``trainers.<name>``, ``env``, ``policy.lookahead``, ``one_graph_trainers``): each rule's
key, type and bounds, a :class:`~edbatch.errors.ConfigError` naming the key, the value and
the fix. :func:`experiments._schema.validate` calls :func:`check_groups` after the schema."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from edbatch.errors import ConfigError

__all__ = ["ENV_CHOICES", "TRAINER_CHOICES", "TRAINER_FLAGS", "TRAINER_RULES", "WANDB_MODES",
           "check_group", "check_groups"]

_INF = float("inf")
#: Trainer hyper-parameters (any trainer of conf/trainer): (type, low, high), inclusive;
#: every number a conf/trainer file sets has its rule (a test checks).
TRAINER_RULES: dict[str, tuple[type, float, float]] = {
    "max_episodes": (int, 1, float("inf")), "eval_every": (int, 1, float("inf")),
    "n_step": (int, 1, float("inf")), "total_timesteps": (int, 1, float("inf")),
    "eval_points": (int, 1, float("inf")), "alpha": (float, 1e-12, 1.0),
    "gamma": (float, 0.0, 1.0), "eps_start": (float, 0.0, 1.0), "eps_min": (float, 0.0, 1.0),
    "eps_decay": (float, 1e-12, 1.0), "early_stop_ratio": (float, 0.0, float("inf")),
    "hidden": (int, 1, float("inf")), "layers": (int, 1, float("inf")),  # trainer=imitation
    "epochs": (int, 1, float("inf")), "dagger_rounds": (int, 0, float("inf")),
    "lr": (float, 1e-12, float("inf")), "label_budget": (int, 0, float("inf")),
    "iterations": (int, 0, float("inf")), "population": (int, 2, float("inf")),  # priority*
    "elite": (int, 1, float("inf")), "sigma": (float, 0.0, float("inf")),
    "sigma_floor": (float, 0.0, float("inf")), "hidden_units": (int, 0, float("inf")),
    "api_rounds": (int, 0, float("inf")), "step_weight": (float, 0.0, float("inf")),
    **{k: (int, 0, _INF) for k in (  # counts and budgets of the other trainers (>= 0)
        "rounds", "teacher_graphs", "budget", "exact_max_nodes", "exact_node_budget",
        "min_count", "max_prune_evals", "augment", "search_sweeps", "complete_min_visits",
        "search_max_evals", "search_min_visits", "search_pairs", "search_pair_evals",
        "auto_probe_evals", "auto_finalists", "warm_start_epochs", "min_votes",
        "search_states", "guard_check")},
    "guard_max_evals": (int, 0, _INF), "batch_size": (int, 1, _INF), "n_jobs": (int, -1, _INF),
    "confidence": (float, 0.0, 1.0), "tau": (float, 1e-12, _INF),
    "weight_decay": (float, 0.0, _INF), "warm_start_lr": (float, 0.0, _INF),
    "guard_margin": (float, -_INF, _INF),
}
#: Trainer keys with a fixed set of values.
TRAINER_CHOICES = {"teacher": ("rollout", "search"), "imitate_target": ("values", "choices")}
#: Trainer switches: true or false (``far=abc`` was read as true).
TRAINER_FLAGS = ("best_heuristic", "clip_bootstrap", "context", "dagger_first",
                 "fallback_snapshot", "far", "guard", "imitate", "prune", "release",
                 "warm_start")
#: Keys of the ``env`` group and their allowed values.
ENV_CHOICES = {"reward": ("ed_batch", "unit", "cost_model"), "on_invalid": ("raise", "noop")}
#: ``logger.mode`` of the wandb logger (``wandb.init``'s modes).
WANDB_MODES = ("offline", "online", "disabled", "shared")


def check_group(prefix: str, node: Any, rules: dict[str, tuple[type, float, float]]) -> None:
    for key, (kind, low, high) in rules.items():
        if not isinstance(node, dict) or key not in node:
            continue
        value = node[key]
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and (
            kind is float or isinstance(value, int)) and low <= value <= high
        if not ok:
            span = f">= {low:g}" if high == float("inf") else f"in [{low:g}, {high:g}]"
            raise ConfigError(f"{prefix}.{key}", value, f"{'an int' if kind is int else 'a number'}"
                              f" {span}", f"pass e.g. {prefix}.{key}=<{kind.__name__} {span}>")


def _check_choices(prefix: str, node: Any) -> None:
    for key in TRAINER_FLAGS:
        value = node.get(key) if isinstance(node, dict) else None
        if value is not None and not isinstance(value, bool) and \
                not str(value).startswith("${"):
            raise ConfigError(f"{prefix}.{key}", value, "true or false",
                              f"pass {prefix}.{key}=true or {prefix}.{key}=false")
    for key, choices in TRAINER_CHOICES.items():
        value = node.get(key) if isinstance(node, dict) else None
        if value is not None and not str(value).startswith("${") and value not in choices:
            raise ConfigError(f"{prefix}.{key}", value, f"one of {list(choices)}",
                              f"pass e.g. {prefix}.{key}={choices[0]}")


def _check_one_graph_trainers(cfg: DictConfig) -> None:
    """``experiments.compare``'s ``one_graph_trainers`` name compared trainers (an unknown
    name was silently ignored: that learner then trained on every graph)."""
    if "trainers" in cfg and cfg.trainers is not None and "one_graph_trainers" in cfg:
        names, one = list(cfg.trainers), list(cfg.one_graph_trainers)
        if any(t not in names for t in one):
            raise ConfigError("one_graph_trainers", one, f"names of the compared trainers "
                              f"{names}", f"pass e.g. one_graph_trainers=[{names[0]}] or "
                              f"one_graph_trainers=[]")


def _check_policy_names(cfg: DictConfig, trainers: dict[str, Any]) -> None:
    """``encoding`` and ``fallback`` of the ``policy`` group and of each trainer: known names
    (a misspelt one was ignored by the trainers that do not read it, e.g. the default); the
    wandb logger's ``mode``."""
    from envs.encoding import ENCODINGS
    from policies.fsm import check_fallback_config

    nodes = dict(trainers)
    if isinstance(cfg.get("policy"), DictConfig):
        nodes["policy"] = OmegaConf.to_container(cfg.policy, resolve=False)
    logger = cfg.get("logger")
    if isinstance(logger, DictConfig) and "mode" in logger and \
            not OmegaConf.is_interpolation(logger, "mode") and logger.mode not in WANDB_MODES:
        raise ConfigError("logger.mode", logger.mode, f"one of {list(WANDB_MODES)}",
                          "pass logger.mode=offline (the default; `wandb sync` later)")
    for prefix, node in nodes.items():
        if not isinstance(node, dict):
            continue
        encoding, fallback = node.get("encoding"), node.get("fallback")
        if isinstance(encoding, str) and not encoding.startswith("${") and \
                encoding not in ENCODINGS:
            raise ConfigError(f"{prefix}.encoding", encoding, f"one of {list(ENCODINGS)}",
                              f"pass e.g. {prefix}.encoding=hints")
        if isinstance(fallback, str) and not fallback.startswith("${"):
            check_fallback_config(f"{prefix}.fallback", fallback)


def check_groups(cfg: DictConfig) -> None:
    """The trainer hyper-parameters and env options the typed schemas leave to the groups."""
    trainers = {}
    if "trainer" in cfg and cfg.trainer is not None:
        trainers["trainer"] = OmegaConf.to_container(cfg.trainer, resolve=False)
    if "trainers" in cfg and cfg.trainers is not None:
        for name in cfg.trainers:
            trainers[f"trainers.{name}"] = OmegaConf.to_container(cfg.trainers[name],
                                                                  resolve=False)
    for prefix, node in trainers.items():
        check_group(prefix, node, TRAINER_RULES)
        _check_choices(prefix, node)
    _check_one_graph_trainers(cfg)
    from policies.fsm import LOOKAHEADS  # the FSM's lookahead names, checked before training

    looks = {f"{p}.lookahead": n.get("lookahead") for p, n in trainers.items()
             if isinstance(n, dict)}
    if isinstance(cfg.get("policy"), DictConfig) and "lookahead" in cfg.policy:
        looks["policy.lookahead"] = OmegaConf.to_container(cfg.policy)["lookahead"]  # type: ignore[index]
    for key, value in looks.items():
        if value is not None and not str(value).startswith("${") and value not in LOOKAHEADS:
            raise ConfigError(key, value, f"one of {list(LOOKAHEADS)}",
                              f"pass e.g. {key}=rollout (rollout2: level 2, ~100x slower; "
                              "search: rollout then sequence search, ~30x)")
    _check_policy_names(cfg, trainers)
    env = cfg.get("env")
    if env is not None:
        for key, choices in ENV_CHOICES.items():
            if key in env and not OmegaConf.is_interpolation(env, key) and \
                    env[key] not in choices:
                raise ConfigError(f"env.{key}", env[key], f"one of {list(choices)}",
                                  f"pass e.g. env.{key}={choices[0]}")
        if env.get("reward") == "cost_model" and not env.get("cost_model"):
            raise ConfigError("env.cost_model", env.get("cost_model"),
                              "a cost-model file or 'calibrate' with env.reward=cost_model",
                              "pass env=cost_model (calibrates in the run) or "
                              "env.cost_model=PATH from python -m experiments.calibrate")
