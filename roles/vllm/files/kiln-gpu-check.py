#!/usr/bin/env python3
"""Prove the GPU stack a kiln image bakes: CUDA through torch, the driver against torch's CUDA, a matmul on every
GPU, an NCCL all-reduce across all of them (the path tensor parallel uses) and, on NVSwitch boards, the fabric
manager. Run with the vLLM virtualenv's Python on a GPU builder; exits 1 with the reason on the first failure."""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

NVIDIA_VENDOR, NVSWITCH_CLASS = "0x10de", "0x0680"


class StackError(Exception):
    pass


def version_key(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.strip().split("."))


def say(text: str) -> None:
    print(f"ok   {text}", flush=True)


def check_cuda(expected_cuda: str) -> int:
    if not torch.cuda.is_available():
        try:
            torch.cuda.init()
            reason = "no CUDA device is visible"
        except Exception as exc:  # the driver's own words: "driver version is insufficient", error 802, ...
            reason = str(exc).strip().splitlines()[0]
        raise StackError(f"torch.cuda.is_available() is False: {reason}")
    built = torch.version.cuda or "none"
    if version_key(built)[:2] != version_key(expected_cuda)[:2]:
        raise StackError(f"torch {torch.__version__} is built for CUDA {built}, not the pinned {expected_cuda}")
    count = torch.cuda.device_count()
    say(f"torch {torch.__version__} (CUDA {built}) sees {count} GPU(s): {torch.cuda.get_device_name(0)}")
    return count


def check_driver(minimum: str) -> None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, check=False, timeout=60)
    except FileNotFoundError:
        raise StackError("nvidia-smi is not installed: the NVIDIA driver is missing") from None
    if out.returncode != 0 or not out.stdout.strip():
        raise StackError(f"nvidia-smi failed: {(out.stderr or out.stdout).strip()}")
    driver = out.stdout.split()[0]
    if version_key(driver) < version_key(minimum):
        raise StackError(f"driver {driver} is older than {minimum}, which torch's CUDA needs")
    say(f"driver {driver} >= {minimum}")


def check_matmul(count: int) -> None:
    for index in range(count):
        device = torch.device("cuda", index)
        a = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
        b = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
        got = (a @ b).float()
        want = a.float() @ b.float()
        torch.cuda.synchronize(device)
        error = ((got - want).abs().max() / want.abs().max()).item()
        if not error < 0.05:
            raise StackError(f"GPU {index}: a BF16 matmul is off by {error:.3g} of its range")
    say(f"a 4096x4096 BF16 matmul is right on all {count} GPU(s)")


def _all_reduce(rank: int, world: int, port: int) -> None:
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        value = torch.ones(64 << 20, device="cuda") * (rank + 1)  # 256 MiB: big enough to take the NVLink path
        dist.all_reduce(value)
        torch.cuda.synchronize()
        want = world * (world + 1) / 2
        if not torch.all(value == want):
            raise StackError(f"rank {rank}: all-reduce gave {value[0].item()}, not {want}")
    finally:
        dist.destroy_process_group()


def check_all_reduce(count: int) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        mp.spawn(_all_reduce, args=(count, port), nprocs=count, join=True)
    except Exception as exc:
        raise StackError(f"NCCL all-reduce across {count} GPUs failed: {str(exc).strip().splitlines()[-1]}") from exc
    say(f"NCCL all-reduce across {count} GPUs")


def nvswitches(sysfs: Path = Path("/sys/bus/pci/devices")) -> int:
    found = 0
    for device in sysfs.iterdir() if sysfs.is_dir() else []:
        try:
            found += ((device / "vendor").read_text().strip() == NVIDIA_VENDOR
                      and (device / "class").read_text().strip().startswith(NVSWITCH_CLASS))
        except OSError:
            continue
    return found


def check_fabric_manager() -> None:
    switches = nvswitches()
    if not switches:
        say("no NVSwitch: no fabric manager needed")
        return
    state = subprocess.run(["systemctl", "is-active", "nvidia-fabricmanager"], capture_output=True, text=True,
                           check=False, timeout=30).stdout.strip()
    if state != "active":
        raise StackError(f"{switches} NVSwitch(es) but nvidia-fabricmanager is {state or 'absent'}: CUDA fails with "
                         "error 802 without it")
    say(f"nvidia-fabricmanager active for {switches} NVSwitch(es)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cuda", required=True, help="the CUDA release torch must be built for (major.minor)")
    parser.add_argument("--minimum-driver", required=True, help="the oldest driver that runs that CUDA")
    args = parser.parse_args(argv)
    os.environ.setdefault("NCCL_DEBUG", "WARN")
    try:
        check_fabric_manager()
        check_driver(args.minimum_driver)
        count = check_cuda(args.cuda)
        check_matmul(count)
        if count > 1:
            check_all_reduce(count)
    except StackError as exc:
        print(f"FAIL {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
