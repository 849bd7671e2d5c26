"""PODS in TRL's asynchronous GRPO trainer (``trl.experimental.async_grpo``).

    worker.py    the rollout worker: PODS's down-sampling where TRL's worker scores its groups.
    budget.py    the rollout-budget planners where the worker draws its prompts.
    scoring.py   a group of n scored with TRL's own reward code, in the worker's child.
    settings.py  the worker's ``pods_*`` settings, checked in one line each.
    cpu.py       what lets the asynchronous trainer run without CUDA (a weight transfer without NCCL, ...).

Importing this package imports nothing; its modules import TRL.
"""
