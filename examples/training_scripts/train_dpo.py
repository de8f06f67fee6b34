"""Direct preference optimisation on prepared preference pairs: DPO, IPO or SimPO (`--loss_type`).

    torchrun --nproc_per_node 2 examples/training_scripts/train_dpo.py --pretrain SFT_MODEL \
        --dataset data/pref --plugin ddp --batch_size 8 --beta 0.1 --save_dir ckpt/dpo --output_dir out/dpo

The same as `coati dpo ...` (`coati.cli.commands.dpo`); `--config FILE` reads the flags from a YAML file.
"""
from coati.cli.commands import dpo as main

if __name__ == "__main__":
    main()
