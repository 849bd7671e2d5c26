"""Do pods-rl's rollout-budget planners decide what the authors' released code decides, on the same inputs?

Give it the authors' repositories (a checkout, or a bare git directory: files are then read with `git show HEAD:`)
and it runs their decision functions, taken from their files as they are (each function's source is cut out of
the file with `ast` and run here, so verl and the other heavy imports are not needed), against ours on random
inputs. Where a decision lives inside a long trainer loop, the few lines that make it are transcribed below, each
with the file it comes from. Nothing of theirs is copied into pods-rl.

    python benchmarks/budget_crosscheck.py --greso PATH --knapsack PATH --reinforce-ada PATH \
        --reinforce-ada-tinker PATH --pilot-commit PATH --cgrpo PYTHON [--trials 200] [--seed 0]

Repositories: Infini-AI-Lab/GRESO, liziniu/KnapsackRL, RLHFlow/Reinforce-Ada, RLHFlow/Reinforce-Ada-Tinker,
databricks/pilot-commit. C-GRPO is a package, ``trl-cgrpo`` 0.2.0, whose trainer needs its own TRL (1.12-1.14):
``--cgrpo`` names the Python of an environment that has it (``python3 -m venv V && V/bin/pip install torch
trl-cgrpo==0.2.0``), and benchmarks/cgrpo_reference.py runs its trainer's own methods there on the same answers.
Prints one line per check (agreeing / compared, and the known differences documented in
docs/concepts/rollout-budgets.md, counted apart); exits 1 if an undocumented difference shows up.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import json
import math
import random
import subprocess
import sys
import time
import types
import typing
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
torch.set_num_threads(1)  # tiny tensors: a thread pool only adds overhead

from pods_rl.budget.ledger import LedgerSettings, PromptLedger  # noqa: E402
from pods_rl.budget.planners import (  # noqa: E402
    CGRPO,
    CGRPOSettings,
    GresoSettings,
    GresoSkip,
    KnapsackSettings,
    PilotCommit,
    PilotCommitSettings,
    ReinforceAda,
    ReinforceAdaSettings,
    encode_answers,
    estimate_success_rate,
    knapsack_allocation,
)


def read(repo: str, path: str) -> str:
    """A file of ``repo``: from its work tree, else from HEAD of a (bare) git directory."""
    if (Path(repo) / path).is_file():
        return (Path(repo) / path).read_text()
    return subprocess.run(["git", "-C", repo, "show", f"HEAD:{path}"], capture_output=True, text=True,
                          check=True).stdout


def extract(source: str, name: str, cls: str | None = None, namespace: dict | None = None):
    """Run the source of top-level function ``name`` (or method ``cls.name``, or class ``name``) in ``namespace``
    (decorators dropped) and return the object."""
    tree = ast.parse(source)
    body = tree.body
    if cls is not None:
        body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    node = next(n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == name)
    node.decorator_list = []
    code = ast.unparse(node)
    ns = namespace if namespace is not None else {}  # shared: functions of one file can call each other
    for key, value in {"np": np, "torch": torch, "defaultdict": defaultdict, "math": math, **{
            hint: getattr(typing, hint) for hint in ("Any", "Optional", "Dict", "List", "Tuple", "Union")}}.items():
        ns.setdefault(key, value)
    exec(compile(code, f"<{name}>", "exec"), ns)  # noqa: S102 (their code, read from the repository given)
    return ns[name]


class Tally:
    """Counts per check: agree, differ in a documented way, differ (a failure)."""

    def __init__(self):
        self.rows: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])

    def add(self, check: str, agree: bool, documented: bool = False) -> None:
        self.rows[check][0 if agree else 1 if documented else 2] += 1

    def report(self) -> bool:
        for check, (agree, documented, differ) in self.rows.items():
            print(f"{check:58s} agree {agree:5d}   documented difference {documented:4d}   differ {differ:4d}")
        return all(row[2] == 0 for row in self.rows.values())


# ---------------------------------------------------------------------------------------------------------------
# GRESO: verl/trainer/ttis/presampling_selector.py (DataProfiler, run as is); the adaptation of p_easy / p_hard is
# transcribed from verl/trainer/ppo/ray_trainer.py (RayPPOTrainer.fit) and metric_utils.compute_reward_metrics.


def greso_skip(repo: str, trials: int, rng: random.Random, tally: Tally) -> None:
    source = read(repo, "verl/trainer/ttis/presampling_selector.py")
    draws = {"u": 0.0}
    shim = types.SimpleNamespace(rand=lambda *shape: torch.tensor([draws["u"]], dtype=torch.float64),
                                 randint=torch.randint)  # their torch.rand(1), returning our draw
    profiler_cls = extract(source, "DataProfiler", namespace={"torch": shim})
    for _ in range(trials):
        P, n = rng.randint(1, 12), 8
        profiler, ledger = profiler_cls(), PromptLedger(LedgerSettings(success_threshold=None, success_max=1.0))
        kind = [rng.choice(["easy", "hard", "mixed", "random"]) for _ in range(P)]
        for epoch in range(rng.randint(0, 6)):
            for i in range(P):
                if rng.random() < 0.2:
                    continue  # not sampled this epoch
                rate = {"easy": 0.97, "hard": 0.03, "mixed": 0.5, "random": rng.random()}[kind[i]]
                rewards = [1.0 if rng.random() < rate else rng.choice([0.0, 0.1]) for _ in range(n)]
                profiler.add_reward(epoch, f"src_{i}", float(np.mean(rewards)))
                ledger.record(torch.tensor([i]), torch.tensor([rewards]), step=epoch)
        p_easy, p_hard = rng.uniform(0.05, 0.95), rng.uniform(0.05, 0.95)
        planner = GresoSkip(GresoSettings())
        planner.p_easy, planner.p_hard = p_easy, p_hard
        probability = planner.plan(torch.arange(P), ledger, n=n).extra["skip_probability"].tolist()
        for i, q in enumerate(probability):  # their decision just below and just above our probability
            for u, skip in (((q * (1 - 1e-9), True), (q * (1 + 1e-9) + 1e-12, False)) if q > 0 else ((1e-12, False),)):
                draws["u"] = u
                theirs = profiler.easy_probabilistic_skip(0, f"src_{i}", p=p_easy) or profiler.hard_probabilistic_skip(
                    0, f"src_{i}", p=p_hard)
                tally.add("GRESO skip probability (their decision at our p -+ 1e-9)", theirs == skip)
        # Same draws: their whole filter over the batch with our uniforms, against our decisions.
        seed = rng.randrange(2**31)
        uniforms = torch.rand(P, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        ours = planner.plan(torch.arange(P), ledger, n=n, generator=torch.Generator().manual_seed(seed))
        theirs = _greso_filter(profiler, P, uniforms, p_easy, p_hard, draws)
        tally.add("GRESO skip decisions (same draws)", theirs == ours.skipped.tolist())


def _greso_filter(profiler, P, uniforms, p_easy, p_hard, draws) -> list[bool]:
    """Their ``filter_examples_all_probabilistic`` over prompts 0..P-1, prompt i's draws being uniforms[i]."""
    batch = types.SimpleNamespace(non_tensor_batch={"index": np.arange(P), "data_source": np.array(["src"] * P)},
                                  select_via_index=lambda idx: idx)
    original = profiler.easy_probabilistic_skip

    def easy(epoch, data_id, p):  # point the shim at this prompt's draw, then run theirs
        draws["u"] = uniforms[int(data_id.split("_")[1])].item()
        return original(epoch, data_id, p=p)

    profiler.easy_probabilistic_skip = easy
    with contextlib.redirect_stdout(io.StringIO()):
        kept = profiler.filter_examples_all_probabilistic(0, batch, p_easy, p_hard)
    profiler.easy_probabilistic_skip = original
    return [i not in kept for i in range(P)]


def greso_adapt(repo: str, trials: int, rng: random.Random, tally: Tally) -> None:
    """Their adaptation against ``update``: each sampled batch's shares from their ``compute_reward_metrics``
    (metric_utils.py, run as is: float32 count / groups), summed over the step's batches weighted by the batch's
    rows, and the step's update, transcribed (ray_trainer.py, fit: 'adjust exploration factor'). 1 to 3 sampled
    batches a step, as their dynamic sampling draws them; targets that shares can sit on exactly."""
    metrics_fn = extract(read(repo, "verl/trainer/ppo/metric_utils.py"), "compute_reward_metrics")
    for _ in range(trials):
        settings = GresoSettings(target_zero_variance=rng.choice([0.1, 0.25, 0.5, 0.75, 0.375]))
        planner, p_easy, p_hard = GresoSkip(settings), settings.p_easy, settings.p_hard
        same = True
        for step in range(30):
            epoch = step // 10
            easy_num = hard_num = total = 0
            summaries = []
            for _ in range(rng.randint(1, 3)):
                groups = [[1.0 if rng.random() < rate else 0.1 for _ in range(8)]
                          for rate in [rng.choice([0.0, 1.0, rng.random()]) for _ in range(rng.randint(1, 16))]]
                rewards = torch.tensor(groups)
                batch = types.SimpleNamespace(batch={"token_level_scores": rewards.view(-1, 1)})
                with contextlib.redirect_stdout(io.StringIO()):
                    metrics = metrics_fn(batch, None)
                easy_num += metrics["examples/all_correct_example_ratio"] * rewards.numel()
                hard_num += metrics["examples/format_example_ratio"] * rewards.numel()
                total += rewards.numel()
                summaries.append(PromptLedger(LedgerSettings(success_threshold=None, success_max=1.0)).record(
                    torch.arange(len(groups)), rewards, step=step))
            easy, hard = easy_num / total, hard_num / total
            if epoch > 0:
                p_hard = max(p_hard - 0.01, 0.05) if hard >= settings.target_zero_variance * 2 / 3 else min(
                    p_hard + 0.01, 0.95)
                p_easy = max(p_easy - 0.01, 0.05) if easy >= settings.target_zero_variance / 3 else min(
                    p_easy + 0.01, 0.95)
            planner.update(summaries, epoch=epoch)
            same = same and (planner.p_easy, planner.p_hard) == (p_easy, p_hard)
        tally.add("GRESO p_easy/p_hard adaptation (30 steps)", same)


# ---------------------------------------------------------------------------------------------------------------
# Knapsack-RL: verl/trainer/ppo/exploration_utils.py (sampling_budget_by_knapsack and solve_by_dp, run as is) and
# verl/utils/dataset/rl_dataset.py (RLHFDataset.update_sample_state / get_sample_state, run as is).


def knapsack(repo: str, trials: int, rng: random.Random, tally: Tally) -> None:
    source = read(repo, "verl/trainer/ppo/exploration_utils.py")
    ns = {"NUMBA_AVAILABLE": False, "time": time}  # their numpy path (numba is optional in their code)
    extract(source, "solve_by_dp", namespace=ns)
    theirs_fn = extract(source, "sampling_budget_by_knapsack", namespace=ns)
    for trial in range(trials):
        large = trial % 20 == 0  # every 20th: a batch of 48 prompts (their pure-Python DP is slow beyond)
        B, n = rng.randint(40, 48) if large else rng.randint(1, 12), rng.choice([4, 8])
        grid = rng.random() < 0.7  # rates on a k/16 grid: many ties
        states = []
        for _ in range(B):
            p = rng.randrange(17) / 16 if grid else rng.choice([0.0, 1.0, rng.random()])
            states.append([1 if rng.random() < 0.85 else 0, p, rng.randint(0, 40)])
        min_n, max_n = rng.choice([1, 2]), rng.choice([8, 16, 32, 64 if large else 8])
        kwargs = dict(min_n=min_n, max_n=max_n, alpha=rng.choice([0.5, 0.9]),
                      cost_estimation=rng.choice(["probability", "expectation"]),
                      allow_fallback=rng.random() < 0.8, total_budget=B * n + rng.choice([0, 0, -B, B]))
        try:
            with contextlib.redirect_stdout(io.StringIO()), np.errstate(divide="ignore", invalid="ignore"):
                theirs, _ = theirs_fn(states, n=n, **kwargs)
        except (ZeroDivisionError, AssertionError) as err:
            theirs = err
        settings = KnapsackSettings(min_n=min_n, max_n=max_n, alpha=kwargs["alpha"],
                                    cost_estimation=kwargs["cost_estimation"], allow_fallback=kwargs["allow_fallback"])
        try:
            ours, _ = knapsack_allocation(torch.tensor([s[1] for s in states]),
                                          torch.tensor([s[0] == 1 for s in states]),
                                          n, kwargs["total_budget"], settings)
        except ValueError as err:
            ours = err
        if isinstance(theirs, Exception) or isinstance(ours, Exception):
            if isinstance(theirs, Exception) and isinstance(ours, Exception):  # a budget below the floors
                tally.add("Knapsack: both refuse a budget below the floors", True)
            else:  # documented: every prompt mixed and cheap, their fallback divides by zero (then fails its assert)
                ok = isinstance(theirs, Exception) and int(ours.sum()) == kwargs["total_budget"]
                tally.add("Knapsack: their code fails, ours allocates the budget", False, documented=ok)
            continue
        tally.add("Knapsack allocation (same rates, budget, knobs)", theirs.tolist() == ours.tolist())
    _knapsack_estimate(repo, trials, rng, tally)


def _knapsack_estimate(repo: str, trials: int, rng: random.Random, tally: Tally) -> None:
    source = read(repo, "verl/utils/dataset/rl_dataset.py")
    update = extract(source, "update_sample_state", cls="RLHFDataset")
    state = extract(source, "get_sample_state", cls="RLHFDataset")
    for _ in range(trials):
        settings = KnapsackSettings(reward_buffer_length=rng.choice([4, 16]), min_buffer_length=rng.choice([0, 8]),
                                    epoch_estimation=rng.random() < 0.8, robust_epoch_estimation=rng.random() < 0.8)
        dataset = types.SimpleNamespace(sample_states={}, min_buffer_length=settings.min_buffer_length,
                                        reward_buffer_length=settings.reward_buffer_length,
                                        epoch_estimation=settings.epoch_estimation,
                                        robust_epoch_estimation=settings.robust_epoch_estimation)
        ledger = PromptLedger(LedgerSettings(window=16))
        for step in range(rng.randint(0, 8)):
            for index in range(6):
                if rng.random() < 0.5:
                    rewards = [rng.choice([-1, 0, 1]) for _ in range(rng.choice([2, 4, 8, 20]))]
                    update(dataset, index, rewards)
                    ledger.record(torch.tensor([index]), torch.tensor([rewards], dtype=torch.float64), step=step)
        valid, rate = estimate_success_rate(ledger.stats(torch.arange(6)), settings)
        theirs = [state(dataset, index) for index in range(6)]
        rollouts = ledger.stats(torch.arange(6)).rollouts.tolist()
        ok = all(t[0] == int(v) and t[1] == r and t[2] == c
                 for t, v, r, c in zip(theirs, valid.tolist(), rate.tolist(), rollouts))
        tally.add("Knapsack success-rate estimate (ledger vs their state)", ok)


# ---------------------------------------------------------------------------------------------------------------
# Reinforce-Ada: verl/trainer/ppo/ray_trainer.py (_generate_multi_round_adaptive_downsampling: the exit checks,
# downsample_cache and the fallback are transcribed below) and core_algos.compute_grpo_outcome_advantage (run as is);
# Tinker: tinker_cookbook/rl/adaptive_sampling.py (AdaptiveSampler._should_finish_prompt and
# _downsample_prompt_cache, run as is).


def _ra_verl_rounds(rewards, threshold, max_rounds, round_repeat, k, choice):
    """Transcribed from Reinforce-Ada's verl trainer: per prompt the kept indices, rollouts sampled, (pos, neg)."""
    P = len(rewards)
    state = [{"finished": False, "pos": [], "neg": []} for _ in range(P)]
    counts, selected = [0] * P, {}
    for _ in range(max_rounds):
        active = [p for p in range(P) if not state[p]["finished"]]
        if not active:
            break
        for p in active:
            for j in range(counts[p], counts[p] + round_repeat):
                (state[p]["pos"] if rewards[p][j] > threshold else state[p]["neg"]).append(j)
            counts[p] += round_repeat
            pos, neg = state[p]["pos"], state[p]["neg"]
            done = (len(pos) >= k // 2 and len(neg) >= k - k // 2) if choice == "balanced" else len(pos) >= 1
            if done:
                tp = min(k // 2, len(pos))
                tn = min(k - tp, len(neg))
                if tp + tn < k:
                    if len(pos) > tp:
                        tp += min(len(pos) - tp, k - (tp + tn))
                    elif len(neg) > tn:
                        tn += min(len(neg) - tn, k - (tp + tn))
                selected[p] = pos[:tp] + neg[:tn]
                state[p]["finished"] = True
    for p in range(P):  # the fallback
        if state[p]["finished"]:
            continue
        pos, neg = state[p]["pos"], state[p]["neg"]
        take = min(k, len(pos) + len(neg))
        target_pos, target_neg = k // 2, k - k // 2
        if choice == "positive_focused":
            ratio = len(pos) / (len(pos) + len(neg)) if pos or neg else 0.0
            target_pos = max(min(math.ceil(ratio * k), take - 1), 1)
            target_neg = take - target_pos
        ap, an = min(len(pos), target_pos), min(len(neg), target_neg)
        if ap + an < take:
            if len(pos) > ap:
                ap += min(len(pos) - ap, take - ap - an)
            elif len(neg) > an:
                an += min(len(neg) - an, take - ap - an)
        selected[p] = pos[:ap] + neg[:an]
    return selected, counts, [(len(s["pos"]), len(s["neg"])) for s in state]


def reinforce_ada(repo: str, tinker: str | None, trials: int, rng: random.Random, tally: Tally) -> None:
    core = read(repo, "verl/trainer/ppo/core_algos.py")
    advantage_fn = extract(core, "compute_grpo_outcome_advantage", namespace={"AlgoConfig": object})
    for _ in range(trials):
        choice = rng.choice(["balanced", "positive_focused"])
        settings = ReinforceAdaSettings(reinforce_ada_choice=choice, max_rounds=rng.choice([1, 2, 4]),
                                        round_repeat=rng.choice([2, 4, 8]), final_keep_per_prompt=rng.choice([2, 4, 5]),
                                        norm_adv_by_std_in_grpo=rng.random() < 0.5,
                                        global_stat_est=rng.random() < 0.5)
        P, cap = rng.randint(1, 8), settings.cap
        rates = [rng.choice([0.0, 1.0, rng.random()]) for _ in range(P)]
        # rewards whose float32 sums round differently in another order (the local baseline sums the kept ones)
        rewards = [[rng.choice([1.0, 0.71, 0.83, 0.9]) if rng.random() < r else rng.choice([0.0, 0.1, 0.2, 0.3, 0.45])
                    for _ in range(cap)] for r in rates]
        selected, their_counts, stats = _ra_verl_rounds(rewards, 0.7, settings.max_rounds, settings.round_repeat,
                                                         settings.final_keep_per_prompt, choice)
        planner = ReinforceAda(settings)
        full = torch.tensor(rewards)
        counts = torch.zeros(P, dtype=torch.long)
        while (more := planner.plan_round(torch.where(torch.arange(cap) < counts.unsqueeze(1), full, float("nan")),
                                          counts)).any():
            counts += more
        seen = torch.where(torch.arange(cap) < counts.unsqueeze(1), full, float("nan"))
        kept = planner.keep(seen, counts)
        ours_sel = [sorted(j for j in row if j >= 0) for row in kept.tolist()]
        tally.add("Reinforce-Ada rounds + exit rule (rollouts per prompt)", counts.tolist() == their_counts)
        tally.add("Reinforce-Ada kept rollouts (verl)", ours_sel == [sorted(selected[p]) for p in range(P)])
        ours_adv = planner.advantages(seen, counts, kept)
        theirs_adv = _ra_verl_advantages(advantage_fn, rewards, selected, stats, settings)
        ok = all(torch.equal(ours_adv[p][kept[p] >= 0].sort().values, theirs_adv[p].sort().values) for p in range(P))
        tally.add(f"Reinforce-Ada advantages, {'all-samples' if settings.global_stat_est else 'kept'} baseline "
                  "(verl, exact)", ok)
        if tinker is not None:
            _ra_tinker(tinker, rewards, seen, counts, planner, settings, tally)


def _ra_verl_advantages(advantage_fn, rewards, selected, stats, settings):
    rows = [(p, j) for p in range(len(rewards)) for j in selected[p]]
    scores = torch.tensor([[rewards[p][j]] for p, j in rows], dtype=torch.float32)
    index = np.array([f"uid{p}" for p, _ in rows], dtype=object)
    config = {"global_stat_est": settings.global_stat_est}
    adv, _ = advantage_fn(scores, torch.ones_like(scores), index, epsilon=settings.epsilon,
                          norm_adv_by_std_in_grpo=settings.norm_adv_by_std_in_grpo, config=config,
                          grpo_uid_to_pos_count={f"uid{p}": s[0] for p, s in enumerate(stats)},
                          grpo_uid_to_neg_count={f"uid{p}": s[1] for p, s in enumerate(stats)})
    out = defaultdict(list)
    for (p, _), value in zip(rows, adv[:, 0]):
        out[p].append(value)
    return [torch.stack(out[p]) if out[p] else torch.empty(0) for p in range(len(rewards))]


def _ra_tinker(repo, rewards, seen, counts, planner, settings, tally):
    source = read(repo, "tinker_cookbook/rl/adaptive_sampling.py")
    group = types.SimpleNamespace  # a TrajectoryGroup stand-in: trajectories_G holds the rollout's index
    ns = {"TrajectoryGroup": lambda **kw: group(**kw)}
    finish = extract(source, "_should_finish_prompt", cls="AdaptiveSampler", namespace=ns)
    downsample = extract(source, "_downsample_prompt_cache", cls="AdaptiveSampler", namespace=ns)
    config = types.SimpleNamespace(strategy=settings.reinforce_ada_choice,
                                   final_samples_per_prompt=settings.final_keep_per_prompt)
    sampler = types.SimpleNamespace(config=config)
    kept = planner.keep(seen, counts)
    for p in range(len(rewards)):
        pos_cache, neg_cache = defaultdict(list), defaultdict(list)
        for j in range(int(counts[p])):
            cache = pos_cache if rewards[p][j] > 0.7 else neg_cache
            cache[p].append(group(trajectories_G=[j], final_rewards_G=[rewards[p][j]], metrics_G=[{}]))
        done = finish(sampler, p, pos_cache, neg_cache)
        theirs = sorted(downsample(sampler, p, pos_cache, neg_cache, fallback=not done).trajectories_G)
        ours = sorted(j for j in kept[p].tolist() if j >= 0)
        documented = settings.reinforce_ada_choice == "positive_focused"  # Tinker prefers positives there
        tally.add("Reinforce-Ada kept rollouts (Tinker)", theirs == ours, documented=documented)


# ---------------------------------------------------------------------------------------------------------------
# Pilot-Commit: recipe/pc/pc_ray_trainer.py (RayPCTrainer.filter_batch, exclude_batch, run as is) and
# recipe/pc/replay_buffer.py (ReplayBuffer: _sample_by_variance, _sample_by_recent, flush, run as is).


def pilot_commit(repo: str, trials: int, rng: random.Random, tally: Tally) -> None:
    trainer = read(repo, "recipe/pc/pc_ray_trainer.py")
    filter_batch = extract(trainer, "filter_batch", cls="RayPCTrainer")
    exclude_batch = extract(trainer, "exclude_batch", cls="RayPCTrainer")
    buffer_cls = extract(read(repo, "recipe/pc/replay_buffer.py"), "ReplayBuffer",
                         namespace={"DataProto": None, "random": random, "deque": None})
    for _ in range(trials):
        settings = PilotCommitSettings(diversity_threshold_upper=rng.choice([0.25, 0.125]),
                                       diversity_threshold_lower=rng.choice([0.125, 0.25]),
                                       exclude_threshold_upper=rng.choice([1.0, 0.875, None]), n_explore=8,
                                       buffer_max_off_steps=rng.randint(0, 4),
                                       buffer_sampling_method=rng.choice(["max_variance", "most_recent"]))
        planner, ledger = PilotCommit(settings), PromptLedger()
        theirs_buffer = buffer_cls(10**5, settings.buffer_max_off_steps)
        verdicts = commits = True
        for step in range(8):
            ids = torch.tensor(rng.sample(range(40), rng.randint(1, 10)))
            rewards = torch.tensor([[float(rng.random() < r) for _ in range(8)]
                                    for r in [rng.choice([0.0, 1.0, rng.random()]) for _ in ids]])
            verdict = planner.after_pilot(ids, rewards, None, ledger, step=step)
            flat_ids, flat_acc = np.repeat(ids.numpy(), 8), rewards.flatten().numpy()
            passed, stats = filter_batch(None, flat_ids, flat_acc, settings.diversity_threshold_upper,
                                         settings.diversity_threshold_lower, len(ids))
            excluded = exclude_batch(None, flat_ids, flat_acc, settings.exclude_threshold_upper)
            verdicts &= sorted(passed) == sorted(ids[verdict.extra["passed"]].tolist())
            verdicts &= stats["too_correct_count"] == int(verdict.skipped.sum())
            verdicts &= stats["too_incorrect_count"] == int(verdict.deferred.sum())
            verdicts &= sorted(excluded) == sorted(ids[verdict.evicted].tolist())
            for i in passed:  # their buffer.add, without the rollouts (in the order filter_batch returns them)
                row = rewards[ids.tolist().index(i)].numpy()
                theirs_buffer.buffer[int(i)] = {"data": None, "step": step, "metric_stats": {
                    "mean": float(np.mean(row)), "std": float(np.std(row)), "count": len(row)}}
            k = rng.randint(0, 6)
            available = list(theirs_buffer.buffer)
            if len(available) <= k:
                chosen = available
            elif settings.buffer_sampling_method == "max_variance":
                chosen = theirs_buffer._sample_by_variance(available, k)
            else:
                chosen = theirs_buffer._sample_by_recent(available, k)
            for key in chosen:
                del theirs_buffer.buffer[key]
            commits &= planner.commit(k).ids.tolist() == [int(c) for c in chosen]
            theirs_buffer.flush(step)  # the end of the step
            planner.flush(step)
            commits &= planner.buffered.tolist() == list(theirs_buffer.buffer)
        tally.add("Pilot-Commit pilot verdicts (pass / easy / hard / evict)", bool(verdicts))
        tally.add("Pilot-Commit commit order and flush (8 steps)", bool(commits))


# ---------------------------------------------------------------------------------------------------------------
# C-GRPO: trl-cgrpo 0.2.0's CGRPOTrainer (calibrate, _resolved, _generate_single_turn) and conformal.py, run as they
# are in the environment given, by benchmarks/cgrpo_reference.py.


def cgrpo(python: str, trials: int, rng: random.Random, tally: Tally) -> None:
    cases = [_cgrpo_case(rng) for _ in range(trials)]
    reference = Path(__file__).resolve().parent / "cgrpo_reference.py"
    done = subprocess.run([python, str(reference)], input=json.dumps(cases), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{python} {reference} failed (an environment with trl-cgrpo==0.2.0?):\n{done.stderr[-2000:]}")
    for case, theirs in zip(cases, json.loads(done.stdout), strict=True):
        ours = _cgrpo_ours(case)
        thresholds = all(a["qhats"] == b["qhats"] and a["delta"] == b["delta"] and a["step"] == b["step"]
                         and a["rollouts"] == b["rollouts"] and a["solve_rate"] == b["solve_rate"]
                         for a, b in zip(ours["calibrations"], theirs["calibrations"], strict=True))
        thresholds &= len(ours["calibrations"]) == len(theirs["calibrations"])
        score = case["score"]
        tally.add(f"C-GRPO thresholds and delta, score={score} (exact)", thresholds)
        tally.add(f"C-GRPO stops: rollouts per prompt, score={score}", ours["stops"] == theirs["stops"])
        tally.add("C-GRPO random stream after the run (same draws, same order)",
                  ours["next_draw"] == theirs["next_draw"])


def _cgrpo_case(rng: random.Random) -> dict:
    """A run of a few steps: knobs, calibration answers for each calibration, each step's prompts' answers."""
    grid = rng.sample([1, 2, 3, 4, 6, 8, 12, 16], rng.randint(1, 5))
    k_max = max(grid)
    score = rng.choice(["aps", "aps", "aps", "first_success", "pass_rate"])
    vocab = ["1", "0"] if score != "aps" else ["7", "3", "11", "42", "", "-5"][:rng.randint(2, 6)]

    def answers(count):  # each prompt its own mix: some agree at once, some never
        rows = []
        for _ in range(count):
            favourite, weight = rng.choice(vocab), rng.choice([0.0, 0.5, 0.8, 1.0])
            rows.append([favourite if rng.random() < weight else rng.choice(vocab) for _ in range(k_max)])
        return rows

    N, steps = rng.randint(1, 24), rng.randint(1, 5)
    return {"budget_grid": grid, "score": score, "seed": rng.randint(0, 10**6),
            "delta": rng.choice([None, None, 0.1, 0.3, 0.5]), "delta_margin": rng.choice([0.05, 0.0, 0.2]),
            "split_delta": rng.random() < 0.3, "recalibrate_every": rng.choice([0, 1, 2]),
            "num_calibration_samples": rng.choice([None, rng.randint(1, N)]),
            "calibration_batch_size": rng.choice([None, 1, 3]),
            "calibration_gold": [rng.choice(vocab + ["99"]) for _ in range(N)],
            "calibrations": [answers(N) for _ in range(steps)],
            "steps": [answers(rng.randint(1, 6)) for _ in range(steps)]}


def _cgrpo_ours(case: dict) -> dict:
    """The same run with pods-rl's planner: calibrate when due, then rounds up the grid until all stop."""
    settings = CGRPOSettings(**{key: case[key] for key in ("budget_grid", "delta", "delta_margin", "split_delta",
                                                           "score", "recalibrate_every", "num_calibration_samples",
                                                           "calibration_batch_size")})
    planner, k_max = CGRPO(settings, seed=case["seed"]), settings.k_max
    calibrations, stops = [], []

    def outcomes(rows):  # answer codes, or passes for the execution scores
        if settings.score == "aps":
            return encode_answers(rows, k_max)[0]
        return torch.tensor([[a == "1" for a in row] for row in rows])

    for step, batch in enumerate(case["steps"]):
        if planner.calibration_due(step):
            N = planner.calibration_size(len(case["calibration_gold"]))
            rows, gold = case["calibrations"][len(calibrations)][:N], case["calibration_gold"][:N]
            codes, gold_codes = encode_answers(rows, k_max, gold)
            metrics = planner.calibrate(codes if settings.score == "aps" else outcomes(rows), gold_codes, step=step)
            calibrations.append({"step": step, "delta": planner.delta, "qhats": planner.qhats.tolist(),
                                 "rollouts": metrics["pods/cgrpo_calibration_rollouts"],
                                 "solve_rate": metrics.get("pods/cgrpo_calibration_solve_rate")})
        full = outcomes(batch)  # (P, k_max); a prompt's outcomes past its count are hidden from the planner
        counts = planner.plan(torch.arange(len(batch)), PromptLedger(), n=k_max).rollouts
        last = counts.clone()
        while True:
            seen = torch.where(torch.arange(k_max) < counts.unsqueeze(1), full, -1 if settings.score == "aps" else 0)
            more = planner.next_round(seen, counts, last > 0)
            if not more.any():
                break
            counts, last = counts + more, more
        stops.append(counts.tolist())
    return {"calibrations": calibrations, "stops": stops, "next_draw": planner.rng.random()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for flag in ("greso", "knapsack", "reinforce-ada", "reinforce-ada-tinker", "pilot-commit"):
        parser.add_argument(f"--{flag}", help="the authors' repository: a checkout or a bare git directory")
    parser.add_argument("--cgrpo", metavar="PYTHON", help="the Python of an environment with trl-cgrpo==0.2.0")
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rng, tally = random.Random(args.seed), Tally()
    checks = [(args.greso, lambda: (greso_skip(args.greso, args.trials, rng, tally),
                                    greso_adapt(args.greso, args.trials, rng, tally))),
              (args.knapsack, lambda: knapsack(args.knapsack, args.trials, rng, tally)),
              (args.reinforce_ada, lambda: reinforce_ada(args.reinforce_ada, args.reinforce_ada_tinker, args.trials,
                                                         rng, tally)),
              (args.pilot_commit, lambda: pilot_commit(args.pilot_commit, args.trials, rng, tally)),
              (args.cgrpo, lambda: cgrpo(args.cgrpo, args.trials, rng, tally))]
    for repo, check in checks:
        if repo:
            start = time.perf_counter()
            check()
            print(f"[{repo}: {time.perf_counter() - start:.1f} s]", file=sys.stderr)
    if not tally.rows:
        parser.error("give at least one repository (or --cgrpo PYTHON)")
    return 0 if tally.report() else 1


if __name__ == "__main__":
    sys.exit(main())
