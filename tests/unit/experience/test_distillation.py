"""On-policy distillation: the top-k forward KL and GKD losses against hand-computed values, the reverse-KL
advantages, the refusal of a term that is identically zero and of a teacher with another vocabulary, a served teacher
scoring as the teacher in the trainer (GRPO and PPO distilling under torchrun: e2e/test_distillation_e2e.py)."""
import math
from dataclasses import replace

import pytest
import torch

from coati.experience.distillation import (DistillationError, DistillConfig, ModelTeacher, ServedTeacher, Teacher,
                                           SAME_SCORES_ATOL, check_served_vocabulary, check_teacher_differs, check_vocabulary,
                                           served_model_name)
from coati.models.tiny import train_tokenizer
from coati.experience.experience import Experience
from coati.models.loss import forward_kl_topk, generalized_jsd
from coati.trainer.components import DistillTerm
from support import teacher_model as _teacher_model

TEACHER = [0.5, 0.3]
"""The teacher's probabilities of its two likeliest tokens at one position (0.2 elsewhere); the student's: 0.2, 0.4."""
STUDENT = [0.2, 0.4]


def _kl(p, q):
    return sum(a * math.log(a / b) for a, b in zip(p, q))


def _renormalised(p):
    return [v / sum(p) for v in p]


def test_forward_kl_and_gkd_on_the_teachers_top_k_equal_hand_computed_values():
    t, s = _renormalised(TEACHER), _renormalised(STUDENT)   # [0.625, 0.375], [1/3, 2/3]
    teacher = torch.tensor([[TEACHER]]).log()
    student = torch.tensor([[STUDENT]]).log()
    assert forward_kl_topk(student, teacher).item() == pytest.approx(_kl(t, s), rel=1e-5)
    beta = 0.3
    m = [beta * a + (1 - beta) * b for a, b in zip(t, s)]
    assert generalized_jsd(student, teacher, beta).item() == pytest.approx(beta * _kl(t, m) + (1 - beta) * _kl(s, m),
                                                                           rel=1e-5)
    assert generalized_jsd(student, teacher, 0.0).item() == pytest.approx(_kl(t, s), rel=1e-5)
    assert generalized_jsd(student, teacher, 1.0).item() == pytest.approx(_kl(s, t), rel=1e-5)
    assert forward_kl_topk(teacher, teacher).item() == pytest.approx(0.0, abs=1e-7)


def _experience(student_logps, teacher_logps, mask, advantages):
    rows, n = student_logps.shape
    return Experience(torch.zeros(rows, n + 2, dtype=torch.long), torch.ones(rows, n + 2, dtype=torch.long), mask, 2,
                      student_logps, torch.zeros(rows), advantages, teacher_log_probs=teacher_logps)


def test_reverse_kl_is_added_to_each_tokens_advantage():
    student = torch.tensor([[-1.0, -2.0, -0.5], [-0.1, -3.0, -9.0]])
    teacher = torch.tensor([[-1.5, -1.0, -0.5], [-0.3, -1.0, -1.0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    before = _experience(student, teacher, mask, torch.tensor([0.5, -1.0]))
    experience = Teacher(DistillConfig(coef=2.0), 10).with_advantages(before)
    assert torch.equal(before.advantages, torch.tensor([0.5, -1.0])) and not before.rollout_stats   # left as it was
    expected = torch.tensor([[0.5 - 2 * 0.5, 0.5 - 2 * -1.0, 0.5 - 0.0], [-1.0 - 2 * 0.2, -1.0 - 2 * -2.0, 0.0]])
    assert torch.allclose(experience.advantages, expected)
    assert experience.rollout_stats["distill_reverse_kl"] == pytest.approx([(0.5 - 1.0 + 0.0) / 3, (0.2 - 2.0) / 2])


def test_a_term_within_the_tolerance_on_every_token_stops_and_one_beyond_it_passes():
    mask = torch.tensor([[True, True, False]])
    with pytest.raises(DistillationError, match=r"the distillation term is zero on every one of the 2 sampled tokens "
                                                r"in this batch: the teacher's log-probs are within 0.0001 of the "
                                                r"policy's \(at most 5e-05 apart\).* Is --teacher_model the policy "
                                                r"itself\?"):
        check_teacher_differs(torch.tensor([[0.0, 5e-5, 0.7]]) * mask, mask, 1e-4)
    check_teacher_differs(torch.tensor([[0.0, 2e-4, 0.0]]), mask, 1e-4)
    check_teacher_differs(torch.tensor([[0.0, 0.0, 0.0]]), torch.zeros_like(mask), 1e-4)   # no sampled token: no verdict


def test_a_teacher_one_ulp_from_the_policy_on_every_token_is_refused_and_a_distinct_one_is_not():
    """Two forwards of one model may round differently (another process or batch layout): a teacher whose log-probs
    are one ulp from the policy's is the policy all the same (the old exact check let it train on nothing)."""
    student = torch.tensor([[-1.0, -2.5, -0.3], [-4.0, -0.01, -7.0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    one_ulp = torch.nextafter(student, torch.full_like(student, -math.inf))
    assert (student - one_ulp).abs().min() > 0
    with pytest.raises(DistillationError, match=r"within 0.05 of the policy's"):   # a served teacher: bf16's tolerance
        Teacher(DistillConfig(), 10).token_rewards(_experience(student, one_ulp, mask, torch.zeros(2)))
    model_teacher = ModelTeacher(torch.nn.Linear(2, 2), DistillConfig(), 10)
    assert SAME_SCORES_ATOL[model_teacher.dtype] == 1e-4
    with pytest.raises(DistillationError, match=r"within 0.0001 of the policy's"):
        model_teacher.token_rewards(_experience(student, one_ulp, mask, torch.zeros(2)))
    distinct = student + torch.tensor([[0.0, 0.0, 0.0], [0.0, 3e-4, 0.0]])
    rewards, _ = model_teacher.token_rewards(_experience(student, distinct, mask, torch.zeros(2)))
    assert rewards[1, 1].item() == pytest.approx(3e-4, rel=1e-3)


def test_a_teacher_with_another_vocabulary_is_refused_in_one_line():
    check_vocabulary(None, {"a": 0}, "T")
    check_vocabulary({"a": 0, "b": 1}, {"a": 0, "b": 1}, "T")
    with pytest.raises(DistillationError, match=r"--teacher_model T: its tokenizer's vocabulary differs from the "
                                                r"policy's \(2 vs 2 tokens; 'b' is 2 there and 1 here\)"):
        check_vocabulary({"a": 0, "b": 2}, {"a": 0, "b": 1}, "T")


def test_the_distillation_loss_reads_the_students_logits_at_the_teachers_top_k_and_pulls_towards_the_teacher():
    logits = torch.tensor([[[2.0, 1.0, 0.0, -1.0]]], requires_grad=True)
    top_ids = torch.tensor([[[2, 0]]])
    top_logps = torch.tensor([[TEACHER]]).log()
    experience = replace(_experience(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1, dtype=torch.bool),
                                     torch.zeros(1)), teacher_top_ids=top_ids, teacher_top_logps=top_logps)
    term = DistillTerm("forward_kl_topk", coef=3.0)
    loss, metrics = term(experience, torch.zeros(1, 1), torch.ones(1, 1), lambda values, mask: values.mean(),
                         logits=logits)
    student = torch.log_softmax(logits.detach(), -1)[0, 0, [2, 0]].exp().tolist()
    assert metrics["loss/distill"][0] == pytest.approx(_kl(_renormalised(TEACHER), _renormalised(student)), rel=1e-5)
    assert loss.item() == pytest.approx(3 * metrics["loss/distill"][0], rel=1e-6)
    loss.backward()
    assert logits.grad[0, 0, 2] < 0 < logits.grad[0, 0, 0]   # token 2 (the teacher's likeliest) is pushed up


def _padded_experience(vocab):
    """Two rows as experience holds them: prompts left-padded to 5 columns, completions right-padded to 4, the first
    with an attended token that does not count (a tool's output) and the second ending early."""
    g = torch.Generator().manual_seed(0)
    sequences = torch.randint(3, vocab, (2, 9), generator=g)
    attention = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 0, 0]])
    action_mask = torch.tensor([[1, 1, 0, 1], [1, 1, 0, 0]], dtype=torch.bool)
    return Experience(sequences * attention, attention, action_mask, 5, None, torch.zeros(2), torch.zeros(2))


def test_a_served_teacher_scores_as_the_teacher_in_the_trainer(tiny_assets, tmp_path, monkeypatch, endpoint):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from coati.inference.local_judge import JudgeServerConfig, LocalJudge

    folder = _teacher_model(tiny_assets, tmp_path / "teacher")
    vocab, config = len(AutoTokenizer.from_pretrained(folder)), DistillConfig(top_k=4)
    padded = _padded_experience(vocab)
    in_trainer = replace(padded, **ModelTeacher(AutoModelForCausalLM.from_pretrained(folder).eval(), config, vocab).scores(
        padded, lambda forward, e: forward(slice(None))))
    local = LocalJudge(JudgeServerConfig(str(folder))).start()
    try:
        monkeypatch.setenv("COATI_TEACHER_TOKEN", local.token)
        assert served_model_name(local.url) == "judge"
        with pytest.raises(DistillationError, match=r"HTTP 404.*give the API's base, which for vLLM ends in /v1"):
            served_model_name(local.url.removesuffix("/v1"))
        policy = AutoTokenizer.from_pretrained(folder)
        assert check_served_vocabulary(local.url, "judge", policy)
        other = train_tokenizer(["a different corpus, with other words: zebra, quartz, jump!"] * 20, vocab_size=300)
        with pytest.raises(DistillationError, match=r"splits a text of the policy's tokens into other ids"):
            check_served_vocabulary(local.url, "judge", other)
        served = [replace(padded, **ServedTeacher(local.url, config, vocab, "judge", batch_size).scores(padded, None))
                  for batch_size in (16, 1)]
    finally:
        local.close()
    counted = in_trainer.action_mask
    for experience in served:
        assert torch.allclose(experience.teacher_log_probs[counted], in_trainer.teacher_log_probs[counted], atol=1e-5)
        assert torch.equal(experience.teacher_top_ids[counted], in_trainer.teacher_top_ids[counted])
        on_support = [x[counted].log_softmax(-1) for x in (experience.teacher_top_logps, in_trainer.teacher_top_logps)]
        assert torch.allclose(*on_support, atol=1e-5)
    _, url = endpoint(answer="Score: 3")
    assert not check_served_vocabulary(url, "judge", AutoTokenizer.from_pretrained(folder))   # no token ids: no check
    with pytest.raises(DistillationError, match=r"teacher .* answered without prompt_logprobs in its choices"):
        ServedTeacher(url, config, vocab, "judge", retries=0).scores(_padded_experience(vocab), None)
