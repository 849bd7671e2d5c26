"""The prompt ledger (pods_rl.budget.ledger): what it keeps per prompt, against a plain-Python reference;
gathering across
ranks (a fake 2-rank gather in threads, and 2 real gloo processes); exact restore from a checkpoint file."""

import math
import os
import random
import threading

import pytest
import torch

from pods_rl.budget.ledger import LEDGER_FILE, LedgerSettings, PromptLedger, prompt_key


def padded(rows, n):
    """(G, n) float64 rewards NaN-padded after each row, and counts (G,)."""
    rewards = torch.full((len(rows), n), float("nan"), dtype=torch.float64)
    for i, row in enumerate(rows):
        rewards[i, : len(row)] = torch.tensor(row, dtype=torch.float64)
    return rewards, torch.tensor([len(r) for r in rows])


class Reference:
    """The ledger's columns computed the slow, obvious way: one Python record per prompt."""

    def __init__(self, threshold, window):
        self.threshold, self.window, self.p = threshold, window, {}

    def record(self, ids, rows, step):
        for key, row in zip(ids, rows):
            p = self.p.setdefault(key, dict(rollouts=0, successes=0, reward_sum=0.0, groups=0, last_step=-1, easy=0,
                                             hard=0, outcomes=[], last=(0, 0)))
            scored = [r for r in row if not math.isnan(r)]
            wins = [r > self.threshold for r in scored]
            p["rollouts"] += len(scored)
            p["successes"] += sum(wins)
            p["reward_sum"] += sum(scored)
            p["groups"] += 1
            p["last_step"] = step
            if scored:
                p["easy"] = p["easy"] + 1 if all(wins) else 0
                p["hard"] = p["hard"] + 1 if not any(wins) else 0
                p["outcomes"] += [int(w) for w in wins]
                p["last"] = (len(scored), sum(wins))

    def check(self, ledger):
        stats = ledger.stats(torch.tensor(sorted(self.p)))
        for i, key in enumerate(sorted(self.p)):
            p = self.p[key]
            window = ([-1] * self.window + p["outcomes"])[-self.window:]
            got = dict(rollouts=stats.rollouts[i].item(), successes=stats.successes[i].item(),
                       groups=stats.groups[i].item(), last_step=stats.last_step[i].item(),
                       easy=stats.all_success_streak[i].item(), hard=stats.no_success_streak[i].item(),
                       window=stats.window[i].tolist(),
                       last=(stats.last_group_rollouts[i].item(), stats.last_group_successes[i].item()))
            want = dict(rollouts=p["rollouts"], successes=p["successes"], groups=p["groups"], last_step=p["last_step"],
                        easy=p["easy"], hard=p["hard"], window=window, last=p["last"])
            assert got == want, (key, got, want)
            assert stats.reward_sum[i].item() == pytest.approx(p["reward_sum"])


def random_groups(rng, num_ids, groups, n):
    ids = [rng.randrange(num_ids) for _ in range(groups)]
    rows = []
    for _ in ids:
        count = rng.randint(0, n)
        rows.append([float("nan") if rng.random() < 0.1 else rng.choice([0.0, 0.0, 1.0, 0.5]) for _ in range(count)])
    return ids, rows


def test_ledger_matches_a_plain_python_reference_over_many_steps():
    rng = random.Random(0)
    ledger, ref = PromptLedger(LedgerSettings(success_threshold=0.6, window=5)), Reference(0.6, 5)
    for step in range(40):
        ids, rows = random_groups(rng, num_ids=12, groups=6, n=7)  # repeated ids within a call too
        rewards, counts = padded(rows, 7)
        ledger.record(torch.tensor(ids), rewards, counts, step=step)
        ref.record(ids, rows, step)
    ref.check(ledger)
    assert sorted(ledger.ids.tolist()) == sorted(ref.p)
    unseen = ledger.stats(torch.tensor([999]))
    assert not unseen.seen[0] and unseen.rollouts[0] == 0 and unseen.last_step[0] == -1
    assert unseen.window[0].tolist() == [-1] * 5


def test_streaks_window_and_success_at_max():
    ledger = PromptLedger(LedgerSettings(success_threshold=None, success_max=1.0, window=4))
    for step, row in enumerate([[1, 1, 1], [1, 1, 1], [1, 0.9, 1], [0, 0.5], [float("nan")] * 2, [0, 0, 0]]):
        rewards, counts = padded([row], 3)
        summary = ledger.record(torch.tensor([7]), rewards, counts, step=step)
    stats = ledger.stats(torch.tensor([7]))
    # 0.9 is not a success at max 1.0; the all-NaN group (step 4) leaves the streaks and window alone
    assert stats.all_success_streak.item() == 0 and stats.no_success_streak.item() == 2
    assert stats.window[0].tolist() == [0, 0, 0, 0] and stats.last_step.item() == 5
    assert stats.recent_success_rate(4).item() == 0.0
    assert summary.no_success.tolist() == [True] and summary.zero_variance.tolist() == [True]
    assert stats.rollouts.item() == 3 + 3 + 3 + 2 + 3 and stats.successes.item() == 3 + 3 + 2


def test_recent_success_rate_over_part_of_the_window():
    ledger = PromptLedger(LedgerSettings(window=6))
    ledger.record(torch.tensor([1, 2]), *padded([[1, 1, 0, 0, 0, 1], [1]], 6), step=0)
    stats = ledger.stats(torch.tensor([1, 2, 3]))
    assert stats.recent_success_rate(6).tolist() == [0.5, 1.0, 0.0]
    assert stats.recent_success_rate(2).tolist() == [0.5, 1.0, 0.0]
    with pytest.raises(ValueError, match="longer than the ledger's window"):
        stats.recent_success_rate(7)


class FakeGather:
    """``gather`` for ``world`` ranks running in threads: each rank's tensor, concatenated in rank order."""

    def __init__(self, world):
        self.slots, self.barrier = [None] * world, threading.Barrier(world)

    def for_rank(self, rank):
        def gather(tensor):
            self.slots[rank] = tensor
            self.barrier.wait()
            out = torch.cat(self.slots)
            self.barrier.wait()  # nobody overwrites a slot before every rank has read it
            return out
        return gather


def test_a_two_rank_gather_gives_every_rank_the_ledger_of_all_groups():
    rng = random.Random(1)
    big = 2**62 + 12345  # a 63-bit hash id survives the float64 table exactly
    steps = []
    for _ in range(10):
        per_rank = [random_groups(rng, num_ids=6, groups=rng.randint(1, 4), n=4) for _ in range(2)]
        steps.append([([big if i == 0 else i for i in ids], rows) for ids, rows in per_rank])
    fake = FakeGather(2)
    ledgers = [PromptLedger(), PromptLedger()]

    def run(rank):
        for step, per_rank in enumerate(steps):
            ids, rows = per_rank[rank]
            rewards, counts = padded(rows + [[]] * (4 - len(rows)), 4)  # pad to 4 groups per rank ...
            counts[len(rows):] = -1  # ... with padding rows that the ledger ignores
            ledgers[rank].record(torch.tensor(ids + [0] * (4 - len(ids))), rewards, counts, step=step,
                                 gather=fake.for_rank(rank), gather_device="cpu")

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    single = PromptLedger()
    for step, per_rank in enumerate(steps):
        ids, rows = per_rank[0][0] + per_rank[1][0], per_rank[0][1] + per_rank[1][1]
        single.record(torch.tensor(ids), *padded(rows, 4), step=step)
    for ledger in ledgers:
        assert_same_state(ledger.state_dict(), single.state_dict())
    assert big in ledgers[1].ids.tolist()


def assert_same_state(a, b):
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key


def _gloo_rank(rank, init_file, out_dir):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)

    def gather(tensor):
        parts = [torch.empty_like(tensor) for _ in range(2)]
        dist.all_gather(parts, tensor)
        return torch.cat(parts)

    ledger = PromptLedger()
    for step in range(3):
        ids = torch.tensor([10 * rank + step, 99])
        rewards = torch.tensor([[1.0, 0.0, float(rank)], [float(step % 2), 1.0, 1.0]])
        ledger.record(ids, rewards, step=step, gather=gather)
    ledger.save(os.path.join(out_dir, f"rank{rank}.pt"))
    # Both ranks leave the last collective before either tears gloo down: a rank that closes its pairs while its
    # peer still reads from them aborts the peer ("terminate called without an active exception", seen in CI).
    dist.barrier()
    dist.destroy_process_group()


def test_two_gloo_processes_keep_identical_ledgers(tmp_path):
    import torch.multiprocessing as mp

    # fork: the children need no fresh import of torch (spawn would take ~4 s more on a small machine)
    mp.start_processes(_gloo_rank, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True,
                       start_method="fork")
    ledgers = [PromptLedger.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert_same_state(ledgers[0].state_dict(), ledgers[1].state_dict())
    stats = ledgers[0].stats(torch.tensor([99, 0, 10, 12]))
    assert stats.groups.tolist() == [6, 1, 1, 1]  # prompt 99 on both ranks at every step
    assert stats.successes.tolist() == [2 * (2 + 3 + 2), 1, 2, 2]


def test_save_and_load_restore_exactly_and_the_runs_go_on_identically(tmp_path):
    rng = random.Random(2)
    ledger = PromptLedger(LedgerSettings(success_threshold=0.2, window=3))
    for step in range(5):
        ledger.record(*(lambda ids, rows: (torch.tensor(ids), *padded(rows, 5)))(*random_groups(rng, 20, 8, 5)),
                      step=step)
    path = ledger.save(tmp_path / LEDGER_FILE)
    assert not (tmp_path / (LEDGER_FILE + ".tmp")).exists() and path.stat().st_size < 20_000
    restored = PromptLedger.load(path)
    assert restored.settings == ledger.settings
    assert_same_state(restored.state_dict(), ledger.state_dict())
    for step in range(5, 12):  # the same groups into both: identical states all along
        ids, rows = random_groups(rng, 30, 8, 5)
        for each in (ledger, restored):
            each.record(torch.tensor(ids), *padded(rows, 5), step=step)
        assert_same_state(restored.state_dict(), ledger.state_dict())
    with pytest.raises(ValueError, match="resume with the saved settings"):
        PromptLedger(LedgerSettings(window=4)).load_state_dict(ledger.state_dict())


def test_eviction_is_kept_and_saved():
    ledger = PromptLedger()
    ledger.evict(torch.tensor([5]))
    ledger.record(torch.tensor([6]), torch.ones(1, 2), step=0)
    assert ledger.stats(torch.tensor([5, 6, 7])).evicted.tolist() == [True, False, False]
    restored = PromptLedger()
    restored.load_state_dict(ledger.state_dict())
    assert restored.stats(torch.tensor([5])).evicted.tolist() == [True]


def test_prompt_key_is_stable_and_ignores_dict_key_order():
    assert prompt_key("What is 2+2?") == prompt_key("What is 2+2?") == 1499113416552330545
    a = [{"role": "user", "content": "hi"}]
    b = [{"content": "hi", "role": "user"}]
    assert prompt_key(a) == prompt_key(b) != prompt_key("hi")
    assert 0 <= prompt_key("x") < 2**63


@pytest.mark.parametrize("call, message", [
    (lambda ledger: ledger.record(torch.tensor([-1]), torch.ones(1, 2), step=0), "prompt ids must be >= 0"),
    (lambda ledger: ledger.record(torch.tensor([1.0]), torch.ones(1, 2), step=0), "1-d integer tensor"),
    (lambda ledger: ledger.record(torch.tensor([1, 2]), torch.ones(1, 2), step=0), "one row per id"),
    (lambda ledger: ledger.record(torch.tensor([1]), torch.ones(1, 2), torch.tensor([3]), step=0), "counts must be"),
])
def test_bad_input_is_one_line_naming_the_problem(call, message):
    with pytest.raises(ValueError, match=message):
        call(PromptLedger())


@pytest.mark.parametrize("kwargs, message", [
    (dict(success_threshold=None), "set exactly one"),
    (dict(success_threshold=0.5, success_max=1.0), "set exactly one"),
    (dict(success_threshold=float("nan")), "finite number"),
    (dict(window=0), "window must be an integer"),
])
def test_bad_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LedgerSettings(**kwargs)
