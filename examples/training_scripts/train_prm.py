"""Process reward model training on prepared step-labelled solutions (prepare_dataset.py --type prm).

    torchrun --nproc_per_node 2 examples/training_scripts/train_prm.py --pretrain SFT_MODEL \
        --dataset data/prm --plugin ddp --batch_size 8 --save_dir ckpt/prm --output_dir out/prm --log_dir logs/prm

The same as `coati prm ...` (`coati.cli.commands.prm`); `--config FILE` reads the flags from a YAML file.
"""
from coati.cli.commands import prm as main

if __name__ == "__main__":
    main()
