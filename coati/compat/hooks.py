"""ColossalChat's callback hook names, kept working: each is called right after the coati hook that means the same,
with the same arguments, so a ColossalChat callback runs unchanged. Imports nothing of coati's."""

PUBLISHED_NAMES = {"on_update_pass_start": "on_learn_epoch_start", "on_update_pass_end": "on_learn_epoch_end",
                   "on_update_batch_start": "on_learn_batch_start", "on_update_batch_end": "on_learn_batch_end",
                   "on_optimizer_step_start": "on_learn_batch_start", "on_optimizer_step_end": "on_learn_batch_end"}
"""coati's hook -> ColossalChat's, called after it: on-policy, an update pass is ColossalChat's learn epoch and a
micro-batch its learn batch; supervised, an optimizer step is its learn batch (`on_learn_epoch_start/end` are also
coati's own hooks of a supervised epoch)."""
