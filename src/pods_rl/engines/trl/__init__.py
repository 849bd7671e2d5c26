"""The synchronous TRL engine: ``PODSConfig`` / ``PODSTrainer`` over ``trl.GRPOTrainer``.

    config.py       PODSConfig (GRPOConfig + the PODS knobs) and the supported TRL range.
    trainer.py      PODSTrainer: the TRL surface it overrides or calls, batching, model card.
    step.py         PODSStep: the PODS step (prepare -> sample/rounds -> score -> select -> TRL on the kept rows).
    rounds.py       RoundsStep: the adaptive rollout rounds.
    rows.py         TRL's per-rollout data by row.
    phase_clock.py  the seconds of each phase of a step.

Importing this package imports nothing; its modules import TRL.
"""
