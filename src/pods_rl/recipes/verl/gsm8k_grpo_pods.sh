#!/usr/bin/env bash
# GRPO-PODS on verl: the paper's GSM8K setting (Xu et al. 2025, sec. 4; recipes/gsm8k/pods.yaml for TRL):
# Qwen2.5-3B-Instruct + LoRA r=64, n=64 rollouts per prompt -> m=16 kept by max_variance, GRPO advantages on the
# kept 16, no KL, lr 5e-6, 512-token responses, 32 prompts (512 kept rows) per optimizer step.
#
# One node, 8 GPUs:
#     bash recipes/verl/gsm8k_grpo_pods.sh
# A Ray cluster (here 2 nodes x 8 GPUs; the same 32 prompts per step, spread over 16 ranks):
#     head node:       ray start --head --port=6379
#     each other node: ray start --address=HEAD_IP:6379
#     head node:       NNODES=2 RAY_ADDRESS=auto bash recipes/verl/gsm8k_grpo_pods.sh
#
# Every node needs the same environment (the PODS buffer runs inside verl's TaskRunner, wherever Ray puts it):
#     pip install -e ".[verl]" "verl[vllm]==0.9.1"   (from a clone of pods-rl; not verl[fsdp]: it pins trl==0.27)
# Data: verl's GSM8K parquet and rule reward (strict "#### answer" format), from a verl checkout:
#     python3 examples/data_preprocess/gsm8k.py --local_save_dir ~/data/gsm8k
# DRY_RUN=1 prints the overrides instead of launching; extra arguments are passed on to verl (Hydra overrides).
set -euo pipefail

MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-3B-Instruct}
DATA_DIR=${DATA_DIR:-$HOME/data/gsm8k}
NNODES=${NNODES:-1}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}

# Batch settings in kept terms (data.train_batch_size, rollout.n, ppo_mini_batch_size, the PODS sampler): no padding.
PODS_TEXT=$(pods verl-args --prompts 32 --n 64 --m 16 --rule max_variance --dp $((NNODES * GPUS_PER_NODE)) \
    --mini-batch 512)
mapfile -t PODS <<< "$PODS_TEXT"

ARGS=(
    algorithm.adv_estimator=grpo
    algorithm.use_kl_in_reward=False
    data.train_files="$DATA_DIR/train.parquet"
    data.val_files="$DATA_DIR/test.parquet"
    data.max_prompt_length=512
    data.max_response_length=512
    data.filter_overlong_prompts=True
    actor_rollout_ref.model.path="$MODEL_PATH"
    actor_rollout_ref.model.lora_rank=64
    actor_rollout_ref.model.lora_alpha=64
    actor_rollout_ref.model.target_modules=all-linear
    actor_rollout_ref.model.use_remove_padding=True
    actor_rollout_ref.model.enable_gradient_checkpointing=True
    actor_rollout_ref.actor.optim.lr=5e-6
    actor_rollout_ref.actor.use_kl_loss=False
    actor_rollout_ref.actor.entropy_coeff=0
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16
    actor_rollout_ref.rollout.name=vllm
    actor_rollout_ref.rollout.temperature=1.0
    actor_rollout_ref.rollout.tensor_model_parallel_size=1
    actor_rollout_ref.rollout.gpu_memory_utilization=0.5
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16
    trainer.n_gpus_per_node="$GPUS_PER_NODE"
    trainer.nnodes="$NNODES"
    trainer.logger='["console","tensorboard"]'
    trainer.project_name=pods
    trainer.experiment_name=gsm8k_grpo_pods_n64_m16
    trainer.test_freq=10
    trainer.save_freq=50
    trainer.total_epochs=15
    "${PODS[@]}"
)
if [ -n "${DRY_RUN:-}" ]; then
    printf '%s\n' "${ARGS[@]}" "$@"
    exit 0
fi
exec python3 -m verl.trainer.main_ppo "${ARGS[@]}" "$@"
