"""The verl lane: real verl 0.9.x, Ray and TransferQueue on CPU (run: python -m pytest -q --lane verl tests/verl).

One local Ray cluster and one TransferQueue serve the whole session (their start-up is most of the lane's time).
Ray gets explicit small resources: TransferQueue's controller and two storage actors take a CPU each and
`tq.init()` waits forever for CPUs Ray does not have (Ray's default on a 2-core machine is 2), so 4 logical CPUs;
no dashboard, a small object store, its temp dir inside pytest's. Every wait is bounded by pytest-timeout.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_configure(config):
    # verl warns once per optional engine it cannot import (megatron, veomni, ...), when a config has no critic,
    # and about its own deprecated loader that _build_replay_buffer calls: not ours to act on.
    for line in ("ignore:.*engine is not available:UserWarning",
                 "ignore:Disabled critic as algorithm.adv_estimator:UserWarning",
                 "ignore:.*load_extern_type.* is deprecated:FutureWarning",
                 "ignore:.*default fixture loop scope:DeprecationWarning"):
        config.addinivalue_line("filterwarnings", line)


@pytest.fixture(scope="session")
def tq_cluster(tmp_path_factory):
    """A local Ray cluster (4 logical CPUs) with TransferQueue on it, for the whole session; shut down after."""
    import ray
    import transfer_queue as tq

    temp_dir = tmp_path_factory.mktemp("ray")
    ray.init(num_cpus=4, include_dashboard=False, object_store_memory=96 * 1024**2, _temp_dir=str(temp_dir),
             log_to_driver=False, configure_logging=False)
    try:
        tq.init()
        yield tq
    finally:
        tq.close()
        ray.shutdown()


@pytest.fixture
def tq_store(tq_cluster):
    """TransferQueue, emptied after the test (every partition), so tests do not see each other's groups."""
    yield tq_cluster
    listing = tq_cluster.kv_list() or {}
    for partition, items in listing.items():
        if items:
            tq_cluster.kv_clear(keys=list(items), partition_id=partition)
