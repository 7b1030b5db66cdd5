"""Scheduler outages: running sessions are kept, new requests get a message a person understands."""

import time

from conftest import login
from portal import demo


def test_slurmctld_outage_keeps_sessions_and_explains_new_spawns(second_hub):
    base = second_hub(lambda config: config["slurm"].update(session_check_interval=2))
    alice, bob = login(base, "alice"), login(base, "bob")
    alice.spawn()
    try:
        demo._stop_pid(demo.paths().run / "slurmctld.pid", "slurmctld")
        time.sleep(8)  # the hub checks alice's session every 2 s: each squeue now fails
        assert alice.model()["servers"][""]["ready"], "a session was dropped because squeue failed"
        assert alice.api("GET", "/user/alice/api/status").status_code == 200

        started = time.monotonic()
        response = bob.start_server()
        print(f"spawn during the outage answered in {time.monotonic() - started:.1f} s")
        assert response.status_code == 503, response.text
        assert "scheduler is not answering" in response.json()["message"]
    finally:
        demo.ensure_slurm()

    assert alice.model()["servers"][""]["ready"]
    assert "ok" in alice.run_code("print('ok')")
    alice.stop_server()
