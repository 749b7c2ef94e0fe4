"""Multi-process training for the policy and value trainers: torch.distributed + FSDP2 (`fully_shard`).

A trainer with `topology.<role>_procs = N > 1` runs as N processes of one job: locally N tasks of one submitit
local job, on SLURM N tasks per node of one sbatch job (submitit's `tasks_per_node` in both cases). Each task
reads its rank from the torchrun variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) when they are set,
else from submitit (`submitit.helpers.TorchDistributedEnvironment`). Backend: nccl on CUDA, gloo on the CPU.
Inside a pipeline's SLURM allocation a trainer placed on several nodes is one srun step of one task per rank:
ranks from SLURM_PROCID / SLURM_STEP_NUM_TASKS / SLURM_LOCALID, rendezvous through a file in its job folder
(`_published_store`).

Data: rank 0 alone touches the run directory (reads batches / samples replay, writes metrics, publishes
weights). It broadcasts each whole batch to every rank (`broadcast`, over a gloo side group whose timeout is
the job's lifetime, so ranks may wait for the next batch as long as rank 0 does); every rank then trains on
its strided share of each micro-batch (`share`). The loss of a share is scaled so the gradient equals the
single-process one: with FSDP averaging gradients over ranks, a rank's token-mean loss over n tokens is
multiplied by n / N × world (N = the batch's tokens over all ranks; `loss_scale`, whose inputs are all
arguments: no state of this module). Publishing gathers the
full state dict onto rank 0's CPU (`unsharded`), which saves it with the usual `save_pretrained`.

With one process (the default) every function here is a no-op and the trainers run exactly as before.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

import torch


@dataclass
class Group:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: str = "cpu"
    control: object = None  # gloo process group for objects and counts (None with one process)

    @property
    def main(self) -> bool:
        return self.rank == 0


_group = Group()


def current() -> Group:
    """This process's group (rank 0 of 1 unless `setup` started a distributed one)."""
    return _group


def rank_device(device: str, local_rank: int) -> str:
    """The device of local rank `local_rank` of a trainer whose topology device is `device`: with CUDA, the
    job's GPUs are consecutive from `device` (the executor made exactly those visible, so they are cuda:0..)."""
    if not device.startswith("cuda"):
        return "cpu"
    visible = [v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if len(visible) == 1:
        return "cuda:0"  # one GPU per task (a cluster that binds GPUs to tasks)
    if visible:
        return f"cuda:{local_rank}"
    base = int(device.split(":")[1]) if ":" in device else 0
    return f"cuda:{base + local_rank}"


RENDEZVOUS_ENV = "PRIME_VALUES_RENDEZVOUS"  # a file of the job's folder: see `_published_store`


def _env_ranks() -> tuple[int, int, int]:
    """(rank, world size, local rank): a trainer over several nodes (one srun task per rank, RENDEZVOUS_ENV set)
    from SLURM's step variables; else from torchrun's variables, else from submitit's job environment."""
    if os.environ.get(RENDEZVOUS_ENV):
        tasks = os.environ.get("SLURM_STEP_NUM_TASKS") or os.environ.get("SLURM_NTASKS") or "1"
        return int(os.environ["SLURM_PROCID"]), int(tasks), int(os.environ.get("SLURM_LOCALID") or 0)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0))
    from submitit.helpers import TorchDistributedEnvironment

    env = TorchDistributedEnvironment()
    if "SUBMITIT_LOCAL_JOB_ID" in os.environ:
        env.master_addr = "127.0.0.1"  # one machine: no need to resolve the host name
    env.export(set_cuda_visible_devices=False, overwrite=True)  # the executor already chose the visible GPUs
    return env.rank, env.world_size, env.local_rank


def node_address() -> str:
    """The address other nodes reach this one at: its NodeAddr in SLURM's node table (what slurmctld itself uses;
    on the local emulated cluster 127.0.0.1, where the node names do not resolve), else the host name."""
    node = os.environ.get("SLURMD_NODENAME")
    if node:
        try:
            out = subprocess.run(["scontrol", "show", "node", "-o", node], capture_output=True, text=True,
                                 timeout=60, check=False).stdout
        except (OSError, subprocess.TimeoutExpired):
            out = ""
        for item in out.split():
            if item.startswith("NodeAddr=") and item[len("NodeAddr="):]:
                return item[len("NodeAddr="):]
    return socket.gethostname()


def _published_store(path: str, rank: int, world: int, timeout: datetime.timedelta):
    """The TCPStore of a trainer whose ranks run on several nodes. Rank 0 opens it on a port the OS picks (port 0:
    bound from the moment it is chosen, so it cannot collide with another job, step or program on that node, as a
    port derived from the job id could) and publishes `{"host", "port"}` in `path` (atomically: written to a
    temporary name, then renamed); the other ranks wait for the file and connect. `path` names the job, SLURM
    step and restart count (launch.controller), so no rank reads the address of an earlier step."""
    import torch.distributed as dist

    if rank == 0:
        store = dist.TCPStore("0.0.0.0", 0, world, True, timeout=timeout, wait_for_workers=False)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump({"host": node_address(), "port": store.port}, f)
        os.replace(tmp, path)
        return store
    deadline = time.time() + timeout.total_seconds()
    while not os.path.exists(path):  # rank 0 may still be importing torch; the step ends if it died
        if time.time() > deadline:
            raise TimeoutError(f"rank 0 published no rendezvous address in {path} within {timeout}")
        time.sleep(0.2)
    with open(path) as f:
        where = json.load(f)
    return dist.TCPStore(where["host"], int(where["port"]), world, False, timeout=timeout)


def setup(procs: int, device: str, timeout_min: float = 120) -> Group:
    """Join the trainer's process group (no-op for procs == 1); returns the group with this rank's device.

    `timeout_min` bounds how long a rank waits in `broadcast` for rank 0 (e.g. for the next batch)."""
    global _group
    if procs <= 1:
        _group = Group(device=device)
        return _group
    import torch.distributed as dist

    rank, world, local_rank = _env_ranks()
    if world != procs:
        raise RuntimeError(f"this trainer was configured for {procs} processes but its job has {world} tasks; "
                           f"start it with tasks_per_node={procs} (the conductor does)")
    dev = rank_device(device, local_rank)
    backend = "nccl" if dev.startswith("cuda") else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(dev)
    timeout = datetime.timedelta(minutes=30)
    store = {"store": _published_store(os.environ[RENDEZVOUS_ENV], rank, world, timeout)} \
        if os.environ.get(RENDEZVOUS_ENV) else {}  # over several nodes; else env:// (MASTER_ADDR/PORT)
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=timeout, **store,
                            **({"device_id": torch.device(dev)} if backend == "nccl" else {}))
    print(f"prime_values.dist: rank {rank} of {world} ({backend}) on node "
          f"{os.environ.get('SLURMD_NODENAME') or os.uname().nodename}", file=sys.stderr, flush=True)
    control = dist.new_group(backend="gloo", timeout=datetime.timedelta(minutes=max(timeout_min, 30)))
    _group = Group(rank, world, local_rank, dev, control)
    return _group


def teardown() -> None:
    global _group
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _group = Group(device=_group.device)


def shard(model: torch.nn.Module, mixed: bool | None = None) -> torch.nn.Module:
    """FSDP2: every transformer block its own unit, then the root (embeddings, final norm, head; tied weights
    stay in one unit). A no-op with one process. Build the optimizer after this (and enable activation
    checkpointing before it).

    `mixed` (default: the model's own precision, `pv_mixed`, which models.build.apply_precision sets): the blocks'
    fp32 shards are all-gathered as bf16 and their gradients reduce-scattered in fp32
    (`MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32, cast_forward_inputs=False)`); the sharded fp32
    parameters are the optimizer's master copy.
    The forward runs under bf16 autocast as with one process (models.build.apply_precision), so the block inputs
    stay fp32 (no cast of the residual stream) and a block computes what autocast computes from its fp32 weights
    rounded to bf16; the root unit (embeddings, final norm, heads) stays fp32."""
    g = current()
    if g.world == 1:
        return model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if mixed is None:
        mixed = bool(getattr(model, "pv_mixed", False))
    blocks = {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                                cast_forward_inputs=False)} if mixed else {}
    mesh = init_device_mesh("cuda" if g.device.startswith("cuda") else "cpu", (g.world,))
    for block in model.model.layers:  # every transformers decoder-only model (and its token classifier)
        fully_shard(block, mesh=mesh, **blocks)
    fully_shard(model, mesh=mesh)
    return model


def broadcast(obj):
    """Rank 0's `obj` on every rank (any picklable object; other ranks pass anything, e.g. None)."""
    g = current()
    if g.world == 1:
        return obj
    import torch.distributed as dist

    box = [obj if g.main else None]
    dist.broadcast_object_list(box, src=0, group=g.control)
    return box[0]


def all_reduce_sum(values: dict[str, float]) -> dict[str, float]:
    """Sum of each value over ranks (the keys must be the same on every rank)."""
    g = current()
    if g.world == 1 or not values:
        return values
    import torch.distributed as dist

    keys = sorted(values)
    tensor = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)
    dist.all_reduce(tensor, group=g.control)
    return dict(zip(keys, tensor.tolist()))


def share(rows: list) -> tuple[list, bool]:
    """This rank's strided share of `rows`, and whether it is real: a rank left without rows (fewer rows than
    ranks) gets the first row to run with weight 0 (its tokens count 0 in `loss_scale` and `token_mean`), since
    FSDP needs every rank in every forward/backward."""
    g = current()
    mine = rows[g.rank::g.world]
    return (mine, True) if mine else (rows[:1], False)


def loss_scale(tokens, total_tokens, world: int) -> float:
    """Factor for a token-mean loss over `tokens` tokens (one rank's micro-batch; 0 for a stand-in share) so that
    the gradients, summed over micro-batches and averaged over the `world` ranks (FSDP), are the single-process
    gradient of the token mean over the `total_tokens` tokens of the whole batch (every rank, every micro-batch):

        scale = tokens / total_tokens × world

    since (1/world) Σ_ranks Σ_micro (n / N × world) · (1/n) Σ_t ∇ℓ_t = (1/N) Σ_all t ∇ℓ_t. With one process and
    one micro-batch it is 1. Hand-worked: 2 ranks, micro-batches of 3 and 5 tokens of a global 16 -> 3/16 × 2 =
    0.375 and 5/16 × 2 = 0.625 (tests/roles/test_dist.py)."""
    return tokens / max(total_tokens, 1) * world


def token_mean(stats: dict[str, float], local_tokens) -> dict[str, float]:
    """Per-rank token-mean statistics over `local_tokens` tokens (0 for a stand-in share) combined into the token
    mean over all ranks (unchanged with one process)."""
    if current().world == 1:
        return stats
    local = float(local_tokens)
    summed = all_reduce_sum({**{k: v * local for k, v in stats.items()}, "__tokens": local})
    total = max(summed.pop("__tokens"), 1.0)
    return {k: v / total for k, v in summed.items()}


def clip_grad_norm(parameters, max_norm: float) -> float:
    """`clip_grad_norm_` that also returns a plain float for sharded (DTensor) gradients."""
    norm = torch.nn.utils.clip_grad_norm_(list(parameters), max_norm)
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return norm.item()


def full_state_dict(model: torch.nn.Module) -> dict | None:
    """The full (unsharded) state dict on rank 0's CPU, None on other ranks. Every rank must call it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return state if current().main else None


def unsharded(model: torch.nn.Module):
    """A plain transformers copy of a sharded model on rank 0's CPU (None on other ranks), for
    `save_pretrained` and evaluation; the model itself with one process. Every rank must call it."""
    if current().world == 1:
        return model
    state = full_state_dict(model)
    if state is None:
        return None
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    auto = AutoModelForTokenClassification if model.config.architectures and any(
        "TokenClassification" in a for a in model.config.architectures) else AutoModelForCausalLM
    if "score.weight" in state:
        auto = AutoModelForTokenClassification
    with torch.device("meta"):
        plain = auto.from_config(model.config, dtype=torch.float32,
                                 attn_implementation=model.config._attn_implementation)
    plain.load_state_dict(state, strict=False, assign=True)
    buffers = dict(model.named_buffers())  # FSDP shards parameters only: buffers (rotary tables) are whole
    for name, buffer in list(plain.named_buffers()):
        if buffer.is_meta:
            owner, _, leaf = name.rpartition(".")
            plain.get_submodule(owner).register_buffer(leaf, buffers[name].detach().cpu().clone(), persistent=False)
    if getattr(plain.config, "tie_word_embeddings", False) and hasattr(plain, "lm_head"):
        plain.lm_head.weight = plain.get_input_embeddings().weight
    missing = [name for name, p in plain.named_parameters() if p.is_meta]
    assert not missing, f"parameters missing from the gathered state dict: {missing[:5]}"
    if getattr(model, "generation_config", None) is not None:  # causal LMs only
        plain.generation_config = model.generation_config
    from prime_values.models.build import apply_precision

    return apply_precision(plain, getattr(model, "pv_mixed", False)).eval()  # evaluated with the trainer's numerics


def optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict | None:
    """The optimizer state to save, keyed by parameter name: the full state (gathered onto rank 0's CPU with
    several processes; None on the other ranks), so a run restarted with another process count resumes from it
    too. Every rank must call it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    state = get_optimizer_state_dict(model, optimizer,
                                     options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return state if current().main else None


def restore_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, read) -> str:
    """Restore the optimizer from what `read()` returns on every rank — (state or None, message), e.g.
    `models.read_optimizer_state` of the version being resumed — only when every rank got a state (one rank's
    torn read must not leave the others in a collective alone); returns the message for the log. A state keyed
    by parameter name (`optimizer_state`) loads with any process count; one keyed by index (an optimizer's own
    state_dict, older runs) loads with one process."""
    state, said = read()
    ok = all_reduce_sum({"ok": float(state is not None)})["ok"] == current().world
    if not ok:
        return said if state is None else "another rank could not read the optimizer state: fresh optimizer"
    groups = state.get("param_groups") or [{}]
    by_name = all(isinstance(p, str) for p in groups[0].get("params", []))
    try:
        if by_name:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

            set_optimizer_state_dict(model, optimizer, optim_state_dict=state,
                                     options=StateDictOptions(full_state_dict=True))
        elif current().world == 1:
            optimizer.load_state_dict(state)
        else:
            return "optimizer state keyed by index (saved by one process): fresh optimizer"
    except Exception as error:  # noqa: BLE001 - another model's state: fresh optimizer (the same on every rank)
        return f"optimizer state unusable ({type(error).__name__}: {error}): fresh optimizer"
    return said
