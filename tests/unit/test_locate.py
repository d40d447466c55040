"""Every command that acts on the local agent finds it the same way: --state-dir, else the agent answering on the
health endpoint (which names its folder), else the one default folder; and says which it acted on."""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiln.cli.locate import default_state_dir, locate
from kiln.cli.main import main
from kiln.serve.front.keys import ApiKey, KeyStore
from kiln.serve.front.secretfiles import load_keys, save_keys
from kiln.serve.layout import ServeLayout
from kiln.serve.reports.health import HealthServer
from kiln.serve.reports.state import AgentState

KEY = "kiln-" + "k" * 40


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[ServeLayout]:
    """A health endpoint answering as a running agent of tmp_path/state does, with one key in its store."""
    layout = ServeLayout(state_dir=tmp_path / "state", health_port=_free_port())
    layout.state_dir.mkdir()
    save_keys(layout.keys_file, KeyStore((ApiKey("default", KEY, origin="generated"),)))
    state = AgentState(endpoint="https://127.0.0.1:1", health=layout.health_url, keys_file=str(layout.keys_file),
                       state_dir=str(layout.state_dir), phase="starting")
    server = HealthServer(state, "127.0.0.1", layout.health_port, lambda: b"")
    server.start()
    layout.agent_health_file.write_text(layout.health_url + "\n")
    try:
        yield layout
    finally:
        server.stop()


def test_the_agent_answering_names_its_folder(agent: ServeLayout) -> None:
    found = locate(None, agent.health_url)
    assert found.running and found.state_dir == agent.state_dir and found.health == agent.health_url
    assert "named by the agent" in found.found_by


def test_a_state_dir_given_wins_and_its_agent_is_found_through_its_health_file(agent: ServeLayout) -> None:
    found = locate(agent.state_dir, None)
    assert found.running and found.state_dir == agent.state_dir and found.found_by == "--state-dir"


def test_another_folders_agent_is_not_taken_for_this_ones(agent: ServeLayout, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    other = tmp_path / "other"
    other.mkdir()
    assert not locate(other, agent.health_url).running
    assert main(["status", "--state-dir", str(other), "--health", agent.health_url]) == 2
    assert f"not the one of {other}" in capsys.readouterr().err


def test_with_no_agent_the_one_default_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    found = locate(None, f"http://127.0.0.1:{_free_port()}")
    assert not found.running and found.state_dir == default_state_dir()
    if os.geteuid() != 0 or not Path("/var/lib/kiln").is_dir():
        assert found.state_dir == tmp_path / "xdg" / "kiln"


def test_keys_and_status_act_on_the_agent_found_with_no_state_dir(agent: ServeLayout,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["keys", "show", "default", "--health", agent.health_url]) == 0
    out = capsys.readouterr()
    assert out.out.strip() == KEY  # stdout holds the key alone, for `KEY=$(kiln keys show default)`
    assert f"state folder {agent.state_dir}" in out.err
    assert main(["keys", "list", "--health", agent.health_url, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [k["name"] for k in listed["keys"]] == ["default"]
    assert listed["agent"]["state_dir"] == str(agent.state_dir) and listed["agent"]["running"]
    assert main(["status", "--health", agent.health_url]) == 0
    assert f"state     {agent.state_dir}" in capsys.readouterr().out


def test_no_agent_and_no_store_is_said_not_an_empty_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    nowhere = f"http://127.0.0.1:{_free_port()}"
    for argv in (["keys", "list"], ["keys", "show", "default"], ["keys", "revoke", "default"]):
        assert main([*argv, "--state-dir", str(tmp_path / "none"), "--health", nowhere]) == 2
        err = capsys.readouterr().err
        assert "no kiln agent runs here" in err and "keys.json does not exist" in err and "Traceback" not in err


def test_an_empty_store_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    save_keys(ServeLayout(state_dir=tmp_path).keys_file, KeyStore())
    assert main(["keys", "list", "--state-dir", str(tmp_path), "--health", f"http://127.0.0.1:{_free_port()}"]) == 0
    assert capsys.readouterr().out.startswith("no keys in ")


def test_a_rate_that_is_a_digit_but_not_a_number_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                            ) -> None:
    save_keys(ServeLayout(state_dir=tmp_path).keys_file, KeyStore((ApiKey("ci", KEY),)))
    assert main(["keys", "limit", "ci", "²", "--state-dir", str(tmp_path),
                 "--health", f"http://127.0.0.1:{_free_port()}"]) == 2
    assert "requests per minute must be a number or none, not '²'" in capsys.readouterr().err


def test_concurrent_key_changes_are_all_kept(tmp_path: Path) -> None:
    """Twenty `kiln keys add` at once: each loads, changes and saves the store under one lock, so none is lost."""
    nowhere = f"http://127.0.0.1:{_free_port()}"
    start = threading.Barrier(20)
    codes: list[int] = []

    def add(i: int) -> None:
        start.wait()
        codes.append(main(["keys", "add", f"team{i}", "--state-dir", str(tmp_path), "--health", nowhere, "--json"]))

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        threads = [threading.Thread(target=add, args=(i,)) for i in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    assert codes == [0] * 20
    store = load_keys(ServeLayout(state_dir=tmp_path).keys_file)
    assert sorted(store.names()) == sorted(f"team{i}" for i in range(20))


def test_the_health_endpoint_listens_with_room_for_a_burst_of_checks(agent: ServeLayout) -> None:
    """The kernel's own view of the listening socket (ss: Send-Q is the backlog). socketserver's default of 5 left a
    burst of checks waiting out SYN retries: 595 of 1,000 concurrent `/status` requests timed out."""
    listening = subprocess.run(["ss", "-ltnH", f"sport = :{agent.health_port}"], capture_output=True, text=True,
                               check=True).stdout.split()
    somaxconn = int(Path("/proc/sys/net/core/somaxconn").read_text())
    assert int(listening[2]) == min(1024, somaxconn)


@pytest.mark.parametrize("kind", ["link", "fifo"])
def test_a_link_or_fifo_at_the_store_is_refused_and_every_key_kept(tmp_path: Path, kind: str,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    real = ServeLayout(state_dir=tmp_path / "real")
    save_keys(real.keys_file, KeyStore((ApiKey("ci", KEY),)))
    layout = ServeLayout(state_dir=tmp_path / "state")
    layout.state_dir.mkdir()
    if kind == "link":
        layout.keys_file.symlink_to(real.keys_file)
    else:
        os.mkfifo(layout.keys_file)
    nowhere = f"http://127.0.0.1:{_free_port()}"
    for argv in (["keys", "list"], ["keys", "add", "team"]):
        assert main([*argv, "--state-dir", str(layout.state_dir), "--health", nowhere]) == 2
        assert "is not a regular file" in capsys.readouterr().err
    assert layout.keys_file.is_symlink() if kind == "link" else layout.keys_file.is_fifo()
    assert load_keys(real.keys_file).names() == ["ci"]
