"""Run by tests/test_divergence.py under torchrun with 2 CPU ranks (gloo): a tiny transformers model sharded with
FSDP2 (``fully_shard``: its parameters and gradients are DTensors), then the divergence checks, first on finite
weights and gradients, then with a NaN put into rank 1's shard of one weight only. Each rank writes what it found."""

import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from transformers import AutoModelForCausalLM

from pods_rl.runlog.divergence import TrainingDiverged, agreed_nonfinite, check_finite_weights


def main(model_dir: str, out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    ids = torch.randint(0, model.config.vocab_size, (2, 6))
    model(input_ids=ids, labels=ids).loss.backward()
    record = {"dtensor": type(next(model.parameters())).__name__,
              "finite_grads": agreed_nonfinite((n, p.grad) for n, p in model.named_parameters()),
              "finite_weights": agreed_nonfinite(model.named_parameters())}
    name, weight = next((n, p) for n, p in model.named_parameters() if "layers.1.mlp" in n)
    if rank == 1:
        with torch.no_grad():
            weight.to_local()[0, 0] = float("nan")  # this rank's shard only
    record["nan_found"] = agreed_nonfinite(model.named_parameters())
    record["nan_name"] = name
    try:
        check_finite_weights(model, step=7)
        record["raised"] = None
    except TrainingDiverged as err:
        record["raised"] = str(err)
    json.dump(record, open(f"{out_dir}/rank{rank}.json", "w"))
    # Both ranks leave the last collective before either tears gloo down: a rank that closes its pairs while its
    # peer still reads from them aborts the peer ("terminate called without an active exception", seen in CI).
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
