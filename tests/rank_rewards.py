"""A reward function written outside coati (`--reward_fn rank_rewards:first_prompt_only`) that logs what each rank
scores: 1.0 for completions of the prompt named by $FIRST_PROMPT, else 0.0, so that a held-out mean reads how often
that prompt was counted; every call appends its rank, `trainer_state.global_step` and completions to $REWARD_LOG."""
import json
import os


def first_prompt_only(prompts, completions, trainer_state, **kwargs):
    """1.0 where the prompt's last message is $FIRST_PROMPT; logs the call as one JSON line."""
    with open(os.environ["REWARD_LOG"], "a") as log:
        log.write(json.dumps({"rank": int(os.environ["RANK"]), "step": trainer_state.global_step,
                              "completions": [c[0]["content"] for c in completions]}) + "\n")
    return [1.0 if prompt[-1]["content"] == os.environ["FIRST_PROMPT"] else 0.0 for prompt in prompts]
