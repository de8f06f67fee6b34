"""Validate and tokenize raw data into a prepared dataset for the training scripts.

    python examples/data_preparation_scripts/prepare_dataset.py --type preference \
        --data_input_dirs raw/ --tokenizer_dir MODEL --data_output_dirs data/rm --max_length 2048

A bad row (malformed JSON, a missing field, a wrong role order, an empty assistant turn) stops with one
line naming file, line and field, and exit status 2; `--skip_invalid` counts such rows instead.
"""
import argparse
import json
from pathlib import Path

from transformers import AutoTokenizer

from coati.dataset.prepare import prepare_dataset
from coati.utils.errors import CoatiUsageError, exit_on_usage_error


def load_tokenizer(tokenizer_dir: str, template_config: str = None, trust_remote_code: bool = False):
    """The tokenizer, with the chat template (and end-of-turn token) of `template_config` when given."""
    if not Path(tokenizer_dir).is_dir():
        raise CoatiUsageError(f"--tokenizer_dir {tokenizer_dir} does not exist")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, trust_remote_code=trust_remote_code)
    if template_config:
        config = json.loads(Path(template_config).read_text())
        if "chat_template" not in config:
            raise CoatiUsageError(f"{template_config}: field 'chat_template' is missing")
        tokenizer.chat_template = config["chat_template"]
        if config.get("end_of_turn_token"):
            tokenizer.eos_token = config["end_of_turn_token"]
    if not tokenizer.chat_template:
        raise CoatiUsageError(f"the tokenizer in {tokenizer_dir} has no chat template; pass --conversation_template_config")
    return tokenizer


@exit_on_usage_error
def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--type", required=True, choices=("sft", "preference", "prompt"))
    parser.add_argument("--data_input_dirs", nargs="+", required=True,
                        help="JSONL files, folders of them, or local dataset folders that datasets.load_dataset reads")
    parser.add_argument("--tokenizer_dir", required=True)
    parser.add_argument("--data_output_dirs", required=True, help="where the prepared dataset is saved")
    parser.add_argument("--max_length", type=int, default=2048, help="tokens per sequence; longer ones are cut from the right")
    parser.add_argument("--conversation_template_config", default=None,
                        help='JSON with "chat_template" (and optional "end_of_turn_token") for a tokenizer without one')
    parser.add_argument("--skip_invalid", action="store_true", help="skip and count invalid rows instead of stopping")
    parser.add_argument("--trust_remote_code", action="store_true")
    args = parser.parse_args(argv)
    tokenizer = load_tokenizer(args.tokenizer_dir, args.conversation_template_config, args.trust_remote_code)
    counts = prepare_dataset(args.data_input_dirs, args.type, tokenizer, args.max_length, args.data_output_dirs,
                             skip_invalid=args.skip_invalid)
    print(f"prepared {args.type} dataset in {args.data_output_dirs}: {counts['kept']} of {counts['rows']} valid rows kept, "
          f"{counts['dropped']} dropped by truncation, {counts['skipped']} invalid rows skipped")


if __name__ == "__main__":
    main()
