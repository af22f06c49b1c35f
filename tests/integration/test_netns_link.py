"""The kernel-shaped link of ``geomx bench --only wan``: two namespaces, a tbf-shaped veth, a real geomx job across.

Skipped unless root with iproute2. Every test checks that the run's namespaces are gone afterwards, also when
the block raised or the process was sent SIGTERM, and that leftovers of a dead creator are cleaned up.
"""

from __future__ import annotations

import os
import random
import signal
import string
import subprocess
import sys
from pathlib import Path

import jobkit
import pytest
from harness import worker_command, write_topology

from geomx.bench.wan import netns

REASON = netns.unavailable_reason()
# cold: a worker forked warm would run in the warm-worker server's namespace, not the one its stub runs in
pytestmark = [pytest.mark.skipif(REASON is not None, reason=REASON or ""), pytest.mark.cold_workers]
PREFIX = "gxt"  # not the bench's prefix: a test never deletes a running bench's namespaces
RATE_MBIT = 50.0


@pytest.fixture
def link():
    """A fresh shaped link; after the test none of its namespaces may be left, whatever the test did."""
    with netns.wan_link(RATE_MBIT, prefix=PREFIX) as built:
        yield built
    left = set(built.namespaces) & set(netns.list_namespaces())
    assert not left, f"namespaces left behind: {left}"


def _party_command(link: netns.Link, party: str, topology: Path, scheduler: str, run_dir: Path) -> list[str]:
    ns, host = (link.ns_a, link.addr_a) if party == "dc0" else (link.ns_b, link.addr_b)
    return link.exec_in(ns, [sys.executable, "-m", "geomx.cli", "launch", str(topology), "--party", party,
                             "--host", host, "--global-scheduler", scheduler, "--run-dir", str(run_dir), "--",
                             *worker_command("train.py")])


def _run_to_the_end(commands: dict[str, list[str]], timeout: float) -> dict[str, str]:
    """Start every command (a session each), wait for all; assert each exited 0 (naming the one that did not, with
    its output's tail); SIGKILL whatever is left on the way out. Returns each command's output."""
    procs = {name: subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    start_new_session=True) for name, argv in commands.items()}
    try:
        outputs = {name: proc.communicate(timeout=timeout)[0] for name, proc in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    for name, proc in procs.items():
        assert proc.returncode == 0, f"{name} failed:\n{outputs[name][-3000:]}"
    return outputs


def test_shaped_rate_and_a_two_party_job_across_the_namespaces(link, tmp_path):
    for reverse in (False, True):
        measured = link.probe_mbit(seconds=1.5, reverse=reverse)
        assert abs(measured - RATE_MBIT) <= 0.1 * RATE_MBIT, f"probe {measured:.1f} Mbit/s, shaped {RATE_MBIT}"
    before = link.counters()
    topology = write_topology(tmp_path / "split.yaml")
    scheduler = f"{link.addr_a}:{link.free_port(link.ns_a, link.addr_a)}"
    runs = {party: tmp_path / f"run-{party}" for party in ("dc0", "dc1")}
    _run_to_the_end({party: _party_command(link, party, topology, scheduler, runs[party])
                     for party in ("dc1", "dc0")}, timeout=180)
    workers = {**jobkit.load_worker_outputs(runs["dc0"]), **jobkit.load_worker_outputs(runs["dc1"])}
    assert sorted(workers) == [0, 1, 2, 3]
    jobkit.assert_fsa_equivalent(workers, num_workers=4)  # the job across the link equals one process
    after = link.counters()
    # every FSA step's aggregate and answer crossed the veth: the qdiscs counted them, each way
    for direction in ("a_to_b", "b_to_a"):
        assert after[direction] - before[direction] >= jobkit.STEPS * jobkit.param_bytes(), (direction, after)


def test_the_links_tcp_congestion_control_is_set_in_both_namespaces_or_refused_by_name():
    host = netns.available_congestion()
    wanted = "reno" if "reno" in host else host[0]  # reno is built into every kernel; the host default seldom
    with netns.wan_link(RATE_MBIT, prefix=PREFIX, congestion=wanted) as built:
        assert built.congestion() == wanted
        for ns in built.namespaces:  # what a flow made in the namespace gets
            code = ("import socket; s = socket.socket(); "
                    "print(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16))")
            got = subprocess.run(built.exec_in(ns, [sys.executable, "-c", code]), capture_output=True, text=True,
                                 timeout=30, check=True).stdout
            assert wanted in got, (ns, got)
    with pytest.raises(netns.NetnsError, match=r"'no-such-cc' is not in this kernel's .*tcp_available"), \
            netns.wan_link(RATE_MBIT, prefix=PREFIX, congestion="no-such-cc"):
        pass
    assert not [ns for ns in netns.list_namespaces() if ns.startswith(PREFIX)], "a refused link left namespaces"


def test_teardown_after_an_exception():
    with pytest.raises(RuntimeError, match="boom"), netns.wan_link(RATE_MBIT, prefix=PREFIX) as built:
        assert set(built.namespaces) <= set(netns.list_namespaces())
        raise RuntimeError("boom")
    assert not set(built.namespaces) & set(netns.list_namespaces())


def test_teardown_on_sigterm(tmp_path):
    code = ("import sys; from geomx.bench.wan import netns\n"
            f"with netns.wan_link({RATE_MBIT}, prefix={PREFIX!r}) as link:\n"
            "    print(link.ns_a, link.ns_b, flush=True)\n"
            "    sys.stdin.readline()\n")  # blocks until the test closes stdin (it never does: SIGTERM comes first)
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    names = proc.stdout.readline().split()
    assert len(names) == 2 and set(names) <= set(netns.list_namespaces())
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    assert not set(names) & set(netns.list_namespaces())


def test_leftovers_of_a_dead_run_are_removed():
    # a prefix of this test's own (letters: no other prefix's "<pid>x" can read it as a pid), so a suite running
    # beside this one, whose same test cleans up "gxt<dead pid>x...", cannot remove this namespace first
    prefix = PREFIX + "".join(random.SystemRandom().choices(string.ascii_lowercase, k=3))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = f"{prefix}{dead.pid}x0a"
    subprocess.run(["ip", "netns", "add", stale], check=True, timeout=20)
    try:
        assert stale in netns.cleanup_leftovers(prefix)
        assert stale not in netns.list_namespaces()
    finally:
        subprocess.run(["ip", "netns", "del", stale], capture_output=True, timeout=20)


def test_collective_parties_on_two_hosts_as_the_docs_say(link, tmp_path):
    """docs/collective.md, "Several hosts", in two namespaces with their own addresses: host A runs the global tier
    (`geomx launch --global-only`) and the central party's own `torchrun --standalone`, host B dc1's; each host keeps
    its own run folder (GEOMX_RUN_DIR). The job across the link equals one process."""
    topology = write_topology(tmp_path / "job.yaml", parties={"dc0": 2, "dc1": 1},
                              lan={"dc0": "collective", "dc1": "collective"}, slice_elems=512)
    scheduler = f"{link.addr_a}:{link.free_port(link.ns_a, link.addr_a)}"
    bin_dir = Path(sys.executable).parent
    runs = {"dc0": tmp_path / "host-a", "dc1": tmp_path / "host-b"}
    hosts = {"dc0": (link.ns_a, link.addr_a), "dc1": (link.ns_b, link.addr_b)}
    commands = {"tier": link.exec_a([str(bin_dir / "geomx"), "launch", str(topology), "--global-only", "--host",
                                     link.addr_a, "--global-scheduler", scheduler, "--run-dir", str(runs["dc0"])])}
    for party, workers in (("dc0", 2), ("dc1", 1)):
        ns, host = hosts[party]
        commands[party] = link.exec_in(ns, [
            "env", f"GEOMX_TOPOLOGY={topology}", f"GEOMX_PARTY={party}", f"GEOMX_GLOBAL_SCHEDULER={scheduler}",
            f"GEOMX_HOST={host}", f"GEOMX_RUN_DIR={runs[party]}",
            str(bin_dir / "torchrun"), "--standalone", f"--nproc-per-node={workers}",
            *worker_command("frontend_train.py")[1:]])
    before = link.counters()
    outputs = _run_to_the_end(commands, timeout=240)
    assert f"the global tier listens at {scheduler}" in outputs["tier"], outputs["tier"][-2000:]
    workers = {**jobkit.load_worker_outputs(runs["dc0"]), **jobkit.load_worker_outputs(runs["dc1"])}
    assert sorted(workers) == [0, 1, 2]
    jobkit.assert_fsa_equivalent(workers, num_workers=3)
    after = link.counters()  # dc1's rank pushed its party's sums and took the answers across the veth, each step
    for direction in ("a_to_b", "b_to_a"):
        assert after[direction] - before[direction] >= jobkit.STEPS * jobkit.param_bytes(), (direction, after)
