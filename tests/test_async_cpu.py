"""TRL's asynchronous trainer on CPU (pods_rl.engines.trl_async.worker, issue #40 item 3): the CPU stand-ins for its
CUDA-only steps, checked against what they replace.
The run against a real vLLM server is tests/vllm/test_async_server.py.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("trl.experimental.async_grpo")

from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402
from trl.experimental.async_grpo import async_grpo_trainer as trl_trainer  # noqa: E402
from trl.experimental.async_grpo.packing import TREE_ATTENTION, TreeRow  # noqa: E402

from pods_rl.engines.trl_async.cpu import async_trainer_on_cpu, register_torch_tree_attention  # noqa: E402
from pods_rl.tiny import build_random_model  # noqa: E402


def sample(ids: list[int], prompt_len: int, group_id: int = 0) -> dict:
    mask = [0] * prompt_len + [1] * (len(ids) - prompt_len)
    return {"input_ids": torch.tensor(ids), "completion_mask": torch.tensor(mask),
            "old_log_probs": torch.zeros(len(ids)), "advantage": 1.0, "group_id": group_id}


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_torch_tree_attention_matches_plain_causal_attention(tmp_path, kv_heads):
    """Samples packed into one prefix tree (shared prompt, forks, a second prompt) and forwarded once through
    ``torch_tree_attention`` give each completion token the log-prob a plain causal forward of that sample alone gives
    (transformers' eager attention), grouped-query attention included."""
    path = build_random_model(tmp_path, arch="qwen2", hidden_size=64, num_layers=2, num_heads=4)
    register_torch_tree_attention()
    plain, tree = (AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path, num_key_value_heads=kv_heads),
                                                    attn_implementation=attention)
                   for attention in ("eager", TREE_ATTENTION))
    tree.load_state_dict(plain.state_dict())
    samples = [sample([5, 6, 7, 8, 9, 10], 3), sample([5, 6, 7, 8, 11, 12, 13], 3), sample([5, 6, 7, 14], 3),
               sample([20, 21, 22, 23, 24], 2, group_id=1)]
    row = TreeRow()
    for s in samples:
        row.add(s)
    packed = row.pack()
    tree_kwargs = {key: packed[key] for key in ("tree_kv_index", "tree_cu_seqlens_q", "tree_cu_seqlens_k")}
    tree_kwargs["tree_max_seqlen_q"], tree_kwargs["tree_max_seqlen_k"] = packed["tree_max_seqlens"].tolist()
    with torch.no_grad():
        logits = tree(input_ids=packed["input_ids"][None], position_ids=packed["position_ids"][None],
                      **tree_kwargs).logits[0]
        expected = []
        for s in samples:
            ids = s["input_ids"]
            logp = torch.log_softmax(plain(input_ids=ids[None]).logits[0], -1)
            expected += [logp[p - 1, ids[p]] for p in range(1, len(ids)) if s["completion_mask"][p]]
    targets = torch.tensor([s["input_ids"][p] for s in samples for p in range(1, len(s["input_ids"]))
                            if s["completion_mask"][p]])
    got = torch.log_softmax(logits, -1)[packed["token_index"], targets]
    assert packed["input_ids"].numel() < sum(len(s["input_ids"]) for s in samples)  # the prompt is shared
    torch.testing.assert_close(got, torch.stack(expected), atol=1e-5, rtol=1e-5)


def test_async_trainer_on_cpu_is_scoped_to_the_block():
    """Inside the block TRL's two CUDA-only construction steps are the CPU stand-ins; after it, TRL's own again."""
    originals = trl_trainer.get_peak_flops_per_device, trl_trainer.register_tree_attention
    with async_trainer_on_cpu() as active:
        if active:
            assert trl_trainer.get_peak_flops_per_device(None, "float32") is None
            assert trl_trainer.register_tree_attention is register_torch_tree_attention
    assert (trl_trainer.get_peak_flops_per_device, trl_trainer.register_tree_attention) == originals
    assert active is not torch.cuda.is_available()
