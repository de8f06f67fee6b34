"""ColossalChat's callback hook names, kept working: each is called right after the coati hook that means the same,
with the same arguments (`PUBLISHED_NAMES`), so a ColossalChat callback runs unchanged. Imports nothing of coati's."""
from typing import Any, Optional

PUBLISHED_NAMES = {"on_update_pass_start": "on_learn_epoch_start", "on_update_pass_end": "on_learn_epoch_end",
                   "on_update_batch_start": "on_learn_batch_start", "on_update_batch_end": "on_learn_batch_end",
                   "on_optimizer_step_start": "on_learn_batch_start", "on_optimizer_step_end": "on_learn_batch_end"}
"""coati's hook -> ColossalChat's, called after it: on-policy, an update pass is ColossalChat's learn epoch and a
micro-batch its learn batch; supervised, an optimizer step is its learn batch."""


def published_name(hook: str) -> Optional[str]:
    """ColossalChat's name called after coati's `hook`, if it has one."""
    return PUBLISHED_NAMES.get(hook)


class ColossalChatHooks:
    """ColossalChat's `on_learn_batch_start/end`, no-ops unless a callback overrides them (`Callback` has them).
    `on_learn_epoch_start/end` are coati's own hooks of a supervised epoch, which ColossalChat's on-policy callbacks
    also receive for each update pass."""

    def on_learn_batch_start(self) -> None:
        pass

    def on_learn_batch_end(self, experience: Any) -> None:
        pass
