"""Run by tests/test_distributed.py under `accelerate launch` with 2 CPU ranks: adaptive rounds whose sizes differ
between the ranks, generated through TRL's own ``VLLMGeneration.generate`` in server mode (its gather of every
rank's prompts, de-duplication by ``num_generations``, broadcast and slicing by rank) with a stand-in for the HTTP
client to a ``trl vllm-serve`` server (which needs CUDA). The stand-in answers each prompt ``a*b=`` with ``a``
followed by a random digit: every completion says which prompt it was generated for. Each rank records, per round,
the ``num_generations`` it used and every (prompt, completion) pair its rewards saw."""

import json
import os
import random
import re
import sys
from pathlib import Path

from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl.generation.vllm_generation import VLLMGeneration

from pods_rl.engines.trl.trainer import PODSConfig, PODSTrainer

record = {"pairs": [], "round_generations": []}


def rank_split_reward(prompts, completions, **kwargs):
    """On rank 0 every completion scores 1: all-equal groups, open for every round (each round has the same size
    for all its prompts); on rank 1 the parity of the completion's last digit: some groups mix after the pilot
    and close, so its rounds are smaller than rank 0's and padded. The pairs seen are recorded."""
    rewards = []
    for prompt, completion in zip(prompts, completions):
        question, answer = prompt[-1]["content"], completion[0]["content"]
        record["pairs"].append([question, answer])
        rewards.append(1.0 if os.environ.get("RANK") == "0" else float(answer[-1:].isdigit() and int(answer[-1]) % 2))
    return rewards


class StandInServerClient:
    """What ``VLLMClient.generate`` returns, computed here: for each prompt (token ids), ``n`` completions."""

    def __init__(self, tokenizer, seed: int):
        self.tokenizer, self.random = tokenizer, random.Random(seed)

    def generate(self, prompts, n=1, logprobs=0, **kwargs):
        completions = []
        for ids in prompts:
            first = re.search(r"(\d+)\*\d+=", self.tokenizer.decode(ids)).group(1)
            for _ in range(n):
                text = f"{first}{self.random.randint(0, 9)}"
                completions.append(self.tokenizer.encode(text, add_special_tokens=False)
                                   + [self.tokenizer.eos_token_id])
        return {"prompt_ids": prompts, "completion_ids": completions,
                "logprobs": [[[-1.0]] * len(c) for c in completions], "logprob_token_ids": None}


def server_generation(trainer) -> VLLMGeneration:
    """TRL's VLLMGeneration in server mode, its client a stand-in (no weights are pushed: that is NCCL's part)."""
    generation = VLLMGeneration.__new__(VLLMGeneration)
    args = trainer.args
    generation.__dict__.update(
        mode="server", accelerator=trainer.accelerator, vllm_client=StandInServerClient(trainer.processing_class, 0),
        temperature=1.0, top_p=1.0, top_k=0, min_p=None, repetition_penalty=1.0,
        max_completion_length=args.max_completion_length, enable_sleep_mode=False, logprobs=0,
        structured_outputs_regex=None, generation_kwargs={}, tensor_parallel_size=1)
    generation.sync_weights = lambda: None
    return generation


def main(model_dir: str, out_dir: str) -> None:
    n, m = 7, 2
    config = PODSConfig(output_dir=out_dir, use_cpu=True, seed=0, learning_rate=1e-3, max_steps=2, beta=0.0,
                        max_completion_length=6, num_generations=n, downsample_to=m, pilot_generations=2,
                        per_device_train_batch_size=2 * m, logging_steps=1, report_to="none", save_strategy="no",
                        vllm_importance_sampling_correction=False)
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": f"{i}*{i}="}] for i in range(32)]})
    trainer = PODSTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir), reward_funcs=[rank_split_reward],
                          args=config, train_dataset=dataset,
                          processing_class=AutoTokenizer.from_pretrained(model_dir))
    trainer.use_vllm, trainer.vllm_mode, trainer._last_loaded_step = True, "server", -1
    trainer.vllm_generation = server_generation(trainer)
    generate = trainer.vllm_generation.generate

    def recording_generate(prompts, images, num_generations, profiler=None):
        record["round_generations"].append(num_generations)
        return generate(prompts=prompts, images=images, num_generations=num_generations, profiler=profiler)

    trainer.vllm_generation.generate = recording_generate
    trainer.train()
    record["rank"] = trainer.accelerator.process_index
    Path(out_dir, f"rank{record['rank']}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
