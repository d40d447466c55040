"""`kiln fleet` through pydo against a local server that answers as DigitalOcean's API does (tests/do_api.py):
exactly what it asks for, that a second `up` asks for nothing, and the API's errors as messages with a fix."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from tests.cli import run_kiln
from tests.do_api import TOKEN, State, serve_api

from kiln.fleet import ops
from kiln.fleet.api import DigitalOcean
from kiln.fleet.spec import FleetSpec, droplet_requests, firewall_request, load_balancer_request

USER_DATA = ("#cloud-config\nwrite_files:\n  - path: /etc/kiln/kiln.yaml\n"
             "    content: 'profile: llama-3.3-70b-instruct'\n")


def fleet(url: str, *args: str, token: str = TOKEN, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DIGITALOCEAN_TOKEN": token, "DIGITALOCEAN_API_URL": url}
    return run_kiln("fleet", *args, stdin=stdin, env=env)


def up_args(tmp_path: Path, count: int = 2, size: str = "gpu-h100x8-640gb", region: str = "nyc2") -> list[str]:
    user_data = tmp_path / "user-data.yaml"
    user_data.write_text(USER_DATA)
    return ["up", "--name", "demo", "--size", size, "--count", str(count), "--region", region, "--image",
            "170000001", "--user-data", str(user_data), "--ssh-from", "198.51.100.7/32", "--ssh-key", "4242"]


def test_up_creates_the_droplets_the_load_balancer_and_the_firewall_and_nothing_else(tmp_path: Path) -> None:
    with serve_api() as (url, state):
        done = fleet(url, *up_args(tmp_path), "--yes", "--json")
        assert done.returncode == 0, done.stderr
        assert state.writes() == [("POST", "/v2/droplets"), ("POST", "/v2/load_balancers"),
                                  ("POST", "/v2/firewalls")]
        posts = {r.path: r.body for r in state.requests if r.method == "POST"}
    assert posts["/v2/droplets"] == {
        "names": ["kiln-demo-0", "kiln-demo-1"], "region": "nyc2", "size": "gpu-h100x8-640gb", "image": 170000001,
        "tags": ["kiln-fleet:demo"], "user_data": USER_DATA, "monitoring": True, "ssh_keys": [4242]}
    lb = posts["/v2/load_balancers"]
    assert lb["tag"] == "kiln-fleet:demo" and lb["region"] == "nyc2"
    assert lb["forwarding_rules"] == [{"entry_protocol": "https", "entry_port": 443, "target_protocol": "https",
                                       "target_port": 443, "tls_passthrough": True}]
    assert lb["health_check"]["path"] == "/health" and lb["health_check"]["protocol"] == "https"
    fw = posts["/v2/firewalls"]
    result = json.loads(done.stdout)
    assert fw["tags"] == ["kiln-fleet:demo"] and fw["name"] == "kiln-fleet-demo"
    assert {"protocol": "tcp", "ports": "22", "sources": {"addresses": ["198.51.100.7/32"]}} in fw["inbound_rules"]
    assert {"protocol": "tcp", "ports": "443", "sources": {"load_balancer_uids": [result["load_balancer"]["id"]]}} \
        in fw["inbound_rules"]
    assert result["created"] == ["kiln-demo-0", "kiln-demo-1"] and result["usd_per_hour_each"] == 23.92


def test_a_second_up_changes_nothing(tmp_path: Path) -> None:
    with serve_api() as (url, state):
        assert fleet(url, *up_args(tmp_path), "--yes").returncode == 0
        before = len(state.writes())
        again = fleet(url, *up_args(tmp_path))  # no --yes: with nothing to change it asks nothing
        assert again.returncode == 0, again.stderr
        assert "nothing to change" in again.stdout
        assert len(state.writes()) == before
        # GPU droplets are listed only with type=gpus, so the fleet reads both lists.
        assert any(r.query.get("type") == "gpus" for r in state.requests if r.path == "/v2/droplets")


def test_nothing_happens_without_a_confirmation_that_names_the_price(tmp_path: Path) -> None:
    with serve_api() as (url, state):
        refused = fleet(url, *up_args(tmp_path), stdin="yes\n")
        assert refused.returncode == 2 and "not confirmed" in refused.stderr
        assert "$23.92/h each" in refused.stderr and "$47.84/h" in refused.stderr
        assert state.writes() == []
        confirmed = fleet(url, *up_args(tmp_path), stdin="demo\n")
        assert confirmed.returncode == 0, confirmed.stderr
        assert len(state.writes()) == 3


def test_scale_adds_and_removes_droplets_by_the_tag(tmp_path: Path) -> None:
    with serve_api() as (url, state):
        assert fleet(url, *up_args(tmp_path), "--yes").returncode == 0
        first = len(state.requests)
        grown = fleet(url, "scale", "demo", "3", "--user-data", str(tmp_path / "user-data.yaml"), "--yes")
        assert grown.returncode == 0, grown.stderr
        new = [r for r in state.requests[first:] if r.method == "POST"]
        assert [r.path for r in new] == ["/v2/droplets"] and new[0].body["names"] == ["kiln-demo-2"]
        assert new[0].body["size"] == "gpu-h100x8-640gb" and new[0].body["region"] == "nyc2"
        assert new[0].body["image"] == next(iter(state.droplets.values()))["image"]["id"]  # the fleet's own
        rebuilt = fleet(url, "scale", "demo", "4", "--user-data", str(tmp_path / "user-data.yaml"),
                        "--image", "170000099", "--yes")  # the fleet's snapshot was replaced
        assert rebuilt.returncode == 0, rebuilt.stderr
        assert state.requests[-1].body["names"] == ["kiln-demo-3"] and state.requests[-1].body["image"] == 170000099
        ids = sorted(state.droplets)
        shrunk = fleet(url, "scale", "demo", "1", "--yes")
        assert shrunk.returncode == 0, shrunk.stderr
        assert state.writes()[-3:] == [("DELETE", f"/v2/droplets/{ids[3]}"), ("DELETE", f"/v2/droplets/{ids[2]}"),
                                       ("DELETE", f"/v2/droplets/{ids[1]}")]
        assert sorted(state.droplets) == [ids[0]]


def test_down_asks_then_deletes_everything_the_fleet_made(tmp_path: Path) -> None:
    with serve_api() as (url, state):
        assert fleet(url, *up_args(tmp_path), "--yes").returncode == 0
        kept = fleet(url, "down", "demo", stdin="\n")
        assert kept.returncode == 2 and "kiln-demo-0, kiln-demo-1" in kept.stderr and state.droplets
        gone = fleet(url, "down", "demo", stdin="demo\n")
        assert gone.returncode == 0, gone.stderr
        lb_id, = (r.path for r in state.requests if r.method == "DELETE" and "load_balancers" in r.path)
        assert state.writes()[-3:] == [("DELETE", lb_id), ("DELETE", state.writes()[-2][1]),
                                       ("DELETE", "/v2/droplets?tag_name=kiln-fleet:demo")]
        assert "/v2/firewalls/" in state.writes()[-2][1]
        assert not state.droplets and not state.load_balancers and not state.firewalls
        assert "does not exist" in fleet(url, "down", "demo", "--yes").stdout


def test_status_lists_each_droplet_and_the_load_balancers_view(tmp_path: Path) -> None:
    with serve_api() as (url, _state):
        assert fleet(url, *up_args(tmp_path), "--yes").returncode == 0
        api = DigitalOcean(TOKEN, url)
        probed: list[str] = []
        result = ops.status(api, FleetSpec("demo"), lambda ip: probed.append(ip) or "serving")
        assert [d["status"] for d in result["droplets"]] == ["active", "active"]
        assert probed == [d["public_ip"] for d in result["droplets"]] and all(probed)
        assert all(d["behind_load_balancer"] for d in result["droplets"])
        assert result["load_balancer"]["status"] == "active" and result["firewall"]["status"] == "succeeded"
        text = fleet(url, "status", "demo")
        assert text.returncode == 0 and "kiln-demo-1" in text.stdout and "targets 2 droplet(s)" in text.stdout


@pytest.mark.parametrize(("change", "message", "fix"), [
    ({"token": "wrong"}, "Unable to authenticate you.", "DIGITALOCEAN_TOKEN"),
    ({"size": "gpu-h100x4-320gb"}, "offers no size 'gpu-h100x4-320gb'", "gpu-h100x8-640gb"),
    ({"region": "atl1"}, "not offered in atl1", "nyc2, tor1"),
    ({"limit": 1}, "exceed your droplet limit", "raise the droplet limit"),
])
def test_the_apis_errors_are_messages_with_a_fix(tmp_path: Path, change: dict[str, object], message: str,
                                                  fix: str) -> None:
    state = State(droplet_limit=int(change.get("limit", 25)))  # type: ignore[call-overload]
    with serve_api(state) as (url, _state):
        args = up_args(tmp_path, size=str(change.get("size", "gpu-h100x8-640gb")),
                       region=str(change.get("region", "nyc2")))
        done = fleet(url, *args, "--yes", token=str(change.get("token", TOKEN)))
        assert done.returncode == 2
        assert message in done.stderr and "fix:" in done.stderr and fix in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
        assert not state.droplets


def test_user_data_the_agent_would_reject_is_refused_before_anything_is_created(tmp_path: Path) -> None:
    with serve_api() as (url, state):
        args = up_args(tmp_path)
        (tmp_path / "user-data.yaml").write_text("#cloud-config\nwrite_files:\n  - path: /etc/kiln/kiln.yaml\n"
                                                 "    content: 'profle: llama-3.3-70b-instruct'\n")
        done = fleet(url, *args, "--yes")
        assert done.returncode == 2 and "profle" in done.stderr and "did you mean `profile`" in done.stderr
        assert state.requests == []


def test_request_bodies_split_at_ten_names_and_terminate_tls_with_a_certificate() -> None:
    spec = FleetSpec("big", size="gpu-h100x1-80gb", count=23, region="tor1", image="ubuntu-24-04-x64",
                     certificate_id="892071a0-bb95-49bc-8021-3afd67a210bf")
    bodies = droplet_requests(spec, [spec.droplet_name(i) for i in range(23)])
    assert [len(b["names"]) for b in bodies] == [10, 10, 3] and bodies[0]["image"] == "ubuntu-24-04-x64"
    rule, = load_balancer_request(spec)["forwarding_rules"]
    assert rule["certificate_id"] == spec.certificate_id and "tls_passthrough" not in rule
    assert firewall_request(spec, "lb-1")["name"] == "kiln-fleet-big"
    with pytest.raises(Exception, match="not usable"):
        FleetSpec("Bad_Name")


def test_up_and_scale_by_demand_use_the_droplets_own_capacity(tmp_path: Path) -> None:
    """`--demand R` creates as many droplets as `kiln fleet plan` says carry R: one droplet's capacity within the
    budget, from the plan each droplet's agent makes from the same user-data."""
    planned = run_kiln("fleet", "plan", "--demand", "40", "--profile", "llama-3.3-70b-instruct", "--machines",
                       "h100x8", "--json")
    assert planned.returncode == 0, planned.stderr
    [option] = json.loads(planned.stdout)["options"]
    args = up_args(tmp_path)
    args[args.index("--count"):args.index("--count") + 2] = ["--demand", "40"]
    with serve_api() as (url, state):
        done = fleet(url, *args, "--yes", "--json")
        assert done.returncode == 0, done.stderr
        sized = json.loads(done.stdout)["sized_by_demand"]
        assert sized["droplets"] == option["droplets"] == len(state.droplets) >= 2
        assert sized["capacity_requests_per_s"] == option["capacity_requests_per_s"]
        assert f"carry 40 requests/s: each carries {option['capacity_requests_per_s']:,.2f}" in done.stderr
        before = len(state.requests)
        fewer = fleet(url, "scale", "demo", "--demand", str(option["capacity_requests_per_s"] / 2), "--user-data",
                      str(tmp_path / "user-data.yaml"), "--yes", "--json")
        assert fewer.returncode == 0, fewer.stderr
        listed = [r for r in state.requests[before:] if r.method == "GET" and r.path == "/v2/droplets"
                  and r.query.get("tag_name") == "kiln-fleet:demo"]
        assert len(listed) == 1, "the fleet is read once: its droplets' size sizes the demand, and the change"
        assert len(state.droplets) == 1 and json.loads(fewer.stdout)["sized_by_demand"]["droplets"] == 1
        neither = fleet(url, "scale", "demo", "--yes")
        assert neither.returncode != 0 and "a count, or --demand" in neither.stderr
        blind = fleet(url, "scale", "demo", "--demand", "40", "--yes")
        assert blind.returncode != 0 and "--user-data" in blind.stderr
        asked = len(state.requests)
        bad = fleet(url, "scale", "demo", "--demand", "nan", "--user-data", str(tmp_path / "user-data.yaml"), "--yes")
        assert bad.returncode != 0 and "must be a number above 0" in bad.stderr and "Traceback" not in bad.stderr
        assert len(state.requests) == asked, "a demand that cannot be sized is refused before the fleet is read"


def test_user_data_that_is_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    with serve_api() as (url, state):
        args = up_args(tmp_path)
        (tmp_path / "user-data.yaml").unlink()
        os.mkfifo(tmp_path / "user-data.yaml")
        done = fleet(url, *args, "--yes")
        assert done.returncode != 0 and "not a regular file" in done.stderr and "Traceback" not in done.stderr
        assert state.requests == []
