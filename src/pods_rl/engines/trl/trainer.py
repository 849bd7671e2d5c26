"""``PODSTrainer``: ``trl.GRPOTrainer`` that samples n rollouts per prompt and trains on m of them.

The TRL surface this package relies on, written only here (``tests/test_trl_surface.py`` pins each at both ends of
``TRL_RANGE``); the step is ``step.py`` (TRL's state through ``adapter.py``), the config ``config.py``:

  overridden   _generate_and_score_completions (the step: TRL's body runs on the kept rows); _generate -> 8-tuple (read
               by name, rows.Generated) and _calculate_rewards -> (N, F), timed; answered per call (instance attributes)
               in TRL's body on the kept rows and to stop it at _generate (adapter.py, trl_*); get_train_dataloader /
               _get_train_sampler (one row per prompt, via Trainer._get_dataloader) and _prepare_inputs (each row n
               times); create_model_card, save_model;
               evaluate; _save_checkpoint; transformers' _load_from_checkpoint, _load_optimizer_and_scheduler,
               _load_scaler, _load_rng_state (errors become runlog.CheckpointUnreadable)
  order        _generate_and_score_completions prepares environments (_environment_pool, reset), tool dicts and images
               before self._generate(prompts); rows read x["prompt"]
  helpers      trl.trainer.utils: RepeatSampler, repeat_iterable_dataset, nanstd, get_config_model_id, get_*_url
  advantages   TRL's own on the kept rows grouped by m (replaced only with advantage_baseline="sampled")
  attributes   num_generations (m around TRL's call), num_iterations, shuffle_dataset, reward_weights,
               reward_func_names, scale_rewards, _metrics["train"], num_generations_eval, multi_objective_aggregation,
               environments, _batch_environments, _environment_pool, _sync_tool_dicts, _async_tool_dicts, tools,
               max_tool_calling_iterations, _pending_extra_logs, _pending_metrics, _tokenizer, environment_factories,
               eos_token_ids (TRL >= 1.15), _paper, _tag_names, vllm_generation (its sleep deferred by the rounds)
  placeholder  train_dataset=None + environment_factory: TRL's placeholder rows become PODS's (PLACEHOLDER_PROMPT)
  tool loop    tools looked up by batch position; max_tool_calling_iterations; a raised or unknown call fails
  vLLM         trl.trainer.grpo_trainer.VLLMGeneration subclassed during GRPOTrainer.__init__ (max_num_seqs, colocate)
  GRPOConfig   subclassed; __post_init__ runs with num_generations = m, its divisibility and eval errors reworded
"""

from __future__ import annotations

import functools
import gc
import logging
import os
import textwrap
from contextlib import contextmanager, nullcontext
from importlib.metadata import version
from pathlib import Path

import torch
from transformers import AutoConfig
from trl import GRPOTrainer
from trl.trainer.utils import RepeatSampler, repeat_iterable_dataset

from pods_rl import tiny
from pods_rl.budget.rollout_budget import RolloutBudget, check_inputs
from pods_rl.engines.trl.config import PODSConfig, eval_batch_problem, quiet_checkpointing_deprecations
from pods_rl.engines.trl.phase_clock import PhaseClock
from pods_rl.engines.trl.step import PODSStep
from pods_rl.machine import pods_rl_version
from pods_rl.reward_guard import guard_reward_funcs, reward_weights_of
from pods_rl.runlog.integrity import reading_checkpoint
from pods_rl.tasks.extraction import completion_text

__all__ = ["PODSConfig", "PODSTrainer", "card_example_prompt", "rollouts_per_generation"]

logger = logging.getLogger(__name__)


def rollouts_per_generation(config: PODSConfig) -> int:
    """Rollouts one process samples per generation (sampled prompts x n); TRL's batch sizes count the m kept."""
    return config.sampled_prompts_per_process() * config.num_generations


@contextmanager
def _colocated_engine_sized_for(config: PODSConfig):
    """Inside ``GRPOTrainer.__init__``: size TRL's colocated vLLM engine (``max_num_seqs``) for every rollout PODS
    samples, not the kept batch; else vLLM generates in n/m serial waves."""
    if not (config.use_vllm and config.vllm_mode == "colocate"):
        yield
        return
    from trl.trainer import grpo_trainer  # imported by now (PODSTrainer subclasses GRPOTrainer)

    built = grpo_trainer.VLLMGeneration
    rows = rollouts_per_generation(config) * config.vllm_tensor_parallel_size

    class SizedVLLMGeneration(built):
        def __init__(self, *args, **kwargs):
            kwargs["max_num_seqs"] = max(kwargs.get("max_num_seqs") or 0, rows)
            super().__init__(*args, **kwargs)

    grpo_trainer.VLLMGeneration = SizedVLLMGeneration
    try:
        yield
    finally:
        grpo_trainer.VLLMGeneration = built


def _train_dataset(args: tuple, kwargs: dict):
    """The training dataset ``GRPOTrainer(model, reward_funcs, args, train_dataset, ...)`` was given, or None."""
    return kwargs.get("train_dataset") if "train_dataset" in kwargs else (args[3] if len(args) > 3 else None)


# The prompt of each row of GRPOTrainer's placeholder dataset (train_dataset=None with an environment_factory: the
# environment's reset returns the real prompt); tests/test_trl_surface.py pins it to TRL's.
PLACEHOLDER_PROMPT = [{"role": "user", "content": ""}]

# The model card's quick start when the training data has no prompt to show (no dataset, an empty one, no column).
GENERIC_CARD_PROMPT = [{"role": "user", "content": "What is 17 + 25? Think it through, then give the answer."}]


def card_example_prompt(dataset, hanging: int = 0) -> str:
    """The first row's ``prompt`` of ``dataset`` as a Python literal for the model card (continuation lines indented
    ``hanging`` spaces); ``GENERIC_CARD_PROMPT`` when there is none to read."""
    import pprint

    prompt = None
    try:
        if dataset is not None and hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__"):
            prompt = dataset[0]["prompt"] if len(dataset) else None
        elif dataset is not None:  # an IterableDataset: its first row only
            prompt = next(iter(dataset), {}).get("prompt")
    except Exception:  # a card is written at every checkpoint: an odd dataset must not stop the save
        prompt = None
    if not prompt:
        prompt = GENERIC_CARD_PROMPT
    return pprint.pformat(prompt, width=100, sort_dicts=False).replace("\n", "\n" + " " * hanging)


class PODSTrainer(PODSStep, GRPOTrainer):
    """``trl.GRPOTrainer`` that samples n rollouts per prompt and trains on m of them; ``args`` is a ``PODSConfig``.

    Same arguments as ``GRPOTrainer``; with ``downsample_to == num_generations`` it is ``GRPOTrainer`` plus phase
    timing. The TRL internals it relies on are listed in this module's docstring."""

    # Long because it wraps GRPOTrainer.__init__: argument fixes before it, PODS state after, in the order they apply.
    def __init__(self, *args, calibration_dataset=None, answer_extractor=None, **kwargs):
        config = kwargs.get("args", args[2] if len(args) > 2 else None)
        if config is None:  # as GRPOTrainer: a default config named after the model (plain GRPO until m is set)
            from trl.trainer.utils import get_config_model_id

            model = kwargs.get("model", args[0] if args else None)
            model_name = model if isinstance(model, str) else get_config_model_id(model.config)
            config = PODSConfig(f"{model_name.split('/')[-1]}-PODS")
            if "args" in kwargs or len(args) <= 2:
                kwargs["args"] = config
            else:
                args = (*args[:2], config, *args[3:])
        if not isinstance(config, PODSConfig):
            raise TypeError(f"PODSTrainer needs args=PODSConfig(...) (or None for the defaults), got "
                            f"{type(config).__name__}.")
        # Reward functions are user code: a time budget per call, checked return values, named errors.
        if "reward_funcs" in kwargs:
            reward_funcs = kwargs["reward_funcs"]
        else:
            reward_funcs = args[1] if len(args) > 1 else None
        if reward_funcs is not None:
            if config.reward_weights is None:
                # A task's functions carry its weights (Task.reward_funcs): the same objective as `pods train`.
                config.reward_weights = reward_weights_of(reward_funcs)
            reward_funcs = guard_reward_funcs(reward_funcs, config.reward_timeout_s)
            if "reward_funcs" in kwargs:
                kwargs["reward_funcs"] = reward_funcs
            else:
                args = (*args[:1], reward_funcs, *args[2:])
        budget = RolloutBudget.from_config(config)  # the planners and the prompt ledger, None without planners
        # A planner's held-out prompts and answer extractor (keywords of PODSTrainer's own), checked before any load
        check_inputs(budget, calibration_dataset, answer_extractor, _train_dataset(args, kwargs), text=completion_text,
                     environment=bool(kwargs.get("environment_factory") or kwargs.get("tools")))
        if config.has_planner and _train_dataset(args, kwargs) is None and kwargs.get("environment_factory"):
            raise ValueError("prompt_planner / rollout_planner tell prompts apart by their text, but the environment "
                             "owns the data here (train_dataset=None: every row is the same placeholder); pass a "
                             "train_dataset, or drop the planners.")
        engine_setup = nullcontext()
        if config.use_vllm:  # imported only then: the vLLM checks and the CPU build's workaround live there
            from pods_rl.engines.vllm import cpu as vllm_cpu

            on_cpu = config.use_cpu or not torch.cuda.is_available()
            vllm_cpu.check_vllm_settings(config.use_vllm, config.vllm_mode, on_cpu=on_cpu)
            model = kwargs.get("model", args[0] if args else None)
            model_config = model.config if hasattr(model, "config") else AutoConfig.from_pretrained(
                model, trust_remote_code=bool(config.trust_remote_code))
            if on_cpu:
                vllm_cpu.check_cpu_model(model_config)
            if config.vllm_mode == "colocate":  # TRL builds the LLM in GRPOTrainer.__init__
                engine_setup = vllm_cpu.reloadable_cpu_weights()
        quiet_checkpointing_deprecations()
        with engine_setup, _colocated_engine_sized_for(config):
            super().__init__(*args, **kwargs)
        self._set_up_pods(config, _train_dataset(args, kwargs) is not None, budget)

    def _set_up_pods(self, config: PODSConfig, has_train_dataset: bool, budget: RolloutBudget | None) -> None:
        """What PODSTrainer adds once GRPOTrainer is built: m and the rule, the placeholder data of environments that
        own theirs, the deciding reward, the planners and ledger (``budget``), the phase clock."""
        # Evaluation samples what a GRPO run with m samples (PODSConfig validated the eval batch in these terms).
        self.num_generations_eval = config.eval_generations
        self.downsample_to = config.downsample_to
        self.downsample_rule = config.downsample_rule
        if config.selects and self.environment_factories is not None and not has_train_dataset:
            # The environment owns the data (its reset returns the prompt): TRL drives the loop with a placeholder
            # dataset of one generation round's prompts, counted for GRPO (generation_batch_size // n, which is 0
            # when a round keeps fewer rows than n); PODS's sampler takes a round of B * oversample_prompts
            # prompts, so the placeholder holds that many rows of TRL's empty prompt, built here.
            from datasets import Dataset

            rows = self._prompts_per_generation_round()
            self.train_dataset = Dataset.from_dict({"prompt": [PLACEHOLDER_PROMPT] * rows})
        if (config.is_adaptive or config.has_planner) and config.adaptive_reward is not None:
            if config.adaptive_reward not in self.reward_func_names:
                raise ValueError(f"adaptive_reward {config.adaptive_reward!r} is not one of this run's reward "
                                 f"functions {self.reward_func_names}; name one of them, or drop it to use the total "
                                 "reward.")
            self._adaptive_reward_index = self.reward_func_names.index(config.adaptive_reward)
        self._selects = config.selects
        self._budget = budget
        # Selection runs on CPU (a (B, n) tensor is tiny): a CPU generator makes `random` reproducible.
        self._selection_generator = torch.Generator().manual_seed(config.seed + self.accelerator.process_index)
        self.phase_clock = PhaseClock(self)
        # First in line, so that its step ends before any callback that evaluates or saves at step end
        # (pods train's TrainingClock): those seconds are not part of the step.
        self.callback_handler.callbacks.insert(0, self.phase_clock)
        if self._budget is not None and "costs" in self._budget.needs:  # auto decides from these phase seconds
            trained = config.per_device_train_batch_size * config.gradient_accumulation_steps  # per optimizer step
            self.phase_clock.listeners.append(functools.partial(self._budget.costs.phases, trained=trained))

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval"):
        """``Trainer.evaluate``, after checking that the eval batch holds whole groups of ``num_generations_eval``."""
        k, processes = self.num_generations_eval, self.accelerator.num_processes
        if (self.args.per_device_eval_batch_size * processes) % k != 0:
            raise ValueError(eval_batch_problem(self.args.per_device_eval_batch_size, processes,
                                                 self.args.num_generations_eval, self.args.downsample_to))
        return super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)

    def release_vllm_engine(self) -> None:
        """Free the colocated vLLM engine (weights, KV cache) for a process that builds another trainer next;
        deleting the trainer does not. The trainer cannot generate with vLLM afterwards."""
        generation = getattr(self, "vllm_generation", None)
        if generation is not None and getattr(generation, "llm", None) is not None:
            generation.llm = None
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()

    # ---- batching: the dataloader yields each prompt once, the batch sizes count the m kept ---------------

    def _prompts_per_generation_round(self) -> int:
        # Global, whole groups: each process samples its kept groups times oversample_prompts.
        return self.args.sampled_prompts_per_process() * self.accelerator.num_processes

    def _get_train_sampler(self, dataset=None):
        if not self._selects:
            return super()._get_train_sampler(dataset)
        return RepeatSampler(  # one row per prompt: _prepare_inputs repeats it n times
            data_source=self.train_dataset if dataset is None else dataset,
            mini_repeat_count=1,
            batch_size=self._prompts_per_generation_round(),
            repeat_count=self.num_iterations * self.args.steps_per_generation,
            shuffle=self.shuffle_dataset,
            seed=self.args.seed,
        )

    def get_train_dataloader(self):
        """TRL's dataloader, sized in prompts: per process and round, the sampled prompts, one row each."""
        if not self._selects:
            return super().get_train_dataloader()
        from datasets import IterableDataset

        dataset = self.train_dataset
        if isinstance(dataset, IterableDataset):
            if self.shuffle_dataset:
                dataset = dataset.shuffle(seed=self.args.seed)
            dataset = repeat_iterable_dataset(
                dataset,
                mini_repeat_count=1,
                batch_size=self._prompts_per_generation_round(),
                repeat_count=self.num_iterations * self.args.steps_per_generation,
            )
        # Per process and generation round: (kept rows / m) * oversample_prompts prompts.
        return self._get_dataloader(
            dataset=dataset,
            description="Training",
            batch_size=self.args.sampled_prompts_per_process(),
            sampler_fn=self._get_train_sampler,
            is_training=True,
        )

    def _prepare_inputs(self, generation_batch):
        """TRL's ``_prepare_inputs`` on each prompt's row repeated n times (the P*n rows of its
        ``_generate_and_score_completions``): the loader yields one row per prompt, so that a step fetches and moves P
        rows, not P*n copies (with n = 4m, as auto runs, the copies cost more than the planner)."""
        if self.model.training and self._selects:
            generation_batch = [row for row in generation_batch for _ in range(self.num_generations)]
        return super()._prepare_inputs(generation_batch)

    # ---- model card (TRL's conventions: same metadata, sections and badges; PODS, n, m and the rule added) ----

    _tag_names = ["trl", "grpo", "pods"]  # TRL adds these to the model's tags and to the card's metadata
    _name = "GRPO-PODS"
    _paper = {
        "title": "Not All Rollouts are Useful: Down-Sampling Rollouts in LLM Reinforcement Learning",
        "id": "2504.13818",
        # docstyle-ignore
        "citation": textwrap.dedent("""\
            @article{xu2025pods,
                title        = {{Not All Rollouts are Useful: Down-Sampling Rollouts in LLM Reinforcement Learning}},
                author       = {Yixuan Even Xu and Yash Savani and Fei Fang and J. Zico Kolter},
                year         = 2025,
                eprint       = {arXiv:2504.13818},
            }"""),
    }

    # Reading a checkpoint back (a resume): an error raised by any of transformers' loaders is a checkpoint that
    # cannot be read, given its own type here, where it is raised (pods train names the file and the way on).
    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        with reading_checkpoint(resume_from_checkpoint):
            loaded = super()._load_from_checkpoint(resume_from_checkpoint, model)
            if self._budget is not None and not self._budget.load(resume_from_checkpoint):
                logger.warning("warning: %s holds no prompt ledger (%s): the planners start from an empty one",
                               resume_from_checkpoint, "pods_ledger.pt")
            return loaded

    def _load_optimizer_and_scheduler(self, checkpoint):
        with reading_checkpoint(checkpoint):
            return super()._load_optimizer_and_scheduler(checkpoint)

    def _load_scaler(self, checkpoint):
        with reading_checkpoint(checkpoint):
            return super()._load_scaler(checkpoint)

    # The prompt ledger and the planners' state travel with each checkpoint (pods_rl.budget: pods_ledger.pt).
    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        if self._budget is not None and self.is_world_process_zero():  # every rank holds the same ledger
            from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

            run_dir = self._get_output_dir(trial=trial)
            self._budget.save(os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"))

    def _load_rng_state(self, checkpoint):
        with reading_checkpoint(checkpoint):
            return super()._load_rng_state(checkpoint)

    def create_model_card(self, model_name: str | None = None, dataset_name: str | None = None,
                          tags: str | list[str] | None = None):
        """Write the PODS model card (base model, rule, n, m, citations) as ``README.md`` in ``output_dir``."""
        if self.is_world_process_zero():
            card = self._pods_model_card(model_name, dataset_name, tags, model_ref=self.args.output_dir)
            card.save(os.path.join(self.args.output_dir, "README.md"))

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False):
        """``Trainer.save_model``; a model saved on its own (not inside a checkpoint) gets its model card too."""
        super().save_model(output_dir, _internal_call)
        if not _internal_call and output_dir is not None and self.is_world_process_zero():
            # TRL's naming (GRPOTrainer._save_checkpoint): the hub repository's name, else the run directory's
            hub = self.args.hub_model_id
            name = hub.split("/")[-1] if hub else Path(self.args.output_dir).name
            card = self._pods_model_card(model_name=name, model_ref=output_dir)
            card.save(os.path.join(output_dir, "README.md"))

    # Long because most of it is the template's keyword list, one line per field.
    def _pods_model_card(self, model_name=None, dataset_name=None, tags=None, model_ref=None):
        """The ``huggingface_hub.ModelCard``, built as TRL's ``generate_model_card`` does, from our template;
        ``model_ref``: what the quick start loads when the model has no hub id."""
        from huggingface_hub import ModelCard, ModelCardData
        from transformers import is_wandb_available
        from trl.trainer.utils import get_comet_experiment_url, get_config_model_id, get_trackio_space_url

        model_id = get_config_model_id(self.model.config)
        local = bool(model_id) and os.path.isdir(model_id)
        if not model_id:
            base_model_text = "a model with no recorded name"
        elif not local:
            base_model_text = f"[{model_id}](https://huggingface.co/{model_id})"
        elif Path(model_id).resolve() == tiny.ASSETS_DIR.resolve():
            base_model_text = "pods-rl's embedded tiny model (`pods_rl/assets/tiny`, built by `pods build-tiny`)"
        else:
            base_model_text = f"`{Path(model_id).name}` (a local model, `{model_id}`)"

        tags = set() if tags is None else {tags} if isinstance(tags, str) else set(tags)
        if hasattr(self.model.config, "unsloth_version"):
            tags.add("unsloth")
        if "JOB_ID" in os.environ:
            tags.add("hf_jobs")
        tags.update(self._tag_names)
        trackio_url = get_trackio_space_url()
        if trackio_url is not None:
            tags = {t for t in tags if not t.startswith("trackio:")} | {f"trackio:{trackio_url}"}
        wandb_url = None
        if is_wandb_available():
            import wandb

            wandb_url = wandb.run.url if wandb.run is not None else None

        args = self.args
        card_data = ModelCardData(
            base_model=None if local else model_id or None,  # hub metadata takes a hub id only
            datasets=dataset_name,
            library_name="transformers",
            licence="license",
            model_name=model_name,
            tags=["generated_from_trainer", *sorted(tags)],
        )
        grpo_paper = GRPOTrainer._paper
        return ModelCard.from_template(
            card_data,
            template_path=str(Path(__file__).parents[2] / "templates" / "model_card.md"),
            base_model_text=base_model_text,
            model_name=model_name,
            hub_model_id=self.hub_model_id,
            model_ref=self.hub_model_id or model_ref or model_name,
            example_prompt=card_example_prompt(self.train_dataset, hanging=len("prompt = ")),
            max_new_tokens=args.max_completion_length,
            dataset_name=dataset_name,
            wandb_url=wandb_url,
            trackio_url=trackio_url,
            comet_url=get_comet_experiment_url(),
            **_card_settings(args),
            paper_title=self._paper["title"],
            paper_id=self._paper["id"],
            grpo_paper_title=grpo_paper["title"],
            grpo_paper_id=grpo_paper["id"],
            pods_citation=self._paper["citation"],
            grpo_citation=grpo_paper["citation"],
            pods_rl_version=pods_rl_version(),  # = pods_rl.__version__; "0+unknown" for a tree never installed
            trl_version=version("trl"),
            transformers_version=version("transformers"),
            pytorch_version=version("torch"),
            datasets_version=version("datasets"),
            tokenizers_version=version("tokenizers"),
        )


def _card_settings(args) -> dict:
    """The model card's training settings of ``args`` (a PODSConfig): PODS's n, m, rule and planners, and the rest."""
    return {"is_pods": args.is_pods, "n": args.num_generations, "m": args.downsample_to, "rule": args.downsample_rule,
            "tiebreak": getattr(args, "downsample_tiebreak", "index"),
            "oversample_prompts": getattr(args, "oversample_prompts", 1),
            "rollout_planner": getattr(args, "rollout_planner", None),
            "prompt_planner": getattr(args, "prompt_planner", None),
            "per_device_train_batch_size": args.per_device_train_batch_size, "learning_rate": args.learning_rate,
            "beta": args.beta, "loss_type": args.loss_type}
