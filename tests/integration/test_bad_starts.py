"""Bad starts named early (issue 46): each one a real process started as a user would, the message it prints and
how long it took to print it.

- a WAN codec no registry holds: refused by `geomx launch` before any process starts, and by a torchrun rank
  before it joins;
- a torchrun whose rank count is not the party's worker count: named with both numbers at the rank's start;
- a global scheduler nobody runs: named within 10 s, and first when the registration wait ends;
- a party with the wrong shared secret: named on the joining side, at once;
- a port in use: one line, from `geomx launch` (before any process) and from a node; `--global-only` says the
  tier listens only once it does;
- a run folder an earlier job wrote to: refused by `geomx launch` before any process.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from harness import WORKERS_DIR, write_topology

from geomx.cluster.addresses import listening
from geomx.launch import free_port

pytestmark = pytest.mark.slow

# a rank that would wait this long for a global scheduler nobody runs, had it tried to join
REGISTER_S = 60


def _collective(tmp_path: Path, register_s: float = REGISTER_S, **options) -> Path:
    return write_topology(tmp_path / "job.yaml", parties={"dc0": 2, "dc1": 2}, lan={"dc0": "collective",
                          "dc1": "collective"}, timeouts={"register": f"{register_s:g}s"}, **options)


def _rank_env(path: Path, party: str, rank: int, world: int) -> dict[str, str]:
    """A torchrun rank's environment (torchrun's variables, as the docs' recipe sets GeoMX's) against a global
    scheduler address nobody listens at: a rank that got as far as joining would wait REGISTER_S there."""
    return {**os.environ, "GEOMX_TOPOLOGY": str(path), "GEOMX_PARTY": party,
            "GEOMX_GLOBAL_SCHEDULER": f"127.0.0.1:{free_port()}", "RANK": str(rank), "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port())}


def _run(argv: list[str], env: dict[str, str], timeout: float = 50) -> tuple[int, str, float]:
    started = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    return done.returncode, done.stdout + done.stderr, time.monotonic() - started


CREATE = "import geomx; geomx.kv.create()"


def test_an_unknown_codec_is_refused_by_launch_before_any_process(tmp_path):
    path = write_topology(tmp_path / "job.yaml", training={"compression": {"type": "zstd"}})
    code, output, _ = _run([sys.executable, "-m", "geomx.cli", "launch", str(path), "--run-dir", str(tmp_path / "run"),
                            "--", sys.executable, "-c", "pass"], dict(os.environ))
    assert code == 2, output
    assert "training.compression {'type': 'zstd'}: unknown codec 'zstd'; known: [" in output, output
    assert "Traceback" not in output and not (tmp_path / "run").exists(), output


def test_a_run_folder_of_an_earlier_job_is_refused_by_launch_and_left_as_it_was(tmp_path):
    """A whole new job into the run folder of a finished one would append to its metrics and add its stats files to
    the summary: refused, naming the folder, before any process; the earlier job's files are untouched."""
    path = write_topology(tmp_path / "job.yaml")
    run = tmp_path / "run"
    (run / "metrics").mkdir(parents=True)
    (run / "metrics" / "dc0_worker0.jsonl").write_text('{"step": 1}\n')
    code, output, _ = _run([sys.executable, "-m", "geomx.cli", "launch", str(path), "--run-dir", str(run), "--",
                            sys.executable, "-c", "pass"], dict(os.environ))
    assert code == 2, output
    assert f"run folder {run} holds an earlier job's metrics" in output and "--resume" in output, output
    assert "Traceback" not in output and not (run / "stats").exists(), output
    assert (run / "metrics" / "dc0_worker0.jsonl").read_text() == '{"step": 1}\n'


@pytest.mark.parametrize(("training", "env", "named"), [
    ({"compression": {"type": "zstd"}}, {}, "training.compression {'type': 'zstd'}: unknown codec 'zstd'"),
    ({}, {"GEOMX_COMPRESSION": "bsc:foo=1"}, "GEOMX_COMPRESSION='bsc:foo=1': codec 'bsc' has no parameter 'foo'"),
    ({"sync": "dist_foo"}, {}, "training.sync 'dist_foo' is unknown"),
    ({}, {"GEOMX_STALENES": "2"}, "GEOMX_STALENES='2': training has unknown fields ['stalenes']"),
])
def test_a_torchrun_rank_refuses_bad_names_before_it_joins(tmp_path, training, env, named):
    path = _collective(tmp_path, training=training)
    code, output, took = _run([sys.executable, "-c", CREATE], {**_rank_env(path, "dc1", 0, 2), **env})
    assert code != 0 and named in output, output
    assert "waiting for" not in output and took < REGISTER_S / 2, (took, output)  # it never tried to join


def test_a_torchrun_with_more_ranks_than_the_party_has_workers_is_named(tmp_path):
    path = _collective(tmp_path, register_s=2 * REGISTER_S)  # torchrun and 3 torch imports: slow on a loaded host
    env = _rank_env(path, "dc1", 0, 3)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name)
    code, output, took = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=3",
                               str(WORKERS_DIR / "frontend_train.py")], env, timeout=2 * REGISTER_S)
    assert code != 0, output
    assert "party dc1 has 2 workers in the topology but torchrun started 3 ranks (WORLD_SIZE=3)" in output, output
    assert "is outside" not in output, output  # named, not a data shard's range error later
    assert "waiting for" not in output and took < REGISTER_S, (took, output)  # no rank tried to join


def _stream(argv: list[str], env: dict[str, str], timeout: float = 90) -> tuple[int, list[tuple[float, str]]]:
    """Run ``argv``; its exit code and every output line with the seconds since the start when it was printed."""
    started = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[tuple[float, str]] = []
    assert proc.stdout is not None
    for line in proc.stdout:  # ends when the process (and the launcher's relays) close it
        lines.append((time.monotonic() - started, line.rstrip()))
        if time.monotonic() - started > timeout:
            proc.kill()
            raise AssertionError(f"still running after {timeout} s:\n" + "\n".join(t for _, t in lines[-40:]))
    return proc.wait(timeout=30), lines


def _first(lines: list[tuple[float, str]], text: str) -> tuple[float, str]:
    found = next(((t, line) for t, line in lines if text in line), None)
    assert found is not None, f"no line with {text!r}:\n" + "\n".join(line for _, line in lines[-40:])
    return found


def _launch_party(path: Path, party: str, address: str, run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "geomx.cli", "launch", str(path), "--party", party, "--global-scheduler", address,
            "--run-dir", str(run_dir), "--", sys.executable, str(WORKERS_DIR / "train.py")]


def test_a_global_scheduler_nobody_runs_is_named_early_and_first(tmp_path):
    """dc1 launched alone against an address where no global scheduler runs: its server names the address and that
    nothing listens there within 10 s, and when the registration wait ends, that is the first error."""
    register_s = 12
    path = write_topology(tmp_path / "job.yaml", timeouts={"register": f"{register_s}s"})
    address = f"127.0.0.1:{free_port()}"
    code, lines = _stream(_launch_party(path, "dc1", address, tmp_path / "run"), dict(os.environ))
    text = "\n".join(line for _, line in lines)
    assert code != 0, text
    noticed_at, notice = _first(lines, f"waiting for the global scheduler at {address}")
    assert noticed_at < 10, (noticed_at, notice)
    assert "nothing listens there (connection refused" in notice, notice
    errors = [(t, line) for t, line in lines if " ERROR " in f" {line} " or "exited with code" in line]
    assert errors, text
    first_at, first = errors[0]
    assert f"the global scheduler at {address} did not complete this node's registration within {register_s} s: " \
           "nothing listens there" in first, text
    assert register_s <= first_at < register_s + 10, (first_at, text)
    assert "registration timed out" not in text.split(first)[0], text  # the party scheduler's generic line: later
    assert "Traceback" not in text, text


def test_a_party_with_the_wrong_secret_is_told_by_the_global_scheduler(tmp_path, reserved_port):
    """dc0 (central) and dc1 launched separately; dc1 has another shared secret: the global scheduler refuses its
    server's connection, and dc1 names that, at once, instead of waiting out the registration timeout."""
    register_s = 30
    path = write_topology(tmp_path / "job.yaml", timeouts={"register": f"{register_s}s"})
    address = f"127.0.0.1:{reserved_port()}"
    central = subprocess.Popen(_launch_party(path, "dc0", address, tmp_path / "run0"),
                               env={**os.environ, "GEOMX_SECRET": "the-right-secret"}, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    seen: list[str] = []
    listening = threading.Event()

    def read_central() -> None:
        assert central.stdout is not None
        for line in central.stdout:
            seen.append(line)
            if "[global_scheduler]" in line and "listening at" in line:
                listening.set()

    reader = threading.Thread(target=read_central, daemon=True)
    reader.start()
    try:  # dc1 starts once the global scheduler listens: what follows is dc1's own time to name the refusal
        assert listening.wait(register_s), "".join(seen)
        code, lines = _stream(_launch_party(path, "dc1", address, tmp_path / "run1"),
                              {**os.environ, "GEOMX_SECRET": "a-wrong-secret"})
    finally:
        central.terminate()
        central.wait(timeout=60)
        reader.join(timeout=10)
    central_output = "".join(seen)
    text = "\n".join(line for _, line in lines)
    assert code != 0, text
    named_at, named = _first(lines, f"the global scheduler at {address} refused this node's shared secret")
    assert named_at < 10, (named_at, named)  # not the registration timeout
    assert "GEOMX_SECRET" in named and "Traceback" not in text, text
    assert "wrong shared secret" in central_output, central_output[-3000:]  # the central side says so too


def test_a_port_in_use_is_one_line_from_launch_before_any_process(tmp_path):
    path = write_topology(tmp_path / "job.yaml")
    with socket.create_server(("127.0.0.1", 0)) as busy:
        address = f"127.0.0.1:{busy.getsockname()[1]}"
        for form in (["--global-only"], ["--party", "dc0"]):
            run_dir = tmp_path / f"run{len(form)}"
            code, output, took = _run([sys.executable, "-m", "geomx.cli", "launch", str(path), *form,
                                       "--global-scheduler", address, "--run-dir", str(run_dir),
                                       *(["--", "true"] if "--party" in form else [])],
                                      dict(os.environ))
            assert code == 2 and took < 20, (form, took, output)
            assert output.strip() == f"geomx launch: the global scheduler cannot listen at {address}: Address " \
                                     "already in use (is another job, or an old process of this one, still " \
                                     "running there? pick another port)", (form, output)
            assert not run_dir.exists(), form  # nothing started


def test_a_port_in_use_is_one_line_from_a_node_started_by_hand(tmp_path):
    path = write_topology(tmp_path / "job.yaml")
    with socket.create_server(("127.0.0.1", 0)) as busy:
        address = f"127.0.0.1:{busy.getsockname()[1]}"
        env = {**os.environ, "GEOMX_ROLE": "global_scheduler", "GEOMX_PARTY": "dc0", "GEOMX_TOPOLOGY": str(path),
               "GEOMX_GLOBAL_SCHEDULER": address}
        code, output, took = _run([sys.executable, "-m", "geomx.node"], env)
    assert code == 3 and took < 20, (took, output)
    assert output.strip() == f"ERROR global_scheduler cannot listen at {address}: Address already in use (is " \
                             "another job, or an old process of this one, still running there?)", output


def test_global_only_says_the_tier_listens_after_its_bind(tmp_path):
    """The line that tells every party where to connect is printed once the global scheduler listens there."""
    path = write_topology(tmp_path / "job.yaml", timeouts={"register": "20s"})
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "geomx.cli", "launch", str(path), "--global-only",
                             "--global-scheduler", f"127.0.0.1:{port}", "--run-dir", str(tmp_path / "run")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            seen.append(line)
            if "the global tier listens at" in line:
                assert listening(port), "".join(seen)  # at the moment it is printed
                assert f"GEOMX_GLOBAL_SCHEDULER=127.0.0.1:{port}" in line, line
                break
        else:
            raise AssertionError("never said it listens:\n" + "".join(seen))
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)


def test_a_global_tier_no_party_joins_names_the_missing_parties(tmp_path):
    """``--global-only`` and no party ever started: the summary names the members that never registered, from the
    global scheduler's finding. Before, it said ``FAILED (global_server0)``, the first process its own wait stopped."""
    path = write_topology(tmp_path / "job.yaml", timeouts={"register": "3s", "shutdown": "2s"})
    code, output, _ = _run([sys.executable, "-m", "geomx.cli", "launch", str(path), "--global-only",
                            "--global-scheduler", f"127.0.0.1:{free_port()}", "--run-dir", str(tmp_path / "run")],
                           dict(os.environ))
    assert code != 0, output
    status = next(line for line in output.splitlines() if line.startswith("status"))
    assert status == "status        : FAILED (local_server@dc0, local_server@dc1 never registered with " \
                     "global_scheduler in 3 s: is every party started, with its address?)", output[-3000:]
