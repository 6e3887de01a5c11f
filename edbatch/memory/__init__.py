"""Memory planning: arenas, row orders and zero-copy operand reads (docs/architecture.md 3.9)."""

from __future__ import annotations

from edbatch.memory.plan import FP32_BYTES, MemoryPlan, Operand, Region
from edbatch.memory.planner import (
                                    STRATEGIES,
                                    Strategy,
                                    plan_key,
                                    plan_memory,
                                    zero_copy_upper_bound,
)

__all__ = [
    "FP32_BYTES",
    "STRATEGIES",
    "MemoryPlan",
    "Operand",
    "Region",
    "Strategy",
    "plan_key",
    "plan_memory",
    "zero_copy_upper_bound",
]
