"""Validate and tokenize raw data into a prepared dataset for the training scripts.

    python examples/data_preparation_scripts/prepare_dataset.py --type preference \
        --data_input_dirs raw/ --tokenizer_dir MODEL --data_output_dirs data/rm --max_length 2048

A bad row (malformed JSON, a missing field, a wrong role order, an empty assistant turn) stops with one
line naming file, line and field, and exit status 2; `--skip_invalid` counts such rows instead.

The same as `coati prepare ...` (`coati.cli.commands.prepare`).
"""
from coati.cli.commands import prepare as main

if __name__ == "__main__":
    main()
