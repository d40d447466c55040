"""The cache disk: what is mounted, which disk holds the model and compile caches, and why."""

from __future__ import annotations

from pathlib import Path

from kiln.choice.schema import Choice
from kiln.hardware.disks import Mount, choose_cache_disk, mount_of, parse_mountinfo, scratch_candidates
from kiln.hardware.system import LiveSystem, hub_cache, repo_folder
from kiln.planner.search import make_plan
from kiln.render.systemd import instance_dropin
from kiln.render.vllm import Runtime, render_instances
from kiln.serve.caches import place_caches
from kiln.setup.types import Plan
from kiln.wiring import Kiln

TiB, GiB = 2**40, 2**30

# The shape of /proc/self/mountinfo on a droplet with a formatted scratch disk (proc(5) fields; paths escaped).
MOUNTINFO = """\
22 29 0:21 / /proc rw,relatime - proc proc rw
25 27 0:23 / /dev/shm rw,relatime - tmpfs tmpfs rw,size=24684084k
29 1 252:1 / / rw,relatime - ext4 /dev/vda1 rw,discard
30 29 252:15 / /boot/efi rw,relatime - vfat /dev/vda15 rw
31 29 252:16 / /boot rw,relatime - ext4 /dev/vda16 rw
40 29 259:0 / /mnt/scratch\\040disk rw,noatime - xfs /dev/nvme1n1 rw
41 29 259:0 / /srv/bound rw,noatime - xfs /dev/nvme1n1 rw
42 29 11:0 / /mnt/config ro,relatime - iso9660 /dev/sr0 ro
43 29 0:50 / /mnt/share rw,relatime - nfs4 10.0.0.5:/export rw
44 29 259:1 / /mnt/spare ro,relatime - ext4 /dev/nvme2n1 ro
"""


def _sized(free: dict[str, int]) -> list[Mount]:
    return [Mount(m.path, m.device, m.fstype, m.dev_id, m.read_only, free.get(m.path, 0), free.get(m.path, 0))
            for m in parse_mountinfo(MOUNTINFO)]


def test_mountinfo_is_read_with_its_escapes_and_flags() -> None:
    mounts = {m.path: m for m in parse_mountinfo(MOUNTINFO)}
    assert mounts["/mnt/scratch disk"].device == "/dev/nvme1n1"
    assert mounts["/mnt/scratch disk"].dev_id == "259:0"
    assert mounts["/mnt/config"].read_only and not mounts["/"].read_only
    assert mount_of("/var/lib/kiln", list(mounts.values())) == mounts["/"]
    assert mount_of("/mnt/scratch disk/kiln", list(mounts.values())) == mounts["/mnt/scratch disk"]


def test_only_a_local_writable_disk_other_than_the_boot_disk_is_a_candidate_once() -> None:
    mounts = _sized({})
    boot = mount_of("/var/lib/kiln", mounts)
    assert boot is not None
    # Not /boot, the config drive, NFS, a read-only disk, or the bind mount of the same scratch filesystem.
    assert [m.path for m in scratch_candidates(mounts, boot)] == ["/mnt/scratch disk"]


def test_the_scratch_disk_is_chosen_when_it_has_more_room() -> None:
    disk = choose_cache_disk(_sized({"/": 650 * GiB, "/mnt/scratch disk": 5 * TiB}), "/var/lib/kiln", {})
    assert disk.scratch and disk.root == "/mnt/scratch disk/kiln" and disk.device == "/dev/nvme1n1"
    assert "more room than the boot disk: 5,120 GiB free against 650 GiB" in disk.reason


def test_the_boot_disk_stays_when_it_has_more_room_or_is_alone() -> None:
    small = choose_cache_disk(_sized({"/": 650 * GiB, "/mnt/scratch disk": 20 * GiB}), "/var/lib/kiln", {})
    assert not small.scratch and small.root == "/var/lib/kiln"
    assert "than the largest other disk, /mnt/scratch disk (20 GiB)" in small.reason
    alone = choose_cache_disk([Mount("/", "/dev/vda1", "ext4", "252:1", free_bytes=400 * GiB)], "/var/lib/kiln", {})
    assert alone.root == "/var/lib/kiln" and "no other local disk is mounted" in alone.reason


def test_the_disk_that_already_holds_the_model_wins() -> None:
    mounts = _sized({"/": 650 * GiB, "/mnt/scratch disk": 5 * TiB})
    baked = choose_cache_disk(mounts, "/var/lib/kiln", {"/var/lib/kiln": 140 * GiB})
    assert not baked.scratch and "the boot disk already holds 140 GiB of the model" in baked.reason


def test_place_caches_counts_the_planned_repositories_in_each_cache(tmp_path: Path) -> None:
    state = tmp_path / "state"
    blobs = repo_folder(hub_cache(state / "huggingface"), "org/model") / "blobs"
    blobs.mkdir(parents=True)
    (blobs / "abc").write_bytes(b"x" * 1000)
    mounts = [Mount(str(tmp_path), "/dev/vda1", "ext4", "252:1", free_bytes=GiB),
              Mount("/mnt/scratch", "/dev/nvme1n1", "ext4", "259:0", free_bytes=TiB)]
    assert not place_caches(mounts, state, ["org/model"]).disk.scratch
    other = place_caches(mounts, state, ["org/other"])
    assert other.disk.scratch and other.hf_home == Path("/mnt/scratch/kiln/huggingface")
    assert other.folders == [Path("/mnt/scratch/kiln/huggingface"), Path("/mnt/scratch/kiln/compile")]
    image = place_caches(mounts, state, ["org/model"])
    # The compile caches follow the model cache; on the boot disk they get a folder of their own, since the state
    # folder itself stays the agent's.
    assert image.folders == [state / "huggingface", state / "compile"]
    assert image.runtime(Runtime()).cache_root == str(state / "compile")


def test_compile_caches_are_set_on_the_cache_disk_and_the_unit_may_write_there(kiln: Kiln) -> None:
    plan = make_plan(kiln.machine("h100x1"), kiln.catalog().get("llama-3.1-8b-instruct"), Choice(), kiln.constants)
    assert isinstance(plan, Plan)
    inst = render_instances(plan, Runtime(hf_home="/mnt/scratch/kiln/huggingface", cache_root="/mnt/scratch/kiln"))[0]
    assert inst.env["HF_HOME"] == "/mnt/scratch/kiln/huggingface"
    assert inst.env["VLLM_CACHE_ROOT"] == "/mnt/scratch/kiln/vllm"
    assert inst.env["TORCHINDUCTOR_CACHE_DIR"] == "/mnt/scratch/kiln/inductor"
    assert inst.env["TRITON_CACHE_DIR"] == "/mnt/scratch/kiln/triton"
    assert inst.env["CUDA_CACHE_PATH"] == "/mnt/scratch/kiln/nv"
    assert "VLLM_CACHE_ROOT" not in render_instances(plan, Runtime())[0].env
    dropin = instance_dropin(inst, profile="p", writable=("/mnt/scratch/kiln",))
    assert "ReadWritePaths=/mnt/scratch/kiln" in dropin.splitlines()


def test_this_machine_root_filesystem_is_read_with_its_size() -> None:
    mounts = LiveSystem().mounts()
    root = mount_of("/", mounts)
    assert root is not None and root.total_bytes > 0 and root.free_bytes > 0
