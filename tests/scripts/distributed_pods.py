"""Run by tests/test_distributed.py under `accelerate launch --num_processes 2 --cpu`: a few PODS steps with a
tiny model (optionally with prompt over-sampling: argv[3], and adaptive rollouts with a pilot of argv[4]);
each rank records how many kept rows reached its loss,
which prompts it generated for and which prompts' rows reached the update."""

import json
import sys
from pathlib import Path

from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

from pods_rl.engines.trl.trainer import PODSConfig, PODSTrainer
from pods_rl.runlog import GracefulStop


def digit_reward(completions, **kwargs):
    return [float(sum(ch.isdigit() for ch in c[0]["content"]) % 4) for c in completions]


def half_constant_reward(prompts, completions, **kwargs):
    """Prompts of even i score 1 on every rollout (all-equal: adaptive rounds keep them open up to n)."""
    varied = digit_reward(completions)
    return [1.0 if int(p[0]["content"].split("*")[0]) % 2 == 0 else v for p, v in zip(prompts, varied)]


def main(model_dir: str, out_dir: str, oversample: float = 1.0, pilot: float = 0) -> None:
    n, m = 6, 2
    adaptive = dict(pilot_generations=int(pilot)) if pilot else {}
    config = PODSConfig(output_dir=out_dir, use_cpu=True, seed=0, learning_rate=1e-2, max_steps=3, beta=0.0,
                        max_completion_length=6, num_generations=n, downsample_to=m, oversample_prompts=oversample,
                        per_device_train_batch_size=2 * m, logging_steps=1, report_to="none", save_strategy="no",
                        **adaptive)
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": f"{i}*{i}="}] for i in range(32)]})
    stop = GracefulStop()

    class SignalOnRankOne(TrainerCallback):
        """At the end of step 2, rank 1 alone has received SIGTERM (as its handler would note it): both ranks
        must stop after step 2 (of 3), or rank 0 would wait for rank 1 in step 3."""

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 2 and state.is_world_process_zero is False:
                stop.signal_name = "SIGTERM"

    trainer = PODSTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir),
                          reward_funcs=[half_constant_reward if pilot else digit_reward],
                          args=config, train_dataset=dataset, processing_class=AutoTokenizer.from_pretrained(model_dir),
                          callbacks=[SignalOnRankOne(), stop])
    record = {"rank": trainer.accelerator.process_index, "world": trainer.accelerator.num_processes,
              "loss_rows": [], "generated_prompts": [], "rounds": [], "rollouts_sampled": [],
              "kept_prompts": [], "advantages_group_sums": []}
    tokenizer = trainer.processing_class
    generate = trainer._generate_and_score_completions

    def spy(inputs):
        record["generated_prompts"].append([x["prompt"][0]["content"] for x in inputs])
        out = generate(inputs)
        record["loss_rows"].append(out["completion_ids"].shape[0])
        record["kept_prompts"].append(tokenizer.batch_decode(out["prompt_ids"], skip_special_tokens=True))
        record["advantages_group_sums"].append(out["advantages"].view(-1, m).sum(1).tolist())
        metrics = trainer._metrics["train"]
        record["rounds"].append(metrics["pods/rounds"][-1])
        record["rollouts_sampled"].append(metrics["pods/rollouts_sampled"][-1])
        return out

    trainer._generate_and_score_completions = spy
    trainer.train()
    record.update(stopped_at=trainer.state.global_step, stop_signal=stop.signal_name)
    Path(out_dir, f"rank{record['rank']}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *(float(a) for a in sys.argv[3:]))
