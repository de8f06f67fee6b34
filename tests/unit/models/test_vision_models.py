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
