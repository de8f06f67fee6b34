"""The HF engine: greedy output equals transformers' generate; each row stops at its EOS and what follows
is masked and padded; top-k/top-p/min-p keep only the allowed tokens, and the repetition penalty is transformers'."""
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from coati.dataset import PromptCollator
from coati.models.generation import HFEngine, sample_next
from coati.config import SamplingConfig


class EosBoost(torch.nn.Module):
    """The model with +4 on the EOS logit, so sampled rows end after a few tokens, at different steps."""

    def __init__(self, model, eos: int) -> None:
        super().__init__()
        self.model, self.eos = model, eos

    def forward(self, **inputs):
        out = self.model(**inputs)
        out.logits[..., self.eos] += 4.0
        return out


def _prompts(tokenizer, questions):
    rows = [{"input_ids": tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)}
            for q in questions]
    return PromptCollator(tokenizer.pad_token_id)(rows)


def test_greedy_generation_matches_transformers_and_masks_after_eos(tiny_assets):
    tokenizer = AutoTokenizer.from_pretrained(tiny_assets["model"])
    model = AutoModelForCausalLM.from_pretrained(tiny_assets["model"]).eval()
    batch = _prompts(tokenizer, ["Ann has 3 pens and gets 2 more. How many pens does Ann have now?", "Ben has 9 cards."])
    eos = tokenizer.eos_token_id
    config = SamplingConfig(max_new_tokens=12, do_sample=False)
    plain = HFEngine(model, tokenizer.pad_token_id, [eos]).generate(batch["input_ids"], batch["attention_mask"], config)
    greedy = plain.sequences[0, plain.prompt_length:].tolist()
    first_new = next(i for i in range(1, len(greedy)) if greedy[i] not in greedy[:i])
    stand_in = greedy[first_new]
    with torch.no_grad():                   # EOS now wins wherever `stand_in` would: row 0 stops there
        model.lm_head.weight[eos] = model.lm_head.weight[stand_in] * 1.01
    out = HFEngine(model, tokenizer.pad_token_id, [eos]).generate(batch["input_ids"], batch["attention_mask"], config)
    expected = model.generate(batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=12,
                              do_sample=False, eos_token_id=eos, pad_token_id=tokenizer.pad_token_id)
    completions = out.sequences[:, out.prompt_length:]
    for row in range(2):
        n = int(out.action_mask[row].sum())
        want = expected[row, out.prompt_length:].tolist()
        want = want[: want.index(eos) + 1] if eos in want else want
        assert completions[row, :n].tolist() == want
        assert (completions[row, n:] == tokenizer.pad_token_id).all()
        if n < 12:
            assert completions[row, n - 1].item() == eos
    assert int(out.action_mask[0].sum()) == first_new + 1
    assert torch.equal(out.attention_mask[:, out.prompt_length:], out.action_mask.long())


def test_rows_stop_at_different_lengths(tiny_assets):
    tokenizer = AutoTokenizer.from_pretrained(tiny_assets["model"])
    model = AutoModelForCausalLM.from_pretrained(tiny_assets["model"]).eval()
    batch = _prompts(tokenizer, ["Cat has 4 coins."] * 8)
    torch.manual_seed(0)
    out = HFEngine(EosBoost(model, tokenizer.eos_token_id), tokenizer.pad_token_id, [tokenizer.eos_token_id]).generate(
        batch["input_ids"], batch["attention_mask"], SamplingConfig(max_new_tokens=16, temperature=1.0))
    lengths = out.action_mask.sum(-1)
    stopped = lengths < 16
    assert stopped.any() and len(set(lengths.tolist())) > 1
    for row in stopped.nonzero().squeeze(-1).tolist():
        n = int(lengths[row])
        assert out.sequences[row, out.prompt_length + n - 1].item() == tokenizer.eos_token_id


def test_top_k_and_top_p_keep_only_the_allowed_tokens():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(2000, 1)
    torch.manual_seed(0)
    assert set(sample_next(logits, SamplingConfig(top_k=2)).tolist()) == {0, 1}
    assert set(sample_next(logits, SamplingConfig(top_p=0.7)).tolist()) == {0, 1}      # 0.5 < 0.7, 0.8 >= 0.7
    assert set(sample_next(logits, SamplingConfig(top_p=0.5)).tolist()) == {0}
    assert sample_next(logits[:1], SamplingConfig(do_sample=False)).item() == 0


def test_min_p_keeps_the_tokens_at_least_that_fraction_as_likely_as_the_likeliest():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(2000, 1)
    torch.manual_seed(0)
    assert set(sample_next(logits, SamplingConfig(min_p=0.5)).tolist()) == {0, 1}       # 0.3 >= 0.25 > 0.15
    assert set(sample_next(logits, SamplingConfig(min_p=0.2)).tolist()) == {0, 1, 2}    # 0.15 >= 0.1 > 0.05


def test_the_repetition_penalty_decodes_as_transformers_does(tiny_assets):
    """Greedy decoding with `repetition_penalty` gives transformers' own tokens (its penalty on the prompt's and the
    completion's tokens), which differ from those without it."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_assets["model"])
    model = AutoModelForCausalLM.from_pretrained(tiny_assets["model"]).eval()
    batch = _prompts(tokenizer, ["Ann has 3 pens and gets 2 more. How many pens does Ann have now?"])
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    engine = HFEngine(model, pad, [eos])

    def completion(penalty):
        out = engine.generate(batch["input_ids"], batch["attention_mask"],
                              SamplingConfig(max_new_tokens=16, do_sample=False, repetition_penalty=penalty))
        return out.sequences[0, out.prompt_length:][out.action_mask[0]].tolist()

    expected = model.generate(batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=16,
                              do_sample=False, repetition_penalty=2.0, eos_token_id=eos, pad_token_id=pad)
    want = expected[0, batch["input_ids"].size(1):].tolist()
    assert completion(2.0) == (want[: want.index(eos) + 1] if eos in want else want)
    assert completion(2.0) != completion(1.0)


def test_sampled_log_probs_come_from_the_sampling_forwards_and_match_a_full_forward(tiny_assets):
    """`logprobs=True` reads each sampled token's log-prob off the step's logits (temperature 1, whatever the
    sampling temperature): the same forwards as without, and the values a full forward gives."""
    from coati.models.logprobs import action_logps

    tokenizer = AutoTokenizer.from_pretrained(tiny_assets["model"])
    model = AutoModelForCausalLM.from_pretrained(tiny_assets["model"]).eval()
    batch = _prompts(tokenizer, ["Cat has 4 coins.", "Dan has 7 pens and gets 2 more. How many pens does Dan have now?"] * 3)
    engine = HFEngine(EosBoost(model, tokenizer.eos_token_id), tokenizer.pad_token_id, [tokenizer.eos_token_id])
    calls = []
    model.register_forward_hook(lambda *_: calls.append(1))
    runs = {}
    for with_logprobs in (False, True):
        calls.clear()
        torch.manual_seed(0)
        runs[with_logprobs] = engine.generate(batch["input_ids"], batch["attention_mask"],
                                              SamplingConfig(max_new_tokens=12, temperature=0.7), logprobs=with_logprobs)
        runs[f"calls_{with_logprobs}"] = len(calls)
    out = runs[True]
    assert runs[False].logprobs is None and torch.equal(runs[False].sequences, out.sequences)
    assert runs["calls_True"] == runs["calls_False"]
    with torch.no_grad():
        full = action_logps(EosBoost(model, tokenizer.eos_token_id), out.sequences, out.attention_mask, out.prompt_length)
    assert torch.allclose(out.logprobs, full * out.action_mask, atol=1e-4)
    assert (out.logprobs[~out.action_mask] == 0).all() and (out.logprobs[out.action_mask] < 0).all()


def test_inference_and_logits_forward_batch_sizes_bound_rows_not_results(tiny_assets):
    """`--inference_batch_size` (the engine's `max_batch_rows`) and `--logits_forward_batch_size` (`in_row_chunks`)
    only split the rows: the same tokens, masks and log-probs as all rows at once."""
    from coati.experience.experience import in_row_chunks
    from coati.models.logprobs import action_logps

    tokenizer = AutoTokenizer.from_pretrained(tiny_assets["model"])
    model = AutoModelForCausalLM.from_pretrained(tiny_assets["model"]).eval()
    batch = _prompts(tokenizer, ["Ann has 3 pens.", "Ben has 9 cards and 2 more.", "Cy has 1.", "Di has 4 hats.", "E"])
    config = SamplingConfig(max_new_tokens=8, do_sample=False)
    whole = HFEngine(model, tokenizer.pad_token_id, [tokenizer.eos_token_id]).generate(
        batch["input_ids"], batch["attention_mask"], config, logprobs=True)
    split = HFEngine(model, tokenizer.pad_token_id, [tokenizer.eos_token_id], max_batch_rows=2).generate(
        batch["input_ids"], batch["attention_mask"], config, logprobs=True)
    assert torch.equal(whole.sequences, split.sequences) and torch.equal(whole.action_mask, split.action_mask)
    assert torch.allclose(whole.logprobs, split.logprobs, atol=1e-5)
    with torch.no_grad():
        full = action_logps(model, whole.sequences, whole.attention_mask, whole.prompt_length)
        chunked = in_row_chunks(lambda rows: action_logps(model, whole.sequences[rows], whole.attention_mask[rows],
                                                          whole.prompt_length), whole.sequences.size(0), 2)
    assert torch.allclose(full, chunked, atol=1e-5)


def test_the_sync_probe_compares_an_engines_scores_with_the_trainers(tiny_assets):
    """The trainer's log-probs of the probe are its model's own (checked against a batched forward); a check passes on
    scores within the tolerance, and stops one line on scores that differ or that did not move with the trainer's."""
    import pytest

    from coati.rollout.probe import EngineSyncError, SyncProbe

    model = AutoModelForCausalLM.from_pretrained(tiny_assets["model"]).eval()
    sequences = [[1, 5, 9, 14, 3], [1, 7, 2]]
    probe = SyncProbe(sequences)
    first = probe.check(model, 1)
    with torch.no_grad():
        logps = torch.log_softmax(model(input_ids=torch.tensor([sequences[0]])).logits[0, :-1], -1)
    assert first.expected[0] == pytest.approx(logps.gather(-1, torch.tensor(sequences[0][1:])[:, None])[:, 0].tolist(),
                                              abs=1e-6)
    assert len(first.expected[1]) == 2 and first.tolerance == 1e-3   # fp32's default
    assert first.verify([[x + 5e-4 for x in row] for row in first.expected], None) == pytest.approx(5e-4, rel=1e-3)
    with pytest.raises(EngineSyncError, match=r"^the engine does not serve weights version 1: .* by 0.01 on average "
                                              r"\(--engine_probe_tolerance 0.001\)$"):
        first.verify([[x - 0.01 for x in row] for row in first.expected], None)
    with torch.no_grad():
        model.lm_head.weight.mul_(1.0001)
    second = probe.check(model, 2)
    assert second.previous == first.expected and second.expected != first.expected
    with pytest.raises(EngineSyncError, match="did not load weights version 2"):
        second.verify(first.expected, first.expected)   # within tolerance, but exactly the old version's scores
    assert second.verify(second.expected, first.expected) == 0.0
