"""Reading the sources from a machine's file layout and a real HTTP metadata service, then merging them."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from tests.conftest import DATA

from kiln.choice.resolve import resolve_choice, tags_to_settings
from kiln.choice.sources import SourceReader

USER_DATA = """#cloud-config
write_files:
  - path: /etc/kiln/kiln.yaml
    content: |
      profile: llama-3.3-70b-instruct
      objective: throughput
"""


def _metadata(tags: list[str]) -> dict[str, object]:
    sample = DATA / "metadata" / "digitalocean-v1.json"
    data: dict[str, object] = json.loads(sample.read_text()) if sample.exists() else {}
    data["tags"] = tags
    data["user_data"] = USER_DATA
    return data


@pytest.fixture
def metadata_server() -> Iterator[tuple[str, dict[str, object]]]:
    state: dict[str, object] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(state["body"]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/metadata/v1.json", state
    server.shutdown()


def _machine_root(tmp: Path, *, vendor: str | None = None, user_data: str | None = None,
                  local: str | None = None) -> Path:
    if vendor:
        (tmp / "sys/class/dmi/id").mkdir(parents=True)
        (tmp / "sys/class/dmi/id/sys_vendor").write_text(vendor + "\n")
    if user_data is not None:
        (tmp / "var/lib/cloud/instance").mkdir(parents=True)
        (tmp / "var/lib/cloud/instance/user-data.txt").write_text(user_data)
    if local is not None:
        (tmp / "etc/kiln").mkdir(parents=True)
        (tmp / "etc/kiln/kiln.yaml").write_text(local)
    return tmp


def test_nocloud_seed_is_read_before_cloud_init_ran(tmp_path: Path) -> None:
    seed = tmp_path / "var/lib/cloud/seed/nocloud"
    seed.mkdir(parents=True)
    (seed / "user-data").write_text(USER_DATA)
    resolved = resolve_choice(SourceReader(root=tmp_path).read())
    assert resolved.choice.profile == "llama-3.3-70b-instruct"
    assert "NoCloud seed" in resolved.origins["profile"]


def test_digitalocean_tags_override_user_data(tmp_path: Path, metadata_server: tuple[str, dict]) -> None:
    url, state = metadata_server
    state["body"] = _metadata(["kiln-objective:latency", "kiln-tp:2", "web"])
    root = _machine_root(tmp_path, vendor="DigitalOcean", user_data=USER_DATA)
    resolved = resolve_choice(SourceReader(root=root, metadata_url=url).read())
    assert resolved.choice.objective == "latency"
    assert resolved.choice.tensor_parallel_size == 2
    assert resolved.origins["objective"] == "droplet tags"
    assert resolved.origins["profile"].startswith("user-data")
    # What the self-signed certificate names: the public addresses, not the anchor or the private one.
    assert resolved.addresses == ("104.131.20.105", "2604:A880:0800:0010:0000:0000:017D:2001")


def test_user_data_from_metadata_when_cloud_init_has_none(tmp_path: Path, metadata_server: tuple[str, dict]) -> None:
    url, state = metadata_server
    state["body"] = _metadata([])
    root = _machine_root(tmp_path, vendor="DigitalOcean")
    resolved = resolve_choice(SourceReader(root=root, metadata_url=url).read())
    assert resolved.choice.profile == "llama-3.3-70b-instruct"
    assert resolved.origins["profile"] == "user-data (digitalocean metadata)"


def test_unreachable_metadata_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    root = _machine_root(tmp_path, vendor="DigitalOcean", user_data=USER_DATA)
    reader = SourceReader(root=root, metadata_url="http://127.0.0.1:9/metadata/v1.json", timeout_s=0.5)
    resolved = resolve_choice(reader.read())
    assert resolved.choice.profile == "llama-3.3-70b-instruct"
    assert any(p.source == "digitalocean metadata" for p in resolved.problems)


def test_local_file_copy_of_user_data_ranks_as_user_data(tmp_path: Path, metadata_server: tuple[str, dict]) -> None:
    url, state = metadata_server
    state["body"] = _metadata(["kiln-objective:latency"])
    copy = "profile: llama-3.3-70b-instruct\nobjective: throughput\n"
    root = _machine_root(tmp_path, vendor="DigitalOcean", user_data=USER_DATA, local=copy)
    resolved = resolve_choice(SourceReader(root=root, metadata_url=url).read())
    assert resolved.choice.objective == "latency"  # tags beat user-data, and the file is only its copy


def test_edited_local_file_wins(tmp_path: Path) -> None:
    root = _machine_root(tmp_path, user_data=USER_DATA, local="profile: qwen3-8b\n")
    resolved = resolve_choice(SourceReader(root=root).read())
    assert resolved.choice.profile == "qwen3-8b"
    assert resolved.origins["profile"] == "/etc/kiln/kiln.yaml"


def test_broken_local_file_keeps_user_data(tmp_path: Path) -> None:
    root = _machine_root(tmp_path, user_data=USER_DATA, local="profile: [unclosed\n")
    resolved = resolve_choice(SourceReader(root=root).read())
    assert resolved.choice.profile == "llama-3.3-70b-instruct"
    assert resolved.problems[0].source == "/etc/kiln/kiln.yaml"
    assert "restart" in resolved.problems[0].fix


def test_no_sources_means_defaults(tmp_path: Path) -> None:
    resolved = resolve_choice(SourceReader(root=tmp_path).read())
    assert resolved.choice.profile is None and not resolved.problems
    assert resolved.summary() == "no user choice found; image defaults"


def test_tags() -> None:
    assert tags_to_settings(["kiln-profile:llama-3-1-8b-instruct", "kiln-speculative:off", "kiln-instances:4",
                             "team:ml"]) == {"profile": "llama-3-1-8b-instruct", "speculative_decoding": False,
                                             "instances": 4}
