"""The synchronous TRL engine: ``PODSConfig`` / ``PODSTrainer`` over ``trl.GRPOTrainer``.

    config.py (PODSConfig, TRL range), trainer.py (PODSTrainer, the TRL surface), step.py (the PODS step),
    rounds.py (adaptive rounds), rows.py (TRL's per-rollout data by row), phase_clock.py (phase seconds);
    parser.py (`pods train`'s TrlParser), sft.py (the tiny model's SFT build, `pods build-tiny`).

Importing this package imports nothing; its modules import TRL.
"""
