"""benchmarks/auto_top_up_share.py: the share by which every prompt at max_n would lengthen a logged step, equal to
a hand computation, and rows without a known slope left out."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import auto_top_up_share as share  # noqa: E402


def test_the_share_is_the_hand_computation_and_unknown_slopes_are_left_out():
    costs = {"pods/auto_fixed_ms": 202.0, "pods/auto_sample_ms": 0.056, "pods/auto_train_ms": 0.526}
    rows = [{"pods/auto_n_mean": 54.4, "pods/auto_slope_known": 1.0, **costs},
            {"pods/auto_n_mean": 16.0, "pods/auto_slope_known": 0.0, **costs},  # slope unknown: never fires
            {"loss": 0.1}]
    shares = share.row_shares(rows, prompts=8, m=16, max_n=64)
    by_hand = 0.056 * 8 * (64 - 54.4) / (202.0 + 0.526 * 8 * 16 + 0.056 * 8 * 54.4)  # 4.3 ms of 293.7 ms
    assert shares.tolist() == [pytest.approx(by_hand)] and 0.014 < by_hand < 0.015
