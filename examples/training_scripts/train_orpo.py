"""ORPO on prepared preference pairs: SFT on chosen plus an odds-ratio penalty, no reference model.

    torchrun --nproc_per_node 2 examples/training_scripts/train_orpo.py --pretrain MODEL \
        --dataset data/pref --plugin ddp --batch_size 8 --lam 0.1 --save_dir ckpt/orpo --output_dir out/orpo

The same as `coati orpo ...` (`coati.cli.commands.orpo`); `--config FILE` reads the flags from a YAML file.
"""
from coati.cli.commands import orpo as main

if __name__ == "__main__":
    main()
