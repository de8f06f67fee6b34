"""Validate and tokenize raw data into a prepared dataset for the training scripts.

    python examples/data_preparation_scripts/prepare_dataset.py --type preference \
        --data_input_dirs raw/ --tokenizer_dir MODEL --data_output_dirs data/rm --max_length 2048

A bad row (malformed JSON, a missing field, a wrong role order, an empty assistant turn) stops with one
line naming file, line and field, and exit status 2; `--skip_invalid` counts such rows instead.
"""
from coati.utils.cli import CoatiArgumentParser, at_least
from coati.utils.errors import CoatiUsageError, exit_cleanly
from coati.utils.preflight import check_writable_dir, resolve_model_dir


@exit_cleanly
def main(argv=None) -> None:
    parser = CoatiArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--type", required=True, choices=("sft", "preference", "prompt", "kto"), help="what the rows are")
    parser.add_argument("--data_input_dirs", nargs="+", required=True,
                        help="JSONL files, folders of them, or local dataset folders that datasets.load_dataset reads")
    parser.add_argument("--tokenizer_dir", required=True, help="tokenizer (with its chat template): a folder or a Hugging Face model id")
    output = parser.add_mutually_exclusive_group(required=True)
    output.add_argument("--data_output_dirs", help="where the prepared dataset is saved")
    output.add_argument("--data_arrow_output_dir", dest="data_output_dirs", help="ColossalChat's name for --data_output_dirs")
    parser.add_argument("--max_length", type=at_least(1), default=2048, help="tokens per sequence; longer ones are cut from the right")
    parser.add_argument("--conversation_template_config", default=None,
                        help='JSON with "chat_template" (and optional "end_of_turn_token") for a tokenizer without one')
    parser.add_argument("--skip_invalid", action="store_true", help="skip and count invalid rows instead of stopping")
    parser.add_argument("--trust_remote_code", action="store_true", help="allow custom tokenizer code")
    parser.add_argument("--data_cache_dir", default=None, help="cache of datasets.load_dataset for dataset-folder inputs")
    parser.add_argument("--num_spliced_dataset_bins", type=at_least(1), default=1, help="arrow files the dataset is split into")
    parser.add_argument("--data_jsonl_output_dir", default=None, help="also write the prepared rows as JSONL files here")
    parser.add_argument("--num_samples_per_datafile", type=at_least(0), default=0,
                        help="rows per JSONL file under --data_jsonl_output_dir (0: one file)")
    args = parser.parse_args(argv)
    check_writable_dir(args.data_output_dirs, "--data_output_dirs")
    if args.data_jsonl_output_dir:
        check_writable_dir(args.data_jsonl_output_dir, "--data_jsonl_output_dir")
    args.tokenizer_dir = resolve_model_dir(args.tokenizer_dir, "--tokenizer_dir")
    from coati.dataset.prepare import OutputLayout, prepare_dataset   # tokenizers, datasets: once flags are checked
    from coati.dataset.tokenization import load_tokenizer

    tokenizer = load_tokenizer(args.tokenizer_dir, args.trust_remote_code, args.conversation_template_config)
    if not tokenizer.chat_template:
        raise CoatiUsageError(f"the tokenizer in {args.tokenizer_dir} has no chat template; pass --conversation_template_config")
    layout = OutputLayout(args.num_spliced_dataset_bins, args.data_jsonl_output_dir, args.num_samples_per_datafile)
    counts = prepare_dataset(args.data_input_dirs, args.type, tokenizer, args.max_length, args.data_output_dirs,
                             skip_invalid=args.skip_invalid, layout=layout, cache_dir=args.data_cache_dir)
    print(f"prepared {args.type} dataset in {args.data_output_dirs}: {counts['kept']} of {counts['rows']} valid rows kept, "
          f"{counts['dropped']} dropped by truncation, {counts['skipped']} invalid rows skipped")


if __name__ == "__main__":
    main()
