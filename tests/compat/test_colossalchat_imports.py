"""ColossalChat's `from coati... import ...` names, each with its documented signature, doing its job on coati's
parts (its scripts and tests import them; `tests/colossalchat/test_lora.py` covers the LoRA ones); every import of
ColossalChat's own training scripts (its main branch, hpcaitech/ColossalAI 4f9953be) resolves, and what only those
scripts use (`coati.compat`: `coati.utils.reward_score`, `lora_manager`, `RawConversationDataset`) does what it does
there."""
import importlib
import json

import pytest
import torch
from datasets import Dataset

from coati.dataset import (DataCollatorForKTODataset, DataCollatorForPreferenceDataset, DataCollatorForPromptDataset,
                           DataCollatorForSupervisedDataset, load_tokenized_dataset, setup_conversation_template,
                           tokenize_kto, tokenize_prompt, tokenize_rlhf, tokenize_sft)
from coati.dataset.conversation import Conversation
from coati.dataset.loader import StatefulDistributedSampler
from coati.dataset.tokenization import IGNORE_INDEX, load_tokenizer
from coati.models import Critic, RewardModel, RLVRRewardModel, disable_dropout, generate_streaming

SFT = {"messages": [{"from": "user", "content": "2 + 3?"}, {"from": "assistant", "content": "5"}]}
PAIR = {"context": [{"from": "user", "content": "2 + 3?"}], "chosen": [{"from": "assistant", "content": "5"}],
        "rejected": [{"from": "assistant", "content": "6"}]}
KTO = {"prompt": [{"from": "user", "content": "2 + 3?"}], "completion": {"from": "assistant", "content": "5"}, "label": True}
PROMPT = {"messages": [{"from": "user", "content": "2 + 3?"}, {"from": "assistant", "content": "5"}], "gt_answer": "5"}


@pytest.fixture(scope="module")
def template(tiny_assets, tmp_path_factory):
    """ColossalChat's set-up: a template config with a system message, written back to `save_path` as it does."""
    tokenizer = load_tokenizer(str(tiny_assets["model"]))
    saved = tmp_path_factory.mktemp("template") / "conversation.json"
    conversation = setup_conversation_template(tokenizer, {"system_message": "Be exact.", "stop_ids": [7]}, str(saved))
    return tokenizer, conversation, saved


def test_setup_conversation_template_fills_in_and_saves_the_config(template):
    tokenizer, conversation, saved = template
    assert isinstance(conversation, Conversation) and conversation.stop_ids == [7]
    assert json.loads(saved.read_text())["chat_template"] == tokenizer.chat_template
    conversation.append_message("user", "2 + 3?")
    assert conversation.get_prompt(add_generation_prompt=True) == tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be exact."}, {"role": "user", "content": "2 + 3?"}], tokenize=False,
        add_generation_prompt=True)
    conversation.clear()


def test_row_tokenizers_map_over_a_dataset_and_train_on_the_answer(template, tmp_path):
    """Through `datasets.map` with ColossalChat's fn_kwargs, then ColossalChat's loader and collators."""
    tokenizer, conversation, _ = template
    kwargs = {"tokenizer": tokenizer, "conversation_template": conversation, "max_length": 64}
    sft = Dataset.from_list([SFT] * 4).map(tokenize_sft, fn_kwargs=kwargs)
    assert sft[0]["labels_decode"] == ["5" + tokenizer.eos_token] and "Be exact." in sft[0]["inputs_decode"]
    sft.save_to_disk(str(tmp_path / "sft"))
    batch = DataCollatorForSupervisedDataset(tokenizer, max_length=64)(list(load_tokenized_dataset([tmp_path / "sft"])))
    assert batch["attention_mask"].dtype == torch.bool and batch["labels"].ne(IGNORE_INDEX).sum() == 4 * 2

    pairs = Dataset.from_list([PAIR] * 2).map(tokenize_rlhf, fn_kwargs=kwargs)
    batch = DataCollatorForPreferenceDataset(tokenizer, 64)(list(pairs))
    assert set(batch) == {f"{side}_{key}" for side in ("chosen", "reject") for key in ("input_ids", "attention_mask", "loss_mask")}
    chosen = batch["chosen_input_ids"][0][batch["chosen_loss_mask"][0]]
    assert tokenizer.decode(chosen) == "5" + tokenizer.eos_token

    kto = Dataset.from_list([KTO, {**KTO, "label": False}]).map(tokenize_kto, fn_kwargs=kwargs)
    batch = DataCollatorForKTODataset(tokenizer, 64)(list(kto))
    assert batch["label"].tolist() == [True, False] and batch["kl_loss_mask"].any()

    prompts = Dataset.from_list([PROMPT]).map(tokenize_prompt, fn_kwargs=kwargs)
    batch = DataCollatorForPromptDataset(tokenizer, 64)(list(prompts))
    assert batch["gt_answer"] == ["5"] and "5<" not in tokenizer.decode(batch["input_ids"][0])   # the answer dropped


def test_a_row_cut_away_by_truncation_is_all_none(template):
    tokenizer, conversation, _ = template
    row = tokenize_sft(SFT, tokenizer, conversation, max_length=3)
    assert set(row.values()) == {None} and "labels_decode" in row


def test_load_tokenized_dataset_takes_none_one_path_or_parts(tiny_assets):
    assert load_tokenized_dataset([]) is None
    assert len(load_tokenized_dataset(str(tiny_assets["sft_train"]))) == 96
    assert StatefulDistributedSampler(range(8), num_replicas=1, rank=0, shuffle=False).__len__() == 8


def test_reward_model_and_critic_from_a_causal_lm(tiny_assets):
    """`RewardModel(pretrained)`: one reward per row, read at its last attended token (right padding changes
    nothing); `Critic(pretrained)`: a value per position."""
    ids = torch.tensor([[5, 9, 13, 2, 0, 0], [5, 9, 13, 2, 17, 21]])
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1] * 6])
    reward_model = RewardModel(str(tiny_assets["model"])).eval()
    rewards = reward_model(ids, attention_mask=mask)
    alone = reward_model(ids[:1, :4], attention_mask=mask[:1, :4])
    assert rewards.shape == (2,) and torch.allclose(rewards[0], alone[0], atol=1e-5)
    assert reward_model.get_input_embeddings().num_embeddings >= 352
    critic = Critic(str(tiny_assets["model"])).eval()
    assert critic(ids, attention_mask=mask).shape == (2, 6)


def test_rlvr_reward_model_sums_its_functions_per_row():
    def exact(input_ids, attention_mask, response_start, response_end, gt_answer, **kwargs):
        return float(int(input_ids[response_start]) == int(gt_answer)) * kwargs["scale"]

    def length(input_ids, attention_mask, response_start, response_end, gt_answer, **kwargs):
        return float(response_end - response_start)

    model = RLVRRewardModel([exact, length], scale=2.0)
    rewards = model(torch.tensor([[1, 7, 3], [1, 8, 3]]), torch.ones(2, 3), response_start=[1, 1], response_end=[3, 2],
                    gt_answer=["7", "7"])
    assert rewards.tolist() == [4.0, 1.0] and model.eval() is model and model.to("cpu") is model


def test_disable_dropout_zeroes_every_dropout():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.3), torch.nn.Sequential(torch.nn.Dropout(0.1)))
    disable_dropout(model)
    assert [m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)] == [0.0, 0.0]


def test_generate_streaming_yields_each_step_and_ends_as_greedy_generation(tiny_assets):
    from transformers import AutoModelForCausalLM

    from coati.models.generation import HFEngine
    from coati.config import SamplingConfig

    tokenizer = load_tokenizer(str(tiny_assets["model"]))
    model = AutoModelForCausalLM.from_pretrained(tiny_assets["model"]).eval()
    ids = torch.tensor([tokenizer.apply_chat_template([{"role": "user", "content": "2 + 3?"}], add_generation_prompt=True)])
    steps = list(generate_streaming(model, ids, tokenizer, max_length=ids.size(1) + 6, do_sample=False))
    assert [s.size(1) for s in steps] == list(range(ids.size(1) + 1, ids.size(1) + 1 + len(steps)))
    greedy = HFEngine(model, tokenizer.pad_token_id, [tokenizer.eos_token_id]).generate(
        ids, torch.ones_like(ids), SamplingConfig(max_new_tokens=6, do_sample=False))
    assert steps[-1][0].tolist() == greedy.sequences[0, :steps[-1].size(1)].tolist()
    with pytest.raises(ValueError, match="beam search does not stream"):
        next(generate_streaming(model, ids, tokenizer, max_length=20, num_beams=2))


SCRIPT_IMPORTS = {
    "train_ppo.py": {"coati.dataset": ["DataCollatorForPromptDataset", "DataCollatorForSupervisedDataset",
                                       "StatefulDistributedSampler", "load_tokenized_dataset",
                                       "setup_conversation_template"],
                     "coati.models": ["Critic", "LoraConfig", "RewardModel", "RLVRRewardModel", "convert_to_lora_module",
                                      "disable_dropout", "lora_manager"],
                     "coati.trainer": ["PPOTrainer"], "coati.utils": ["load_checkpoint"],
                     "coati.utils.reward_score": ["gsm8k_reward_fn", "math_competition_reward_fn", "extract_solution",
                                                  "validate_response_structure"]},
    "train_grpo.py": {"coati.models": ["LoraConfig", "RewardModel", "RLVRRewardModel", "convert_to_lora_module",
                                       "disable_dropout", "lora_manager"], "coati.trainer": ["GRPOTrainer"],
                      "coati.utils.reward_score": ["gsm8k_reward_fn", "math_competition_reward_fn"]},
    "lora_finetune.py": {"coati.dataset.loader": ["RawConversationDataset"]},
    "train_sft.py": {"coati.models": ["LoraConfig", "convert_to_lora_module"], "coati.trainer": ["SFTTrainer"]},
    "train_rm.py": {"coati.models": ["LogExpLoss", "LogSigLoss", "LoraConfig", "RewardModel", "convert_to_lora_module"],
                    "coati.trainer": ["RewardModelTrainer"]},
    "train_dpo.py": {"coati.dataset": ["DataCollatorForPreferenceDataset"], "coati.trainer": ["DPOTrainer"]},
    "train_kto.py": {"coati.dataset": ["DataCollatorForKTODataset"], "coati.trainer": ["KTOTrainer"]},
    "train_orpo.py": {"coati.trainer": ["ORPOTrainer"]},
}
"""The `from coati... import ...` lines of ColossalChat's examples/training_scripts, as they are written there."""


@pytest.mark.parametrize("script", sorted(SCRIPT_IMPORTS))
def test_every_name_a_colossalchat_training_script_imports_resolves(script):
    for module, names in SCRIPT_IMPORTS[script].items():
        imported = importlib.import_module(module)
        assert all(getattr(imported, name, None) is not None for name in names), (module, names)
    star = {}
    exec("from coati.utils.reward_score import *", star)
    assert {"gsm8k_reward_fn", "math_competition_reward_fn", "extract_solution", "validate_response_structure"} <= set(star)


def _reward(fn, tokenizer, response: str, gt_answer, inclusive_end: bool = False) -> float:
    """`fn` called as ColossalChat's RLVRRewardModel calls it, on a prompt then `response`."""
    prompt = tokenizer("What is 6 x 7?", add_special_tokens=False)["input_ids"]
    answer = tokenizer(response, add_special_tokens=False)["input_ids"]
    ids = torch.tensor(prompt + answer)
    end = len(ids) - 1 if inclusive_end else len(ids)
    return float(fn(ids, torch.ones_like(ids), tokenizer=tokenizer, response_start=len(prompt), response_end=end,
                    gt_answer=gt_answer, tags=None))


def test_colossalchats_verifiable_rewards_give_one_for_the_format_and_nine_more_for_the_answer(tokenizer):
    from coati.utils.reward_score import (extract_solution, gsm8k_reward_fn, math_competition_reward_fn,
                                          validate_response_structure)

    good = "<think>six sevens</think><answer>42</answer>"
    assert _reward(gsm8k_reward_fn, tokenizer, good, "42") == 10.0
    assert _reward(gsm8k_reward_fn, tokenizer, good, "41") == 1.0
    assert _reward(gsm8k_reward_fn, tokenizer, "<think>x</think><answer>forty two</answer>", "forty two") == 0.0
    assert _reward(gsm8k_reward_fn, tokenizer, "<answer>42</answer>", "42") == 0.0          # no think block
    assert _reward(gsm8k_reward_fn, tokenizer, good + " more", "42") == 0.0                 # text after the answer
    assert _reward(gsm8k_reward_fn, tokenizer, good, None) == 0.0
    assert _reward(math_competition_reward_fn, tokenizer, "<think>x</think><answer>\\frac{1}{2}</answer>",
                   "\\frac{1}{2}", inclusive_end=True) == 10.0                          # any answer text; end included
    assert _reward(math_competition_reward_fn, tokenizer, "<think>x</think><answer>A B</answer>", "ab",
                   inclusive_end=True) == 10.0                                           # spaces and case ignored
    assert extract_solution("<answer>1</answer> and <answer> 2 </answer>") == ("2", "<answer>1</answer> and <answer> "
                                                                                    "2 </answer>")
    assert extract_solution("no tags") == (None, "no tags")
    assert not validate_response_structure("<answer>1</answer><think>x</think>")              # out of order
    assert validate_response_structure("[t]x[/t][a]1[/a]", {
        "think_start": {"text": "[t]", "num_occur": 1}, "think_end": {"text": "[/t]", "num_occur": 1},
        "answer_start": {"text": "[a]", "num_occur": 1}, "answer_end": {"text": "[/a]", "num_occur": 1}})


def test_the_lora_manager_switch_is_there_to_set():
    from coati.models import lora_manager

    assert lora_manager.able_to_merge is True
    lora_manager.able_to_merge = False
    try:
        assert importlib.import_module("coati.models").lora_manager.able_to_merge is False   # one shared switch
    finally:
        lora_manager.able_to_merge = True


def test_raw_conversations_are_left_padded_with_the_assistants_tokens_as_labels(tokenizer, tmp_path):
    from coati.dataset.loader import RawConversationDataset

    conversation = [{"role": "user", "content": "What is 6 x 7?"}, {"role": "assistant", "content": "42"}]
    rl_row = {"messages": {"role": "user", "content": "What is 2 + 2?"}, "gt_answer": "4"}
    path = tmp_path / "chats.jsonl"
    path.write_text(json.dumps(conversation) + "\n" + json.dumps(rl_row) + "\n")
    dataset = RawConversationDataset(tokenizer, str(path), 256, "Answer briefly.")
    assert len(dataset) == 2
    row = dataset[0]
    system = {"role": "system", "content": "Answer briefly."}
    user, assistant = (tokenizer.apply_chat_template([system, m], tokenize=True, add_generation_prompt=True)
                       for m in conversation)
    assistant = assistant[1:] if assistant[0] == tokenizer.bos_token_id else assistant
    padding = 256 - len(user) - len(assistant)
    assert row["input_ids"].tolist() == [tokenizer.pad_token_id] * padding + user + assistant
    assert row["attention_mask"].tolist() == [0] * padding + [1] * (len(user) + len(assistant))
    assert row["labels"].tolist() == [-100] * (padding + len(user)) + assistant
    assert dataset[1]["gt_answer"] == "4" and (dataset[1]["labels"] == -100).all()
    assert dataset[0] is row                                                            # tokenized once
    cut = RawConversationDataset(tokenizer, str(path), 8)
    assert cut[0]["input_ids"].tolist() == user[:8]                                     # cut from the right
