"""Supervised fine-tuning on prepared chat data.

    torchrun --nproc_per_node 2 examples/training_scripts/train_sft.py --pretrain MODEL \
        --dataset data/sft --plugin ddp --batch_size 8 --save_dir ckpt/sft --output_dir out/sft --log_dir logs/sft

The same as `coati sft ...` (`coati.cli.commands.sft`); `--config FILE` reads the flags from a YAML file.
"""
from coati.cli.commands import sft as main

if __name__ == "__main__":
    main()
