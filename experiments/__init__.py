"""Hydra entry points of edbatch (the only place that imports Hydra)."""
