"""A rendered instance as a hardened systemd service unit. Pure text."""

from __future__ import annotations

from kiln.render.vllm import RenderedInstance

NVIDIA_CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-caps")


def quote(arg: str) -> str:
    """One argument in systemd's command-line syntax: specifiers (%) and variables ($) escaped."""
    escaped = arg.replace("%", "%%").replace("$", "$$")
    if escaped and all(ch.isalnum() or ch in "-_./:,=+@" for ch in escaped):
        return escaped
    escaped = escaped.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def _env_line(key: str, value: str) -> str:
    return "Environment=" + quote(f"{key}={value}")


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


def instance_unit(inst: RenderedInstance, *, profile: str, user: str = "kiln",
                  state_dir: str = "/var/lib/kiln") -> str:
    gpus = ",".join(map(str, inst.gpus)) or "none (CPU)"
    lines = [
        "[Unit]",
        f"Description=kiln vLLM instance {inst.name} ({profile}, GPUs {gpus}, port {inst.port})",
        "Documentation=https://docs.vllm.ai/",
        "After=network-online.target nvidia-persistenced.service nvidia-fabricmanager.service",
        "Wants=network-online.target",
        "PartOf=kiln.target",
        "StartLimitIntervalSec=600",
        "StartLimitBurst=10",
        "",
        "[Service]",
        "Type=exec",
        f"User={user}",
        f"Group={user}",
        *(_env_line(k, v) for k, v in sorted(inst.env.items())),
        "ExecStart=" + " ".join(quote(a) for a in inst.argv),
        "Restart=on-failure",
        "RestartSec=5",
        "RestartSteps=5",
        "RestartMaxDelaySec=120",
        "TimeoutStartSec=1800",
        "TimeoutStopSec=60",
        "KillMode=mixed",
        "LimitNOFILE=1048576",
        "LimitMEMLOCK=infinity",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        "ProtectKernelTunables=yes",
        "ProtectKernelModules=yes",
        "ProtectControlGroups=yes",
        "RestrictSUIDSGID=yes",
        "LockPersonality=yes",
        f"ReadWritePaths={state_dir}",
        "DevicePolicy=closed",
    ]
    if inst.gpus:
        lines += [f"DeviceAllow={dev} rw" for dev in NVIDIA_CONTROL_DEVICES]
        lines += [f"DeviceAllow=/dev/nvidia{minor} rw" for minor in inst.device_minors]
    if inst.cpus:
        lines.append(f"CPUAffinity={_cpu_list(inst.cpus)}")
    if inst.numa_node is not None:
        lines += ["NUMAPolicy=bind", f"NUMAMask={inst.numa_node}"]
    lines += ["", "[Install]", "WantedBy=kiln.target", ""]
    return "\n".join(lines)
