"""Every user-data the README and docs/ document passes cloud-init's schema without a warning (Debian 12's
cloud-init, for real) and is read by kiln."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests.documented import user_data

from kiln.choice.userdata import extract_settings

HERE = Path(__file__).resolve().parent
# Debian 12's python3-* versions of cloud-init's runtime needs (apt-cache show cloud-init).
CLOUD_INIT_DEPS = ["jsonschema==4.10.3", "PyYAML==6.0.1", "requests==2.28.1", "configobj==5.0.8", "jsonpatch==1.32"]


def documented_user_data() -> list[str]:
    """Every page's #cloud-config: at least a machine's and a cluster's."""
    texts = [b.text for b in user_data()]
    assert any("cluster:" in t for t in texts) and any("cluster:" not in t for t in texts)
    return texts


def run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=600, **kw)  # type: ignore[call-overload,no-any-return]


@pytest.fixture(scope="session")
def cloud_init(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(python with cloud-init's deps, cloud-init's package folder) from Debian's .deb, not installed."""
    if shutil.which("apt-get") is None:
        pytest.fail("needs apt-get (Debian/Ubuntu) to fetch Debian's cloud-init package")
    work = tmp_path_factory.mktemp("cloud-init")
    download = subprocess.run(["apt-get", "download", "cloud-init"], cwd=work, capture_output=True, text=True,
                              check=False)
    if download.returncode != 0:
        run(["apt-get", "update", "-q"])
        run(["apt-get", "download", "cloud-init"], cwd=work)
    deb = next(work.glob("cloud-init_*.deb"))
    run(["dpkg", "-x", str(deb), str(work / "root")])
    run([sys.executable, "-m", "venv", str(work / "venv")])
    python = work / "venv" / "bin" / "python"
    run([str(python), "-m", "pip", "install", "-q", *CLOUD_INIT_DEPS])
    return python, work / "root" / "usr" / "lib" / "python3" / "dist-packages"


def check(cloud_init: tuple[Path, Path], files: list[Path]) -> dict[str, dict[str, list[str]]]:
    python, site = cloud_init
    out = run([str(python), str(HERE / "cloud_init_schema_check.py"), *map(str, files)],
              env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}).stdout
    return {Path(r["file"]).name: r for r in map(json.loads, out.splitlines())}


def test_documented_user_data_is_warning_free_and_read_by_kiln(cloud_init: tuple[Path, Path], tmp_path: Path) -> None:
    texts = documented_user_data()
    documented = [tmp_path / f"documented-{i}.yaml" for i in range(len(texts))]
    for path, text in zip(documented, texts, strict=True):
        settings = extract_settings(text.encode()).settings
        assert settings.get("profile") or settings.get("models")
        path.write_text(text)
    unknown_key = tmp_path / "unknown-key.yaml"
    unknown_key.write_text("#cloud-config\nkiln:\n  profile: qwen3-8b\n")
    bad_write_files = tmp_path / "bad-write-files.yaml"
    bad_write_files.write_text("#cloud-config\nwrite_files:\n  - path: /etc/kiln/kiln.yaml\n    permissions: 0600\n")
    results = check(cloud_init, [*documented, unknown_key, bad_write_files])
    for path in documented:
        assert results[path.name] == {"file": str(path), "errors": [], "strict_errors": []}
    # The checker sees real problems: an unknown top-level key under 23.4's rules, an unquoted mode always.
    assert results["unknown-key.yaml"]["strict_errors"]
    assert results["bad-write-files.yaml"]["errors"]
