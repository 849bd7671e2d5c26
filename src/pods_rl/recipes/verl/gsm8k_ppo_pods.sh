#!/usr/bin/env bash
# PPO-PODS on verl: the GSM8K setting of gsm8k_grpo_pods.sh with PPO instead of GRPO: GAE advantages from a learned
# critic (Qwen2.5-3B-Instruct with a value head, full fine-tuning, lr 1e-5). PODS keeps m=16 of n=64 rollouts per
# prompt by max_variance before anything else runs, so the critic's values, GAE and both updates see the kept
# rollouts only (the paper's "beyond GRPO" direction). 32 prompts (512 kept rows) per actor and critic mini-batch.
#
# One node, 8 GPUs:
#     bash recipes/verl/gsm8k_ppo_pods.sh
# A Ray cluster (2 nodes x 8 GPUs):
#     head node:       ray start --head --port=6379
#     each other node: ray start --address=HEAD_IP:6379
#     head node:       NNODES=2 RAY_ADDRESS=auto bash recipes/verl/gsm8k_ppo_pods.sh
#
# Environment and data: as in gsm8k_grpo_pods.sh. DRY_RUN=1 prints the overrides instead of launching.
set -euo pipefail

MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-3B-Instruct}
CRITIC_MODEL_PATH=${CRITIC_MODEL_PATH:-$MODEL_PATH}
DATA_DIR=${DATA_DIR:-$HOME/data/gsm8k}
NNODES=${NNODES:-1}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}

PODS_TEXT=$(pods verl-args --prompts 32 --n 64 --m 16 --rule max_variance --dp $((NNODES * GPUS_PER_NODE)) \
    --mini-batch 512 --critic-mini-batch 512)
mapfile -t PODS <<< "$PODS_TEXT"

ARGS=(
    algorithm.adv_estimator=gae
    algorithm.gamma=1.0
    algorithm.lam=1.0
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
    actor_rollout_ref.rollout.gpu_memory_utilization=0.4
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16
    critic.model.path="$CRITIC_MODEL_PATH"
    critic.model.use_remove_padding=True
    critic.model.enable_gradient_checkpointing=True
    critic.optim.lr=1e-5
    critic.ppo_micro_batch_size_per_gpu=16
    trainer.critic_warmup=0
    trainer.n_gpus_per_node="$GPUS_PER_NODE"
    trainer.nnodes="$NNODES"
    trainer.logger='["console","tensorboard"]'
    trainer.project_name=pods
    trainer.experiment_name=gsm8k_ppo_pods_n64_m16
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
