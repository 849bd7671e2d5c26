"""Tests for pods_rl.downsample: the down-sampling rules and GRPO group advantages.

The max_variance rule is checked against brute force over every subset (itertools.combinations) for small
groups; group_advantages against a hand computation and against TRL's own formula.
"""

from __future__ import annotations

import importlib
import itertools
import math
import statistics
from fractions import Fraction

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pods_rl
from pods_rl import available_rules, downsample, group_advantages, register_rule

# `pods_rl.downsample` is the function (re-exported in __init__), so fetch the module itself this way.
ds_module = importlib.import_module("pods_rl.downsample")

HYPOTHESIS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------------------------------------------------
# Brute-force references


def population_variance(values) -> float:
    values = [float(v) for v in values]
    mean = math.fsum(values) / len(values)
    return math.fsum((v - mean) ** 2 for v in values) / len(values)


def brute_force_max_variance(group: list[float], m: int) -> float:
    """Largest population variance over all size-m subsets of ``group``."""
    return max(population_variance(c) for c in itertools.combinations(group, m))


def assert_valid_indices(kept: torch.Tensor, n: int, m: int) -> None:
    """kept (B, m): int64, in [0, n), strictly ascending (so distinct) within each row."""
    assert kept.dtype == torch.long
    assert kept.shape[-1] == m
    assert bool(((kept >= 0) & (kept < n)).all())
    if m > 1:
        assert bool((kept[..., 1:] > kept[..., :-1]).all())


def kept_variance_is_max(group: list[float], kept: list[int], m: int) -> bool:
    best = brute_force_max_variance(group, m)
    got = population_variance([group[i] for i in kept])
    return math.isclose(got, best, rel_tol=1e-9, abs_tol=1e-12)


# ---------------------------------------------------------------------------------------------------------
# max_variance is exact


@pytest.mark.parametrize("kind", ["int_ties", "float", "float32", "bool", "float_offset"])
def test_max_variance_matches_brute_force_for_every_n_and_m(kind):
    gen = torch.Generator().manual_seed(0)
    for n in range(1, 11):
        groups = 6
        if kind == "int_ties":
            rewards = torch.randint(0, 3, (groups, n), generator=gen)  # many ties
        elif kind == "float":  # not exact in float32: the float64 sort path
            rewards = torch.randn((groups, n), generator=gen, dtype=torch.float64)
        elif kind == "float32":  # the int64-key path
            rewards = torch.randn((groups, n), generator=gen)
        elif kind == "bool":
            rewards = torch.rand((groups, n), generator=gen) < 0.5
        else:  # a large common offset must not cancel the variance away
            rewards = 1e6 + torch.rand((groups, n), generator=gen, dtype=torch.float64)
        for m in range(1, n + 1):
            kept = downsample(rewards, m)  # (groups, m), all groups at once
            assert kept.shape == (groups, m)
            assert_valid_indices(kept, n, m)
            for group, row in zip(rewards.double().tolist(), kept.tolist()):
                assert kept_variance_is_max(group, row, m), (kind, n, m, group, row)


def test_max_variance_known_examples_and_tie_rule():
    # Keep the k lowest and m - k highest (smallest k among equal variances); among equal rewards the
    # lowest indices, at both ends (before issue #13 the low end took the highest indices: [1, 2], [1, 2]).
    assert downsample(torch.tensor([0.0, 1.0, 0.0, 1.0]), 2).tolist() == [0, 1]
    assert downsample(torch.tensor([0.0, 0.0, 1.0, 1.0]), 2).tolist() == [0, 2]
    assert downsample(torch.tensor([5.0, 1.0, 3.0, 9.0, 7.0]), 2).tolist() == [1, 3]
    assert downsample(torch.tensor([5.0, 1.0, 3.0, 9.0, 7.0]), 3).tolist() == [1, 3, 4]
    # All-equal groups (common: every rollout right or every one wrong) keep the lowest indices, like
    # max_reward; so does m == 1 (variance 0 for every choice).
    assert downsample(torch.ones(6), 3).tolist() == [0, 1, 2]
    assert downsample(torch.tensor([2.0, 7.0, 7.0, 1.0]), 1).tolist() == [1]
    assert downsample(torch.tensor([2.0, 7.0, 7.0, 1.0]), 1, "max_reward").tolist() == [1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_m_equal_one_keeps_the_max_reward_for_any_floats(dtype):
    # Every single rollout has variance 0; the tie rule must decide, not float rounding noise.
    gen = torch.Generator().manual_seed(11)
    rewards = (torch.randn((500, 40), generator=gen, dtype=torch.float64) * 3 + 7).to(dtype)
    assert torch.equal(downsample(rewards, 1), downsample(rewards, 1, "max_reward"))


def test_max_variance_is_deterministic_and_batched_equals_per_group():
    gen = torch.Generator().manual_seed(1)
    rewards = torch.randint(0, 4, (64, 12), generator=gen).float()  # (B, n), many ties
    for rule in ["max_variance", "max_reward"]:
        batched = downsample(rewards, 5, rule)
        assert torch.equal(batched, downsample(rewards.clone(), 5, rule))
        per_group = torch.stack([downsample(group, 5, rule) for group in rewards])
        assert torch.equal(batched, per_group)


@pytest.mark.parametrize("n", [200, 1500])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])  # the int64-key and float64-sort paths
def test_max_variance_large_group_against_candidate_scan(n, dtype):
    # Beyond brute-force sizes: compare with an independent O(m^2) scan over the k lowest + m-k highest.
    gen = torch.Generator().manual_seed(2)
    rewards = torch.rand((8, n), generator=gen, dtype=torch.float64).to(dtype)
    m = 37
    kept = downsample(rewards, m)
    assert_valid_indices(kept, n, m)
    for group, row in zip(rewards, kept):
        values = group.sort().values
        best = max(
            population_variance(torch.cat([values[:k], values[n - (m - k) :]]).tolist()) for k in range(m + 1)
        )
        got = population_variance(group[row].tolist())
        assert math.isclose(got, best, rel_tol=1e-12), (dtype, n)


# ---------------------------------------------------------------------------------------------------------
# Property tests

group_of_floats = st.lists(
    st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, allow_infinity=False, width=32),
    min_size=1,
    max_size=10,
)
group_of_ints = st.lists(st.integers(min_value=-3, max_value=3), min_size=1, max_size=10)


@HYPOTHESIS
@given(group=st.one_of(group_of_floats, group_of_ints), data=st.data())
def test_property_max_variance_valid_and_maximal(group, data):
    n = len(group)
    m = data.draw(st.integers(min_value=1, max_value=n), label="m")
    rewards = torch.tensor(group, dtype=torch.float32)
    kept = downsample(rewards, m)
    assert kept.shape == (m,)
    assert_valid_indices(kept, n, m)
    exact = rewards.double().tolist()
    assert kept_variance_is_max(exact, kept.tolist(), m)


@HYPOTHESIS
@given(group=st.one_of(group_of_floats, group_of_ints), data=st.data())
def test_property_max_reward_keeps_a_top_m_multiset(group, data):
    n = len(group)
    m = data.draw(st.integers(min_value=1, max_value=n), label="m")
    rewards = torch.tensor(group, dtype=torch.float32)
    kept = downsample(rewards, m, "max_reward")
    assert_valid_indices(kept, n, m)
    assert sorted(rewards[kept].tolist()) == sorted(rewards.tolist())[n - m :]
    # Among equal rewards the lowest indices: every dropped rollout is strictly worse than a kept one
    # with a higher index.
    kept_set = set(kept.tolist())
    for dropped in set(range(n)) - kept_set:
        assert not any(rewards[i] == rewards[dropped] and i > dropped for i in kept_set)


@HYPOTHESIS
@given(
    n=st.integers(min_value=1, max_value=12),
    batch=st.integers(min_value=1, max_value=5),
    seed=st.integers(min_value=0, max_value=2**31),
    data=st.data(),
)
def test_property_random_valid_and_reproducible(n, batch, seed, data):
    m = data.draw(st.integers(min_value=1, max_value=n), label="m")
    rewards = torch.zeros(batch, n)
    first = downsample(rewards, m, "random", generator=torch.Generator().manual_seed(seed))
    again = downsample(rewards, m, "random", generator=torch.Generator().manual_seed(seed))
    assert first.shape == (batch, m)
    assert_valid_indices(first, n, m)
    assert torch.equal(first, again)


def test_random_is_uniform_over_subsets():
    # 6000 groups of n=5, m=2: each of the 10 pairs should come up ~600 times. Seeded, so not flaky;
    # the bound (+-25%, about 6 standard deviations) still fails a rule biased towards any pair.
    kept = downsample(torch.zeros(6000, 5), 2, "random", generator=torch.Generator().manual_seed(0))
    counts = {pair: 0 for pair in itertools.combinations(range(5), 2)}
    for row in kept.tolist():
        counts[tuple(row)] += 1
    assert all(450 <= c <= 750 for c in counts.values()), counts
    # Different seeds give different draws.
    other = downsample(torch.zeros(6000, 5), 2, "random", generator=torch.Generator().manual_seed(1))
    assert not torch.equal(kept, other)


def test_random_without_generator_is_valid():
    kept = downsample(torch.arange(10.0), 4, "random")
    assert_valid_indices(kept, 10, 4)


# ---------------------------------------------------------------------------------------------------------
# Shapes, dtypes, devices


@pytest.mark.parametrize(
    "dtype",
    [
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
        torch.int32,
        torch.int64,
        torch.uint8,
        torch.bool,
    ],
)
@pytest.mark.parametrize("rule", ["max_variance", "max_reward"])
def test_every_dtype_gives_the_float64_answer(dtype, rule):
    gen = torch.Generator().manual_seed(3)
    values = torch.randint(0, 2 if dtype == torch.bool else 5, (16, 9), generator=gen)
    rewards = values.to(dtype)  # exactly representable in every dtype
    kept = downsample(rewards, 4, rule)
    assert kept.dtype == torch.long and kept.shape == (16, 4)
    assert torch.equal(kept, downsample(values.double(), 4, rule))


def test_non_integer_float_dtypes_keep_a_maximal_subset():
    gen = torch.Generator().manual_seed(4)
    for dtype in [torch.float16, torch.bfloat16]:
        rewards = torch.rand((10, 8), generator=gen).to(dtype)
        kept = downsample(rewards, 3)
        for group, row in zip(rewards.double().tolist(), kept.tolist()):
            assert kept_variance_is_max(group, row, 3)


def _mixed_rewards(B: int, n: int, seed: int) -> torch.Tensor:
    """(B, n) float32 rewards with ties, negatives, -0.0 next to +0.0, and random floats."""
    gen = torch.Generator().manual_seed(seed)
    ties = torch.randint(-2, 3, (B, n), generator=gen).float() * 0.5
    ties[ties == 0] = torch.where(torch.rand(int((ties == 0).sum()), generator=gen) < 0.5, -0.0, 0.0)
    floats = torch.randn((B, n), generator=gen)
    return torch.where(torch.rand((B, n), generator=gen) < 0.5, ties, floats)


@pytest.mark.parametrize("n", [12, 300, 700])  # 700: torch.sort keeps long rows when it has > 2 threads
def test_numpy_and_torch_sorts_agree(monkeypatch, n):
    rewards = _mixed_rewards(16, n, seed=8)
    results = []
    for numpy_module in [ds_module._numpy, None]:  # numpy's SIMD sort on CPU, then torch.sort
        monkeypatch.setattr(ds_module, "_numpy", numpy_module)
        results.append(
            [
                downsample(rewards, n // 4, rule, generator=torch.Generator().manual_seed(0))
                for rule in available_rules()
            ]
        )
    for with_numpy, with_torch in zip(*results):
        assert torch.equal(with_numpy, with_torch)


def test_order_keys_and_the_float64_sort_give_the_same_order(monkeypatch):
    # float32-exact rewards go through int64 keys; other float64 rewards through a stable sort of the
    # values. Both must realize the same documented tie rule.
    rewards = _mixed_rewards(64, 20, seed=9)
    by_keys = {m: (downsample(rewards, m), downsample(rewards, m, "max_reward")) for m in (1, 5, 12, 19)}
    monkeypatch.setattr(ds_module, "_order_keys", lambda values, low=None: None)
    for m, (variance_keys, reward_keys) in by_keys.items():
        assert torch.equal(downsample(rewards.double(), m), variance_keys)
        assert torch.equal(downsample(rewards.double(), m, "max_reward"), reward_keys)


def test_negative_zero_ties_with_zero():
    assert downsample(torch.tensor([-0.0, 0.0, 0.0, -1.0]), 1, "max_reward").tolist() == [0]
    assert downsample(torch.tensor([0.0, -0.0, -1.0]), 2).tolist() == [0, 2]


def test_accepts_lists_and_keeps_rank():
    assert downsample([0.0, 1.0, 0.5], 2).tolist() == [0, 1]
    assert downsample([[0, 1, 2], [2, 1, 0]], 2).tolist() == [[0, 2], [0, 2]]
    assert downsample(torch.tensor([3.0]), 1).tolist() == [0]


@pytest.mark.parametrize("rule", ["max_variance", "max_reward", "random"])
def test_m_equal_n_keeps_everything(rule):
    rewards = torch.tensor([[3.0, 1.0, 2.0], [0.0, 0.0, 0.0]])
    assert downsample(rewards, 3, rule).tolist() == [[0, 1, 2], [0, 1, 2]]


@pytest.mark.parametrize("rule", ["max_variance", "max_reward", "random"])
def test_rewards_that_require_grad_are_accepted(rule):
    rewards = torch.tensor([[0.0, 3.0, 1.0, 2.0]], requires_grad=True)  # e.g. straight from a reward model
    kept = downsample(rewards, 2, rule, generator=torch.Generator().manual_seed(0))
    assert kept.shape == (1, 2) and not kept.requires_grad


def test_zero_groups_give_empty_result():
    kept = downsample(torch.zeros(0, 8), 3)
    assert kept.shape == (0, 3) and kept.dtype == torch.long


def test_m_may_be_an_integer_tensor_or_numpy_int():
    np = pytest.importorskip("numpy")
    rewards = torch.tensor([0.0, 5.0, 1.0, 4.0])
    assert (
        downsample(rewards, torch.tensor(2)).tolist() == downsample(rewards, np.int64(2)).tolist() == [0, 1]
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cpu_and_cuda_agree():
    gen = torch.Generator().manual_seed(5)
    for rewards in [
        torch.randint(0, 3, (256, 16), generator=gen).float(),
        torch.rand((256, 64), generator=gen),
    ]:
        for rule in ["max_variance", "max_reward"]:
            on_gpu = downsample(rewards.cuda(), 8, rule)
            assert on_gpu.device.type == "cuda"
            assert torch.equal(on_gpu.cpu(), downsample(rewards, 8, rule))
        kept = downsample(rewards.cuda(), 8, "random", generator=torch.Generator("cuda").manual_seed(0))
        assert kept.device.type == "cuda"
        assert_valid_indices(kept.cpu(), rewards.shape[1], 8)
    adv = torch.tensor([[1.0, 0.0, float("nan"), 1.0]])
    assert torch.allclose(group_advantages(adv.cuda()).cpu(), group_advantages(adv))


# ---------------------------------------------------------------------------------------------------------
# Bad input: clear ValueErrors


@pytest.mark.parametrize(
    ("m", "match"),
    [
        (0, r"1 <= m <= n \(group size n=4\), got m=0"),
        (5, r"1 <= m <= n \(group size n=4\), got m=5"),
        (-1, "got m=-1"),
        (2.0, "m must be an integer.*float 2.0"),
        (True, "m must be an integer.*bool"),
        ("2", "m must be an integer.*str"),
        (None, "m must be an integer.*NoneType"),
    ],
)
def test_bad_m(m, match):
    with pytest.raises(ValueError, match=match):
        downsample(torch.zeros(4), m)


def test_unknown_rule_lists_available_rules():
    with pytest.raises(
        ValueError, match=r"unknown down-sampling rule 'max_var'.*'max_reward', 'max_variance', 'random'"
    ):
        downsample(torch.zeros(4), 2, "max_var")


@pytest.mark.parametrize("shape", [(), (2, 3, 4)])
def test_wrong_rank(shape):
    with pytest.raises(ValueError, match=rf"shape \(n,\) or \(B, n\).*{len(shape)}-d"):
        downsample(torch.zeros(shape), 1)


@pytest.mark.parametrize("shape", [(0,), (3, 0)])
def test_empty_group(shape):
    with pytest.raises(ValueError, match="empty group"):
        downsample(torch.zeros(shape), 1)


def test_nan_names_the_groups():
    rewards = torch.zeros(10, 4)
    rewards[3, 1] = float("nan")
    rewards[7, 0] = float("nan")
    rewards[5, 2] = float("inf")
    for rule in available_rules():
        with pytest.raises(ValueError, match=r"rewards contain NaN in group\(s\) \[3, 7\]"):
            downsample(rewards, 2, rule)
    with pytest.raises(ValueError, match=r"rewards contain NaN in group\(s\) \[0\]"):
        downsample(torch.tensor([0.0, float("nan")]), 1)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_found_in_every_float_dtype_and_position(dtype, bad):
    for row, col in [(0, 0), (1, 3), (2, 5)]:
        rewards = torch.arange(18.0).view(3, 6).to(dtype)
        rewards[row, col] = bad
        for rule in available_rules():
            with pytest.raises(ValueError, match=rf"in group\(s\) \[{row}\]"):
                downsample(rewards, 2, rule)


def test_huge_float64_rewards_are_refused_not_mangled():
    for rewards in [[1e308, 1.5e308, 0.0], [1.5e308, 0.0, -1.5e308], [1e200, 0.0, 1.0]]:
        with pytest.raises(ValueError, match="spread too wide"):
            downsample(torch.tensor(rewards, dtype=torch.float64), 2)
    # A huge common offset with a small spread is fine.
    assert downsample(torch.tensor([1e200, 1e200, 1e200], dtype=torch.float64), 2).tolist() == [0, 1]


def test_inf_names_the_groups():
    rewards = torch.zeros(4, 3, dtype=torch.float16)
    rewards[2, 0] = float("-inf")
    with pytest.raises(ValueError, match=r"infinite values in group\(s\) \[2\]"):
        downsample(rewards, 2)


@pytest.mark.parametrize(
    ("rewards", "match"),
    [
        ([[1.0, 2.0], [3.0]], "must be a tensor"),
        (["a", "b"], "must be a tensor"),
        (torch.zeros(3, dtype=torch.complex64), "real numbers"),
    ],
)
def test_unusable_rewards(rewards, match):
    with pytest.raises(ValueError, match=match):
        downsample(rewards, 1)


# ---------------------------------------------------------------------------------------------------------
# tiebreak: same kept reward values, then smaller tiebreak, then lower index (issue #13)


def reference_keep(group: list[float], m: int, rule: str, tiebreak: list[float] | None) -> list[int]:
    """The documented rule, computed the slow way with exact arithmetic.

    Kept values: max_reward -> the m highest; max_variance -> the k lowest + m - k highest sorted values for
    the smallest k of maximal exact variance (checked against all subsets for small n). Then, for each
    reward value kept c times, the c rollouts with that reward that come first by (tiebreak, index).
    """
    n = len(group)
    values = sorted(Fraction(v) for v in group)
    if rule == "max_reward":
        kept_values = values[n - m :]
    else:

        def exact_var(vs):
            mean = sum(vs) / len(vs)
            return sum((v - mean) ** 2 for v in vs) / len(vs)

        candidates = [values[:k] + values[n - m + k :] for k in range(m + 1)]
        scores = [exact_var(c) for c in candidates]
        kept_values = candidates[scores.index(max(scores))]
        if n <= 10:
            assert max(scores) == max(
                exact_var([Fraction(group[i]) for i in c]) for c in itertools.combinations(range(n), m)
            )
    tb = tiebreak if tiebreak is not None else [0] * n
    kept = []
    for value in set(kept_values):
        same = sorted((i for i in range(n) if Fraction(group[i]) == value), key=lambda i: (tb[i], i))
        kept += same[: kept_values.count(value)]
    return sorted(kept)


def _tie_cases(seed: int):
    """(rewards (B, n) float32, tiebreak (B, n) or None) with many ties in both, all-equal groups included."""
    gen = torch.Generator().manual_seed(seed)
    for n in range(1, 10):
        rewards = torch.randint(0, 3, (12, n), generator=gen).float()
        rewards[:3] = torch.randint(0, 2, (3, 1), generator=gen).float()  # all-equal groups
        rewards[3:6] = (torch.rand((3, n), generator=gen) < 0.5).float()  # binary
        yield rewards, None
        yield rewards, torch.randint(0, 3, (12, n), generator=gen)  # tied tiebreaks: the index decides
        yield rewards, torch.randn((12, n), generator=gen, dtype=torch.float64)  # not float32-exact


@pytest.mark.parametrize("rule", ["max_variance", "max_reward"])
@pytest.mark.parametrize("path", ["keys", "float64_sort"])
def test_tiebreak_matches_brute_force(monkeypatch, rule, path):
    if path == "float64_sort":  # the sort of float64 values (rewards not exact in float32), stable sorts
        monkeypatch.setattr(ds_module, "_order_keys", lambda values, low=None: None)
    for rewards, tiebreak in _tie_cases(seed=3):
        n = rewards.shape[1]
        for m in range(1, n + 1):
            kept = downsample(rewards, m, rule, tiebreak=tiebreak)
            assert_valid_indices(kept, n, m)
            for b in range(rewards.shape[0]):
                tb = None if tiebreak is None else tiebreak[b].tolist()
                expected = reference_keep(rewards[b].tolist(), m, rule, tb)
                assert kept[b].tolist() == expected, (rule, rewards[b].tolist(), tb, m)
                # batched == per group
                one = downsample(rewards[b], m, rule, tiebreak=None if tiebreak is None else tiebreak[b])
                assert one.tolist() == expected


@pytest.mark.parametrize("rule", ["max_variance", "max_reward"])
def test_tiebreak_keeps_the_same_reward_values(rule):
    # Large groups with few reward values: the tiebreak changes which rollouts, never which values.
    gen = torch.Generator().manual_seed(4)
    rewards = torch.randint(0, 4, (64, 300), generator=gen).float() * 0.25
    lengths = torch.randint(1, 1000, (64, 300), generator=gen)
    for m in (1, 7, 150, 299):
        plain = downsample(rewards, m, rule)
        by_length = downsample(rewards, m, rule, tiebreak=lengths)
        assert torch.equal(rewards.gather(1, plain).sort(1).values, rewards.gather(1, by_length).sort(1).values)
        for b in range(0, 64, 9):
            expected = reference_keep(rewards[b].tolist(), m, rule, lengths[b].tolist())
            assert by_length[b].tolist() == expected


def test_tiebreak_examples():
    rewards = torch.tensor([0.0, 1.0, 0.0, 1.0, 1.0, 0.0])
    lengths = torch.tensor([50, 40, 10, 30, 20, 60])
    # max_variance keeps two 0s and two 1s: the shortest of each.
    assert downsample(rewards, 4, tiebreak=lengths).tolist() == [0, 2, 3, 4]
    assert downsample(rewards, 4, tiebreak=-lengths).tolist() == [0, 1, 3, 5]  # longest first
    assert downsample(rewards, 2, "max_reward", tiebreak=lengths).tolist() == [3, 4]
    # Equal tiebreaks fall back to the index; m == 1 and all-equal groups keep the preferred top reward.
    assert downsample(rewards, 4, tiebreak=torch.zeros(6)).tolist() == downsample(rewards, 4).tolist()
    assert downsample(rewards, 1, tiebreak=lengths).tolist() == [4]
    assert downsample(torch.ones(4), 2, tiebreak=torch.tensor([3.0, 1.0, 2.0, 1.0])).tolist() == [1, 3]
    # random ignores the tiebreak.
    g = lambda: torch.Generator().manual_seed(0)  # noqa: E731
    assert torch.equal(downsample(rewards, 3, "random", tiebreak=lengths, generator=g()),
                       downsample(rewards, 3, "random", generator=g()))


@pytest.mark.parametrize(
    ("tiebreak", "match"),
    [
        (torch.zeros(2, 5), r"tiebreak must have the shape of rewards \(2, 4\).*\(2, 5\)"),
        (torch.zeros(4), r"tiebreak must have the shape of rewards \(2, 4\)"),
        (torch.tensor([[0.0, float("nan"), 0, 0], [0, 0, 0, 0]]), r"tiebreak contains NaN in group\(s\) \[0\]"),
        (torch.zeros(2, 4, dtype=torch.complex64), "real numbers"),
        ("abc", "tiebreak must be a tensor"),
    ],
)
def test_bad_tiebreak(tiebreak, match):
    with pytest.raises(ValueError, match=match):
        downsample(torch.zeros(2, 4), 2, tiebreak=tiebreak)


# ---------------------------------------------------------------------------------------------------------
# Registry


# (scratch_registry: tests/conftest.py)


def test_builtin_rules_are_discoverable():
    assert {"max_variance", "max_reward", "random"} <= set(available_rules())
    assert available_rules() == sorted(available_rules())
    assert pods_rl.available_rules is available_rules


def test_register_custom_rule(scratch_registry):
    @register_rule("min_reward")
    def min_reward(rewards, m, generator):
        # Deliberately returns the indices unsorted: downsample sorts them.
        return torch.sort(rewards, dim=1, descending=True, stable=True).indices[:, -m:].flip(1)

    assert "min_reward" in available_rules()
    assert downsample(torch.tensor([[4.0, 1.0, 3.0, 0.0]]), 2, "min_reward").tolist() == [[1, 3]]
    assert downsample(torch.tensor([4.0, 1.0, 3.0, 0.0]), 2, "min_reward").tolist() == [1, 3]
    # Integer rewards reach a rule as floats.
    seen = []
    register_rule("spy", lambda r, m, g: seen.append(r.dtype) or torch.arange(m).expand(r.shape[0], m))
    downsample(torch.tensor([1, 2, 3]), 2, "spy")
    assert seen and seen[0].is_floating_point


def test_register_rule_refuses_duplicates_and_non_callables(scratch_registry):
    with pytest.raises(ValueError, match="already registered.*overwrite=True"):
        register_rule("max_variance", lambda r, m, g: None)
    with pytest.raises(ValueError, match="must be callable"):
        register_rule("broken", 42)
    with pytest.raises(ValueError, match="non-empty string"):
        register_rule("", lambda r, m, g: None)
    replacement = register_rule("max_reward", ds_module._RULES["max_variance"], overwrite=True)
    assert replacement is ds_module._RULES["max_reward"]


def test_register_rule_checks_the_signature_when_registered(scratch_registry):
    # Issue #11: a rule that cannot be called as fn(rewards, m, generator) fails at registration.
    for bad in [lambda rewards, m: None, lambda rewards, m, generator, extra: None, lambda *, rewards: None]:
        with pytest.raises(ValueError, match=r"must be callable as fn\(rewards, m, generator\).*signature"):
            register_rule("bad", bad)
        assert "bad" not in available_rules()

    def needs_features_positionally(rewards, m, generator, features, extra):
        return None

    with pytest.raises(ValueError, match="signature"):
        register_rule("bad", needs_features_positionally)
    # Accepted: plain rules, *args, defaults, callables objects, and rules that take features.
    register_rule("a", lambda rewards, m, generator=None: None)
    register_rule("b", lambda *args: None)
    register_rule("c", lambda r, m, g, *, features: None)
    register_rule("d", lambda r, m, g, **kwargs: None)
    register_rule("e", lambda r, m, g, features=None: None)
    register_rule("f", type("Rule", (), {"__call__": lambda self, r, m, g: None})())
    assert [ds_module.rule_takes_features(x) for x in "abcdef"] == [False, False, True, True, True, False]
    assert not ds_module.rule_takes_features("max_variance")
    register_rule("c", lambda r, m, g: None, overwrite=True)  # re-registering updates the flag
    assert not ds_module.rule_takes_features("c")


def reward_per_token(rewards, m, generator, *, features):
    """GFPO-style example rule: keep the m rollouts with the highest reward per completion token
    (ties: the shorter, then the lower index)."""
    lengths = features["lengths"].to(rewards.dtype).clamp(min=1)  # (B, n)
    efficiency = rewards / lengths  # (B, n)
    # rank by (-efficiency, length, index) with two stable sorts
    by_length = torch.sort(lengths, dim=1, stable=True).indices
    order = torch.sort(-efficiency.gather(1, by_length), dim=1, stable=True).indices
    return by_length.gather(1, order)[:, :m]


def test_feature_rule_sees_the_rollouts(scratch_registry):
    register_rule("reward_per_token", reward_per_token)
    rewards = torch.tensor([[1.0, 1.0, 0.0, 1.0], [0.0, 1.0, 1.0, 0.0]])
    lengths = torch.tensor([[100, 20, 5, 50], [10, 30, 30, 10]])
    kept = downsample(rewards, 2, "reward_per_token", features={"lengths": lengths})
    assert kept.tolist() == [[1, 3], [1, 2]]
    # One group (1-d rewards): features get the group dimension too.
    assert downsample(rewards[0], 2, "reward_per_token", features={"lengths": lengths[0]}).tolist() == [1, 3]

    seen = {}

    @register_rule("spy")
    def spy(rewards, m, generator, *, features):
        seen.update(features)
        return torch.arange(m).expand(rewards.shape[0], m)

    per_func = torch.zeros(2, 4, 3)
    downsample(rewards, 2, "spy", tiebreak=lengths, features={"rewards_per_func": per_func})
    assert seen["rewards_per_func"].shape == (2, 4, 3)
    assert seen["tiebreak"].tolist() == lengths.double().tolist()
    seen.clear()
    downsample(rewards, 2, "spy")
    assert seen == {}  # no features passed: an empty dict
    with pytest.raises(ValueError, match=r"feature 'lengths' must start with the shape of rewards \(2, 4\)"):
        downsample(rewards, 2, "spy", features={"lengths": torch.zeros(4, 2)})
    with pytest.raises(ValueError, match="features must be a dict"):
        downsample(rewards, 2, "spy", features=[1, 2])
    # A plain rule cannot use a tiebreak (it would be silently ignored).
    register_rule("plain", lambda r, m, g: torch.arange(m).expand(r.shape[0], m))
    with pytest.raises(ValueError, match="does not take features, so it cannot use a tiebreak"):
        downsample(rewards, 2, "plain", tiebreak=lengths)
    assert downsample(rewards, 2, "plain", features={"lengths": lengths}).tolist() == [[0, 1], [0, 1]]


@pytest.mark.parametrize(
    ("output", "match"),
    [
        (lambda r, m: torch.zeros(r.shape[0], m + 1, dtype=torch.long), r"shape \(B, m\) = \(2, 2\)"),
        (lambda r, m: torch.zeros(r.shape[0], m), "integer indices"),
        (lambda r, m: torch.full((r.shape[0], m), 9), r"outside \[0, 4\)"),
        (lambda r, m: torch.zeros(r.shape[0], m, dtype=torch.long), "repeated indices"),
    ],
)
def test_bad_custom_rule_output_is_caught(scratch_registry, output, match):
    register_rule("bad", lambda rewards, m, generator: output(rewards, m))
    with pytest.raises(ValueError, match=match):
        downsample(torch.zeros(2, 4), 2, "bad")


# ---------------------------------------------------------------------------------------------------------
# group_advantages


def test_group_advantages_by_hand():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0]])
    adv = group_advantages(rewards)
    std = statistics.stdev([1.0, 0.0, 0.0, 1.0])  # unbiased: sqrt(1/3)
    expected = [0.5 / (std + 1e-4), -0.5 / (std + 1e-4)]
    assert adv.dtype == torch.float32 and adv.shape == (2, 4)
    assert adv[0].tolist() == pytest.approx([expected[0], expected[1], expected[1], expected[0]], rel=1e-6)
    assert adv[1].tolist() == [0.0, 0.0, 0.0, 0.0]  # zero-variance group: no signal
    # scale="none": no division; scale="batch": mean per group, one std over the batch.
    assert group_advantages(rewards, scale="none")[0].tolist() == [0.5, -0.5, -0.5, 0.5]
    batch_std = statistics.stdev(rewards.flatten().tolist())
    assert group_advantages(rewards, scale="batch")[0, 0].item() == pytest.approx(0.5 / (batch_std + 1e-4))
    assert group_advantages(rewards, eps=0.5)[0, 0].item() == pytest.approx(0.5 / (std + 0.5))
    # Boolean scale as TRL's old scale_rewards; 1-D input.
    assert torch.equal(group_advantages(rewards, scale=True), adv)
    assert torch.equal(group_advantages(rewards, scale=False), group_advantages(rewards, scale="none"))
    assert torch.equal(group_advantages(rewards[0]), adv[0])


def test_group_advantages_huge_finite_rewards_are_not_silent_zeros():
    # (r - mean)^2 overflows float32 at |r| ~ 1e38: the advantages must still be those of the scaled rewards.
    small = torch.tensor([[1.0, -1.0, 3.0, 0.5], [2.0, 2.0, 0.0, float("nan")]])
    huge = small * 1e38
    adv = group_advantages(huge)
    assert torch.isfinite(adv).all() and adv.dtype == torch.float32
    assert torch.allclose(adv, group_advantages(small, eps=0.0), rtol=1e-5)
    assert adv[0].abs().min() > 0.05  # not silently zeroed
    assert torch.allclose(group_advantages(huge, scale="batch"), group_advantages(small, eps=0.0, scale="batch"),
                          rtol=1e-5)
    assert torch.allclose(group_advantages(huge.double()).float(), adv, rtol=1e-5)
    with pytest.raises(ValueError, match="overflow"):  # r - mean itself does not fit: say so
        group_advantages(torch.tensor([[3e38, -3e38]]), scale="none")


def test_group_advantages_nan_rows_are_ignored_and_get_zero():
    rewards = torch.tensor([[1.0, float("nan"), 0.0, 0.0], [float("nan"), 3.0, float("nan"), float("nan")]])
    adv = group_advantages(rewards)
    std = statistics.stdev([1.0, 0.0, 0.0])  # mean 1/3 over the three scorable rollouts
    high, low = (2 / 3) / (std + 1e-4), (-1 / 3) / (std + 1e-4)
    assert adv[0].tolist() == pytest.approx([high, 0.0, low, low], rel=1e-6)
    assert adv[0, 1].item() == 0.0  # the unscorable rollout
    assert adv[1].tolist() == [0.0, 0.0, 0.0, 0.0]  # one scorable rollout: std undefined -> 0 (as TRL)


def test_group_advantages_dtypes_and_single_rollout():
    assert group_advantages(torch.tensor([[1, 0, 1]])).dtype == torch.float32
    assert group_advantages(torch.tensor([[True, False]])).dtype == torch.float32
    assert group_advantages(torch.tensor([[1.0, 0.0]], dtype=torch.float64)).dtype == torch.float64
    assert group_advantages(torch.tensor([[1.0, 0.0]], dtype=torch.bfloat16)).dtype == torch.bfloat16
    assert group_advantages(torch.tensor([[5.0], [1.0]])).tolist() == [[0.0], [0.0]]  # m == 1


def trl_sum_then_normalize(
    rewards_flat: torch.Tensor, num_generations: int, scale_rewards: str
) -> torch.Tensor:
    """TRL 1.16 GRPOTrainer._generate_and_score_completions, sum_then_normalize branch, copied inline."""
    from trl.trainer.utils import nanstd

    rewards = rewards_flat.clone()
    mean_grouped_rewards = torch.nanmean(rewards.view(-1, num_generations), dim=1)
    mean_grouped_rewards = mean_grouped_rewards.repeat_interleave(num_generations, dim=0)
    if scale_rewards in ["group", "none"]:
        if num_generations > 1:
            std_rewards = nanstd(rewards.view(-1, num_generations), dim=1)
            std_rewards = std_rewards.repeat_interleave(num_generations, dim=0)
        else:
            std_rewards = torch.zeros_like(rewards)
    elif scale_rewards == "batch":
        if rewards.numel() > 1:
            std_rewards = nanstd(rewards).expand_as(rewards)
        else:
            std_rewards = torch.zeros_like(rewards)
    advantages = rewards - mean_grouped_rewards
    if scale_rewards != "none":
        advantages = advantages / (std_rewards + 1e-4)
    return torch.nan_to_num(advantages, nan=0.0)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_group_advantages_match_trl_exactly(scale):
    gen = torch.Generator().manual_seed(6)
    for B, m in [(1, 1), (1, 4), (7, 4), (16, 8), (3, 1)]:
        rewards = torch.rand((B, m), generator=gen) * 3 - 1
        rewards[torch.rand((B, m), generator=gen) < 0.2] = float("nan")  # unscorable rows
        rewards[0] = torch.round(rewards[0])
        expected = trl_sum_then_normalize(rewards.flatten(), m, scale).view(B, m)
        got = group_advantages(rewards, scale=scale)
        assert torch.equal(got, expected), (B, m, scale)  # bit-identical, not just close


def test_private_nanstd_matches_trl():
    from trl.trainer.utils import nanstd

    gen = torch.Generator().manual_seed(7)
    x = torch.randn((5, 6), generator=gen)
    x[1, 2] = x[4] = float("nan")
    x[3, 1:] = float("nan")
    for dim in [None, 0, 1]:
        for keepdim in [False, True]:
            ours = ds_module.nanstd(x, dim=dim, keepdim=keepdim)
            theirs = nanstd(x, dim=dim, keepdim=keepdim)
            assert ours.shape == theirs.shape
            assert torch.equal(ours.isnan(), theirs.isnan())
            assert torch.equal(ours.nan_to_num(-1.0), theirs.nan_to_num(-1.0))


@pytest.mark.parametrize(
    ("kwargs", "rewards", "match"),
    [
        ({"scale": "groups"}, torch.zeros(2, 3), r"scale must be one of \['group', 'batch', 'none'\]"),
        ({"eps": -1.0}, torch.zeros(2, 3), "eps must be a non-negative number"),
        ({}, torch.zeros(2, 3, 4), r"shape \(m,\) or \(B, m\)"),
        ({}, torch.zeros(2, 0), "empty group"),
        ({}, torch.tensor([[1.0, float("inf")], [0.0, 1.0]]), r"infinite values in group\(s\) \[0\]"),
    ],
)
def test_group_advantages_bad_input(kwargs, rewards, match):
    with pytest.raises(ValueError, match=match):
        group_advantages(rewards, **kwargs)


def test_downsample_then_advantages_end_to_end():
    rewards = torch.tensor(
        [[1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0]]
    )
    keep = downsample(rewards, 4)  # (2, 4)
    kept = rewards.gather(1, keep)
    # max_variance keeps the lone odd rollout plus the most balanced mix possible.
    assert kept.sum(1).tolist() == [3.0, 1.0]
    assert 3 in keep[0].tolist() and 6 in keep[1].tolist()
    adv = group_advantages(kept)
    assert adv.shape == (2, 4) and bool((adv != 0).all())


@pytest.mark.parametrize("seed", range(20))
def test_the_readable_max_variance_and_the_batched_one_agree(seed):
    """downsample.max_variance_reference (ten lines, one group) and the batched rule keep the same indices: on
    rewards with ties (0 / 0.5 / 1, exact in float) and on continuous ones."""
    from pods_rl.downsample import max_variance_reference

    gen = torch.Generator().manual_seed(seed)
    n = int(torch.randint(2, 33, (1,), generator=gen))
    tied = torch.randint(0, 3, (16, n), generator=gen).double() / 2  # (16, n)
    continuous = torch.rand((16, n), generator=gen, dtype=torch.float64)  # (16, n)
    for rewards in (tied, continuous):
        for m in sorted({1, max(1, n // 4), max(1, n // 2), n - 1}):
            batched = pods_rl.downsample(rewards, m, rule="max_variance")  # (16, m)
            readable = [max_variance_reference(row.tolist(), m) for row in rewards]
            assert batched.tolist() == readable, (n, m)


def test_every_kind_of_rule_registers_through_one_registry(scratch_registry, monkeypatch):
    """Down-sampling rules, adaptive rules and planners share pods_rl.registry.Registry: the same checks at
    registration (a non-name, a taken name without overwrite, a bad entry: one line each), the same sorted names."""
    import importlib

    from pods_rl import adaptive, planners
    from pods_rl.budget.planners import base
    from pods_rl.registry import Registry

    monkeypatch.setattr(adaptive, "_RULES", adaptive._RULES.copy())
    monkeypatch.setattr(base, "_PLANNERS", base._PLANNERS.copy())
    ds = importlib.import_module("pods_rl.downsample")  # (`pods_rl.downsample` is also the function)
    registries = {"rule": (ds._RULES, register_rule),
                  "adaptive rule": (adaptive._RULES, adaptive.register_adaptive_rule),
                  "planner": (base._PLANNERS, planners.register_planner)}
    for what, (registry, register) in registries.items():
        assert isinstance(registry, Registry) and registry.what == what
        with pytest.raises(ValueError, match=f"^{what} name must be a non-empty string"):
            register("")
        taken = registry.names()[0]
        with pytest.raises(ValueError, match=f"{what} {taken!r} is already registered; pass overwrite=True"):
            register(taken, registry[taken])
        with pytest.raises(ValueError, match=f"^{what} 'broken' must"):
            register("broken", object())
        assert "broken" not in registry and registry.names() == sorted(registry)
