"""Logits only where a loss reads them: the LM head sees the label / completion columns only, log-probs and entropies
are taken chunk by chunk, and every number and gradient stays what the full-logits computation gives."""
import pytest
import torch

from coati.dataset.tokenization import IGNORE_INDEX
from coati.models import logprobs
from coati.models.loss import token_entropy
from coati.models.tiny import build_tiny_llama, train_tokenizer


@pytest.fixture(scope="module")
def model():
    from coati.dataset.demo_data import tokenizer_corpus

    tokenizer = train_tokenizer(tokenizer_corpus(100))
    return build_tiny_llama(tokenizer, "tiny", seed=1)


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(logprobs, "LOGP_CHUNK_ROWS", 7)   # many chunks, one of them partial


def _batch(rows: int = 3, width: int = 40, prompt: int = 25):
    torch.manual_seed(0)
    ids = torch.randint(4, 300, (rows, width))
    mask = torch.ones(rows, width, dtype=torch.long)
    labels = ids.clone()
    labels[:, :prompt] = IGNORE_INDEX
    labels[1, :prompt + 4] = IGNORE_INDEX   # rows start their labels at different columns
    labels[2, -3:] = IGNORE_INDEX           # and end them at different columns (right padding)
    mask[2, -3:] = 0
    return ids, mask, labels


def _as_batch(ids, mask, labels):
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _head_widths(model):
    """The sequence lengths the LM head is applied to, recorded by a hook."""
    widths = []
    handle = model.lm_head.register_forward_hook(lambda module, args, out: widths.append(args[0].size(1)))
    return widths, handle


def _grads(model):
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def test_label_logps_match_the_full_logits_and_the_head_sees_labels_only(model, small_chunks):
    ids, mask, labels = _batch()
    model.zero_grad()
    logits = model(input_ids=ids, attention_mask=mask).logits
    targets = labels[:, 1:]
    full = (torch.log_softmax(logits[:, :-1], -1).gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
            * (targets != IGNORE_INDEX)).sum(-1)
    full.sum().backward()
    expected_grads = _grads(model).clone()

    model.zero_grad()
    widths, handle = _head_widths(model)
    sums, counts = logprobs.sequence_logps(model, _as_batch(ids, mask, labels))
    sums.sum().backward()
    handle.remove()
    assert torch.allclose(sums, full, atol=1e-5) and counts.tolist() == (targets != IGNORE_INDEX).sum(-1).tolist()
    assert torch.allclose(_grads(model), expected_grads, atol=1e-5)
    assert widths == [40 - 25 + 1]   # the first label column is 25: positions 24..39 reach the head


def test_action_logps_apply_the_head_to_completion_positions_only(model, small_chunks):
    ids, mask, _ = _batch()
    mask[0, :4] = 0   # a left-padded prompt
    positions = logprobs.mask_positions(mask)
    full = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, 29:-1]
    expected = torch.log_softmax(full, -1).gather(-1, ids[:, 30:].unsqueeze(-1)).squeeze(-1)
    widths, handle = _head_widths(model)
    logps, logits = logprobs.action_logps(model, ids, mask, 30, return_logits=True)
    handle.remove()
    assert widths == [11] and logits.shape == (3, 10, full.size(-1))
    assert torch.allclose(logps, expected, atol=1e-5)
    assert torch.allclose(token_entropy(logits), _entropy(full), atol=1e-5)


def _entropy(logits):
    return -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1)


def test_chunked_entropy_and_log_probs_keep_their_gradients(small_chunks):
    torch.manual_seed(2)
    logits = torch.randn(4, 9, 50, requires_grad=True)
    targets = torch.randint(0, 50, (4, 9))
    weights = torch.randn(4, 9)
    value = (logprobs.token_logps(logits, targets) * weights).sum() + (token_entropy(logits) * weights).sum()
    grad, = torch.autograd.grad(value, logits)
    reference = logits.detach().clone().requires_grad_(True)
    expected = ((torch.log_softmax(reference, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1) * weights).sum()
                + (_entropy(reference) * weights).sum())
    expected_grad, = torch.autograd.grad(expected, reference)
    assert torch.allclose(value, expected, atol=1e-4) and torch.allclose(grad, expected_grad, atol=1e-6)


class _NoLogitsToKeep(torch.nn.Module):
    """A causal LM whose forward takes no `logits_to_keep`, as older or custom modelling code."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, attention_mask, position_ids=None):
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)


def test_a_model_without_logits_to_keep_gets_the_same_numbers(model):
    ids, mask, labels = _batch()
    kept, _ = logprobs.sequence_logps(model, _as_batch(ids, mask, labels))
    cut, _ = logprobs.sequence_logps(_NoLogitsToKeep(model), _as_batch(ids, mask, labels))
    assert torch.allclose(kept, cut, atol=1e-6)
    assert _NoLogitsToKeep in logprobs._NO_LOGITS_TO_KEEP
