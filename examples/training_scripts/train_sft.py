"""Supervised fine-tuning on prepared chat data.

    torchrun --nproc_per_node 2 examples/training_scripts/train_sft.py --pretrain MODEL \
        --dataset data/sft --plugin ddp --batch_size 8 --save_dir ckpt/sft --output_dir out/sft --log_dir logs/sft
"""
from coati.cli.arguments import training_parser
from coati.cli.colossalchat import add_colossalchat_flags
from coati.utils.errors import exit_cleanly


@exit_cleanly
def main(argv=None) -> None:
    parser = training_parser(__doc__.strip().splitlines()[0])
    add_colossalchat_flags(parser, "sft")
    args = parser.parse_args(argv)
    from coati.cli.runner import run_supervised   # the training stack loads once the flags are read
    from coati.trainer.sft import SFTTrainer

    run_supervised(args, SFTTrainer, "sft")


if __name__ == "__main__":
    main()
