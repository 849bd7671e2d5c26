"""`pods train`'s command line on TRL's parser: ``TrlParser`` of the run's arguments, ``PODSConfig`` and
``trl.ModelConfig`` (``pods_rl.recipes`` adds ``--config``, the help and the one-line errors)."""

from __future__ import annotations

from trl import ModelConfig, TrlParser

from pods_rl.engines.trl.trainer import PODSConfig


def train_parser(run_arguments: type, **kwargs) -> TrlParser:
    """``TrlParser((run_arguments, PODSConfig, trl.ModelConfig), **kwargs)``: its ``parse_args_and_config`` reads
    a recipe's YAML (``--config``) and the flags into the three dataclasses, in that order."""
    return TrlParser((run_arguments, PODSConfig, ModelConfig), **kwargs)
