"""A session job that dies before its server answers fails the spawn quickly, with the job's words."""

import time

from conftest import login, wait_no_jobs


def test_job_dying_at_start_fails_within_seconds_showing_its_error(second_hub):
    def broken_environment(config):
        config["session"]["environment"] = "/nonexistent/dsportal-env"

    base = second_hub(broken_environment)
    alice = login(base, "alice")
    started = time.monotonic()
    response = alice.start_server()
    events = alice.progress_events(timeout=120) if response.status_code == 202 else []
    elapsed = time.monotonic() - started
    print(f"spawn failure reported after {elapsed:.1f} s")

    if events:
        final = events[-1]
        assert final.get("failed"), events
        message = final["message"]
    else:
        assert response.status_code >= 400, response.text
        message = response.json()["message"]
    # The job's own error text reaches the user, with Slurm's view of the job.
    assert "/nonexistent/dsportal-env/bin/python" in message, message
    assert "No such file or directory" in message, message
    assert "FAILED" in message, message
    # It ended on the job's own failure, not on start_timeout (how fast: bench/spawn_bench.py).
    assert "timeout" not in message.lower(), message
    assert wait_no_jobs("alice") == []
    assert alice.model()["servers"] == {}
