"""Forming a cluster at boot: the user-data, finding the nodes (by tag over DigitalOcean's API, or given), the
head's roster, the firewall rules, and two nodes' watches keeping real processes in step over real HTTP."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest
from tests.do_api import TOKEN, State, serve_api
from tests.do_metadata import droplet_metadata, metadata_service
from tests.unit.test_supervisor import FAST, RecordedRouting, free_port, server, wait_until

from kiln.choice.resolve import merge
from kiln.choice.schema import ClusterSetting, Layer, validate_fields
from kiln.cli.status import status_text
from kiln.cluster.discovery import DigitalOceanDroplets, DiscoveryError, droplet_identity
from kiln.cluster.firewall import EPHEMERAL, cluster_rules
from kiln.cluster.membership import Droplet, Membership, NotYet, from_droplets
from kiln.cluster.roster import NodeReport, Roster, worker_step
from kiln.processes import LocalProcesses
from kiln.render.cluster import MASTER_PORT
from kiln.render.vllm import Runtime
from kiln.serve.agent import http_probe
from kiln.serve.cluster_node import ClusterOptions, NodeWatch, find_membership
from kiln.serve.decide import decide
from kiln.serve.processes.supervisor import HELD, Supervisor
from kiln.serve.reports.state import AgentState
from kiln.wiring import Kiln

SETTING = ClusterSetting(name="big", nodes=2)


# -- the user-data ----------------------------------------------------------------------------------------------
def test_cluster_settings_are_checked_with_the_fix_and_the_token_is_never_shown(kiln: Kiln) -> None:
    good = merge([validate_fields({"profile": "tiny-cpu", "cluster": {"name": "big", "nodes": 2},
                                   "do_token": "dop_v1_" + "a" * 20}, source="user-data")])
    assert good.choice.cluster == SETTING and not good.problems
    report = decide(kiln, "h100x1", good, Runtime(vllm_command=("vllm",))).choice_report()
    assert "dop_v1_" not in json.dumps(report, default=str) and "big" in json.dumps(report)
    for bad, words in [({"name": "big", "nodes": 2, "head": "10.0.0.1"}, "give head and rank together"),
                       ({"name": "big", "nodes": 2, "head": "10.0.0.1", "rank": 2}, "rank 2 is not below nodes"),
                       ({"name": "Big_1", "nodes": 2}, "name"),
                       ({"name": "big", "nodes": 1}, "nodes")]:
        layer = validate_fields({"cluster": bad}, source="user-data")
        problem = next(p for p in layer.problems if p.field == "cluster")
        assert words in problem.what and "kiln-cluster:NAME" in problem.fix, problem


# -- finding the nodes ------------------------------------------------------------------------------------------
def droplets(*ids: int) -> list[Droplet]:
    return [Droplet(i, f"node-{i}", f"10.116.0.{i % 250}") for i in ids]


def test_ranks_follow_the_droplet_ids_so_every_node_works_out_the_same_answer() -> None:
    listed = droplets(907, 305, 611)  # in no order
    three = SETTING.model_copy(update={"nodes": 3})
    members = [from_droplets(three, own, listed, "eth1") for own in (305, 611, 907)]
    assert all(isinstance(m, Membership) for m in members)
    assert [m.rank for m in members if isinstance(m, Membership)] == [0, 1, 2]
    assert {m.head_address for m in members if isinstance(m, Membership)} == {"10.116.0.55"}
    assert members[0].names == ("node-305", "node-611", "node-907")  # type: ignore[union-attr]


def test_the_nodes_that_cannot_form_the_cluster_yet_say_why_and_how_to_fix_it() -> None:
    early = from_droplets(SETTING, 305, droplets(305), "eth1")
    assert isinstance(early, NotYet) and not early.final and "1 of 2 droplets tagged kiln-cluster:big" in early.what
    untagged = from_droplets(SETTING, 999, droplets(305, 611), "eth1")
    assert isinstance(untagged, NotYet) and "doctl compute droplet tag 999 --tag-name kiln-cluster:big" in untagged.fix
    extra = from_droplets(SETTING, 907, droplets(305, 611, 907), "eth1")
    assert isinstance(extra, NotYet) and extra.final and "raise cluster.nodes to 3" in extra.fix
    apart = from_droplets(SETTING, 305, [Droplet(305, "a", "10.116.0.2", "vpc-1"), Droplet(611, "b", "10.117.0.2",
                                                                                      "vpc-2")], "eth1")
    assert isinstance(apart, NotYet) and apart.final and "in 2 VPCs (a: vpc-1, b: vpc-2)" in apart.what
    assert "--vpc-uuid" in apart.fix
    no_vpc = from_droplets(SETTING, 305, [*droplets(305), Droplet(611, "node-611", None)], "eth1")
    assert isinstance(no_vpc, NotYet) and "node-611 has no private address" in no_vpc.what


def gpu_droplet(state: State, name: str, tags: list[str], private: str) -> int:
    droplet_id = next(state.ids)
    state.droplets[droplet_id] = {
        "id": droplet_id, "name": name, "status": "active", "tags": tags, "_seen": True, "vpc_uuid": "vpc-1",
        "gpu_info": {"count": 8, "model": "nvidia_h100"}, "networks": {"v4": [
            {"ip_address": private, "netmask": "255.255.240.0", "type": "private"},
            {"ip_address": "203.0.113.9", "netmask": "255.255.255.0", "type": "public"}]}}
    return droplet_id


def test_tagged_gpu_droplets_are_read_from_the_api_page_by_page() -> None:
    with serve_api() as (url, state):
        ids = [gpu_droplet(state, f"n{i}", ["kiln-cluster:big"], f"10.116.0.{i + 2}") for i in range(3)]
        gpu_droplet(state, "other", ["kiln-cluster:small"], "10.116.0.50")
        api = DigitalOceanDroplets(TOKEN, url)
        found = api.tagged("kiln-cluster:big")
        assert [d.id for d in found] == ids and found[0].private_address == "10.116.0.2"
        assert found[0].vpc_uuid == "vpc-1"
        # Both lists, since the API lists GPU droplets only with type=gpus and not with tag_name beside it.
        queries = [r.query for r in state.requests if r.path == "/v2/droplets"]
        assert {"tag_name": "kiln-cluster:big", "per_page": "200"} in queries
        assert {"type": "gpus", "per_page": "200"} in queries
        with pytest.raises(DiscoveryError) as refused:
            DigitalOceanDroplets("dop_v1_wrong", url).tagged("kiln-cluster:big")
        assert "refused do_token (401)" in refused.value.what and "droplet:read" in refused.value.fix


def test_a_node_waits_for_the_other_tagged_droplets_then_finds_its_rank() -> None:
    with serve_api() as (url, state):
        first = gpu_droplet(state, "big-0", ["kiln-cluster:big"], "10.116.0.2")
        with metadata_service(droplet_metadata(first, "big-0", "10.116.0.2", ["kiln-cluster:big"])) as metadata_url:
            assert droplet_identity(metadata_url=metadata_url) == (first, "10.116.0.2")
            options = ClusterOptions(do_api_url=url, retry_s=0.05,
                                     metadata_get=lambda: droplet_identity(metadata_url=metadata_url))
            waits: list[NotYet] = []

            def waiting(why: NotYet) -> None:
                waits.append(why)
                if len(waits) == 2:  # the second droplet is tagged while the first waits
                    gpu_droplet(state, "big-1", ["kiln-cluster:big"], "10.116.0.3")

            found = find_membership(SETTING, TOKEN, options, threading.Event(), waiting)
    assert isinstance(found, Membership), found
    assert (found.rank, found.head_address, found.address, found.found_by) == (0, "10.116.0.2", "10.116.0.2",
                                                                               "tag kiln-cluster:big")
    assert found.names == ("big-0", "big-1")
    assert "1 of 2 droplets tagged kiln-cluster:big so far (big-0)" in waits[0].what


def test_without_a_token_or_a_head_the_node_is_told_at_once() -> None:
    found = find_membership(SETTING, None, ClusterOptions(), threading.Event(), lambda _why: None)
    assert isinstance(found, NotYet) and found.final and "do_token" in found.fix and "cluster.head" in found.fix


def test_an_explicit_head_and_rank_need_no_api() -> None:
    setting = ClusterSetting(name="big", nodes=2, head="127.0.0.1", rank=1)
    found = find_membership(setting, None, ClusterOptions(), threading.Event(), lambda _why: None)
    assert isinstance(found, Membership)
    assert (found.rank, found.head_address, found.address, found.interface) == (1, "127.0.0.1", "127.0.0.1", "lo")


# -- the firewall -----------------------------------------------------------------------------------------------
def test_the_cluster_ports_open_to_the_vpc_only_and_nothing_else_changes() -> None:
    rules = cluster_rules("10.116.0.0/20", (8091, MASTER_PORT, 8091))
    assert [r[r.index("port") + 1] for r in rules] == ["8091", str(MASTER_PORT), EPHEMERAL]
    for rule in rules:
        assert rule[:2] == ["ufw", "allow"] and rule[rule.index("from") + 1] == "10.116.0.0/20"
    flat = " ".join(" ".join(r) for r in rules)
    assert "enable" not in flat and "deny" not in flat and "22" not in flat.split()


# -- the head's roster ------------------------------------------------------------------------------------------
def report(rank: int = 1, running: bool = True, generation: int = 1, launches: int = 1) -> NodeReport:
    return NodeReport(rank, f"big-{rank}", f"10.116.0.{rank + 2}", running, generation, launches)


def test_the_head_starts_when_every_node_answers_and_restarts_all_when_one_is_lost() -> None:
    head = report(0, running=False, generation=0, launches=0)
    roster = Roster(3, head, ("big-0", "big-1", "big-2"), lost_after_s=10, since=0.0)
    assert roster.step(1.0, head_launches=0) is None
    assert roster.waiting_for(1.0) == ["big-1 (rank 1): no report in 1 s", "big-2 (rank 2): no report in 1 s"]
    roster.record(report(1, running=False, generation=0, launches=0), 2.0)
    roster.record(report(2, running=False, generation=0, launches=0), 2.0)
    assert roster.step(2.0, head_launches=0) == "start"
    assert roster.step(3.0, head_launches=1) is None and roster.generation == 1 and not roster.complete(3.0)
    roster.record(report(1), 4.0)
    roster.record(report(2), 4.0)
    assert roster.step(4.0, head_launches=1) is None and roster.complete(4.0)
    assert [r["joined"] for r in roster.view(4.0)] == [True, True, True]

    # Rank 2's engine restarts on its own: it has left the running engine, so every node must restart.
    roster.record(report(2, launches=2), 6.0)
    assert roster.step(6.0, head_launches=1) == "stop"
    assert roster.lost == ["big-2 (rank 2, 10.116.0.4): its engine restarted, so it left the running engine"]
    assert roster.step(7.0, head_launches=1) == "start"  # every node still answers
    # The head's launch is not counted yet and rank 2 still reports its restarted engine: not lost again.
    assert roster.step(7.5, head_launches=1) is None and roster.engine_on
    assert roster.step(8.0, head_launches=2) is None and roster.generation == 2

    # Rank 1 goes silent: lost after 10 s, and named.
    roster.record(report(1, generation=2, launches=2), 9.0)
    roster.record(report(2, generation=2, launches=3), 9.0)
    assert roster.step(9.0, head_launches=2) is None and roster.complete(9.0)
    roster.record(report(2, generation=2, launches=3), 20.0)
    assert roster.step(20.0, head_launches=2) == "stop"
    assert roster.lost == ["big-1 (rank 1, 10.116.0.3) stopped answering 11 s ago"]
    assert roster.step(21.0, head_launches=2) is None  # not until rank 1 answers again
    assert roster.waiting_for(21.0) == ["big-1 (rank 1, 10.116.0.3): no report in 12 s"]
    view = {r["rank"]: r for r in roster.view(21.0)}
    assert not view[1]["up"] and view[2]["up"] and not view[0]["joined"]
    roster.record(report(1, generation=2, launches=2), 22.0)
    assert roster.step(22.0, head_launches=2) == "start"


def test_a_worker_restarts_its_engine_only_for_a_new_generation_of_the_head() -> None:
    assert worker_step(0, 0) is None  # the head has not started
    assert worker_step(1, 0) == 1
    assert worker_step(1, 1) is None
    assert worker_step(2, 1) == 2


def test_a_report_from_the_network_is_bounded_and_typed() -> None:
    body = {**report().as_dict(), "name": "x" * 500, "gpus": [{"index": i} for i in range(40)]}
    parsed = NodeReport.from_dict(body)
    assert len(parsed.name) == 64 and len(parsed.gpus) == 16
    with pytest.raises((KeyError, ValueError)):
        NodeReport.from_dict({"rank": "one"})


# -- two nodes' watches, over loopback, with real processes as their engines ------------------------------------
@contextmanager
def two_watches(tmp_path: Path) -> Iterator[tuple[NodeWatch, NodeWatch]]:
    """A head and a worker over loopback, each keeping a real process (its "engine") in step."""
    options = ClusterOptions(peer_port=free_port(), lost_after_s=3.0)
    watches, supervisors = [], []
    for rank in (0, 1):
        engine = server(tmp_path, f"engine{rank}")
        engine.held = True
        sup = Supervisor(launcher=LocalProcesses(), routing=RecordedRouting(), probe=lambda u: http_probe(u, 0.5),
                         settings=FAST, instances=[engine])
        member = Membership("pair", 2, rank, "127.0.0.1", "127.0.0.1", "lo", "user-data", ("pair-0", "pair-1"))
        state = AgentState(endpoint="-", health="-", keys_file="-", phase="starting", supervisor=sup)
        watches.append(NodeWatch(member, sup, engine, state, ({"index": 0, "name": "GPU"},), options,
                                 interval_s=0.1, report_every_s=0.1))
        supervisors.append(sup)
    try:
        for sup in supervisors:
            sup.start()
        yield watches[0], watches[1]
    finally:
        for watch in watches:
            watch.stop()
        for sup in supervisors:
            sup.stop()


def test_two_watches_start_both_engines_and_restart_both_when_the_worker_engine_dies(tmp_path: Path) -> None:
    with two_watches(tmp_path) as (head, worker):
        head.start()
        time.sleep(0.5)  # the worker is not up yet: the head's engine waits for it
        assert head.engine.state == HELD and head.engine.launches == 0 and head.state.current_phase() == "joining"
        worker.start()
        wait_until(lambda: bool(head.view()["complete"]))
        assert head.engine.launches == worker.engine.launches == 1 and worker.generation == 1
        # Every node has joined; the head is ready once its own engine answers its health probe.
        wait_until(lambda: head.state.current_phase() == "ready")
        rows = head.view()["members"]
        assert [(r["rank"], r["up"], r["joined"], len(r["gpus"])) for r in rows] == [(0, True, True, 1),
                                                                                     (1, True, True, 1)]
        assert worker.view()["role"] == "worker" and worker.view()["head_answers"]

        # kill -9 the worker's engine: its supervisor restarts it, so it left the engine; the head restarts both.
        pid = worker.engine.running.pid if worker.engine.running else 0
        psutil.Process(pid).send_signal(signal.SIGKILL)
        wait_until(lambda: head.state.last_error is not None)
        assert head.state.last_error is not None
        lost = head.state.last_error.what
        assert "node lost: pair-1 (rank 1, 127.0.0.1): its engine stopped (exited with code -9" in lost
        assert "restarts on all nodes" in head.state.last_error.fix
        wait_until(lambda: head.engine.launches == 2 and worker.generation == 2 and bool(head.view()["complete"]))
        assert head.view()["generation"] == 2


def test_a_worker_that_goes_silent_stops_the_engine_until_it_answers_again(tmp_path: Path) -> None:
    with two_watches(tmp_path) as (head, worker):
        head.start()
        worker.start()
        wait_until(lambda: bool(head.view()["complete"]))
        worker.stop()  # the worker's agent, or its whole machine, is gone: no more reports
        wait_until(lambda: head.engine.state == HELD)
        assert head.state.last_error is not None and "pair-1 (rank 1, 127.0.0.1) stopped answering" in (
            head.state.last_error.what)
        assert head.state.current_phase() == "joining" and not head.view()["members"][1]["up"]
        # The machine is back: a new agent, whose engine starts for the head's new generation.
        revived = NodeWatch(worker.member, worker.supervisor, worker.engine, worker.state, worker.gpus,
                            worker.options, interval_s=0.1, report_every_s=0.1)
        revived.start()
        try:
            wait_until(lambda: head.engine.launches == 2 and bool(head.view()["complete"]))
            assert revived.generation == 2
        finally:
            revived.stop()


# -- this node's plan -------------------------------------------------------------------------------------------
def test_each_node_plans_its_part_and_a_model_that_fits_one_node_is_not_split(kiln: Kiln) -> None:
    runtime = Runtime(vllm_command=("/opt/kiln/vllm/bin/vllm", "serve"))
    member = Membership("big", 2, 1, "10.116.0.2", "10.116.0.3", "eth1", "tag kiln-cluster:big")
    deepseek = merge([Layer("user-data", {"profile": "deepseek-v3.2"})])
    worker = decide(kiln, "h100x8", deepseek, runtime, membership=member)
    assert worker.failure is None and worker.node is not None and not worker.node.is_head
    argv = worker.rendered[0].argv
    assert "--headless" in argv and argv[argv.index("--master-addr") + 1] == "10.116.0.2"
    assert argv[argv.index("--node-rank") + 1] == "1"
    assert worker.rendered[0].env["VLLM_HOST_IP"] == "10.116.0.3"
    assert worker.rendered[0].env["NCCL_SOCKET_IFNAME"] == "eth1"

    llama = merge([Layer("user-data", {"profile": "llama-3.3-70b-instruct"})])
    alone = decide(kiln, "h100x8", llama, runtime, membership=member)
    assert alone.node is None and alone.failure is None
    problem = next(p for p in alone.problems if p.field == "cluster")
    assert "not split across nodes" in problem.what and "kiln fleet up --count 2" in problem.fix
    assert all("--nnodes" not in r.argv for r in alone.rendered)

    refused = decide(kiln, "h100x1", deepseek, runtime, membership=member)
    assert refused.failure is not None and "cannot be served on 2 x h100x1" in refused.failure[0]


# -- kiln status ------------------------------------------------------------------------------------------------
def test_kiln_status_shows_every_node_on_the_head_and_the_head_on_a_worker() -> None:
    head = Membership("big", 2, 0, "10.116.0.2", "10.116.0.2", "eth1", "tag kiln-cluster:big", ("big-0", "big-1"))
    roster = Roster(2, report(0, generation=1), ("big-0", "big-1"), since=0.0)
    roster.record(report(1), 1.0)
    members = roster.view(5.0)
    shown = status_text({"phase": "ready", "endpoint": "https://203.0.113.9", "cluster": {
        **head.as_dict(), "generation": 1, "members": members}})
    assert "endpoint  https://203.0.113.9/v1" in shown
    assert "cluster   big: head, rank 0 of 2, head 10.116.0.2 (found by tag kiln-cluster:big), engine generation 1" \
        in shown
    rows = [line.split() for line in shown.splitlines() if line.split()[:1] in (["0"], ["1"])]
    assert rows == [["0", "big-0", "10.116.0.2", "yes", "no", "0"], ["1", "big-1", "10.116.0.3", "yes", "no", "0"]]
    worker = Membership("big", 2, 1, "10.116.0.2", "10.116.0.3", "eth1", "tag kiln-cluster:big")
    shown = status_text({"phase": "ready", "endpoint": "https://203.0.113.10", "cluster": worker.as_dict()})
    assert "endpoint  on the head, 10.116.0.2" in shown and "worker, rank 1 of 2" in shown
