"""When periodic work is due: logging (`LogCadence`, the published GRPO module's logging flags) and saving or
evaluating (`Frequency`, every so many epochs, steps or seconds). Light: the argument parsers import it."""
from dataclasses import dataclass

LOGGING_STRATEGIES = ("steps", "no")


@dataclass(frozen=True)
class LogCadence:
    """When training metrics are logged, as the published GRPO logging module has it: with `strategy` "steps",
    every `steps` steps, and after the first step too with `first_step`; with "no", never. A logged value is
    the mean over the steps since the last log."""

    strategy: str = "steps"
    steps: int = 1
    first_step: bool = False

    def __post_init__(self) -> None:
        if self.strategy not in LOGGING_STRATEGIES:
            raise ValueError(f"unknown logging strategy {self.strategy!r}; expected one of {', '.join(LOGGING_STRATEGIES)}")

    @property
    def enabled(self) -> bool:
        return self.strategy != "no"

    def due(self, step: int) -> bool:
        """Whether the window ends at `step` (1-based)."""
        return self.enabled and (step % self.steps == 0 or (self.first_step and step == 1))

