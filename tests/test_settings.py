"""portal.yaml validation: a bad file is refused with the key and the reason."""

import pytest
import yaml

from conftest import CONFIG
from portal.core.settings import OidcSettings, SettingsError, load, parse_memory_mb, parse_walltime

pytestmark = pytest.mark.quick


def write(tmp_path, edit):
    config = yaml.safe_load(CONFIG.read_text())
    edit(config)
    path = tmp_path / "portal.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_the_shipped_config_is_valid():
    settings = load(CONFIG)
    assert settings.profile().name == "gpu"
    assert settings.profile("gpu").cpus_per_gpu == 8
    assert parse_memory_mb(settings.profile("gpu").mem_per_gpu) == 48 * 1024


@pytest.mark.parametrize(
    "edit, key",
    [
        (lambda c: c["profiles"][0].update(cpus_per_gpu=0), "profiles.0.cpus_per_gpu"),
        (lambda c: c["profiles"][0].update(mem_per_gpu="lots"), "profiles.0.mem_per_gpu"),
        (lambda c: c["profiles"][0].update(max_walltime="8 hours"), "profiles.0.max_walltime"),
        (lambda c: c["profiles"][0].update(partition="gpu; rm -rf /"), "profiles.0.partition"),
        (lambda c: c["profiles"][0].update(extra_sbatch=["--comment=x\n#SBATCH --uid=0"]), "profiles.0.extra_sbatch"),
        (lambda c: c["profiles"][0].update(default_gpus=3), "profiles.0"),
        (lambda c: c["hub"].update(start_timeout="soon"), "hub.start_timeout"),
        (lambda c: c["slurm"].update(submit_as="ssh"), "slurm.submit_as"),
        (lambda c: c["session"].update(default_profile="nope"), "default_profile"),
        (lambda c: c.update(partitions=[]), "partitions"),
    ],
    ids=["cpus", "memory", "walltime", "partition-injection", "sbatch-injection", "default-gpus", "timeout",
         "submit-as", "default-profile", "unknown-key"],
)
def test_invalid_config_names_the_key(tmp_path, edit, key):
    with pytest.raises(SettingsError) as error:
        load(write(tmp_path, edit))
    assert key in str(error.value)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(SettingsError, match="file not found"):
        load(tmp_path / "absent.yaml")


def test_walltime_and_memory_parsing():
    assert parse_walltime("08:00:00") == 8 * 3600
    assert parse_walltime("1-12:00:00") == 36 * 3600
    assert parse_memory_mb("48G") == 49152
    assert parse_memory_mb("512M") == 512
    with pytest.raises(ValueError):
        parse_walltime("08:61:00")


def test_settings_under_their_old_names_are_read_under_the_new_ones_with_a_notice(tmp_path):
    """slurm.poll_interval is slurm.squeue_interval and slurm.session_check_interval is hub.poll_interval
    (JupyterHub's Spawner.poll_interval): one name in every layer. An older file still starts the hub."""
    def old_names(config):
        config["slurm"].pop("squeue_interval")
        config["hub"].pop("poll_interval")
        config["slurm"].update(poll_interval=3.5, session_check_interval=7)

    settings = load(write(tmp_path, old_names))
    assert settings.slurm.squeue_interval == 3.5 and settings.hub.poll_interval == 7
    assert settings.notices == ["slurm.poll_interval is now called slurm.squeue_interval: please rename it",
                                "slurm.session_check_interval is now called hub.poll_interval: please rename it"]
    assert load(CONFIG).notices == []
    with pytest.raises(SettingsError, match="slurm.session_check_interval is the old name of hub.poll_interval"):
        load(write(tmp_path, lambda config: config["slurm"].update(session_check_interval=7)))


def test_logins_by_ldap_or_openid_connect_exactly_one(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("s")
    sso = {"issuer": "https://sso.example.org/realms/hpc", "client_id": "portal", "client_secret_file": str(secret),
           "allowed_groups": ["datascience"]}
    assert load(write(tmp_path, lambda c: (c.pop("ldap"), c.update(oidc=sso)))).oidc.client_id == "portal"
    for edit in (lambda c: c.update(oidc=sso), lambda c: c.pop("ldap")):
        with pytest.raises(SettingsError, match="exactly one of them"):
            load(write(tmp_path, edit))


def test_openid_connect_settings_refuse_what_would_be_unsafe(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("s")
    secret.chmod(0o600)
    base = {"issuer": "https://sso.example.org/realms/hpc/", "client_id": "portal", "client_secret_file": str(secret),
            "allowed_groups": ["datascience"]}
    assert OidcSettings(**base).issuer == "https://sso.example.org/realms/hpc/"  # exactly as the provider names itself
    for change, words in [({"issuer": "http://sso.example.org"}, "must be https"),
                          ({"issuer": "http://localhost:556"}, "must be https"),  # a name: ::1 may come first
                          ({"issuer": "http://127.0.0.1:5556"}, "below 1024"),  # any user could listen there
                          ({"allowed_groups": []}, "at least 1"),
                          ({"issuer": "https://sso.example.org/?realm=hpc"}, "is not a URL like"),
                          ({"client_secret_file": "secret"}, "absolute path"),
                          ({"scopes": ["profile"]}, "must include openid")]:
        with pytest.raises(ValueError, match=words):
            OidcSettings(**{**base, **change})
    assert OidcSettings(**{**base, "issuer": "http://127.0.0.1:556"}).issuer == "http://127.0.0.1:556"  # the demo's
    assert OidcSettings(**base).client_secret() == "s"
    secret.chmod(0o644)
    with pytest.raises(SettingsError, match="may be read by other accounts"):
        OidcSettings(**base).client_secret()


def test_the_uids_of_people_are_one_setting_for_logins_and_the_mediator(tmp_path, monkeypatch):
    import json

    from portal.admin import hubaccount

    for uids in ([0, 59999], [2000, 1000]):  # root is never a person; first <= last
        with pytest.raises(SettingsError, match="people_uids"):
            load(write(tmp_path, lambda c, uids=uids: c["slurm"].update(people_uids=uids)))
    settings = load(write(tmp_path, lambda c: c["slurm"].update(people_uids=[1234500000, 1234699999])))  # FreeIPA's
    settings = settings.model_copy(update={"slurm": settings.slurm.model_copy(update={"mediator": tmp_path / "mediator"})})
    monkeypatch.setattr(hubaccount, "MEDIATOR_SETTINGS", tmp_path / "mediator.json")
    hubaccount.install_mediator(settings)
    written = json.loads((tmp_path / "mediator.json").read_text())
    assert (written["min_uid"], written["max_uid"]) == (1234500000, 1234699999)


def test_no_login_as_a_system_account_or_as_nobody_here():
    from portal.hub.auth import account_refusal

    people = (1000, 59999)
    assert "a system account (uid 0" in account_refusal("root", people, must_exist=False)
    assert "a system account" in account_refusal("daemon", people, must_exist=True)
    assert account_refusal("no-such-account", people, must_exist=False) is None  # LDAP: the directory decides
    assert account_refusal("no-such-account", people, must_exist=True) == "no Unix account of that name here"
    assert account_refusal("root", (0, 0), must_exist=True) is None  # only as portal.yaml says (which refuses 0)


def test_check_says_when_the_mediators_range_is_not_portal_yamls(tmp_path, monkeypatch):
    from portal.admin import check, hubaccount

    installed = tmp_path / "mediator.json"
    installed.write_text('{"min_uid": 1234500000, "max_uid": 1234699999}')  # edited by hand before 0.4
    monkeypatch.setattr(hubaccount, "MEDIATOR_SETTINGS", installed)
    told = check.check_people_uids(load(CONFIG))
    assert not told.ok and "serves uids 1234500000 to 1234699999" in told.detail and "says 1000 to 59999" in told.detail
    installed.write_text('{"min_uid": 1000, "max_uid": 59999}')
    assert check.check_people_uids(load(CONFIG)) is None
