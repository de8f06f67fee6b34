"""GRPO with verifiable rewards on prepared prompt data (its ground-truth fields reach the reward).

    torchrun --nproc_per_node 2 examples/training_scripts/train_grpo.py --pretrain SFT_MODEL \
        --prompt_dataset data/prompts --eval_dataset data/prompts_eval --reward_fn math_answer \
        --num_generations 8 --plugin ddp --batch_size 4 --num_episodes 20 --output_dir out/grpo

Add `--async_rollout --max_staleness 1` to generate in Ray actors while the trainer trains.

The same as `coati grpo ...` (`coati.cli.commands.grpo`); `--config FILE` reads the flags from a YAML file.
"""
from coati.cli.commands import grpo as main

if __name__ == "__main__":
    main()
