"""Run by tests/test_contract.py and tests/test_geometry.py under ``accelerate launch`` with 2 gloo ranks: the
contract's pairs (PODS n -> m, then GRPOTrainer with m on the rollouts PODS kept) for the features or batch
geometries named in argv[3:], on every rank; each rank
writes what it found to ``<out_dir>/rank<r>.json``: per feature, whether the two runs agreed (and where not), the
environment resets it made (adaptive rounds pad a process's round with rows of fresh environments), and with a
planner what its prompt ledger holds (its rows in order, evictions included)."""

import json
import sys
from pathlib import Path


def main(model_dir: str, out_dir: str, names: list[str]) -> None:
    from pods_rl import register_rule
    from tests import contract
    from tests.test_contract import FEATURES, run_grpo, run_pods
    from tests.test_dropin import Counter
    from tests.test_geometry import GEOMETRIES

    FEATURES = {**FEATURES, **GEOMETRIES}  # the contract's features and its batch geometries, by name

    register_rule("keep_indices", contract.keep_indices, overwrite=True)
    found, rank = {}, None
    for name in names:
        where = Path(out_dir) / name.replace(" ", "_").replace(",", "")
        Counter.resets = 0
        pods = run_pods(FEATURES[name], where, {"text": model_dir})
        pods_resets = Counter.resets
        grpo = run_grpo(FEATURES[name], where, {"text": model_dir}, pods)
        rank = pods.trainer.accelerator.process_index
        assert pods.trainer.accelerator.num_processes == 2, pods.trainer.accelerator.num_processes
        try:  # (with over-sampling GRPO's data is the prompts PODS kept: another dataset size, another `epoch`)
            contract.assert_same(pods, grpo, ignore=("epoch",) if FEATURES[name].pods.get("oversample_prompts", 1) > 1
                                 else ())
            found[name] = {"same": True}
        except AssertionError as err:
            found[name] = {"same": False, "where": str(err)[:3000]}
        found[name].update(steps=pods.trainer.state.global_step, counter_resets=pods_resets,
                           rows_per_round=[len(b["advantages"]) for b in pods.recorder.batches])
        if pods.trainer._budget is not None:  # the prompt ledger: every rank's groups, so the same on every rank
            ledger = pods.trainer._budget.ledger
            stats = ledger.stats(ledger.ids)
            found[name]["ledger"] = {"ids": ledger.ids.tolist(), "groups": int(stats.groups.sum()),  # in row order
                                     "evicted": ledger.ids[stats.evicted].tolist()}
    if any(name in GEOMETRIES for name in names):  # one kept row per process: refused in one line on every rank
        from pods_rl.engines.trl.trainer import PODSConfig

        try:
            PODSConfig(output_dir=str(Path(out_dir) / "refused"), use_cpu=True, num_generations=4, downsample_to=2,
                       per_device_train_batch_size=1, report_to="none")
            found["refused"] = "accepted"
        except ValueError as err:
            found["refused"] = str(err)
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(found, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
