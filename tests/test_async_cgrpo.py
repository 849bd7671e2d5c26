"""C-GRPO in TRL's asynchronous worker (pods_rl.budget.cgrpo_run): groups start at budget_grid[0], are topped
up the grid until their prediction set is a singleton, keep m of k (all k below m); the calibration runs in the worker's
event loop before the first group is judged, its rollouts pushed as metrics; the refusals are one line. Generation is
answered from a script (tests.test_async_pods.ScriptedLoop, no server)."""

from __future__ import annotations

import pytest

pytest.importorskip("trl.experimental.async_grpo")

from datasets import Dataset  # noqa: E402

from pods_rl.engines.trl_async.budget import check_budget_settings  # noqa: E402
from tests.test_async_budget import pushed  # noqa: E402
from tests.test_async_pods import (  # noqa: E402
    ScriptedLoop,
    _config,
    accelerate_state,  # noqa: F401  (a module fixture)
    close_loop,
    real_loop,
    run_loops,
    scored_value,
)

# Calibration prompt -> its k_max answers, and the gold answer: c0 always right, c1 right half the time, c2 never.
CALIBRATION_SCRIPT = {"c0": "11111111", "c1": "10101010", "c2": "00000000"}
CALIBRATION = Dataset.from_dict({"prompt": [[{"role": "user", "content": c}] for c in CALIBRATION_SCRIPT],
                                 "answer": ["1", "0", "1"]})


def answer_of(text):
    return text.strip() or None


class CalibratedLoop(ScriptedLoop):
    """ScriptedLoop, whose calibration rollouts (group id -1) answer from ``CALIBRATION_SCRIPT``."""

    async def _generate_one(self, prompt, tool_dict, tools, group_id=0):
        if group_id != -1:
            return await super()._generate_one(prompt, tool_dict, tools, group_id)
        text = prompt[-1]["content"]
        j = self.calibration_drawn.get(text, 0)
        self.calibration_drawn[text] = j + 1
        return [{"role": "assistant", "content": CALIBRATION_SCRIPT[text][j]}], [5], [], 0, 0, None


def cgrpo_loop(tmp_path, monkeypatch, model_dir, prompts, **pods):
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": p}] for p in prompts]})
    loop = real_loop(tmp_path, monkeypatch, model_dir, (scored_value,), dataset, CalibratedLoop,
                     _config(tmp_path, max_inflight_tasks=6), **pods)
    loop.sampled, loop.calibration_drawn = {}, {}
    return loop


@pytest.mark.parametrize("delta", [None, 0.9])
def test_groups_climb_the_grid_and_stop_at_a_singleton_set(tmp_path, monkeypatch, tiny_model_dir, delta):
    """n = 8 on the grid 2, 4, 8, m = 3: "flat" agrees at once and trains its 2 rollouts; "late" (1111 0111) agrees
    through 4 and disagrees at 8; "mixed" (01 01 1111) disagrees at 2. Calibration: 3 prompts x 8, once. delta None:
    from the solve rate (2 of 3: every threshold 1.0, "mixed" climbs to 8); 0.9: the smallest score, below 1."""
    loop = cgrpo_loop(tmp_path, monkeypatch, tiny_model_dir, ["flat", "late", "mixed"], pods_m=3,
                      pods_rollout_planner="cgrpo",
                      pods_rollout_planner_args={"budget_grid": [2, 4, 8], "delta": delta},
                      pods_calibration_dataset=CALIBRATION, pods_answer_extractor=answer_of, pods_groups_per_step=3)
    try:
        assert loop.num_generations == 2 and loop.pods_n == 8  # TRL's generate loop emits budget_grid[0]
        rows = run_loops(loop, groups=3)
    finally:
        close_loop(loop)
    planner = loop.budget.budget.how_many
    assert loop.calibration_drawn == dict.fromkeys(CALIBRATION_SCRIPT, 8)
    calibrations = [m for m in pushed(loop) if "pods/cgrpo_calibration_rollouts" in m]
    assert [m["pods/cgrpo_calibration_rollouts"] for m in calibrations] == [24.0]
    qhat = dict(zip(planner.settings.budget_grid, planner.qhats.tolist()))
    assert (qhat[8] == 1.0) == (delta is None)
    sampled = {group_id: int(samples[0].metrics["pods/rollouts_sampled"]) for group_id, samples in rows.items()}
    assert sampled[0] == 2 and len(rows[0]) == 2  # flat: a singleton set at 2, trained whole (k < m)
    assert sampled[1] == (2 if qhat[2] <= 1.0 else 4)  # late: 1, 1 agree (share 1.0 reaches any threshold)
    assert sampled[2] == (2 if qhat[2] <= 0.5 else 4 if qhat[4] <= 0.5 else 8)  # mixed: 0, 1 | 0, 1 | ...
    assert all(len(rows[g]) == min(sampled[g], 3) for g in rows if g < 3)


@pytest.mark.parametrize("settings, message", [
    (dict(pods_calibration_dataset=CALIBRATION), "pass pods_answer_extractor="),
    (dict(pods_answer_extractor=answer_of), "pass pods_calibration_dataset="),
    (dict(pods_calibration_dataset=CALIBRATION, pods_answer_extractor=answer_of,
          pods_rollout_planner_args={"budget_grid": [2, 4, 8], "score": "pass_rate"}), "needs a verifier"),
    (dict(pods_calibration_dataset=CALIBRATION, pods_answer_extractor=lambda text: text), "must pickle"),
])
def test_the_worker_refuses_bad_calibration_in_one_line(settings, message):
    settings = {"pods_rollout_planner": "cgrpo", "pods_rollout_planner_args": {"budget_grid": [2, 4, 8]}, **settings}
    with pytest.raises(ValueError, match=message) as err:
        check_budget_settings(8, 3, **settings)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="are C-GRPO's"):
        check_budget_settings(8, 3, pods_rollout_planner="knapsack", pods_answer_extractor=answer_of)


@pytest.mark.parametrize("inputs, expected", [
    (dict(answer_extractor=None), "{rollout_planner}='cgrpo' (score='aps') compares the answers of a prompt's "
                                  "completions: pass {answer_extractor}=fn(text)"),
    (dict(calibration_dataset=None), "{rollout_planner}='cgrpo' calibrates its thresholds on held-out prompts: pass "
                                     "{calibration_dataset}= "),
    (dict(calibration_dataset=[{"prompt": "held out"}]), "{calibration_dataset} has no 'answer' column (set "
                                                         "calibration_answer_column in {rollout_planner_args})"),
    (dict(calibration_dataset=[{"prompt": "seen", "answer": "1"}]), "{calibration_dataset} shares 1 of its 1 prompts "
                                                                    "with the training set"),
    (dict(planner="knapsack"), "{calibration_dataset} and {answer_extractor} are C-GRPO's: set "
                               "{rollout_planner}='cgrpo', or drop them"),
], ids=["extractor", "calibration_set", "column", "overlap", "not_cgrpo"])
def test_both_engines_refuse_calibration_in_the_same_words_each_in_its_spelling(tmp_path, inputs, expected):
    """One source (pods_rl.budget.cgrpo_run) words the refusals; each engine's entry point names its own settings,
    and none of the other engine's."""
    import re

    from pods_rl.engines.settings import spelled
    from pods_rl.engines.trl.trainer import PODSTrainer
    from tests.test_cgrpo import config, reward

    inputs = {"calibration_dataset": CALIBRATION, "answer_extractor": answer_of, "planner": "cgrpo", **inputs}
    train = Dataset.from_dict({"prompt": ["seen", "also seen"]})
    planner = inputs.pop("planner")
    args = {"budget_grid": [2, 4]} if planner == "cgrpo" else None
    messages = {}
    with pytest.raises(ValueError) as trl:  # the model does not exist: the refusal comes first
        PODSTrainer(model=str(tmp_path / "no-model"), reward_funcs=[reward], train_dataset=train,
                    args=config(tmp_path, rollout_planner=planner, rollout_planner_args=args), **inputs)
    messages["trl"] = str(trl.value)
    with pytest.raises(ValueError) as worker:
        check_budget_settings(4, 2, dataset=train, pods_rollout_planner=planner, pods_rollout_planner_args=args,
                              **{f"pods_{key}": value for key, value in inputs.items()})
    messages["trl_async"] = str(worker.value)
    for engine, other in (("trl", "trl_async"), ("trl_async", "trl")):
        assert messages[engine].startswith(expected.format(**spelled(engine, "budget"))), messages[engine]
        for name in set(spelled(other, "budget").values()) - set(spelled(engine, "budget").values()):
            assert not re.search(rf"(?<![\w.]){re.escape(name)}\b", messages[engine]), (name, messages[engine])
