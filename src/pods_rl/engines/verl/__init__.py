"""PODS in verl.

    replay_buffer.py   PODS as verl 0.9.x's replay buffer (``pkg://pods_rl.engines.verl.replay_buffer``); imports
                       verl, not TRL.
    batch_settings.py  verl's batch settings in kept terms, for ``pods verl-args``; imports neither.

Importing this package imports nothing (``pods verl-args`` runs without verl).
"""
