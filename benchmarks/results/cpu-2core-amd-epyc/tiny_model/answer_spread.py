"""Per-problem share of correct samples for tiny models: where RL has something to sharpen.

    python answer_spread.py OUT.json MODEL_DIR [MODEL_DIR ...]

For each model: 200 held-out `arithmetic` problems x 32 samples (T = 1, seed 0); p = the share of a problem's
samples that are correct. RL on the verifiable reward quickly raises problems where the right answer is already
the most frequent one; the histogram of p and the share of problems whose most frequent answer is right say how
many such problems a model has.
"""

import json
import sys
from collections import Counter

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from pods_rl.tasks.arithmetic import ArithmeticTask

PROBLEMS, SAMPLES, BATCH = 200, 32, 25


def answer_spread(path: str, task) -> dict:
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    problems = task.load("test", limit=PROBLEMS)
    texts = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False) for p in problems["prompt"]]
    torch.manual_seed(0)
    share_correct, mode_correct = [], []  # (PROBLEMS,) each
    with torch.no_grad():
        for start in range(0, PROBLEMS, BATCH):
            batch = tokenizer([t for t in texts[start : start + BATCH] for _ in range(SAMPLES)], return_tensors="pt",
                              padding=True, add_special_tokens=False)
            output_ids = model.generate(**batch, max_new_tokens=24, do_sample=True, temperature=1.0, top_k=0,
                                        top_p=1.0, pad_token_id=tokenizer.pad_token_id)
            completions = tokenizer.batch_decode(output_ids[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
            for j, answer in enumerate(problems["answer"][start : start + BATCH]):
                samples = completions[j * SAMPLES : (j + 1) * SAMPLES]
                share_correct.append(np.mean([task.score(c, answer)["correct"] for c in samples]))
                answers = Counter(c.split("<answer>")[-1].split("</answer>")[0].strip() for c in samples)
                mode_correct.append(answers.most_common(1)[0][0] == str(answer).strip())
    p = np.array(share_correct)
    return {"model": path, "mean_share_correct": round(float(p.mean()), 4),
            "problems_by_share": {"0": float((p == 0).mean()), "(0, 0.25)": float(((p > 0) & (p < 0.25)).mean()),
                                  "[0.25, 0.5)": float(((p >= 0.25) & (p < 0.5)).mean()),
                                  "[0.5, 1]": float((p >= 0.5).mean())},
            "most_frequent_answer_correct": float(np.mean(mode_correct)), "problems": PROBLEMS, "samples": SAMPLES}


if __name__ == "__main__":
    torch.set_num_threads(1)
    rows = [answer_spread(path, ArithmeticTask()) for path in sys.argv[2:]]
    for row in rows:
        print(json.dumps(row))
    with open(sys.argv[1], "w") as f:
        json.dump({"command": "python " + " ".join(sys.argv), "rows": rows}, f, indent=1)
