"""Tiny vision-language models under coati's losses: the batch's pixels are the processor's own (the loss equals
transformers' on the processor's inputs), the images reach the model, and what trains is what the flags say."""
import re

import pytest
import torch
from datasets import load_from_disk
from transformers import AutoModelForImageTextToText

from coati.dataset.collators import ImageBatches, PreferenceCollator, SupervisedCollator
from coati.dataset.prepare import prepare_dataset
from coati.dataset.tokenization import IGNORE_INDEX, load_tokenizer
from coati.dataset.vision import ImageProcessing, decode_image
from coati.models.logprobs import model_label_logps, pair_sequence_logps, sequence_logps
from coati.models.tiny import VISION_TOKENS
from coati.models.vision import (freeze_unused_vision_layers, freeze_vision_parts, is_vision_model,
                                 language_model_lora_targets)

STYLES = ("qwen2_5_vl", "llava")


def _prepared(assets, style, data_type, folder):
    images = ImageProcessing.load(str(assets[style]), load_tokenizer(str(assets[style])))
    prepare_dataset([assets["sft" if data_type == "sft" else "preference"]], data_type, images.processor.tokenizer, 256,
                    folder, images=images)
    return images, list(load_from_disk(str(folder)))


@pytest.mark.parametrize("style", STYLES)
def test_sft_loss_on_a_batch_equals_transformers_loss_on_the_processors_inputs(vision_assets, style, tmp_path):
    images, rows = _prepared(vision_assets, style, "sft", tmp_path / "sft")
    model = AutoModelForImageTextToText.from_pretrained(vision_assets[style]).eval()
    collate = ImageBatches(SupervisedCollator(images.processor.tokenizer.pad_token_id), images)
    batch = collate(rows[:4])
    with torch.no_grad():
        logps, mask = model_label_logps(model, batch)
        ours = (-logps.sum() / mask.sum()).item()
        texts = [images.processor.tokenizer.decode(row["input_ids"]) for row in rows[:4]]
        placeholder = images.processor.tokenizer.convert_ids_to_tokens(images.image_token_id)
        one_each = [re.sub(f"(?:{re.escape(placeholder)})+", placeholder, text) for text in texts]
        inputs = images.processor(text=one_each, images=[decode_image(row["images"][0]) for row in rows[:4]],
                                  padding=True, return_tensors="pt")
        assert torch.equal(inputs["input_ids"], batch["input_ids"])   # the processor expands them as preparation did
        theirs = model(**inputs, labels=batch["labels"]).loss.item()
    assert ours == pytest.approx(theirs, rel=1e-5)
    assert (batch["labels"][batch["input_ids"] == images.image_token_id] == IGNORE_INDEX).all()

    other = dict(rows[0], images=rows[1]["images"])   # the same text with another image: the image reaches the model
    with torch.no_grad():
        first = sequence_logps(model, collate([rows[0]]))[0]
        swapped = sequence_logps(model, collate([other]))[0]
    assert not torch.allclose(first, swapped)


def test_a_preference_batch_scores_both_sides_with_the_rows_pixels(vision_assets, tmp_path):
    images, rows = _prepared(vision_assets, "qwen2_5_vl", "preference", tmp_path / "pref")
    model = AutoModelForImageTextToText.from_pretrained(vision_assets["qwen2_5_vl"]).eval()
    pad = images.processor.tokenizer.pad_token_id
    batch = ImageBatches(PreferenceCollator(pad), images)(rows[:3])
    with torch.no_grad():
        together, _ = pair_sequence_logps(model, batch)
        for side, offset in (("chosen", 0), ("rejected", 3)):
            alone = ImageBatches(SupervisedCollator(pad), images)(
                [{"input_ids": r[f"{side}_input_ids"], "labels": r[f"{side}_labels"], "images": r["images"]} for r in rows[:3]])
            assert torch.allclose(together[offset:offset + 3], sequence_logps(model, alone)[0], atol=1e-5)


def test_frozen_parts_and_lora_targets_keep_to_what_the_flags_name(vision_assets):
    assert is_vision_model(vision_assets["llava"]) and not is_vision_model(vision_assets["llava"] / "missing")
    qwen = AutoModelForImageTextToText.from_pretrained(vision_assets["qwen2_5_vl"])
    tower = sum(p.numel() for n, p in qwen.named_parameters() if n.startswith("visual.") and ".merger." not in n)
    merger = sum(p.numel() for n, p in qwen.named_parameters() if n.startswith("visual.merger."))
    assert freeze_vision_parts(qwen, vision_tower=True, projector=False) == tower
    assert all(p.requires_grad for n, p in qwen.named_parameters() if n.startswith("visual.merger."))
    assert freeze_vision_parts(qwen, vision_tower=False, projector=True) == merger
    assert all(p.requires_grad for n, p in qwen.named_parameters() if not n.startswith("visual."))
    assert freeze_unused_vision_layers(qwen) == 0

    llava = AutoModelForImageTextToText.from_pretrained(vision_assets["llava"])
    norm = sum(p.numel() for p in llava.vision_tower.vision_model.post_layernorm.parameters())
    assert freeze_unused_vision_layers(llava) == norm   # it reads the last layer's output, before the final norm
    llava.config.vision_feature_layer = -2   # LLaVA-1.5's choice: the last layer is never read either
    last = sum(p.numel() for p in llava.vision_tower.vision_model.encoder.layers[-1].parameters())
    assert freeze_unused_vision_layers(llava) == norm + last

    pattern = language_model_lora_targets(llava, ["all-linear"])
    linear = [n for n, m in llava.named_modules() if isinstance(m, torch.nn.Linear)]
    chosen = [n for n in linear if re.fullmatch(pattern, n)]
    assert chosen and all(n.startswith("language_model.model.layers.") for n in chosen)
    assert "language_model.lm_head" not in chosen
    assert len(chosen) == 2 * 7   # two layers: q, k, v, o, gate, up, down
    assert [n for n in linear if re.fullmatch(language_model_lora_targets(llava, ["q_proj"]), n)] == [
        "language_model.model.layers.0.self_attn.q_proj", "language_model.model.layers.1.self_attn.q_proj"]


@pytest.mark.parametrize("style", STYLES)
def test_the_engine_generates_from_image_prompts_as_transformers_does(vision_assets, style, tmp_path):
    """Greedy tokens of `HFEngine` (its own positions: Qwen2-VL's 3-D rotary ones) equal `model.generate`'s on left-padded
    image prompts of different lengths, and `action_logps` of the result equals transformers' own forward; an image
    placeholder token is never sampled, however likely."""
    from coati.config import SamplingConfig
    from coati.models.generation import HFEngine
    from coati.models.logprobs import action_logps, mask_positions
    from coati.models.vision import joined_image_inputs

    images = ImageProcessing.load(str(vision_assets[style]), load_tokenizer(str(vision_assets[style])))
    prepare_dataset([vision_assets["prompt"]], "prompt", images.processor.tokenizer, 256, tmp_path / "prompts",
                    images=images)
    rows = list(load_from_disk(str(tmp_path / "prompts")))[:3]
    rows[1]["input_ids"] = rows[1]["input_ids"][:-3] + rows[1]["input_ids"][-2:]   # one token shorter: left padding
    model = AutoModelForImageTextToText.from_pretrained(vision_assets[style]).eval()
    with torch.no_grad():
        for param in model.parameters():   # weights that make different rows say different things
            if param.dim() > 1:
                param.normal_(0, 0.5)
    pad = images.processor.tokenizer.pad_token_id
    width = max(len(r["input_ids"]) for r in rows)
    ids = torch.tensor([[pad] * (width - len(r["input_ids"])) + r["input_ids"] for r in rows])
    mask = torch.tensor([[0] * (width - len(r["input_ids"])) + [1] * len(r["input_ids"]) for r in rows])
    per_row = [images.pixel_inputs(r["images"]) for r in rows]
    engine = HFEngine(model, pad, [])
    out = engine.generate(ids, mask, SamplingConfig(max_new_tokens=6, do_sample=False), images=per_row)
    pixels = joined_image_inputs(per_row)
    expected = model.generate(input_ids=ids, attention_mask=mask, **pixels, max_new_tokens=6, do_sample=False,
                              eos_token_id=None, pad_token_id=pad)
    assert torch.equal(out.sequences[:, width:], expected[:, width:])
    with torch.no_grad():
        ours = action_logps(model, out.sequences, out.attention_mask, width, images=pixels)
        logits = model(input_ids=out.sequences, attention_mask=out.attention_mask, **pixels,
                       **({} if style == "qwen2_5_vl" else {"position_ids": mask_positions(out.attention_mask)})).logits
        theirs = logits[:, width - 1:-1].log_softmax(-1).gather(-1, out.sequences[:, width:, None]).squeeze(-1)
    assert torch.allclose(ours, theirs, atol=1e-5)

    markers = VISION_TOKENS[:4] if style == "qwen2_5_vl" else ["<image>"]
    special = images.processor.tokenizer.convert_tokens_to_ids(markers)
    with torch.no_grad():   # the image token and its markers made the likeliest next tokens everywhere
        model.get_output_embeddings().bias = torch.nn.Parameter(torch.zeros(model.get_output_embeddings().out_features))
        model.get_output_embeddings().bias[special] = 1e4
    sampled = engine.generate(ids, mask, SamplingConfig(max_new_tokens=4, do_sample=True), images=per_row)
    assert not torch.isin(sampled.sequences[:, width:], torch.tensor(special)).any()
    with torch.no_grad():   # Qwen's positions read a vision-start token as an image's: a completion ending in one failed
        assert action_logps(model, sampled.sequences, sampled.attention_mask, width, images=pixels).isfinite().all()


def test_held_out_evaluation_reads_the_prompts_images(vision_assets, tmp_path):
    """`evaluate_model` (the demos' held-out accuracy) loads a vision-language folder with its processor and generates
    from each prompt with its image, in single-turn and in tool episodes."""
    from coati.rollout.evaluation import evaluate_model

    images = ImageProcessing.load(str(vision_assets["qwen2_5_vl"]), load_tokenizer(str(vision_assets["qwen2_5_vl"])))
    prepare_dataset([vision_assets["prompt"]], "prompt", images.processor.tokenizer, 256, tmp_path / "prompts",
                    images=images)
    result = evaluate_model(str(vision_assets["qwen2_5_vl"]), [str(tmp_path / "prompts")], ["math_answer"], 4)
    assert len(result.samples) == 32 and 0 <= result.components["math_answer"] <= 1
    assert all("<|image_pad|>" not in sample["completion"] for sample in result.samples)
    with_tools = evaluate_model(str(vision_assets["qwen2_5_vl"]), [str(tmp_path / "prompts")], ["math_answer"], 4,
                                tools=["calculator"], max_turns=2)   # the prompts rendered again with the tools
    assert len(with_tools.samples) == 32 and "environment" in with_tools.components


def test_a_tool_episode_on_an_image_prompt_generates_and_trains_every_turn_with_the_image(vision_assets, tmp_path):
    """With tools, the prompt is rendered again (the tools' system turn first): its image tokens are expanded as
    preparation counted them, so the model's image features fill them; every turn of the episode is generated with
    the row's pixels; the trained sample carries them, and the learner's log-probs of the multi-turn sequence equal
    transformers' own forward with the pixels (and differ without them)."""
    from coati.config import SamplingConfig
    from coati.dataset.collators import IMAGE_INPUTS, PromptRows
    from coati.experience.experience import collate
    from coati.experience.scorer import Scorer
    from coati.models.generation import HFEngine
    from coati.models.logprobs import action_logps
    from coati.models.vision import joined_image_inputs
    from coati.rewards import WeightedReward
    from coati.rollout.chat import ChatTokens
    from coati.rollout.environment import EnvStep, Environment
    from coati.rollout import LocalPool, run_episodes
    from coati.rollout.multiturn import MultiTurnWorkflow
    from coati.rollout.tools import resolve_tools, tool_schemas

    class Answering(Environment):
        def step(self, turn):
            return EnvStep([{"role": "tool", "name": "calculator", "content": "12"}])

    class Recording(LocalPool):
        def __init__(self, engine):
            super().__init__(engine)
            self.requests = []

        async def agenerate(self, prompt_ids, config, n, session=None, seat=None, image_inputs=None):
            self.requests.append((list(prompt_ids), image_inputs))
            return await super().agenerate(prompt_ids, config, n, session, seat, image_inputs)

    images = ImageProcessing.load(str(vision_assets["qwen2_5_vl"]), load_tokenizer(str(vision_assets["qwen2_5_vl"])))
    tokenizer = images.processor.tokenizer
    prepare_dataset([vision_assets["prompt"]], "prompt", tokenizer, 256, tmp_path / "prompts", images=images)
    rows = PromptRows(images=images)(list(load_from_disk(str(tmp_path / "prompts")))[:2])
    model = AutoModelForImageTextToText.from_pretrained(vision_assets["qwen2_5_vl"]).eval()
    closer = tokenizer.convert_tokens_to_ids("<|im_end|>")
    head = model.get_output_embeddings()
    with torch.no_grad():   # weights that read the image, and turns that end at once: three turns an episode
        for param in model.parameters():
            if param.dim() > 1:
                param.normal_(0, 0.5)
        head.bias = torch.nn.Parameter(torch.zeros(head.out_features))
        head.bias[closer] = 1e4
    pool = Recording(HFEngine(model, tokenizer.pad_token_id, [closer]))
    chat = ChatTokens(tokenizer, [closer], tool_schemas(resolve_tools(["calculator"])), images=images)
    workflow = MultiTurnWorkflow(Scorer(tokenizer, WeightedReward.from_specs(["math_answer"])), chat, Answering,
                                 SamplingConfig(max_new_tokens=4, do_sample=False), 2, 3, 0)
    trajectories = run_episodes(workflow, pool, rows)

    image_token = images.image_token_id
    for row, trajectory in zip(rows, trajectories):
        prompt = trajectory.samples[0].prompt_ids
        assert prompt.count(image_token) == row["input_ids"].count(image_token) > 0
        assert "calculator" in tokenizer.decode(prompt[:prompt.index(image_token)])   # the tools come first
        assert trajectory.rollout_stats["turns"] == [3.0, 3.0]
        assert all(s.image_inputs is row[IMAGE_INPUTS] for s in trajectory.samples)
    asked = {id(pixels) for _, pixels in pool.requests}
    assert len(pool.requests) == 2 + 2 * 2 * 2 and asked == {id(row[IMAGE_INPUTS]) for row in rows}   # every turn

    samples = [s for t in trajectories for s in t.samples]
    batch = collate(samples, tokenizer.pad_token_id)
    pixels = joined_image_inputs([s.image_inputs for s in samples])
    with torch.no_grad():
        head.bias.zero_()
        ours = action_logps(model, batch.sequences, batch.attention_mask, batch.prompt_length, images=pixels)
        logits = model(input_ids=batch.sequences, attention_mask=batch.attention_mask, **pixels).logits
        theirs = logits[:, batch.prompt_length - 1:-1].log_softmax(-1).gather(
            -1, batch.sequences[:, batch.prompt_length:, None]).squeeze(-1)
        text_logits = model(input_ids=batch.sequences, attention_mask=batch.attention_mask).logits
        blind = text_logits[:, batch.prompt_length - 1:-1].log_softmax(-1).gather(
            -1, batch.sequences[:, batch.prompt_length:, None]).squeeze(-1)
    mask = batch.action_mask
    assert mask.sum() == 3 * len(samples)
    assert torch.allclose(ours[mask], theirs[mask], atol=1e-5)
    assert not torch.allclose(ours[mask], blind[mask], atol=1e-3)


def test_ray_generators_generate_from_image_prompts_whole_and_in_partial_chunks(vision_assets, tmp_path):
    """Asynchronous GRPO's Ray generators load the vision-language model and generate from each request's pixels:
    greedy tokens, in one piece and in partial-rollout chunks, equal transformers' `generate` with the pixels (and
    differ from it without them)."""
    import asyncio

    import ray

    from coati.config import SamplingConfig
    from coati.dataset.collators import IMAGE_INPUTS, PromptRows
    from coati.rollout import GeneratorPool

    images = ImageProcessing.load(str(vision_assets["qwen2_5_vl"]), load_tokenizer(str(vision_assets["qwen2_5_vl"])))
    tokenizer = images.processor.tokenizer
    prepare_dataset([vision_assets["prompt"]], "prompt", tokenizer, 256, tmp_path / "prompts", images=images)
    row = PromptRows(images=images)(list(load_from_disk(str(tmp_path / "prompts")))[:1])[0]
    model = AutoModelForImageTextToText.from_pretrained(vision_assets["qwen2_5_vl"]).eval()
    torch.manual_seed(0)
    with torch.no_grad():   # weights that read the image
        for param in model.parameters():
            if param.dim() > 1:
                param.normal_(0, 0.5)
    ids = torch.tensor([row["input_ids"]])

    def transformers_greedy(**pixels):
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **pixels, max_new_tokens=6,
                             do_sample=False, eos_token_id=None, pad_token_id=tokenizer.pad_token_id)
        return out[0, ids.size(1):].tolist()

    with torch.no_grad():
        expected = transformers_greedy(**row[IMAGE_INPUTS])
        assert expected != transformers_greedy()
    pool = GeneratorPool(str(vision_assets["qwen2_5_vl"]), tokenizer.pad_token_id, [], num_generators=1)
    try:
        pool.publish(model.state_dict(), 1).result(timeout=120)
        greedy = SamplingConfig(max_new_tokens=6, do_sample=False)
        whole = asyncio.run(pool.agenerate(row["input_ids"], greedy, 1, image_inputs=row[IMAGE_INPUTS]))
        pool.chunk_tokens = 2
        chunked = asyncio.run(pool.agenerate(row["input_ids"], greedy, 1, image_inputs=row[IMAGE_INPUTS]))
    finally:
        pool.shutdown()
        ray.shutdown()
    assert whole.rows[0].token_ids == expected and chunked.rows[0].token_ids == expected


def _left_padded_image_prompts(vision_assets, tmp_path):
    """Two prepared image prompts of the tiny Qwen2.5-VL, left-padded (the second one token shorter), with each row's
    image inputs, and the pad id."""
    from coati.dataset.collators import IMAGE_INPUTS, PromptRows

    images = ImageProcessing.load(str(vision_assets["qwen2_5_vl"]), load_tokenizer(str(vision_assets["qwen2_5_vl"])))
    pad = images.processor.tokenizer.pad_token_id
    prepare_dataset([vision_assets["prompt"]], "prompt", images.processor.tokenizer, 256, tmp_path / "prompts",
                    images=images)
    rows = PromptRows(images=images)(list(load_from_disk(str(tmp_path / "prompts")))[:2])
    rows[1]["input_ids"] = rows[1]["input_ids"][:-3] + rows[1]["input_ids"][-2:]   # one token shorter: left padding
    width = max(len(r["input_ids"]) for r in rows)
    ids = torch.tensor([[pad] * (width - len(r["input_ids"])) + r["input_ids"] for r in rows])
    mask = torch.tensor([[0] * (width - len(r["input_ids"])) + [1] * len(r["input_ids"]) for r in rows])
    return ids, mask, [r[IMAGE_INPUTS] for r in rows], pad


def _with_shared_random_weights(model, backbone=None):
    """Give `model` (and the image-text `backbone`, where given) the same large random weights, the LM head apart, so
    that what the image contributes is far above float noise."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() > 1 and "lm_head" not in name:
                param.normal_(0, 0.5)
                if backbone is not None:
                    backbone.get_parameter(name).copy_(param)


def _last_hidden(backbone, ids, mask, pixels=None):
    return backbone(input_ids=ids, attention_mask=mask, **(pixels or {}), output_hidden_states=True).hidden_states[-1]


def test_a_vision_language_critic_reads_the_images_with_a_value_head_on_the_policys_backbone(vision_assets, tmp_path):
    """PPO's critic of a vision-language policy is its image-text model with a one-output head in place of the LM
    head: its values on left-padded image prompts are that head on transformers' own last hidden states (3-D
    positions and all), they depend on the pixels, and the head is not tied to the embeddings."""
    from coati.models.critic import action_values, load_critic
    from coati.models.vision import joined_image_inputs

    ids, mask, row_images, pad = _left_padded_image_prompts(vision_assets, tmp_path)
    pixels = joined_image_inputs(row_images)
    critic = load_critic(str(vision_assets["qwen2_5_vl"]), pad).eval()
    backbone = AutoModelForImageTextToText.from_pretrained(vision_assets["qwen2_5_vl"]).eval()
    _with_shared_random_weights(critic, backbone)
    with torch.no_grad():
        values = action_values(critic, ids, mask, 1, images=pixels)
        expected = critic.get_output_embeddings()(_last_hidden(backbone, ids, mask, pixels)).squeeze(-1)[:, :-1]
        blind = critic.get_output_embeddings()(_last_hidden(backbone, ids, mask)).squeeze(-1)[:, :-1]
    assert critic.get_output_embeddings().weight.shape == (1, backbone.config.hidden_size)
    assert not critic.config.tie_word_embeddings
    real = mask[:, :-1].bool()
    assert torch.allclose(values[real], expected[real], atol=1e-4)
    assert not torch.allclose(values[real], blind[real], atol=1e-3)


def test_a_vision_language_reward_model_scores_with_the_images_and_loads_back_with_its_head(vision_assets, tmp_path,
                                                                                            capsys):
    """A reward model of a vision-language model is its image-text model with a one-output head: the reward of a
    left-padded image row is that head on transformers' last hidden state of the row's last token, with the pixels;
    saved, it loads back with its head (no new weights said), as a reward model and as PPO's critic (ColossalChat
    starts the critic from the reward model); the scorer of rollouts passes each sample's pixels."""
    from coati.experience.experience import RolloutSample
    from coati.experience.scorer import REWARD_MODEL, Scorer
    from coati.models.critic import load_critic
    from coati.models.reward_model import load_reward_model, sequence_rewards
    from coati.models.vision import joined_image_inputs

    ids, mask, row_images, pad = _left_padded_image_prompts(vision_assets, tmp_path)
    pixels = joined_image_inputs(row_images)
    model = load_reward_model(str(vision_assets["qwen2_5_vl"]), pad).eval()
    assert "lm_head.weight start from random weights" in capsys.readouterr().err
    backbone = AutoModelForImageTextToText.from_pretrained(vision_assets["qwen2_5_vl"]).eval()
    _with_shared_random_weights(model, backbone)
    head = model.get_output_embeddings()
    with torch.no_grad():
        rewards = sequence_rewards(model, ids, mask, pixels)
        expected = head(_last_hidden(backbone, ids, mask, pixels)[:, -1]).squeeze(-1)
        blind = head(_last_hidden(backbone, ids, mask)[:, -1]).squeeze(-1)
    assert head.weight.shape == (1, backbone.config.hidden_size) and not model.config.tie_word_embeddings
    assert torch.allclose(rewards, expected, atol=1e-4) and not torch.allclose(rewards, blind, atol=1e-3)

    model.save_pretrained(tmp_path / "rm")
    reloaded = load_reward_model(str(tmp_path / "rm"), pad).eval()
    critic = load_critic(str(tmp_path / "rm"), pad)
    assert "random weights" not in capsys.readouterr().err
    with torch.no_grad():
        assert torch.allclose(sequence_rewards(reloaded, ids, mask, pixels), rewards, atol=1e-5)
    assert torch.equal(critic.get_output_embeddings().weight, head.weight)

    rows = [ids[row][mask[row].bool()].tolist() for row in range(len(ids))]
    samples = [RolloutSample(row[:-2], row[-2:], [True, True], None, [0, 0], image_inputs=inputs)
               for row, inputs in zip(rows, row_images)]   # the same rows, their last two tokens as the completion
    scorer = Scorer(load_tokenizer(str(vision_assets["qwen2_5_vl"])), reward_model=reloaded)
    _, components = scorer.score_texts(["", ""], ["", ""], {}, samples)
    assert components[REWARD_MODEL] == pytest.approx(rewards.tolist(), abs=1e-5)


def test_a_vision_language_distillation_teacher_reads_each_rows_images(vision_assets, tmp_path):
    """On-policy distillation of a vision-language policy: the teacher's log-probs (and top-k) of the sampled tokens
    are those of its forward with each row's pixels, not of the image tokens read as text."""
    from coati.experience.distillation import DistillConfig, ModelTeacher
    from coati.experience.experience import Experience
    from coati.models.logprobs import action_logps
    from coati.models.vision import joined_image_inputs

    ids, mask, row_images, pad = _left_padded_image_prompts(vision_assets, tmp_path)
    teacher = AutoModelForImageTextToText.from_pretrained(vision_assets["qwen2_5_vl"]).eval()
    _with_shared_random_weights(teacher)
    prompt_length = ids.size(1) - 2   # the rows' last two tokens taken as their completion
    experience = Experience(ids, mask, torch.ones(2, 2, dtype=torch.bool), prompt_length, None, torch.zeros(2),
                            torch.zeros(2), image_inputs=row_images)
    vocab = teacher.config.vocab_size
    with torch.no_grad():
        scores = ModelTeacher(teacher, DistillConfig(top_k=3), vocab).scores(experience, lambda forward, e: forward(slice(None)))
        seen = action_logps(teacher, ids, mask, prompt_length, images=joined_image_inputs(row_images))
        blind = action_logps(teacher, ids, mask, prompt_length)
    assert torch.allclose(scores["teacher_log_probs"], seen, atol=1e-6)
    assert not torch.allclose(scores["teacher_log_probs"], blind, atol=1e-3)
    assert scores["teacher_top_logps"].shape == (2, 2, 3) and scores["teacher_top_ids"].max() < vocab
