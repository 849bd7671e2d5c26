"""PODS in TRL's asynchronous GRPO trainer: the rollout worker (worker.py), its planners (budget.py), scoring
(scoring.py), settings checks (settings.py) and running without CUDA (cpu.py). Importing this imports nothing."""
