"""PODS on verl (v1 trainer, 0.9.x): a replay buffer whose ``sample()`` keeps m of each prompt's n rollouts, selected
(``pods_rl.selection.select``) by reward per session ``{uid}_{session}`` (an agent loop's outputs, scored by the last);
dropped rows are cleared from TransferQueue before log-probs, values and advantages. Load it with ``pods verl-args``'s
overrides; settings, metrics, resume: docs/guides/verl.md."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from packaging.specifiers import SpecifierSet

# The verl versions whose v1 ReplayBuffer internals this module was tested against (defined beside verl's batch
# arithmetic, which needs no verl; pyproject.toml's `verl` extra must lie inside it).
from pods_rl.engines.verl.batch_settings import VERL_RANGE


def _require_supported_verl(installed: str | None) -> None:
    """Refuse a missing verl or one outside ``VERL_RANGE`` with one line, before touching its internals."""
    if installed is None:
        raise ImportError('pods-rl\'s verl engine needs verl, which is not installed: pip install -e ".[verl]" in '
                          "a clone of pods-rl (in an environment of its own: verl pins its own transformers range)")
    if not SpecifierSet(VERL_RANGE).contains(installed, prereleases=True):
        raise ImportError(f"pods-rl's verl engine supports verl{VERL_RANGE} (it subclasses verl's v1 ReplayBuffer),"
                          f' but verl {installed} is installed: pip install -e ".[verl]" in a clone of pods-rl')


def _installed_verl() -> str | None:
    try:
        return version("verl")
    except PackageNotFoundError:
        return None


_require_supported_verl(_installed_verl())  # before the imports below, which reach into verl's internals

import logging  # noqa: E402
import os  # noqa: E402
from collections.abc import Mapping  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import torch  # noqa: E402
import transfer_queue as tq  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402
from torch.nn.utils.rnn import pad_sequence  # noqa: E402
from transfer_queue import KVBatchMeta  # noqa: E402
from verl.trainer.ppo.checkpoint_callback import CheckpointCallback  # noqa: E402
from verl.trainer.ppo.utils import need_critic  # noqa: E402
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync  # noqa: E402
from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path  # noqa: E402
from verl.utils.import_utils import load_module  # noqa: E402

from pods_rl.budget.ledger import LEDGER_FILE, LedgerSettings, PromptLedger, check_finite  # noqa: E402
from pods_rl.downsample import rule_takes_features  # noqa: E402
from pods_rl.engines.settings import spelled  # noqa: E402
from pods_rl.engines.verl.batch_settings import SEPARATE_ASYNC, padding_rows  # noqa: E402
from pods_rl.engines.verl.budget_settings import MANAGER_KEY, PLANNER_KEYS, VerlBudget, verl_budget  # noqa: E402
from pods_rl.selection import SelectionSettings, kept_groups, select  # noqa: E402

__all__ = ["PODSCheckpointCallback", "PODSReplayBuffer", "PODSReplayBufferAsync", "PODSSettings", "select_sessions",
           "VERL_RANGE"]

logger = logging.getLogger("pods_rl")

# How verl's users spell the selection settings (SelectionSettings' errors name them so).
VERL_NAMES = spelled("verl", "selection")
_NO_INDEX = ("sampler_kwargs.ledger keys prompts by the dataset index verl stores with each rollout "
             "(the `index` field, from the row's extra_info.index): ")
_NO_REWARDS = ("no rewards (rm_scores) in TransferQueue when the PODS replay buffer samples: PODS selects by reward "
               "before anything else runs, so use rule-based rewards or a reward model in its own resource pool "
               "(reward.reward_model.enable_resource_pool=True)")


@dataclass(frozen=True)
class PODSSettings:
    """The ``sampler_kwargs`` of the PODS replay buffer, validated (and the trainer's facts it needs)."""

    m: int
    rule: str = "max_variance"
    tiebreak: str = "index"
    oversample_prompts: float = 1.0
    seed: int = 0
    rule_module: str | None = None
    ledger: bool = False  # keep a prompt ledger of every sampled group (pods_rl.budget.ledger), saved with checkpoints
    ledger_success_threshold: float = 0.5  # a session succeeds when its reward is above this
    n: int | None = None  # rollout.n, when the trainer's config is known
    planners: Mapping | None = None  # the rollout-budget keys (PLANNER_KEYS) as given, for budget_settings.verl_budget
    response_length: int | None = None  # rollout.response_length: where a response counts as truncated

    @classmethod
    def from_sampler_kwargs(cls, sampler_kwargs, trainer_config: DictConfig | None = None) -> PODSSettings:
        """Validate ``sampler_kwargs``; a ValueError names the bad key and the fix. ``trainer_config`` gives n."""
        kwargs = _plain(sampler_kwargs)
        known = {f for f in cls.__dataclass_fields__ if f not in ("n", "planners")} | set(PLANNER_KEYS)
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ValueError(f"unknown PODS sampler_kwargs {unknown}; known: {sorted(known)}")
        if "m" not in kwargs:
            raise ValueError("the PODS replay buffer needs +trainer.v1.sampler.sampler_kwargs.m=M (rollouts kept per "
                             "prompt); `pods verl-args` prints all the settings")
        if kwargs.get("rule_module"):
            _import_rule_module(str(kwargs["rule_module"]))
        selection = SelectionSettings.validated(kwargs["m"], kwargs.get("rule", "max_variance"),
                                                kwargs.get("tiebreak", "index"), kwargs.get("oversample_prompts", 1.0),
                                                names=VERL_NAMES)
        seed = kwargs.get("seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"sampler_kwargs.seed must be an integer, got {seed!r}")
        n = response_length = None
        if trainer_config is not None:
            n = int(trainer_config.actor_rollout_ref.rollout.n)
            response_length = int(trainer_config.actor_rollout_ref.rollout.response_length)
        response_length = kwargs.get("response_length", response_length)
        if rule_takes_features(selection.rule) and response_length is None:
            raise ValueError(f"rule {selection.rule!r} takes features (lengths, truncated): set "
                             "+trainer.v1.sampler.sampler_kwargs.response_length to rollout.response_length")
        ledger, threshold = kwargs.get("ledger", False), kwargs.get("ledger_success_threshold", 0.5)
        if not isinstance(ledger, bool):
            raise ValueError(f"sampler_kwargs.ledger must be true or false, got {ledger!r}")
        check_finite("sampler_kwargs.ledger_success_threshold", threshold)
        return cls(m=selection.m, rule=selection.rule, tiebreak=selection.tiebreak,
                   oversample_prompts=selection.oversample_prompts, seed=seed, rule_module=kwargs.get("rule_module"),
                   ledger=ledger, ledger_success_threshold=float(threshold), n=n, response_length=response_length,
                   planners={key: kwargs[key] for key in PLANNER_KEYS if key in kwargs} or None)

    @property
    def selection(self) -> SelectionSettings:
        """m, the rule, its tiebreak and over-sampling, as ``pods_rl.selection.select`` takes them."""
        return SelectionSettings(m=self.m, rule=self.rule, tiebreak=self.tiebreak,
                                 oversample_prompts=self.oversample_prompts, names=VERL_NAMES)


def _plain(mapping) -> dict:
    if mapping is None:
        return {}
    if isinstance(mapping, DictConfig):
        return OmegaConf.to_container(mapping, resolve=True)
    if not isinstance(mapping, Mapping):
        raise ValueError(f"trainer.v1.sampler.sampler_kwargs must be a mapping, got {type(mapping).__name__}")
    return dict(mapping)


def _import_rule_module(spec: str) -> None:
    """Import the module that registers the user's rules: ``pkg://a.b``, ``a.b``, or a ``.py`` file path (the
    buffer runs in verl's TaskRunner process, so a rule registered in the launching shell does not exist there)."""
    if not spec.startswith(("pkg://", "file://")) and not spec.endswith(".py"):
        spec = "pkg://" + spec
    try:
        load_module(spec)
    except (ImportError, FileNotFoundError, RuntimeError) as err:
        raise ValueError(f"sampler_kwargs.rule_module={spec!r} could not be imported: {err}") from None


def check_trainer_config(config: DictConfig, settings: PODSSettings) -> None:
    """Refuse, with one line, verl settings under which PODS would be wrong or would train on padding."""
    if config.trainer.v1.trainer_mode == "separate_async":
        raise ValueError(SEPARATE_ASYNC)
    reward_model = config.reward.reward_model
    if reward_model.enable and not reward_model.enable_resource_pool:
        raise ValueError("PODS selects rollouts by reward inside the replay buffer, but a colocated reward model "
                         "scores only after sampling: set reward.reward_model.enable_resource_pool=True (its own GPUs) "
                         "or use a rule-based reward")
    filter_groups = config.algorithm.get("filter_groups", None)
    if filter_groups is not None and filter_groups.get("enable", False):
        raise ValueError("verl does not apply algorithm.filter_groups to custom samplers; drop it and use "
                         "+trainer.v1.sampler.sampler_kwargs.oversample_prompts (PODS's group over-sampling)")
    n, m = settings.n, settings.m
    if m > n:
        raise ValueError(f"sampler_kwargs.m={m} is larger than actor_rollout_ref.rollout.n={n}: PODS keeps m of the n "
                         "rollouts of each prompt")
    kept_rows = kept_groups(config.data.train_batch_size, settings.oversample_prompts) * m
    actor_rows = config.actor_rollout_ref.actor.ppo_mini_batch_size * n
    critic_rows = config.critic.ppo_mini_batch_size * n if need_critic(config) else None
    pad = padding_rows(kept_rows, 1, actor_rows, critic_rows)
    if pad:
        raise ValueError(f"{kept_rows} kept rows per update do not fill whole mini-batches of {actor_rows} (actor)"
                         + (f" / {critic_rows} (critic)" if critic_rows else "") + f" rows: verl would train on {pad} "
                         "padding rows; `pods verl-args` prints batch settings in kept terms")


class PODSReplayBuffer(ReplayBuffer):
    """verl's replay buffer keeping m of each group's n rollouts; outside ``sync`` mode a ``PODSReplayBufferAsync``."""

    def __new__(cls, *args, **kwargs):
        trainer_mode = kwargs.get("trainer_mode", args[0] if args else "sync")
        if cls is PODSReplayBuffer and trainer_mode != "sync":
            cls = PODSReplayBufferAsync
        return super().__new__(cls)

    def __init__(self, trainer_mode: str, trainer_config, max_off_policy_threshold, max_off_policy_strategy: str,
                 sampler_kwargs, refill_fn=None, **kwargs):
        # verl passes refill_fn as a bound method of the trainer: through it the buffer sees the whole config
        # (reward model placement, rollout.n, batch sizes) and refuses what cannot work before any GPU work.
        config = getattr(getattr(refill_fn, "__self__", None), "config", None)
        self.pods = PODSSettings.from_sampler_kwargs(sampler_kwargs, config)
        # The rollout-budget planners (docs/guides/verl.md, "Rollout budgets"), checked first: their refusals say more
        # than the selection's. PODS's agent loop manager is handed this buffer and plans from its ledger.
        self.plan = planners_of(self.pods, config, trainer_mode)
        if config is not None:
            check_trainer_config(config, self.pods)
            # verl hands sync_refill_failed_groups, and the gen_batch_size=1 it needs, only to its own buffer
            if trainer_mode == "sync" and bool(config.trainer.v1.sampler.get("sync_refill_failed_groups", False)):
                kwargs.update(sync_refill_failed_groups=True, gen_batch_size=1)
        super().__init__(trainer_mode=trainer_mode, trainer_config=trainer_config,
                         max_off_policy_threshold=max_off_policy_threshold,
                         max_off_policy_strategy=max_off_policy_strategy, sampler_kwargs=sampler_kwargs,
                         refill_fn=refill_fn, **kwargs)
        self._generator = torch.Generator().manual_seed(self.pods.seed)
        self._pods_metrics: dict[str, float] = {}
        self._config = config
        self.budget = self.plan.budget
        self.plan_metrics: dict[str, float] = {}  # the manager's pods/* metrics since the last sample()
        self._trainer = getattr(refill_fn, "__self__", None)
        if self.budget is not None:
            self.ledger = self.budget.ledger
        elif self.pods.ledger or self.plan.planned:
            self.ledger = PromptLedger(LedgerSettings(success_threshold=self.pods.ledger_success_threshold))
        else:
            self.ledger = None
        self._ledger_resumed, self._global_steps = False, 0

    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[KVBatchMeta, dict]:
        """verl's ``sample``: the kept rollouts and ``pods/*`` metrics; ``batch_size`` counts sampled groups."""
        self._pods_metrics = {}
        if partition_id != "val":
            self.resume_ledger(global_steps)
        self._global_steps = global_steps
        batch, metrics = super().sample(global_steps=global_steps, partition_id=partition_id, batch_size=batch_size)
        metrics.update(self._pods_metrics)
        if partition_id != "val":
            metrics.update(self.plan_metrics)
            self.plan_metrics = {}
            if self.budget is not None:
                self.budget.costs.trained(global_steps, len(batch.keys))  # auto's costs: the step's sampling ends
        return batch, metrics

    def save_ledger(self, checkpoint_dir: str) -> str | None:
        """Write the ledger (and the planners' state, with planners) into ``checkpoint_dir`` as ``pods_ledger.pt``; its
        path, or None without a ledger."""
        if self.budget is not None:
            return str(self.budget.save(checkpoint_dir))
        if self.ledger is None:
            return None
        return str(self.ledger.save(os.path.join(checkpoint_dir, LEDGER_FILE)))

    def resume_ledger(self, global_steps: int) -> None:
        """On a resumed run's first training sample (or PODS's manager's first plan, which comes before it), load
        the ledger (and planners) of the checkpoint verl resumed from; once."""
        if self._ledger_resumed or self.ledger is None or self._config is None:
            return
        self._ledger_resumed = True
        folder = _resume_folder(self._config.trainer, global_steps)
        if folder is None:
            return
        path = os.path.join(folder, LEDGER_FILE)
        if not os.path.isfile(path):
            logger.warning("warning: %s holds no prompt ledger (%s): the ledger starts empty", folder, LEDGER_FILE)
            return
        if self.budget is not None:
            self.budget.load(folder)
        else:
            self.ledger = PromptLedger.load(path)

    def _materialize_batch(self, partition_id: str, selected_prompt_uids: list[str],
                           partition_snapshot: dict[str, dict]) -> KVBatchMeta:
        batch = super()._materialize_batch(partition_id, selected_prompt_uids, partition_snapshot)
        if partition_id == "val" or not batch.keys:
            return batch  # validation: every rollout, untouched
        sessions, final_keys, table = _sessions_by_prompt(batch.keys, batch.tags, self.pods.response_length)
        rewards, indices = _session_rewards(partition_id, final_keys, with_index=self.ledger is not None)
        sizes = table["sizes"]  # (G,) sessions per prompt (a failed one is missing)
        table["rewards"] = pad_sequence(rewards.split(sizes.tolist()), batch_first=True, padding_value=float("nan"))
        num_groups = kept_groups(len(selected_prompt_uids), self.pods.oversample_prompts)
        kept, metrics = select_sessions(batch.keys, sessions, table, self.pods, num_groups, self._generator)
        if self.ledger is not None:  # a group's prompt: its first session's dataset index
            metrics.update(self._record(torch.tensor(indices)[sizes.cumsum(0) - sizes], table["rewards"], sizes))
        dropped = [key for key, keep in zip(batch.keys, kept) if not keep]
        if dropped:
            tq.kv_clear(keys=dropped, partition_id=partition_id)  # verl clears only the keys it trains on
        self._pods_metrics = metrics
        return KVBatchMeta(partition_id=partition_id, keys=[k for k, keep in zip(batch.keys, kept) if keep],
                           tags=[t for t, keep in zip(batch.tags, kept) if keep])
    def _record(self, ids: torch.Tensor, table: torch.Tensor, counts: torch.Tensor) -> dict[str, float]:
        """Every sampled group (all its sessions, before selection) into the ledger: ``ids`` (G,) their prompts' dataset
        index, ``table`` (G, n_max) their rewards in session order (the ledger's window is then the same every run)."""
        if len(ids) > 1 and not bool(ids.any()):
            raise ValueError(_NO_INDEX + f"every one of the {len(ids)} sampled prompts has index 0, so the ledger "
                             "would merge them: give each row its extra_info.index (verl's preprocessing scripts do)")
        if self.budget is not None:  # the planners' record: the ledger, then GRESO's adaptation
            return self.budget.record(ids, table, counts, step=self._global_steps, epoch=self._epoch())
        return self.ledger.record(ids, table, counts, step=self._global_steps).metrics

    def judge_pilots(self, ids: torch.Tensor, rewards: torch.Tensor, step: int) -> torch.Tensor:
        """(P,) bool, passed: Pilot-Commit's one verdict on each pilot of ``ids`` (P,), ``rewards`` (P, n_explore), in
        order (``RolloutBudget.judge_one``: the passed committed, the solved evicted); the dropped are recorded."""
        self.budget.which.flush(step + 1)  # buffer_max_off_steps = 0: nothing an earlier step passed waits (a resume)
        passed = torch.zeros(len(ids), dtype=torch.bool)
        for p, prompt in enumerate(ids.tolist()):
            passed[p], judged = self.budget.judge_one(prompt, rewards[p].tolist(), step=step)
            if not passed[p]:  # a committed pilot is recorded with its whole group, when it is sampled
                self.budget.record(ids[p:p + 1], rewards[p:p + 1], torch.tensor([rewards.shape[1]]), step=step,
                                   epoch=self._epoch(step))
            # the step's counts under their per-step names (the counters' "_total" is the async worker's running sum)
            metrics = {key.removesuffix("_total"): value for key, value in judged.items() if key.endswith("_total")}
            metrics["pods/pilots_dropped"] = float(~passed[p])
            for key, value in metrics.items():
                self.plan_metrics[key] = self.plan_metrics.get(key, 0.0) + value
        return passed

    def _epoch(self, step: int | None = None) -> int:
        """The epoch of ``step`` (default: the one sampled) as verl's fit() counts it (0 before its dataloader)."""
        per_epoch = getattr(self._trainer, "steps_per_epoch", None)
        step = self._global_steps if step is None else step
        return (max(step, 1) - 1) // per_epoch if per_epoch else 0


def planners_of(settings: PODSSettings, config: DictConfig | None, trainer_mode: str) -> VerlBudget:
    """The rollout-budget planners of ``settings`` against the trainer's ``config``; one ValueError line if verl cannot
    meet them (budget_settings.verl_budget)."""
    kwargs = dict(settings.planners or {})
    if config is None:
        if kwargs:
            raise ValueError("sampler_kwargs.prompt_planner/rollout_planner need verl's trainer config: build the "
                             "buffer through verl's trainer (trainer.v1.sampler.custom_sampler), not by hand")
        return VerlBudget(budget=None, rounds=None, n=settings.n or 1)
    rollout, reward_model = config.actor_rollout_ref.rollout, config.reward.reward_model
    manager = OmegaConf.select(config, MANAGER_KEY, default=None)
    gen_batch_size = config.data.get("gen_batch_size", None) or config.data.train_batch_size
    return verl_budget(kwargs, n=int(rollout.n), m=settings.m, seed=settings.seed,
                       success_threshold=settings.ledger_success_threshold, trainer_mode=trainer_mode,
                       gen_batch_size=gen_batch_size if trainer_mode == "sync" else 1,
                       colocated_reward_model=bool(reward_model.enable and not reward_model.enable_resource_pool),
                       manager_class=manager)


class PODSReplayBufferAsync(PODSReplayBuffer, ReplayBufferAsync):
    """``PODSReplayBuffer`` with verl's ``ReplayBufferAsync`` sampling (trainer_mode colocate_async)."""


class PODSCheckpointCallback(CheckpointCallback):
    """verl's checkpoint hook (``trainer.checkpoint_callback_class``) that saves the buffer's ledger beside each
    checkpoint. With a callback of your own, subclass this one and call ``super().on_save(...)``."""

    def on_save(self, trainer, global_step: int, checkpoint_dir: str, async_save: bool = False, **kwargs) -> None:
        """Write ``trainer.replay_buffer``'s ledger into ``checkpoint_dir`` (nothing without a PODS ledger)."""
        buffer = getattr(trainer, "replay_buffer", None)
        if isinstance(buffer, PODSReplayBuffer):
            buffer.save_ledger(checkpoint_dir)


def _resume_folder(trainer_config, global_steps: int) -> str | None:
    """The checkpoint folder verl's ``_load_checkpoint`` resumed from, seen from the first training step after it
    (``global_steps``: 1 in a fresh run), or None when it did not resume."""
    mode = trainer_config.resume_mode
    if mode == "disable" or global_steps <= 1:
        return None
    if mode == "resume_path":
        folder = str(trainer_config.resume_from_path)
    else:  # auto: the latest checkpoint, as verl finds it, when it is the step before this one
        root = str(trainer_config.default_local_dir)
        folder = find_latest_ckpt_path(root if os.path.isabs(root) else os.path.join(os.getcwd(), root))
        if folder is None or not folder.rstrip("/").endswith(f"global_step_{global_steps - 1}"):
            return None
    return folder if os.path.isabs(folder) else os.path.join(os.getcwd(), folder)


def _session_rewards(partition_id: str, keys: list[str], with_index: bool = False) -> tuple[torch.Tensor, list]:
    """Each key's reward (B,) float64, the sum of its ``rm_scores``; and, ``with_index``, its prompt's dataset index."""
    fields = ["rm_scores", "index"] if with_index else ["rm_scores"]
    try:
        data = tq.kv_batch_get(keys=keys, partition_id=partition_id, select_fields=fields)
    except Exception as err:  # TransferQueue refuses a field one of the keys lacks
        if not with_index:
            raise
        raise ValueError(_NO_INDEX + f"TransferQueue has none for these rollouts ({err})") from None
    if "rm_scores" not in data.keys() or data.batch_size[0] != len(keys):
        raise ValueError(_NO_REWARDS)
    scores = data["rm_scores"]
    if getattr(scores, "is_nested", False):  # jagged: one row per key
        rewards = torch.stack([row.sum() for row in scores.unbind(0)]).double()
    else:
        rewards = scores.reshape(len(keys), -1).sum(dim=1).double()
    if not with_index:
        return rewards, None
    if "index" not in data.keys():
        raise ValueError(_NO_INDEX + "TransferQueue has none for these rollouts")
    return rewards, [int(i) for i in (data["index"].tolist() if torch.is_tensor(data["index"]) else data["index"])]


def select_sessions(keys: list[str], sessions: list[list[str]], table: dict[str, torch.Tensor], settings: PODSSettings,
                    num_groups: int, generator: torch.Generator | None = None) -> tuple[list[bool], dict[str, float]]:
    """``select`` on the batch's sessions grouped by prompt: one keep bool per key and the ``pods/*`` metrics.
    ``keys``: ``{uid}_{session}_{index}``; ``sessions``, ``table``: ``_sessions_by_prompt``'s, with (G, n_max)
    ``rewards``; ``num_groups``: B groups to keep."""
    sizes = table["sizes"]
    features = {"lengths": table["lengths"], "truncated": table["truncated"]}  # (G, n_max) each
    selection = select(table["rewards"].unsqueeze(2), torch.ones(1, dtype=torch.float64), num_groups,
                       settings.selection, counts=sizes, features=features, generator=generator)
    kept_sessions = {sessions[p][j] for p, j in (divmod(row, selection.n) for row in selection.kept_rows)}
    keep = [key.rsplit("_", 1)[0] in kept_sessions for key in keys]
    expected = settings.n or int(sizes.max())
    return keep, {**selection.metrics, "pods/rollouts_sampled": float(sizes.sum()),
                  "pods/rollouts_kept": float(len(kept_sessions)),
                  "pods/groups_ragged": float((sizes < expected).sum())}


def _sessions_by_prompt(keys: list[str], tags: list[dict], response_length: int | None):
    """Prompt groups in order of appearance: session names ``{uid}_{session}`` in order, each one's last output key
    (S,), and (G,) ``sizes``, (G, n_max) ``lengths`` and ``truncated`` (its last output reached ``response_length``)."""
    lengths: dict[str, int] = {}
    last: dict[str, tuple[int, int, str]] = {}  # session -> (index, response_len, key) of its last output
    by_uid: dict[str, list[tuple[int, str]]] = {}
    for key, tag in zip(keys, tags):
        uid, session, index = key.rsplit("_", 2)
        name, response_len = f"{uid}_{session}", int(tag.get("response_len", 0))
        if name not in lengths:
            lengths[name] = 0
            by_uid.setdefault(uid, []).append((int(session) if session.isdigit() else 0, name))
        lengths[name] += response_len
        if name not in last or last[name][0] < int(index):
            last[name] = (int(index), response_len, key)
    sessions = [[name for _, name in sorted(group)] for group in by_uid.values()]
    flat, sizes = [name for names in sessions for name in names], [len(names) for names in sessions]
    truncated = [response_length is not None and last[name][1] >= response_length for name in flat]
    table = {field: pad_sequence(torch.tensor(values).split(sizes), batch_first=True)
             for field, values in (("lengths", [lengths[name] for name in flat]), ("truncated", truncated))}
    return sessions, [last[name][2] for name in flat], {"sizes": torch.tensor(sizes), **table}
