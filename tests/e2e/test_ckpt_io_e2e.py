"""Checkpoints across two real ranks: colossalai's tensor-parallel shards gathered whole for a rollout engine."""
from conftest import dist_script_result


def test_tensor_parallel_shards_are_gathered_whole_for_a_rollout_engine():
    """What `--rollout_backend vllm` publishes from a sharded trainer: ColossalAI's own column/row shards and padded
    vocabulary of two real ranks gathered back, LoRA adapters merged, equal to the unsharded model's weights."""
    result = dist_script_result("whole_weights.py")
    assert result["whole_before"] and not result["whole_after"]
    assert result["shard_shapes"] == {"q_proj": [16, 8], "embed_tokens": [19, 16]}   # each rank held half
    assert result["names_equal"]
    assert result["shapes"] == {"model.embed_tokens.weight": [37, 16], "model.layers.0.self_attn.q_proj.weight": [16, 16]}
    assert result["max_difference"] == 0.0
