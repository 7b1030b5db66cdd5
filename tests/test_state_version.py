"""A hub refuses to start on a state that a newer dsportal ran last (a downgrade), in words; it records its own
version otherwise (portal/hub/stateversion.py; docs/how-to/take-a-security-release.md). No cluster needed."""

from types import SimpleNamespace

import pytest

from portal import cli
from portal.hub import stateversion

pytestmark = pytest.mark.quick


def test_the_first_start_records_its_version_and_an_upgrade_moves_it_forward(tmp_path):
    assert stateversion.check_and_record(tmp_path, "0.1.0") is None
    assert (tmp_path / "dsportal-version").read_text() == "0.1.0\n"
    assert stateversion.check_and_record(tmp_path, "0.1.0") == "0.1.0"
    assert stateversion.check_and_record(tmp_path, "0.2.0") == "0.1.0"
    assert stateversion.recorded(tmp_path) == "0.2.0"
    assert oct((tmp_path / "dsportal-version").stat().st_mode & 0o777) == "0o644"


def test_an_older_dsportal_on_a_newer_state_is_refused_in_words(tmp_path):
    stateversion.check_and_record(tmp_path, "0.2.0")
    with pytest.raises(stateversion.Downgrade) as refused:
        stateversion.check_and_record(tmp_path, "0.1.0")
    words = str(refused.value)
    assert f"{tmp_path}/dsportal-version says dsportal 0.2.0 last ran this hub; this is dsportal 0.1.0, older" in words
    assert "Install dsportal 0.2.0 or newer" in words
    assert stateversion.recorded(tmp_path) == "0.2.0"  # left as it was
    # a pre-release of the same version is older too (PEP 440)
    with pytest.raises(stateversion.Downgrade):
        stateversion.check_and_record(tmp_path, "0.2.0rc1")


def test_a_version_that_is_none_neither_refuses_nor_is_recorded(tmp_path):
    stateversion.check_and_record(tmp_path, "0.2.0")
    assert stateversion.check_and_record(tmp_path, "unknown (not installed)") == "0.2.0"
    assert stateversion.recorded(tmp_path) == "0.2.0"


def test_dsportal_hub_stops_before_jupyterhub_loads(tmp_path, monkeypatch, capsys):
    (tmp_path / "dsportal-version").write_text("99.0\n")
    settings = SimpleNamespace(hub=SimpleNamespace(account=None, data_dir=tmp_path), source=tmp_path / "portal.yaml")
    monkeypatch.setattr(cli, "production_settings", lambda args: settings)
    monkeypatch.setattr(cli, "version", lambda: "0.2.0")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DSPORTAL_CONFIG", str(tmp_path / "portal.yaml"))
    assert cli.main(["hub"]) == 2
    assert "dsportal hub: " + f"{tmp_path}/dsportal-version says dsportal 99.0 last ran this hub; this is dsportal " \
           "0.2.0, older" in capsys.readouterr().err


def test_a_hub_that_fails_to_set_up_leaves_the_version_as_it_was_and_one_set_up_records_its_own(
        tmp_path, monkeypatch):
    """Recorded once set up (after JupyterHub's init_tornado_application), not as it starts: an upgraded hub that
    fails to start leaves the rollback to the release before it open."""
    import jupyterhub.app

    from portal.upstream import hub as upstream

    (tmp_path / "dsportal-version").write_text("0.2.0\n")
    settings = SimpleNamespace(hub=SimpleNamespace(account=None, data_dir=tmp_path), source=tmp_path / "portal.yaml")
    monkeypatch.setattr(cli, "production_settings", lambda args: settings)
    monkeypatch.setattr(cli, "version", lambda: "0.3.0")
    monkeypatch.setattr(cli, "_hub_config_file", lambda: str(tmp_path / "jupyterhub_config.py"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DSPORTAL_CONFIG", str(tmp_path / "portal.yaml"))  # `dsportal hub` exports it: restored after
    monkeypatch.setattr(upstream, "_AFTER_INIT", [])
    monkeypatch.setattr(cli.gc, "disable", lambda: None)  # the hub's loading without the collector: not here
    monkeypatch.setattr(jupyterhub.app, "main", lambda argv: 1)  # JupyterHub stopped before it was set up
    assert cli.main(["hub"]) == 1
    assert stateversion.recorded(tmp_path) == "0.2.0"
    (record,) = [extension for extension in upstream._AFTER_INIT if extension is not cli._start_garbage_collection]
    record(SimpleNamespace())  # what runs once JupyterHub's tornado application is made
    assert stateversion.recorded(tmp_path) == "0.3.0"
