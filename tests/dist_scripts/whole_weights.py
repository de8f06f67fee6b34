"""Run under torchrun with 2 ranks: a tiny Llama (with LoRA adapters on its attention) whose weights are sharded the
way ColossalAI's tensor parallelism shards them (column- and row-wise, the vocabulary padded then split), gathered
whole again for a rollout engine; rank 0 prints what it compared."""
import copy
import json

import torch
import torch.distributed as dist
from colossalai.tensor.d_tensor.api import shard_colwise, shard_rowwise, sharded_tensor_to_existing_param
from colossalai.tensor.padded_tensor import to_padded_tensor
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

from coati.distributed import rank
from coati.distributed.launch import init_distributed
from coati.models.lora import merged_weights
from coati.utils.ckpt_io import holds_whole_parameters, inner_model, whole_state_dict

from leave import leave_together

init_distributed()
torch.manual_seed(0)
config = LlamaConfig(vocab_size=37, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                     num_key_value_heads=2, tie_word_embeddings=False)
model = get_peft_model(LlamaForCausalLM(config), LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]))
for name, parameter in model.named_parameters():
    if "lora_B" in name:
        torch.nn.init.normal_(parameter)   # adapters that change the merged weights
whole = copy.deepcopy(model)
expected = merged_weights(inner_model(whole))
before = holds_whole_parameters(model)

group = dist.group.WORLD
base = inner_model(model).model
for layer in base.layers:
    for linear in (layer.self_attn.q_proj.base_layer, layer.mlp.up_proj):
        sharded_tensor_to_existing_param(shard_colwise(linear.weight.data, group), linear.weight)
    sharded_tensor_to_existing_param(shard_rowwise(layer.mlp.down_proj.weight.data, group), layer.mlp.down_proj.weight)
embedding = base.embed_tokens
embedding.weight = to_padded_tensor(embedding.weight, 38, 0)   # as PaddingParallelModule.resize_embedding_weight
sharded_tensor_to_existing_param(shard_rowwise(embedding.weight.data, group), embedding.weight)

gathered = merged_weights(inner_model(model), whole_state_dict(model))
shard_shapes = {"q_proj": list(base.layers[0].self_attn.q_proj.base_layer.weight.shape),
                "embed_tokens": list(embedding.weight.shape)}
if rank() == 0:
    print("RESULT " + json.dumps({
        "whole_before": before, "whole_after": holds_whole_parameters(model), "shard_shapes": shard_shapes,
        "names_equal": sorted(gathered) == sorted(expected),
        "shapes": {n: list(t.shape) for n, t in gathered.items() if "embed" in n or "layers.0.self_attn.q" in n},
        "max_difference": max(float((gathered[n] - expected[n]).abs().max()) for n in expected)}), flush=True)
leave_together()
