"""Padding-free packing: a packed micro-batch gives every trainer the loss, metrics and gradients of the same rows
padded (to 1e-5, gradients in norm), attention stays within rows, and a model that would attend across rows is refused;
micro-batches filled to a token budget keep every rank in step and resume where they stopped."""
import random

import pytest
import torch
from colossalai.booster import Booster
from colossalai.booster.plugin import TorchDDPPlugin
from datasets import load_from_disk
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

from coati.dataset.collators import (ROWS, KTOCollator, PreferenceCollator, SupervisedCollator, batch_rows,
                                    shared_prompt)
from coati.dataset.sampler import TokenBudgetBatchSampler, row_tokens
from coati.dataset.tokenization import IGNORE_INDEX
from coati.models.loss import DPOLoss, KTOLoss, ORPOLoss, SimPOLoss
from coati.models.packing import enable_packed_attention
from coati.models.reward_model import load_reward_model
from coati.trainer.dpo import DPOTrainer
from coati.trainer.kto import KTOTrainer
from coati.trainer.rm import RewardModelTrainer
from coati.trainer.sft import SFTTrainer
from coati.utils import CoatiUsageError


def _rows(path, n=6):
    """`n` prepared rows of different lengths."""
    data = list(load_from_disk(str(path)))
    return sorted(data, key=lambda row: len(next(v for k, v in row.items() if k.endswith("input_ids"))))[::len(data) // n][:n]


def _booster_and(model):
    plugin = TorchDDPPlugin()
    booster = Booster(plugin=plugin)
    boosted, optimizer, *_ = booster.boost(model, torch.optim.SGD(model.parameters(), lr=0.0))
    return {"model": boosted, "booster": booster, "optimizer": optimizer, "plugin": plugin}


def _loss_and_grads(trainer, batch):
    trainer.model.zero_grad()
    result = trainer._compute_batch(batch)
    result.loss.backward()
    grads = torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])
    return result, grads


def _assert_same(padded, packed):
    (result_a, grads_a), (result_b, grads_b) = padded, packed
    assert result_b.loss.item() == pytest.approx(result_a.loss.item(), rel=1e-5)
    for name, (total, count) in result_a.metrics.items():
        assert result_b.metrics[name][1] == count, name
        assert result_b.metrics[name][0] == pytest.approx(total, rel=1e-5, abs=1e-5), name
    assert (grads_b - grads_a).norm() <= 1e-5 * grads_a.norm(), ((grads_b - grads_a).norm(), grads_a.norm())


def _both(trainer, collator_cls, rows, pad_token_id, **kwargs):
    padded = collator_cls(pad_token_id, **kwargs)(rows)
    packed = collator_cls(pad_token_id, packing=True, **kwargs)(rows)
    return _loss_and_grads(trainer, padded), _loss_and_grads(trainer, packed), padded, packed


def _policy(path):
    model = AutoModelForCausalLM.from_pretrained(path)
    enable_packed_attention(model)
    return model


def test_pack_sequences_restarts_positions_and_ignores_each_rows_first_label():
    rows = [{"input_ids": [5, 6, 7], "labels": [IGNORE_INDEX, 6, 7]}, {"input_ids": [8, 9], "labels": [8, 9]}]
    batch = SupervisedCollator(0, packing=True)(rows)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 9]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1]]
    assert batch["labels"].tolist() == [[IGNORE_INDEX, 6, 7, IGNORE_INDEX, 9]]
    assert batch["seq_lens"].tolist() == [3, 2] and batch[ROWS] == 2 == batch_rows(batch)
    assert "attention_mask" not in batch


def test_a_pair_packs_its_rejected_row_as_a_branch_after_the_shared_prompt():
    rows = [{"chosen_input_ids": [1, 2, 3, 4], "chosen_labels": [-100, -100, 3, 4],
             "rejected_input_ids": [1, 2, 5], "rejected_labels": [-100, -100, 5],
             "chosen_ref_logps": -1.0, "rejected_ref_logps": -2.0},
            {"chosen_input_ids": [6, 7], "chosen_labels": [6, 7], "rejected_input_ids": [8, 9, 9], "rejected_labels": [8, 9, 9],
             "chosen_ref_logps": -3.0, "rejected_ref_logps": -4.0}]
    batch = PreferenceCollator(0, packing=True)(rows)
    # pair 0 shares [1, 2]: its rejected branch repeats the prompt's last token at its position (1), then goes on
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4, 2, 5, 6, 7, 8, 9, 9]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 1, 2, 0, 1, 0, 1, 2]]
    assert batch["labels"].tolist() == [[-100, -100, 3, 4, -100, 5, -100, 7, -100, 9, 9]]
    assert batch["seq_lens"].tolist() == [4, 2, 2, 3] and batch_rows(batch) == 2
    assert batch["chosen_ref_logps"].tolist() == [-1.0, -3.0]
    unshared = PreferenceCollator(0, packing=True, share_prompt=False)(rows)
    assert unshared["input_ids"].tolist() == [[1, 2, 3, 4, 1, 2, 5, 6, 7, 8, 9, 9]]


@pytest.mark.parametrize("chosen,rejected,rejected_labels,expected", [
    ([1, 2, 3], [1, 2, 4], [-100, -100, 4], 2),
    ([1, 2, 3], [1, 2, 3, 5], [-100, -100, 3, 5], 2),   # the common prefix stops short of the chosen row's end
    ([1, 2, 3, 4], [1, 2, 3, 5], [-100, -100, 3, 5], 2),  # and at the rejected row's first label
    ([1, 5], [1, 6], [-100, 6], 0),                    # one shared token: nothing to gain
    ([1, 2, 3], [1, 2, 4], [1, 2, 4], 0),              # every token a label (--disable_loss_mask)
])
def test_shared_prompt_stops_at_the_first_rejected_label(chosen, rejected, rejected_labels, expected):
    assert shared_prompt(chosen, rejected, rejected_labels) == expected


def test_sft_loss_and_gradients_match_unpacked(world_of_one, tiny_assets):
    tokenizer = AutoTokenizer.from_pretrained(tiny_assets["model"])
    trainer = SFTTrainer(max_epochs=1, **_booster_and(_policy(tiny_assets["model"])))
    rows = _rows(tiny_assets["sft_train"])
    padded, packed, padded_batch, packed_batch = _both(trainer, SupervisedCollator, rows, tokenizer.pad_token_id)
    _assert_same(padded, packed)
    assert trainer._count_items(packed_batch) == trainer._count_items(padded_batch) > 0
    assert packed_batch["input_ids"].numel() < padded_batch["input_ids"].numel()


def test_sft_with_every_token_a_label_matches_unpacked(world_of_one, tiny_assets):
    tokenizer = AutoTokenizer.from_pretrained(tiny_assets["model"])
    trainer = SFTTrainer(max_epochs=1, **_booster_and(_policy(tiny_assets["model"])))
    padded, packed, _, _ = _both(trainer, SupervisedCollator, _rows(tiny_assets["sft_train"]), tokenizer.pad_token_id,
                                 loss_on_every_token=True)
    _assert_same(padded, packed)


@pytest.mark.parametrize("loss_fn", [DPOLoss(beta=0.1), DPOLoss(beta=0.1, loss_type="ipo"), SimPOLoss(), ORPOLoss()],
                         ids=["dpo", "ipo", "simpo", "orpo"])
def test_dpo_family_loss_metrics_and_gradients_match_unpacked(world_of_one, tiny_assets, loss_fn):
    tokenizer = AutoTokenizer.from_pretrained(tiny_assets["model"])
    policy = _policy(tiny_assets["model"])
    with torch.no_grad():                    # make the policy differ from the reference
        for p in policy.parameters():
            p.add_(0.01 * torch.randn_like(p))
    reference = _policy(tiny_assets["model"]).eval()
    trainer = DPOTrainer(**_booster_and(policy), ref_model=reference if loss_fn.needs_reference else None, loss_fn=loss_fn)
    rows = _rows(tiny_assets["pref_train"])
    padded, packed, _, packed_batch = _both(trainer, PreferenceCollator, rows, tokenizer.pad_token_id)
    _assert_same(padded, packed)
    assert trainer._count_items(packed_batch) == 6
    both_rows = sum(len(row["chosen_input_ids"]) + len(row["rejected_input_ids"]) for row in rows)
    assert packed_batch["input_ids"].size(1) < 0.75 * both_rows   # the prompts went through the model once


def test_kto_loss_and_gradients_match_unpacked(world_of_one, tiny_assets):
    tokenizer = AutoTokenizer.from_pretrained(tiny_assets["model"])
    policy = _policy(tiny_assets["model"])
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.01 * torch.randn_like(p))
    trainer = KTOTrainer(**_booster_and(policy), ref_model=_policy(tiny_assets["model"]).eval(), loss_fn=KTOLoss())
    rows = [{"input_ids": row["chosen_input_ids"], "labels": row["chosen_labels"], "desirable": i % 2 == 0,
             "prompt_length": next(j for j, t in enumerate(row["chosen_labels"]) if t != IGNORE_INDEX)}
            for i, row in enumerate(_rows(tiny_assets["pref_train"]))]
    padded, packed, _, _ = _both(trainer, KTOCollator, rows, tokenizer.pad_token_id)
    _assert_same(padded, packed)


def test_reward_model_rewards_and_gradients_match_unpacked(world_of_one, tiny_assets):
    tokenizer = AutoTokenizer.from_pretrained(tiny_assets["model"])
    model = load_reward_model(str(tiny_assets["model"]), tokenizer.pad_token_id)
    enable_packed_attention(model)
    trainer = RewardModelTrainer(**_booster_and(model))
    padded, packed, _, _ = _both(trainer, PreferenceCollator, _rows(tiny_assets["pref_train"]), tokenizer.pad_token_id)
    _assert_same(padded, packed)


@pytest.fixture
def plain_sdpa(monkeypatch):
    """transformers' own SDPA attention, as in a process that never enabled packing (earlier tests in this process
    did): restored to what it was after the test."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    import coati.models.packing as packing

    monkeypatch.setitem(AttentionInterface._global_mapping, "sdpa", sdpa_attention_forward)
    monkeypatch.setattr(packing, "_PLAIN_SDPA", None)


def test_unpacked_batches_run_as_before_once_packing_is_enabled(tiny_assets, plain_sdpa):
    model = AutoModelForCausalLM.from_pretrained(tiny_assets["model"]).eval()
    ids, mask = torch.tensor([[5, 6, 7, 8], [0, 0, 9, 10]]), torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    left_padded_row = {"input_ids": ids[1:], "attention_mask": mask[1:], "position_ids": torch.tensor([[0, 0, 0, 1]])}
    with torch.no_grad():
        before = [model(input_ids=ids, attention_mask=mask).logits, model(**left_padded_row).logits]
        enable_packed_attention(model)
        after = [model(input_ids=ids, attention_mask=mask).logits, model(**left_padded_row).logits]
    assert torch.equal(before[0], after[0])
    # a left-padded single row is taken for packed rows (its position ids restart): its tokens score as before within
    # rounding, and its padding positions, which no loss reads, differ
    attended = mask[1:].bool()
    assert torch.allclose(before[1][attended], after[1][attended], rtol=0, atol=1e-5)


class _AttendsAcrossRows(LlamaForCausalLM):
    """Modelling code that ignores the attention interface's row boundaries, as custom code may."""

    def forward(self, input_ids=None, position_ids=None, **kwargs):
        kwargs = {k: v for k, v in kwargs.items() if not k.startswith(("cu_seq_lens", "max_length"))}
        return super().forward(input_ids=input_ids, **kwargs)


def test_a_model_that_attends_across_rows_is_refused(tiny_assets):
    model = _AttendsAcrossRows.from_pretrained(tiny_assets["model"])
    with pytest.raises(CoatiUsageError, match="does not stay within each packed row"):
        enable_packed_attention(model)


def test_a_model_loaded_with_eager_attention_is_switched_to_sdpa(tiny_assets):
    model = AutoModelForCausalLM.from_pretrained(tiny_assets["model"], attn_implementation="eager")
    enable_packed_attention(model)
    assert model.config._attn_implementation == "sdpa"


def test_token_budget_plan_keeps_ranks_in_step_within_budget_and_covers_every_row():
    lengths = [random.Random(i).randint(10, 100) for i in range(203)]
    samplers = [TokenBudgetBatchSampler(lengths, 300, 2, rank, shuffle=True, seed=3) for rank in range(2)]
    batches = [list(s) for s in samplers]
    assert len(batches[0]) == len(batches[1]) == len(samplers[0])
    for batch in batches[0] + batches[1]:
        assert batch and sum(lengths[i] for i in batch) <= 300
    seen = [i for rank in batches for batch in rank for i in batch]
    assert set(seen) == set(range(203)) and len(seen) - 203 <= 2   # padding only in the last step
    assert sum(lengths) / (300 * 2 * len(batches[0])) > 0.75       # micro-batches are mostly full
    samplers[0].set_epoch(1)
    assert list(samplers[0]) != batches[0]                          # a new order each epoch


def test_token_budget_sampler_resumes_at_the_step_after_the_rows_seen():
    lengths = [random.Random(i).randint(10, 100) for i in range(100)]
    whole = [list(TokenBudgetBatchSampler(lengths, 250, 2, rank, seed=1)) for rank in range(2)]
    seen_by_rank0 = sum(len(b) for b in whole[0][:4])
    for rank in range(2):
        resumed = TokenBudgetBatchSampler(lengths, 250, 2, rank, seed=1)
        resumed.set_start_index(seen_by_rank0)
        assert list(resumed) == whole[rank][4:] and len(resumed) == len(whole[rank]) - 4


def test_a_row_over_the_token_budget_is_refused_by_name():
    with pytest.raises(CoatiUsageError, match="row 1 has 120 tokens"):
        TokenBudgetBatchSampler([50, 120], 100, 1, 0)


def test_row_tokens_counts_both_sides_of_a_pair_cut_to_max_length(tiny_assets):
    data = load_from_disk(str(tiny_assets["pref_train"]))
    counts = row_tokens(data, max_length=40)
    assert counts[0] == min(len(data[0]["chosen_input_ids"]), 40) + min(len(data[0]["rejected_input_ids"]), 40)


def test_a_packed_batch_counts_the_tokens_and_rows_a_padded_one_does(tiny_assets):
    from coati.trainer.callbacks import count_samples_and_tokens

    rows = _rows(tiny_assets["pref_train"])
    padded, packed = PreferenceCollator(0)(rows), PreferenceCollator(0, packing=True)(rows)
    assert count_samples_and_tokens(packed) == count_samples_and_tokens(padded) == (
        6, sum(len(r["chosen_input_ids"]) + len(r["rejected_input_ids"]) for r in rows))


def _rollout_batch(vocab: int):
    """A GRPO-like left-padded batch: 2 prompts (4 and 6 tokens) x 3 completions of 5, 2, 0 / 7, 3, 6 tokens (one
    completion empty, one with a turn it does not train on), prompt width 6, completion width 7."""
    generator = torch.Generator().manual_seed(0)
    prompt_width, width = 6, 7
    prompts = [torch.randint(3, vocab, (4,), generator=generator), torch.randint(3, vocab, (6,), generator=generator)]
    lengths = [[5, 2, 0], [7, 3, 6]]
    rows = sum(len(group) for group in lengths)
    sequences = torch.zeros(rows, prompt_width + width, dtype=torch.long)
    attention = torch.zeros_like(sequences)
    action_mask = torch.zeros(rows, width, dtype=torch.bool)
    row = 0
    for prompt, group in zip(prompts, lengths):
        for length in group:
            sequences[row, prompt_width - prompt.numel():prompt_width] = prompt
            sequences[row, prompt_width:prompt_width + length] = torch.randint(3, vocab, (length,), generator=generator)
            attention[row, prompt_width - prompt.numel():prompt_width + length] = 1
            action_mask[row, :length] = True
            row += 1
    action_mask[3, 2:4] = False   # a tool's turn inside the completion: attended, not trained on
    return sequences, attention, action_mask, prompt_width


def test_pack_rollouts_computes_each_groups_prompt_once():
    from coati.models.packing import pack_rollouts

    sequences, attention, _, prompt_width = _rollout_batch(50)
    packed = pack_rollouts(sequences, attention, prompt_width)
    # group 1: prompt + 5, then branches of 2 and (empty, no piece); group 2: prompt + 7, branches of 3 and 6
    assert packed.inputs["cu_seq_lens_q"].tolist() == [0, 9, 11, 24, 27, 33]
    assert packed.inputs["position_ids"][0, 9:11].tolist() == [4, 5]   # the branch goes on after its 4-token prompt
    assert packed.inputs["input_ids"].numel() == 33 < int(attention.sum())
    # every group's first completion token is read at its prompt's last token, for each of its rows
    assert packed.kept[packed.reads[0:3, 0]].tolist() == [3, 3, 3]
    assert packed.kept[packed.reads[3:6, 0]].tolist() == [16, 16, 16]
    unshared = pack_rollouts(sequences, attention, prompt_width, share_prompts=False)
    assert unshared.inputs["input_ids"].numel() == int(attention.sum())


@pytest.mark.parametrize("share", [True, False], ids=["groups_share_prompts", "rows_apart"])
def test_packed_rl_forwards_match_padded_log_probs_values_losses_and_gradients(tiny_assets, share, monkeypatch):
    """The learning forward's policy loss (with entropy) and its gradients, the old/reference log-probs and the
    critic's values and value loss: packed equal padded to 1e-5 over the tokens that count."""
    from coati.experience.experience import Experience
    from coati.models import critic as critic_module
    from coati.models import logprobs
    from coati.models.critic import action_values, load_critic
    from coati.models.logprobs import action_logps
    from coati.models.loss import PolicyLoss, ValueLoss
    from coati.trainer.components import ObjectiveConfig, PolicyGradient

    for module in (logprobs, critic_module):   # FlashAttention-2 (not on this CPU) packs without shared prompts
        monkeypatch.setattr(module, "shares_prompts", lambda model: share)
    actor = AutoModelForCausalLM.from_pretrained(tiny_assets["model"])
    enable_packed_attention(actor)
    critic = load_critic(str(tiny_assets["model"]), 0)
    enable_packed_attention(critic)
    sequences, attention, action_mask, prompt_width = _rollout_batch(actor.config.vocab_size)
    counted = action_mask.float()
    with torch.no_grad():
        old = action_logps(actor, sequences, attention, prompt_width) - 0.05
    objective = PolicyGradient(ObjectiveConfig(PolicyLoss(), entropy_coef=0.01))
    results = {}
    for packed in (False, True):
        experience = Experience(sequences, attention, action_mask, prompt_width, old, torch.ones(6),
                                torch.linspace(-1, 1, 6)[:, None].expand(6, 7), packed=packed)
        actor.zero_grad()
        output = objective(actor, experience)
        output.loss.backward()
        critic.zero_grad()
        values = action_values(critic, sequences, attention, prompt_width, packed=packed)
        value_loss = ValueLoss()(values, torch.zeros_like(values), torch.ones_like(values), action_mask)
        value_loss.backward()
        with torch.no_grad():
            logps = action_logps(actor, sequences, attention, prompt_width, packed=packed)
        results[packed] = {"loss": output.loss.detach(), "value_loss": value_loss.detach(), "logps": logps * counted,
                           "values": values.detach() * counted, "metrics": output.metrics,
                           "grads": torch.cat([p.grad.flatten() for p in actor.parameters()]),
                           "critic_grads": torch.cat([p.grad.flatten() for p in critic.parameters() if p.grad is not None])}
    padded, packed = results[False], results[True]
    for name in ("loss", "value_loss", "logps", "values"):
        assert torch.allclose(packed[name], padded[name], atol=1e-5), name
    assert packed["metrics"]["policy_entropy"][0] == pytest.approx(padded["metrics"]["policy_entropy"][0], abs=1e-5)
    for name in ("grads", "critic_grads"):
        assert float((packed[name] - padded[name]).norm()) <= 1e-5 * float(padded[name].norm()) + 1e-7, name
    assert float(padded["grads"].norm()) > 0
