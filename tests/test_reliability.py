"""Scheduler outages: running sessions are kept, new requests get a message a person understands."""

import os
import signal
import subprocess
import time
from pathlib import Path

import democluster as demo
from conftest import login, wait_no_jobs


def test_slurmctld_outage_keeps_sessions_and_explains_new_spawns(second_hub):
    base = second_hub(lambda config: config["hub"].update(poll_interval=2))
    alice, bob = login(base, "alice"), login(base, "bob")
    alice.spawn()
    try:
        demo.stop_pid(demo.paths().run / "slurmctld.pid", "slurmctld")
        time.sleep(8)  # the hub checks alice's session every 2 s: each squeue now fails
        assert alice.model()["servers"][""]["ready"], "a session was dropped because squeue failed"
        assert alice.api("GET", "/user/alice/api/status").status_code == 200

        started = time.monotonic()
        response = bob.start_server()
        if response.status_code in (201, 202):  # sbatch still trying to reach slurmctld (MessageTimeout)
            events = bob.progress_events(timeout=120)
            message = next((e for e in events if e.get("failed")), {}).get("message", f"no failure in {events}")
        else:
            assert response.status_code == 503, response.text
            message = response.json()["message"]
        print(f"spawn during the outage failed after {time.monotonic() - started:.1f} s: {message}")
        assert "scheduler is not answering" in message, message
        assert bob.model()["servers"] == {}
    finally:
        demo.ensure_slurm()

    assert alice.model()["servers"][""]["ready"]
    assert "ok" in alice.run_code("print('ok')")
    alice.stop_server()


def test_hung_slurmctld_gets_a_message_keeps_sessions_and_leaves_no_job_behind(alice, bob):
    """slurmctld frozen (SIGSTOP: it accepts connections and never answers), not down: bob's start
    fails with a message a person understands, alice's running session and the hub keep answering,
    and a session job that Slurm takes in once it wakes up (nobody waits for it any more) ends
    itself instead of holding the slice."""
    alice.spawn({"profile": "cpu"})
    ctld = int((demo.paths().run / "slurmctld.pid").read_text().split()[0])
    started_wall = time.time()
    os.kill(ctld, signal.SIGSTOP)
    try:
        started = time.monotonic()
        response = bob.start_server({"profile": "cpu"})
        if response.status_code in (201, 202):  # the hub answered before sbatch gave up: the spawn goes on
            events = bob.progress_events(timeout=120)
            failure = next((e for e in events if e.get("failed")), {})
            message, code = failure.get("message", f"no failure in {events}"), 0
        else:
            message, code = response.json()["message"], response.status_code
        seconds = time.monotonic() - started
        # Meanwhile: alice's session and the hub's own pages answer.
        assert alice.api("GET", "/user/alice/api/status").status_code == 200
        assert alice.model()["servers"][""]["ready"]
        assert bob.api("GET", "/hub/api/user").status_code == 200
    finally:
        os.kill(ctld, signal.SIGCONT)
    print(f"bob's start with slurmctld frozen failed after {seconds:.1f} s ({code or 'in progress'}): {message}")
    assert code in (0, 503), (code, message)
    assert "scheduler is not answering" in message, message
    assert bob.model()["servers"] == {}
    # Slurm may have queued the submission it never answered: that job is refused its port and ends.
    assert wait_no_jobs("bob", timeout=90) == [], "a session job nobody waits for still holds the node"
    for log in sorted(Path("/home/bob/.dsportal/logs").glob("session-*.log"), key=lambda p: p.stat().st_mtime)[-1:]:
        if log.stat().st_mtime > started_wall and "refused this session's port" in log.read_text():
            print(f"the job Slurm took in after waking up ended itself: {log.read_text().splitlines()[-1]}")
    assert "ok" in alice.run_code("print('ok')")
    bob.spawn({"profile": "cpu"})  # and the next start works


def test_a_stop_while_slurmctld_hangs_does_not_block_the_next_start_and_goes_through_once_it_wakes(alice):
    """alice stops her session while slurmctld is frozen: the stop does not wait out the outage (her
    next start is answered about the scheduler, not JupyterHub's "alice is pending stop"), and her
    job is cancelled once slurmctld answers again: nothing holds her slice."""
    alice.spawn({"profile": "cpu"})
    ctld = int((demo.paths().run / "slurmctld.pid").read_text().split()[0])
    os.kill(ctld, signal.SIGSTOP)
    try:
        alice.stop_server()  # returns once the hub shows no session (at most 60 s)
        response = alice.start_server({"profile": "cpu"})
        if response.status_code in (201, 202):
            events = alice.progress_events(timeout=120)
            message = next((e for e in events if e.get("failed")), {}).get("message", f"no failure in {events}")
        else:
            message = response.json()["message"]
    finally:
        os.kill(ctld, signal.SIGCONT)
    print(f"alice's start right after her stop, slurmctld frozen: {message}")
    assert "pending stop" not in message, message
    assert "scheduler is not answering" in message, message
    assert wait_no_jobs("alice", timeout=120) == [], "the job of the stopped session still holds its slice"


def test_a_pidfile_whose_pid_came_round_to_another_program_names_no_daemon(tmp_path):
    """A daemon killed without its pidfile removed: the next `make demo` must start it again, and
    `make stop` must not signal whatever program holds the pid by then (pid_max is 32768)."""
    from democluster.base import alive, stop_pid

    pidfile = tmp_path / "slapd.pid"
    innocent = subprocess.Popen(["sleep", "60"])
    try:
        pidfile.write_text(f"{innocent.pid}\n")
        os.utime(pidfile, (time.time() - 3, time.time() - 3))  # older than the process with its pid
        assert alive(pidfile) is None
        stop_pid(pidfile, "slapd")
        assert innocent.poll() is None, "stop_pid signalled a program the stale pidfile named by chance"

        pidfile.write_text(f"{innocent.pid}\n")  # written by the daemon after it started: its own
        assert alive(pidfile) == innocent.pid
    finally:
        innocent.kill()
        innocent.wait()
    assert alive(pidfile) is None
