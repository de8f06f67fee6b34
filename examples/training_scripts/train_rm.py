"""Reward-model training on prepared preference pairs.

    torchrun --nproc_per_node 2 examples/training_scripts/train_rm.py --pretrain SFT_MODEL \
        --dataset data/rm --plugin ddp --batch_size 8 --save_dir ckpt/rm --output_dir out/rm --log_dir logs/rm

The same as `coati rm ...` (`coati.cli.commands.rm`); `--config FILE` reads the flags from a YAML file.
"""
from coati.cli.commands import rm as main

if __name__ == "__main__":
    main()
