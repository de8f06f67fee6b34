"""What a reward function may return besides a plain list of floats."""
from dataclasses import dataclass, field
from typing import Dict, Sequence


@dataclass
class RewardOutput:
    """`values`: the reward, one per completion. `diagnostics`: named per-completion values logged beside it (as
    `rewards/<function>/<name>`, e.g. how many checks timed out) but not added to the reward."""

    values: Sequence[float]
    diagnostics: Dict[str, Sequence[float]] = field(default_factory=dict)
