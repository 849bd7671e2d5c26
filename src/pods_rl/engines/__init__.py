"""The engines: the only code that imports TRL, verl or vLLM (tests/test_layout.py), one package per engine.

    trl/        PODSConfig / PODSTrainer over trl.GRPOTrainer; `pods train`'s parser; the tiny model's SFT.
    trl_async/  PODS in TRL's asynchronous GRPO trainer.
    verl/       PODS as verl's replay buffer; verl's batch settings.
    vllm/       vLLM's CPU build checks; the server extension that reloads weights.

Nothing here is imported by ``import pods_rl``; each engine needs its optional extra.
"""
