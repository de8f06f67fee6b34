"""Image rows as TRL users have them, prepared for tiny Qwen2.5-VL and LLaVA models: the image tokens the processor
makes, labels off them, every image source TRL and OpenAI rows use, and each bad image input in one line."""
import base64
import io
import json
import shutil
from pathlib import Path

import pytest
from datasets import Dataset, load_from_disk
from PIL import Image

from coati.dataset.cache import is_raw
from coati.dataset.prepare import load_prepared, prepare_dataset, prepared_image_limits
from coati.dataset.tokenization import IGNORE_INDEX, load_tokenizer
from coati.dataset.vision import ImageLimits, ImageProcessing, ImageTokens
from coati.utils.errors import CoatiUsageError

STYLES = ("qwen2_5_vl", "llava")


def _processing(model: Path, limits: ImageLimits = ImageLimits()) -> ImageProcessing:
    return ImageProcessing.load(str(model), load_tokenizer(str(model)), limits)


def _rows(path: Path) -> list:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def _write(rows: list, path: Path) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.mark.parametrize("style", STYLES)
def test_sft_rows_hold_the_processors_image_tokens_and_labels_only_the_answer(vision_assets, style, tmp_path):
    images = _processing(vision_assets[style])
    counts = prepare_dataset([vision_assets["sft"]], "sft", images.processor.tokenizer, 256, tmp_path / "out",
                             images=images)
    assert counts["kept"] == 32
    prepared = load_from_disk(str(tmp_path / "out"))
    raw = _rows(vision_assets["sft"])
    for row, given in list(zip(prepared, raw))[:4]:
        picture = Image.open(Path(vision_assets["sft"]).parent / given["images"][0]).convert("RGB")
        text = images.processor.apply_chat_template(given["messages"], tokenize=False)
        expected = images.processor(text=[text], images=[picture])["input_ids"][0]
        assert row["input_ids"] == list(expected[:len(row["input_ids"])])   # the processor's own ids, markup after the answer dropped
        labelled = [t for t, label in zip(row["input_ids"], row["labels"]) if label != IGNORE_INDEX]
        answer = images.processor.tokenizer(given["messages"][1]["content"][0]["text"] + "<|im_end|>",
                                            add_special_tokens=False)["input_ids"]
        assert labelled == answer
        assert images.image_token_id in row["input_ids"]
        assert row["images"] == [(Path(vision_assets["sft"]).parent / given["images"][0]).read_bytes()]
    assert json.loads((tmp_path / "out" / "coati_prepared.json").read_text())["image_limits"] == {
        "max_pixels": 0, "min_pixels": 0}


def test_preference_and_prompt_rows_keep_their_images(vision_assets, tmp_path):
    images = _processing(vision_assets["qwen2_5_vl"])
    tokenizer = images.processor.tokenizer
    prepare_dataset([vision_assets["preference"]], "preference", tokenizer, 256, tmp_path / "pref", images=images)
    pair = load_from_disk(str(tmp_path / "pref"))[0]
    for side in ("chosen", "rejected"):
        assert pair[f"{side}_input_ids"].count(images.image_token_id) == 8   # 112 x 56 pixels: 8 x 4 patches, 2 x 2 merged
        assert all(label == IGNORE_INDEX for token, label in zip(pair[f"{side}_input_ids"], pair[f"{side}_labels"])
                   if token == images.image_token_id)
    assert len(pair["images"]) == 1
    prepare_dataset([vision_assets["prompt"]], "prompt", tokenizer, 256, tmp_path / "prompt", images=images)
    prompt = load_from_disk(str(tmp_path / "prompt"))[0]
    assert prompt["input_ids"].count(images.image_token_id) == 8 and len(prompt["images"]) == 1
    assert prompt["gt_answer"] == _rows(vision_assets["prompt"])[0]["gt_answer"]


def _one_image_row(image: object, column: str = "images") -> dict:
    return {column: image, "messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "2+3?"}]},
                                        {"role": "assistant", "content": [{"type": "text", "text": "5"}]}]}


def test_every_image_source_trl_and_openai_rows_use_gives_the_same_row(vision_assets, tmp_path):
    images = _processing(vision_assets["qwen2_5_vl"])
    tokenizer = images.processor.tokenizer
    folder = Path(vision_assets["sft"]).parent
    name = _rows(vision_assets["sft"])[0]["images"][0]
    data = (folder / name).read_bytes()
    data_url = "data:image/png;base64," + base64.b64encode(data).decode()
    shutil.copy(folder / name, tmp_path / "beside.png")
    openai = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url}},
                                                        {"type": "text", "text": "2+3?"}]},
                           {"role": "assistant", "content": "5"}]}
    rows = [_one_image_row([str(folder / name)]), _one_image_row("beside.png", "image"), _one_image_row([data_url]), openai]
    prepare_dataset([_write(rows, tmp_path / "rows.jsonl")], "sft", tokenizer, 256, tmp_path / "out", images=images)
    prepared = list(load_from_disk(str(tmp_path / "out")))
    assert all(row["images"] == [data] for row in prepared)
    assert len({tuple(row["input_ids"]) for row in prepared}) == 1

    # local datasets folders with an image column, decoded by datasets: parquet files, and a folder save_to_disk wrote
    picture = Image.open(folder / name)
    Dataset.from_list([{**_one_image_row([picture])}]).to_parquet(str(tmp_path / "hub" / "train.parquet"))
    Dataset.from_list([{**_one_image_row([picture])}]).save_to_disk(str(tmp_path / "saved"))
    for given in ("hub", "saved", "hub/train.parquet"):   # the folder, save_to_disk's, one file by its format
        out = tmp_path / f"from_{given.replace('/', '_')}"
        prepare_dataset([tmp_path / given], "sft", tokenizer, 256, out, images=images)
        from_hub = load_from_disk(str(out))[0]
        assert from_hub["input_ids"] == prepared[0]["input_ids"]
        assert Image.open(io.BytesIO(from_hub["images"][0])).tobytes() == picture.convert("RGB").tobytes()
    assert is_raw(str(tmp_path / "saved")) and not is_raw(str(tmp_path / "from_saved"))


def test_each_bad_image_input_is_one_line_naming_file_line_and_field(vision_assets, tmp_path):
    images = _processing(vision_assets["qwen2_5_vl"])
    tokenizer = images.processor.tokenizer
    (tmp_path / "notes.png").write_text("not an image")
    good = Path(vision_assets["sft"]).parent / _rows(vision_assets["sft"])[0]["images"][0]
    two_placeholders = _one_image_row([str(good)])
    two_placeholders["messages"][0]["content"].insert(0, {"type": "image"})
    cases = [
        (_one_image_row(["missing.png"]), "field 'images[0]': image file not found: missing.png (looked for "
                                          f"{tmp_path / 'missing.png'} or missing.png)"),
        (_one_image_row(["notes.png"]), "field 'images[0]': notes.png is not an image PIL can read "
                                        "(UnidentifiedImageError)"),
        (_one_image_row([str(good), str(good)]), "field 'images': 2 images for 1 {\"type\": \"image\"} placeholder"),
        (two_placeholders, "field 'images': 1 image for 2 {\"type\": \"image\"} placeholders"),
        (_one_image_row(["https://example.com/a.png"]), "images are not downloaded; save it and give its path"),
        (_one_image_row(["data:image/png,abc"]), "a data: URL image must be base64"),
    ]
    for row, message in cases:
        data = _write([_one_image_row([str(good)]), row], tmp_path / "rows.jsonl")
        with pytest.raises(CoatiUsageError) as error:
            prepare_dataset([data], "sft", tokenizer, 256, tmp_path / "never", images=images)
        assert str(error.value).startswith(f"{data}:2: ") and message in str(error.value), str(error.value)
        assert "\n" not in str(error.value)
    counts = prepare_dataset([data], "sft", tokenizer, 256, tmp_path / "skipped", skip_invalid=True, images=images)
    assert (counts["kept"], counts["skipped"]) == (1, 1)

    kto = _write([{"prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "?"}]}],
                   "completion": "5", "label": True, "images": [str(good)]}], tmp_path / "kto.jsonl")
    with pytest.raises(CoatiUsageError, match=r"kto.jsonl:1: field 'images': kto data takes no images"):
        prepare_dataset([kto], "kto", tokenizer, 256, tmp_path / "kto_out", images=images)
    text_model = load_tokenizer(str(vision_assets["qwen2_5_vl"]))
    with pytest.raises(CoatiUsageError, match="the data has images, and the tokenizer's folder has no image processor"):
        prepare_dataset([vision_assets["sft"]], "sft", text_model, 256, tmp_path / "text_out")


def test_truncation_never_splits_an_image_and_pixel_limits_change_the_token_count(vision_assets, tmp_path):
    tokens = ImageTokens(token_id=7, counts=(3, 2))
    ids = [1, 7, 7, 7, 2, 7, 7, 3]
    assert tokens.cut(ids, ids, 6) == ([1, 7, 7, 7, 2], [1, 7, 7, 7, 2], 1)   # the second image's run is cut whole
    assert tokens.cut(ids, ids, 3)[2] == 0 and tokens.cut(ids, ids, 3)[0] == [1]
    assert tokens.cut(ids, ids, 8)[2] == 2

    images = _processing(vision_assets["qwen2_5_vl"])
    tokenizer = images.processor.tokenizer
    with pytest.raises(CoatiUsageError, match="all 32 rows were dropped by truncation"):   # 8 tokens cut into the image
        prepare_dataset([vision_assets["sft"]], "sft", tokenizer, 8, tmp_path / "short", images=images)
    larger = _processing(vision_assets["qwen2_5_vl"], ImageLimits(min_pixels=56 * 168))
    prepare_dataset([vision_assets["sft"]], "sft", tokenizer, 256, tmp_path / "larger", images=larger)
    row = load_from_disk(str(tmp_path / "larger"))[0]
    assert row["input_ids"].count(images.image_token_id) == 15   # 112 x 56 resized to 140 x 84: 10 x 6 patches, 2 x 2 merged
    assert prepared_image_limits([tmp_path / "larger"]) == ImageLimits(min_pixels=56 * 168)
    too_small = _processing(vision_assets["qwen2_5_vl"], ImageLimits(max_pixels=28 * 28))
    with pytest.raises(CoatiUsageError, match="Qwen2VLImageProcessor cannot resize a 112 x 56 image within max_pixels "
                                              "784, min_pixels default"):
        prepare_dataset([vision_assets["sft"]], "sft", tokenizer, 256, tmp_path / "small", images=too_small)
    with pytest.raises(CoatiUsageError, match="--max_pixels: CLIPImageProcessor resizes every image to a fixed size"):
        _processing(vision_assets["llava"], ImageLimits(max_pixels=1000))
    assert load_prepared([tmp_path / "larger"], "sft").num_rows == 32
