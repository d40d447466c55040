"""kiln's systemd units: the static ones shipped in data/systemd, and a rendered drop-in per vLLM instance. Pure text.

Every unit starts its process through `kiln agent exec NAME`, which execve()s the command recorded in
/var/lib/kiln/runtime.json, so the argv and environment never appear in unit files. What differs
between instances on a machine (GPU device nodes, CPU affinity, NUMA node) comes in a drop-in for the
template kiln-vllm@.service.
"""

from __future__ import annotations

import re
from importlib import resources

from kiln.render.vllm import RenderedInstance

TARGET = "kiln.target"
VLLM_TEMPLATE = "kiln-vllm@.service"
DROPIN_NAME = "50-kiln.conf"
UNIT_SUFFIXES = (".service", ".target")

# Instance names end up in unit names; keep them to what needs no systemd-escape.
_INSTANCE_NAME = re.compile(r"[A-Za-z0-9_.-]+")


def quote(arg: str) -> str:
    """One argument in systemd's command-line syntax: specifiers (%) and variables ($) escaped."""
    escaped = arg.replace("%", "%%").replace("$", "$$")
    if escaped and all(ch.isalnum() or ch in "-_./:,=+@" for ch in escaped):
        return escaped
    escaped = escaped.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def _cpu_list(cpus: tuple[int, ...]) -> str:
    """CPU ids as systemd ranges: 0-15 32-47."""
    ranges: list[str] = []
    start = prev = None
    for cpu in cpus:
        if start is None:
            start = prev = cpu
        elif prev is not None and cpu == prev + 1:
            prev = cpu
        else:
            ranges.append(f"{start}-{prev}" if start != prev else str(start))
            start = prev = cpu
    if start is not None:
        ranges.append(f"{start}-{prev}" if start != prev else str(start))
    return " ".join(ranges)


def _check_name(name: str) -> str:
    if not _INSTANCE_NAME.fullmatch(name):
        raise ValueError(f"instance name {name!r} is not usable in a systemd unit name")
    return name


def instance_unit_name(name: str) -> str:
    """The unit that runs instance NAME: kiln-vllm@NAME.service."""
    return VLLM_TEMPLATE.replace("@", f"@{_check_name(name)}")


def dropin_path(name: str) -> str:
    """Where instance NAME's drop-in goes, relative to a unit folder (e.g. /run/systemd/system)."""
    return f"{instance_unit_name(name)}.d/{DROPIN_NAME}"


def instance_dropin(inst: RenderedInstance, *, profile: str, writable: tuple[str, ...] = ()) -> str:
    """The drop-in for kiln-vllm@NAME.service: its GPUs' device nodes, CPUs, NUMA node, a description, and the
    folders beyond /var/lib/kiln it writes (the cache on a scratch disk)."""
    gpus = ",".join(map(str, inst.gpus)) or "none (CPU)"
    description = f"kiln vLLM instance {inst.name} ({profile}, GPUs {gpus}, port {inst.port})"
    lines = [
        f"# {dropin_path(inst.name)}: devices, CPUs and NUMA node of vLLM instance {inst.name}, written by kiln.",
        "[Unit]",
        # A % in the profile name would otherwise read as a specifier.
        "Description=" + description.replace("%", "%%"),
        "",
        "[Service]",
    ]
    # DeviceAllow= adds to the template's list (control devices); DevicePolicy=closed shuts out other GPUs.
    lines += [f"DeviceAllow=/dev/nvidia{minor} rw" for minor in inst.device_minors]
    if inst.cpus:
        lines.append(f"CPUAffinity={_cpu_list(inst.cpus)}")
    if inst.numa_node is not None:
        lines += ["NUMAPolicy=bind", f"NUMAMask={inst.numa_node}"]
    # ReadWritePaths= adds to the template's folders in /var/lib/kiln under ProtectSystem=strict.
    lines += [f"ReadWritePaths={quote(path)}" for path in writable]
    return "\n".join(lines) + "\n"


def unit_files() -> dict[str, str]:
    """The static units shipped in the package's data/systemd folder: {file name: text}."""
    folder = resources.files("kiln").joinpath("data").joinpath("systemd")
    return {
        entry.name: entry.read_text(encoding="utf-8")
        for entry in sorted(folder.iterdir(), key=lambda e: e.name)
        if entry.name.endswith(UNIT_SUFFIXES)
    }
