"""What the training scripts share: the flags (`arguments`) and the set-up of a run from them (`runner` for every
script, `rl_runner` for PPO and GRPO). Nothing else in coati imports this package."""
