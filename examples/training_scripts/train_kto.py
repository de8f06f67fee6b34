"""KTO on prepared KTO data (prompt, completion, desirable-or-not label) against a frozen reference.

    torchrun --nproc_per_node 2 examples/training_scripts/train_kto.py --pretrain SFT_MODEL \
        --dataset data/kto --plugin ddp --batch_size 8 --beta 0.1 --save_dir ckpt/kto --output_dir out/kto

The same as `coati kto ...` (`coati.cli.commands.kto`); `--config FILE` reads the flags from a YAML file.
"""
from coati.cli.commands import kto as main

if __name__ == "__main__":
    main()
