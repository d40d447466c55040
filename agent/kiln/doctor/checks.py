"""The pre-flight verdicts: is this machine's GPU stack able to run the plan? Pure: facts in, checks out.

Each check passes, or names the problem and the exact fix. FAIL blocks vLLM from starting (it would only crash
or hang); WARN serves but is shown.
"""

from __future__ import annotations

from collections.abc import Callable

from kiln.doctor.facts import (
    CLOCK_SLOWDOWNS,
    FABRIC_COMPLETED,
    FABRIC_IN_PROGRESS,
    FABRIC_NOT_SUPPORTED,
    GpuHealth,
    InstalledStack,
    Needs,
    NvmlHealth,
)
from kiln.doctor.kernels import check_flashinfer_kernels
from kiln.doctor.report import FAIL, PASS, SKIP, WARN, Check, Report
from kiln.doctor.stack import GpuStack, at_least, version_key
from kiln.hardware.model import Machine
from kiln.hardware.system import SystemFacts

FABRIC_MANAGER = "nvidia-fabricmanager"
PERSISTENCED = "nvidia-persistenced"
SHM_MINIMUM = 1 << 30  # NCCL's documented container setting is --shm-size=1g
CACHE_MARGIN = 1.05  # the checkpoint plus tokenizer, config and download temporaries
REPLACE = ("this GPU is failing: destroy the droplet and create another (on your own hardware, have the GPU "
           "replaced); report its UUID to the provider")


def _gpus(indices: list[int]) -> str:
    return ("GPU " if len(indices) == 1 else "GPUs ") + ", ".join(str(i) for i in indices)


def _install_driver(stack: GpuStack) -> str:
    b, v = stack.driver.branch, stack.driver.version
    return (f"use an image built by kiln (driver {v}), or install the R{b} driver: apt-get install "
            f"nvidia-headless-{b}-server-open nvidia-utils-{b}-server (plus nvidia-fabricmanager-{b} of the same "
            "version on 8-GPU HGX machines), then reboot")


def check_driver(machine: Machine, stack: GpuStack, installed: InstalledStack | None = None) -> Check:
    # The torch really installed decides when it is known; else the one the image pins.
    if installed and installed.torch and installed.torch_cuda:
        cuda, torch = installed.torch_cuda, f"torch {installed.torch} (in {installed.where})"
    else:
        cuda, torch = stack.torch.cuda, f"torch {stack.torch.version} (vLLM {stack.vllm.version})"
    running, cuda_driver = machine.driver_version, machine.cuda_driver_version
    if not running:
        return Check("driver", FAIL, "NVML did not report a driver version", _install_driver(stack))
    minimum = stack.minimum_driver(cuda)
    if minimum and not at_least(running, minimum):
        return Check("driver", FAIL,
                     f"driver {running} is older than {minimum}, the minimum for CUDA {cuda}, which {torch} is "
                     "built for: every vLLM instance would fail at CUDA initialisation", _install_driver(stack))
    if cuda_driver and version_key(cuda_driver)[:2] < version_key(cuda)[:2] and not (
            minimum and version_key(cuda_driver)[0] == version_key(cuda)[0]):  # minor version compatibility
        return Check("driver", FAIL, f"the driver's CUDA is {cuda_driver}, older than the CUDA {cuda} {torch} is "
                     "built for", _install_driver(stack))
    return Check("driver", PASS, f"driver {running} (CUDA {cuda_driver or '?'}) runs CUDA {cuda} of {torch}"
                 + (f", minimum {minimum}" if minimum else ""))


def check_installed(machine: Machine, stack: GpuStack, installed: InstalledStack | None) -> Check:
    if installed is None or installed.vllm is None or installed.torch is None:
        return Check("vllm build", SKIP, "no vLLM installation was read (a recorded machine, or none at the "
                     "image's path)" if installed is None
                     else f"vLLM or torch is not installed in {installed.where}")
    built = f"{installed.vllm}, torch {installed.torch} " + (
        f"(CUDA {installed.torch_cuda})" if installed.torch_cuda else "(a CPU build)") + f" in {installed.where}"
    if machine.gpus and not installed.torch_cuda:
        return Check("vllm build", FAIL, f"{built}: it cannot use the GPUs",
                     "use an image baked for GPUs (`kiln image build --target digitalocean`, or the playbook with "
                     "-e vllm_flavour=cuda)")
    version = installed.vllm.split()[-1]
    if version != stack.vllm.version:
        return Check("vllm build", WARN, f"{built}; kiln's image pins vLLM {stack.vllm.version}, and its version "
                     "checks do not cover this one", f"reinstall the pinned vLLM: {installed.where}/bin/pip install "
                     f"vllm=={stack.vllm.version}, or rebuild the image")
    return Check("vllm build", PASS, built)


def check_architectures(machine: Machine, stack: GpuStack) -> Check:
    if not machine.gpus or not machine.driver_version:
        return Check("gpu support", SKIP, "no driver version to compare")
    classes = sorted({(g.compute_capability, g.name) for g in machine.gpus})
    for cc, name in classes:
        arch = stack.architecture(cc)
        if arch and not at_least(machine.driver_version, arch.driver):
            return Check("gpu support", FAIL,
                         f"{name} (compute capability {cc[0]}.{cc[1]}) needs driver {arch.driver} or newer; "
                         f"this is {machine.driver_version}", _install_driver(stack))
    known = [f"{n} ({cc[0]}.{cc[1]})" for cc, n in classes if stack.architecture(cc)]
    if not known:
        return Check("gpu support", WARN, f"{classes[0][1]}: kiln has no minimum driver on record for compute "
                     f"capability {classes[0][0][0]}.{classes[0][0][1]}",
                     "check NVIDIA's driver release notes list this GPU")
    return Check("gpu support", PASS, "driver supports " + ", ".join(known))


def check_mig(machine: Machine) -> Check:
    on = [g.index for g in machine.gpus if g.mig_enabled]
    if on:
        return Check("mig", FAIL, f"MIG mode is on for {_gpus(on)}: vLLM would see MIG slices, not whole GPUs",
                     "turn it off: nvidia-smi -i " + ",".join(map(str, on)) + " -mig 0, then reboot")
    return Check("mig", PASS, "off on every GPU")


def _nvswitch_board(machine: Machine, health: NvmlHealth, system: SystemFacts) -> bool:
    fabric = any(g.fabric_state not in (None, FABRIC_NOT_SUPPORTED) for g in health.gpus)
    return bool(machine.gpus) and (system.nvswitches > 0 or fabric)


def check_fabric(machine: Machine, health: NvmlHealth, system: SystemFacts, stack: GpuStack) -> Check:
    if not _nvswitch_board(machine, health, system):
        return Check("fabric manager", SKIP, "no NVSwitch on this machine")
    fm = system.units.get(FABRIC_MANAGER)
    start = f"systemctl enable --now {FABRIC_MANAGER}; see `journalctl -u {FABRIC_MANAGER}`"
    if fm is None:
        return Check("fabric manager", FAIL,
                     f"NVSwitch board without {FABRIC_MANAGER}: CUDA fails on every GPU with error 802 "
                     "(system not ready)",
                     f"apt-get install nvidia-fabricmanager-{stack.driver.branch} at exactly the driver's version "
                     f"({machine.driver_version}), then {start}")
    if fm != "active":
        return Check("fabric manager", FAIL,
                     f"{FABRIC_MANAGER} is {fm}: without it CUDA fails on every GPU with error 802 (system not ready)",
                     f"{start}; its version must equal the driver's ({machine.driver_version})")
    training = [g.index for g in health.gpus if g.fabric_state == FABRIC_IN_PROGRESS]
    if training:
        return Check("fabric manager", FAIL, f"the NVLink fabric is still being set up for {_gpus(training)}",
                     f"wait for {FABRIC_MANAGER} to finish, then systemctl restart kiln-agent", transient=True)
    unready = [g.index for g in health.gpus
               if g.fabric_state not in (None, FABRIC_NOT_SUPPORTED)
               and (g.fabric_state != FABRIC_COMPLETED or (g.fabric_status or 0) != 0)]
    if unready:
        return Check("fabric manager", FAIL,
                     f"{FABRIC_MANAGER} is active but NVML's fabric state is not completed for {_gpus(unready)}",
                     f"systemctl restart {FABRIC_MANAGER} and check `nvidia-smi -q | grep -A3 Fabric`; a version "
                     f"other than the driver's ({machine.driver_version}) is the usual cause")
    return Check("fabric manager", PASS, f"{FABRIC_MANAGER} active, fabric completed on every GPU")


def _per_gpu(name: str, health: NvmlHealth, test: Callable[[GpuHealth], bool | None], problem: str,
             fix: str, status: str, good: str) -> Check:
    known = [g for g in health.gpus if test(g) is not None]
    if not known:
        return Check(name, SKIP, "not reported by NVML")
    bad = [g.index for g in known if test(g)]
    if bad:
        return Check(name, status, f"{_gpus(bad)}: {problem}", fix)
    return Check(name, PASS, good)


def check_persistence(health: NvmlHealth) -> Check:
    return _per_gpu("persistence", health,
                    lambda g: None if g.persistence_mode is None else not g.persistence_mode,
                    "persistence mode is off, so each process re-initialises the GPU (slower start, clocks reset)",
                    f"systemctl enable --now {PERSISTENCED} (or nvidia-smi -pm 1)", WARN, "on for every GPU")


def check_memory_errors(health: NvmlHealth) -> list[Check]:
    checks = [
        _per_gpu("row remapping", health,
                 lambda g: None if g.remapped_rows is None else g.remapped_rows.failure,
                 "row remapping failed: the GPU memory has more bad rows than it can spare", REPLACE, FAIL,
                 "no remapping failure"),
        _per_gpu("pending memory repair", health,
                 lambda g: (None if g.remapped_rows is None and g.retired_pages_pending is None
                            else bool(g.remapped_rows and g.remapped_rows.pending) or bool(g.retired_pages_pending)),
                 "a row remap or page retirement is pending: the bad memory stays in use until the GPU is reset",
                 "reboot the machine (it resets the GPU and applies the repair); if it is still pending after, "
                 + REPLACE, FAIL, "nothing pending"),
        _per_gpu("ecc errors", health,
                 lambda g: None if g.ecc_uncorrected_volatile is None else g.ecc_uncorrected_volatile > 0,
                 "uncorrectable ECC errors since the driver loaded (a process on that GPU was killed)",
                 "reboot; if they come back, " + REPLACE, WARN, "no uncorrectable ECC error since the driver loaded"),
    ]
    return checks


def _slow_link(g: GpuHealth) -> bool | None:
    link = g.pcie
    if link is None or link.width is None or link.max_width is None:
        return None
    narrow = link.width < link.max_width
    # The current generation drops at idle to save power, so compare what the link can reach with the GPU's own.
    capped = (link.max_generation is not None and link.gpu_max_generation is not None
              and link.max_generation < link.gpu_max_generation)
    return narrow or capped


def check_pcie(health: NvmlHealth) -> Check:
    check = _per_gpu("pcie link", health, _slow_link, "", "", WARN, "every GPU at its full PCIe width and generation")
    if check.status != WARN:
        return check
    parts = []
    for g in health.gpus:
        if _slow_link(g) and g.pcie:
            p = g.pcie
            found = []
            if p.width is not None and p.max_width is not None and p.width < p.max_width:
                found.append(f"runs x{p.width} of x{p.max_width}")
            if p.max_generation is not None and p.gpu_max_generation is not None \
                    and p.max_generation < p.gpu_max_generation:
                found.append(f"reaches Gen{p.max_generation} of the GPU's Gen{p.gpu_max_generation}")
            parts.append(f"GPU {g.index} " + " and ".join(found))
    return Check("pcie link", WARN, "; ".join(parts) + ": weights load and host copies are slower",
                 "on a droplet, recreate it (another host); on your own machine, reseat the GPU and check the slot's "
                 "BIOS link settings")


def check_clocks(health: NvmlHealth) -> Check:
    def slowed(g: GpuHealth) -> bool | None:
        return None if g.clock_event_reasons is None else bool(g.clock_event_reasons & sum(CLOCK_SLOWDOWNS))

    check = _per_gpu("clocks", health, slowed, "", "", WARN, "no thermal or power-brake slowdown")
    if check.status != WARN:
        return check
    parts = [f"GPU {g.index}: " + ", ".join(n for bit, n in CLOCK_SLOWDOWNS.items()
                                            if (g.clock_event_reasons or 0) & bit)
             for g in health.gpus if slowed(g)]
    return Check("clocks", WARN, "; ".join(parts) + " (before any load)",
                 "check cooling and power: nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER; on a droplet, report it "
                 "to the provider")


def check_p2p(health: NvmlHealth, needs: Needs | None) -> Check:
    if needs is None or not needs.multi_gpu:
        return Check("peer to peer", SKIP, "the plan runs no tensor parallel across GPUs")
    if not health.p2p:
        return Check("peer to peer", SKIP, "not reported by NVML")
    missing = sorted({(i, j) for group in needs.tensor_parallel_groups for i in group for j in group
                      if i < j and health.p2p[i][j] not in (0, None)})
    if missing:
        pairs = ", ".join(f"{i}-{j}" for i, j in missing)
        return Check("peer to peer", WARN,
                     f"GPU pairs {pairs} cannot read each other's memory directly: tensor parallel falls back to "
                     "copies through host memory (vLLM disables its custom all-reduce), much slower",
                     "check `nvidia-smi topo -p2p r`; on HGX boards this follows a fabric manager problem, on PCIe "
                     "machines enable P2P in the hypervisor or plan one instance per GPU (user-data "
                     "tensor_parallel_size: 1)")
    groups = " ".join("[" + ",".join(map(str, g)) + "]" for g in needs.tensor_parallel_groups if len(g) > 1)
    return Check("peer to peer", PASS, f"every tensor-parallel group reaches its peers: {groups}")


def check_shm(system: SystemFacts, needs: Needs | None) -> Check:
    if not system.described:
        return Check("shared memory", SKIP, "the machine file does not describe the host")
    multi = bool(needs and needs.multi_gpu)
    size = system.shm_bytes
    fix = ("mount a larger /dev/shm: mount -o remount,size=50% /dev/shm (in a container, --ipc=host or "
           "--shm-size=16g)")
    if size is None:
        return Check("shared memory", FAIL if multi else WARN, "/dev/shm is not mounted: NCCL and vLLM's workers "
                     "exchange data through it", fix)
    if size < SHM_MINIMUM:
        return Check("shared memory", FAIL if multi else WARN,
                     f"/dev/shm is {size / 2**20:.0f} MiB, less than the 1 GiB NCCL needs for tensor parallel", fix)
    return Check("shared memory", PASS, f"/dev/shm {size / 2**30:.1f} GiB")


def check_disk(system: SystemFacts, needs: Needs | None) -> Check:
    if needs is None:
        return Check("model cache disk", SKIP, "no plan: nothing to download")
    if needs.model_bytes is None:
        return Check("model cache disk", SKIP, f"{needs.model or 'the model'} is on the machine: nothing to download")
    free = system.cache_free_bytes
    if not system.described or free is None:
        return Check("model cache disk", SKIP, f"cannot read the free space of {system.cache_dir}")
    want = max(0, int(needs.model_bytes * CACHE_MARGIN) - system.cached_bytes)
    if free < want:
        return Check("model cache disk", FAIL,
                     f"{system.cache_dir} has {free / 2**30:.1f} GiB free; {needs.model or 'the model'} needs "
                     f"{want / 2**30:.1f} GiB more",
                     "free space there, or use a droplet with a larger disk (or a smaller profile)")
    return Check("model cache disk", PASS, f"{free / 2**30:.0f} GiB free in {system.cache_dir}, "
                 f"{want / 2**30:.1f} GiB still to download")


def diagnose(machine: Machine, health: NvmlHealth, system: SystemFacts, stack: GpuStack,
             needs: Needs | None = None, installed: InstalledStack | None = None) -> Report:
    host = [check_installed(machine, stack, installed), check_shm(system, needs), check_disk(system, needs)]
    if not machine.gpus:
        why = machine.description if "NVML" in machine.description or "driver" in machine.description else ""
        gpu = Check("gpus", SKIP, "no NVIDIA GPU" + (f" ({why})" if why else "") + ": the GPU checks do not apply")
        return Report(machine=machine.name, checks=(gpu, *host))
    checks = [check_driver(machine, stack, installed), check_architectures(machine, stack), check_mig(machine),
              check_flashinfer_kernels(machine, installed)]
    if health.problem:
        checks.append(Check("nvml", FAIL, health.problem, "check `nvidia-smi`; reinstall the driver and reboot"))
    checks += [check_fabric(machine, health, system, stack), check_persistence(health),
               *check_memory_errors(health), check_pcie(health), check_clocks(health), check_p2p(health, needs), *host]
    return Report(machine=machine.name, checks=tuple(checks))
