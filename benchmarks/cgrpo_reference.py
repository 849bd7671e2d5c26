"""trl-cgrpo 0.2.0's own decisions on given answers, for benchmarks/budget_crosscheck.py --cgrpo PYTHON.

Runs in an environment with ``trl-cgrpo==0.2.0`` and its TRL (1.12-1.14), not pods-rl's: reads cases (JSON) on stdin,
writes their outcomes (JSON) on stdout. Each case drives ``CGRPOTrainer``'s own methods (``_calibration_due``,
``calibrate``, ``_generate_single_turn``, ``_resolved``, ``_outcomes``, ``_score``) on a trainer built without
``__init__`` whose generation, tokenizer and state are stand-ins: a "completion" is its answer string, handed out
in the order the case lists them. Nothing of theirs is copied; nothing of pods-rl is imported.
"""

from __future__ import annotations

import json
import random
import sys
import types
from collections import defaultdict

from trl_cgrpo import CGRPOTrainer
from trl_cgrpo import cgrpo_trainer as module


class Draws:
    """The stand-in generator: each prompt's next answers, in the case's order."""

    def __init__(self):
        self.sequences: dict[str, list[str]] = {}
        self.drawn: dict[str, int] = defaultdict(int)

    def __call__(self, prompt_ids, *_args, **_kwargs):
        out = []
        for prompt in prompt_ids:
            out.append(self.sequences[prompt][self.drawn[prompt]])
            self.drawn[prompt] += 1
        return out, None


def run_case(case: dict) -> dict:
    grid = sorted(case["budget_grid"])
    k_max = grid[-1]
    args = types.SimpleNamespace(
        score=case["score"], delta=case["delta"], delta_margin=case["delta_margin"], split_delta=case["split_delta"],
        recalibrate_every=case["recalibrate_every"], num_calibration_samples=case["num_calibration_samples"],
        calibration_batch_size=case["calibration_batch_size"], per_device_train_batch_size=k_max,
        calibration_answer_column="answer")
    trainer = object.__new__(CGRPOTrainer)
    draws = Draws()
    trainer.args = args
    trainer.budget_grid = grid
    trainer.num_generations = k_max
    trainer.qhats, trainer.delta, trainer._last_calibration_step = None, None, None
    trainer._rng = random.Random(case["seed"])
    trainer._metrics = {"train": defaultdict(list)}
    trainer.state = types.SimpleNamespace(global_step=0)
    trainer.use_vllm = False
    trainer._padded_rows = None
    trainer._tokenizer = types.SimpleNamespace(batch_decode=lambda ids, skip_special_tokens=True: list(ids),
                                               eos_token_id="<eos>", pad_token_id=None)
    trainer._tokenize_prompts = lambda prompts: (list(prompts), None, None)
    trainer._base_generate = draws  # the instance attribute stands in for the model's generation
    trainer.answer_extractor = lambda text: text
    trainer.verifier = lambda completions, **fields: [c == "1" for c in completions]
    calibrations, stops = [], []
    for step, batch in enumerate(case["steps"]):
        trainer.state.global_step = step
        if trainer._calibration_due():
            answers = case["calibrations"][len(calibrations)]
            trainer.calibration_dataset = [{"prompt": f"cal{i}", "answer": gold}
                                           for i, gold in enumerate(case["calibration_gold"])]
            for i, row in enumerate(answers):
                draws.sequences[f"cal{i}"], draws.drawn[f"cal{i}"] = row, 0
            trainer.calibrate()
            metrics = trainer._metrics["train"]
            calibrations.append({"step": step, "delta": trainer.delta, "qhats": [trainer.qhats[k] for k in grid],
                                 "rollouts": metrics["cgrpo/calibration_rollouts"][-1],
                                 "solve_rate": (metrics["cgrpo/calibration_solve_rate"][-1]
                                                if case["delta"] is None else None)})
        prompt_ids, inputs = [], []
        for p, row in enumerate(batch):
            draws.sequences[f"s{step}p{p}"], draws.drawn[f"s{step}p{p}"] = row, 0
            prompt_ids += [f"s{step}p{p}"] * k_max
            inputs += [{"prompt": f"s{step}p{p}"}] * k_max
        trainer._batch_inputs = inputs
        if module._BASE_TAKES_NUM_GENERATIONS:
            trainer._generate_single_turn(prompt_ids, None, {}, k_max)
        else:
            trainer._generate_single_turn(prompt_ids, None, {})
        padded = trainer._padded_rows
        stops.append([k_max - sum(padded[p * k_max:(p + 1) * k_max]) for p in range(len(batch))])
        trainer._batch_inputs = None
    return {"calibrations": calibrations, "stops": stops, "next_draw": trainer._rng.random()}


def main() -> None:
    cases = json.load(sys.stdin)
    json.dump([run_case(case) for case in cases], sys.stdout)


if __name__ == "__main__":
    main()
