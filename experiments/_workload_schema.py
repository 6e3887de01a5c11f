"""The ``workload`` config group, generated from the workload registry (no yaml per workload).

Every registered workload ``name`` becomes the group option ``workload=name``: a structured
config (a dataclass made from the constructor's signature, registered in Hydra's
ConfigStore) under the key ``workload.<name>``, so ``workload=<name>
workload.<name>.hidden_dim=64`` works as the yaml files did, and a value of the wrong type
(``workload.<name>.hidden_dim=abc``) or an unknown key fails at compose time. The fields
are the constructor's parameters with their defaults, ``_target_`` the class, then the
class's :attr:`~edbatch.workloads.Workload.config_defaults` (an ``eval`` node holds
evaluation defaults, not constructor arguments). A workload with one granularity has no
``granularity`` key. A constructor taking ``**kwargs`` (the synthetic generators' options)
gets a plain dict node, so ``++workload.synthetic.num_nodes=40`` still adds a key.

The option ``workload=real_data`` selects every workload with ``real_data = True``
(``conf/evaluate.yaml``'s default), in registry order.

Importing :mod:`experiments` registers the group (:func:`register_workload_configs`; call it
again after defining a workload outside ``edbatch.workloads``).
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from edbatch.workloads import WORKLOADS, Workload

__all__ = ["REAL_DATA_OPTION", "register_workload_configs", "workload_config"]

#: The group option holding every real-data workload.
REAL_DATA_OPTION = "real_data"
_PRIMITIVES = (int, float, str, bool)


def _field_type(annotation: Any) -> Any:
    """The OmegaConf type of a constructor annotation: a primitive, an optional primitive,
    else ``Any`` (paths, unions: the constructor checks those)."""
    if annotation in _PRIMITIVES:
        return annotation
    args = typing.get_args(annotation)
    rest = [a for a in args if a is not type(None)]
    if len(rest) == 1 and len(args) == 2 and rest[0] in _PRIMITIVES:
        return Optional[rest[0]]  # noqa: UP045 - OmegaConf reads typing.Optional
    return Any


def _default(value: Any) -> dataclasses.Field:  # type: ignore[type-arg]
    if isinstance(value, (dict, list)):
        return dataclasses.field(default_factory=lambda: value.copy())
    return dataclasses.field(default=value)


def workload_config(cls: type[Workload]) -> Any:
    """The config node of one workload class: a dataclass type, or a dict for a constructor
    with ``**kwargs``."""
    signature = inspect.signature(cls.__init__)
    hints = typing.get_type_hints(cls.__init__)
    values: dict[str, Any] = {"_target_": f"{cls.__module__}.{cls.__qualname__}"}
    types: dict[str, Any] = {"_target_": str}
    open_node = False
    for name, param in list(signature.parameters.items())[1:]:
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            open_node = True
            continue
        if param.kind is inspect.Parameter.VAR_POSITIONAL or (
                name == "granularity" and len(cls.granularities) < 2):
            continue
        values[name] = MISSING if param.default is inspect.Parameter.empty else param.default
        types[name] = _field_type(hints.get(name, Any))
    for name, value in cls.config_defaults.items():
        values[name] = value
        types.setdefault(name, Any)
    if open_node:
        return values
    fields = [(k, types[k], _default(v)) for k, v in values.items()]
    return dataclasses.make_dataclass(f"{cls.__name__}Config", fields)


def register_workload_configs(store: ConfigStore | None = None) -> None:
    """Store ``workload/<name>`` for every registered workload and ``workload/real_data``."""
    store = store or ConfigStore.instance()
    nodes = {name: workload_config(cls) for name, cls in WORKLOADS.items()}
    for name, node in nodes.items():
        store.store(group="workload", name=name, node={name: node},
                    provider="edbatch.workloads")
    store.store(group="workload", name=REAL_DATA_OPTION,
                node={n: nodes[n] for n, cls in WORKLOADS.items() if cls.real_data},
                provider="edbatch.workloads")


register_workload_configs()
