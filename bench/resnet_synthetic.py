"""ResNet-50 training throughput on synthetic data, data-parallel over the job's GPUs.

Run by every rank of a job: ``--mode ddp`` under torchrun (torch.distributed + NCCL, DDP) or
``--mode hvd`` under mpirun (Horovod with NCCL). Batch 128 per GPU, bf16 autocast, SGD; the
images and labels are random tensors made on the GPU (no input pipeline in the measurement).
Rank 0 prints one ``RESULT`` line with the images per second of all ranks together.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torchvision


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=["ddp", "hvd"], required=True)
    parser.add_argument("--batch", type=int, default=128, help="images per GPU per step")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--steps", type=int, default=60, help="timed steps")
    parser.add_argument("--label", default="", help="printed on the RESULT line")
    args = parser.parse_args()

    if args.mode == "ddp":
        import torch.distributed as dist

        dist.init_process_group("nccl")
        rank, size, local = dist.get_rank(), dist.get_world_size(), int(os.environ["LOCAL_RANK"])
    else:
        import horovod.torch as hvd

        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        # The rank's place on its node as its launcher counts it (mpirun: OMPI_COMM_WORLD_LOCAL_RANK,
        # first: inside a batch job every rank also inherits the batch step's SLURM_LOCALID=0; srun:
        # SLURM_LOCALID). Horovod's own local_rank() comes from MPI's shared-memory grouping, which
        # put every rank alone when each ran in a container with a /dev/shm of its own.
        local = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", os.environ.get("SLURM_LOCALID", hvd.local_rank())))
        if local != hvd.local_rank():
            print(f"rank {rank}: Horovod's local_rank() is {hvd.local_rank()}, the launcher's {local}: using {local}", flush=True)
    torch.cuda.set_device(local)
    torch.backends.cudnn.benchmark = True
    model = torchvision.models.resnet50().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * size, momentum=0.9)
    if args.mode == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local])
    else:
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    images = torch.randn(args.batch, 3, 224, 224, device="cuda")
    labels = torch.randint(0, 1000, (args.batch,), device="cuda")

    def step():
        optimizer.zero_grad()  # Horovod's optimizer takes no set_to_none
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(args.steps):
        step()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    mine = torch.tensor([args.batch * args.steps / seconds], device="cuda")
    if args.mode == "ddp":
        dist.all_reduce(mine)
    else:
        mine = hvd.allreduce(mine, op=hvd.Sum)
    print(f"rank {rank}/{size} on {torch.cuda.get_device_name(local)}: "
          f"{args.batch * args.steps / seconds:.0f} img/s", flush=True)
    if rank == 0:
        print(f"RESULT {args.label} mode={args.mode} gpus={size} img_per_s={mine.item():.1f}", flush=True)
    if args.mode == "ddp":
        del model
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
