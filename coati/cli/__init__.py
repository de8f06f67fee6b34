"""What the training scripts share: their parsers, built from `coati.config`'s settings (`options`, `arguments`),
ColossalChat's flags (`colossalchat`), the checks before a run (`preflight`), and the set-up of a run from the parsed
flags (`runner` for every script; `rl_runner`, `rl_parts` and `rl_checks` for PPO and GRPO). Nothing else in coati
imports this package."""
