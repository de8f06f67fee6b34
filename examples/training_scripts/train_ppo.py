"""PPO with a trained reward model (and/or verifiable reward functions) on prepared prompt data.

    torchrun --nproc_per_node 2 examples/training_scripts/train_ppo.py --pretrain SFT_MODEL \
        --rm_pretrain RM_MODEL --prompt_dataset data/prompts --eval_dataset data/prompts_eval \
        --plugin ddp --batch_size 8 --num_episodes 20 --output_dir out/ppo

The same as `coati ppo ...` (`coati.cli.commands.ppo`); `--config FILE` reads the flags from a YAML file.
"""
from coati.cli.commands import ppo as main

if __name__ == "__main__":
    main()
