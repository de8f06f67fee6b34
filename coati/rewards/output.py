"""What a reward function may return besides a plain list of floats."""
from dataclasses import dataclass, field
from typing import Any, Dict, Sequence


@dataclass
class RewardOutput:
    """`values`: the reward, one per completion. `diagnostics`: named per-completion values logged beside it (as
    `rewards/<function>/<name>`, e.g. how many checks timed out) but not added to the reward. `columns`: named
    per-completion values for the sample tables only (a judge's raw answers), as TRL's `log_extra` adds them."""

    values: Sequence[float]
    diagnostics: Dict[str, Sequence[float]] = field(default_factory=dict)
    columns: Dict[str, Sequence[Any]] = field(default_factory=dict)
