"""Hydra entry points; importing the package registers the config schemas (ConfigStore)
and the ``edbatch_output_subdir`` resolver the configs use."""

from experiments import _cli, _schema, _workload_schema  # noqa: F401 - registration side effects
