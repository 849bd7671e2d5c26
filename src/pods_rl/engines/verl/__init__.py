"""PODS in verl: the replay buffer (replay_buffer.py, imports verl) and batch settings in kept terms
(batch_settings.py, for ``pods verl-args``, imports neither). Importing this package imports nothing."""
