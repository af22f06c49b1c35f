"""``scripts/fuzz_job.py`` against a live job with a shared secret (a small number of frames; the script
itself sends 100,000). Every port of every process is sprayed twice: without the secret (each process
refuses the connections in the handshake and logs it) and with it (the junk reaches the decoders, which
drop it). The job must still finish, every process exiting 0, with exactly the single-process reference
model: the junk changed nothing.
"""

from __future__ import annotations

import sys

import jobkit
import pytest
from harness import REPO_ROOT, worker_command, write_topology

from geomx.algorithms.tsengine.rules import read_reports as read_ts_reports
from geomx.config import SecuritySpec
from geomx.runs.runlog import read_stats

sys.path.insert(0, str(REPO_ROOT / "scripts"))
from fuzz_job import LiveJob, junk, spray

# cold: the fuzzer finds every process's ports by its pid, and a warm worker's pid is its stub's
pytestmark = pytest.mark.cold_workers

SECRET = "fuzzing-is-fun-0123456789"
FRAMES = 1500
STEPS = 5


def test_fuzzing_every_port_of_a_secured_job(tmp_path):
    topology = write_topology(tmp_path / "fuzz.yaml", parties={"dc0": 1, "dc1": 1},
                              timeouts={"request": "60s", "round": "60s", "shutdown": "5s"})
    topology.write_text(topology.read_text() + f"security:\n  secret: {SECRET}\n")
    run_dir = tmp_path / "run"
    job = LiveJob(topology, worker_command("survive_train.py", "--steps", str(STEPS), "--fault-step", "2",
                                           "--fault-rank", "0", "--hold-until", "fuzzed"), run_dir)
    try:
        ports_by_process = job.wait_for_ports(timeout=60)
        ports = sorted(p for found in ports_by_process.values() for p in found)
        assert len(ports_by_process) == 8  # global scheduler + server, 2 x (scheduler, server, worker)
        stranger = spray(ports, junk(FRAMES, seed=1), None, linger_s=1.0)
        insider = spray(ports, junk(FRAMES, seed=2), SecuritySpec(secret=SECRET))
    finally:
        (run_dir / "fuzzed").touch()  # let the held worker go on (also when the spraying failed)
    result = job.wait(timeout=180)
    output = job.output.getvalue()
    print(output)
    assert result.exit_code == 0, output[-3000:]
    assert stranger.frames + stranger.unsendable == insider.frames == FRAMES
    jobkit.assert_fsa_equivalent(jobkit.load_worker_outputs(run_dir), num_workers=2, steps=STEPS)

    lines = output.splitlines()
    refusing = {label for label in ports_by_process
                if any(line.startswith(f"[{label}]") and "refused a connection" in line for line in lines)}
    assert refusing == set(ports_by_process), sorted(set(ports_by_process) - refusing)
    assert "dropped a malformed message" in output
    servers = [s for s in read_stats(run_dir) if s.get("role") in ("global_server", "local_server")]
    assert len(servers) == 3
    for stats in servers:  # the insider's junk reached every server's decoder (and nothing was answered)
        unknown = stats["peers"].get("<unknown>", {"recv": 0, "sent": 0})
        assert unknown["recv"] > 0 and unknown["sent"] == 0, stats


def test_a_job_whose_links_are_all_curve_encrypted_trains_exactly(tmp_path):
    """Keys from `geomx keygen`, every link CURVE: the job trains to the reference, and a stranger who only
    knows the servers' public keys (its own key pair is not the job's) is refused by every process. dc0's two
    workers also talk to each other (TSEngine inside the party: merges and relays), encrypted too."""
    from geomx.cli import main as geomx_main

    topology = write_topology(tmp_path / "curve.yaml", parties={"dc0": 2, "dc1": 1},
                              timeouts={"request": "60s", "round": "60s", "shutdown": "5s"},
                              tsengine={"inter": False, "intra": True, "max_greed": 0.5})
    assert geomx_main(["keygen", str(tmp_path / "keys"), "--topology", str(topology)]) == 0
    topology.write_text(topology.read_text() + "security:\n  curve_keys: keys\n")  # relative to the topology
    run_dir = tmp_path / "run"
    job = LiveJob(topology, worker_command("survive_train.py", "--steps", str(STEPS), "--fault-step", "2",
                                           "--fault-rank", "0", "--hold-until", "fuzzed"), run_dir)
    try:
        ports_by_process = job.wait_for_ports(timeout=60)
        ports = sorted(p for found in ports_by_process.values() for p in found)
        stranger = spray(ports, junk(200, seed=3), SecuritySpec(secret=SECRET), linger_s=1.0)
    finally:
        (run_dir / "fuzzed").touch()
    result = job.wait(timeout=180)
    output = job.output.getvalue()
    print(output)
    assert result.exit_code == 0, output[-3000:]
    assert stranger.frames + stranger.unsendable == 200
    jobkit.assert_fsa_equivalent(jobkit.load_worker_outputs(run_dir), num_workers=3, steps=STEPS)
    assert read_ts_reports(run_dir)["dc0_server"]["rounds"] > 0
    lines = output.splitlines()
    refusing = {label for label in ports_by_process
                if any(line.startswith(f"[{label}]") and "refused a connection" in line for line in lines)}
    assert refusing == set(ports_by_process), sorted(set(ports_by_process) - refusing)
    assert "dropped a malformed message" not in output  # nothing of the stranger reached a decoder
