"""A setting is declared once (portal/core/settings.py): the hub's classes make their traits from it and the hub's
configuration hands each its value in one loop (portal/core/settingtraits.py). No cluster needed."""

import re
from pathlib import Path

import pytest
from traitlets.config import Config

from portal.core.settings import load
from portal.core.settingtraits import _field, hand_down
from portal.hub.auth import PortalAuthenticator
from spawner.gpuspawner import SlurmGPUSpawner
from spawner.partitionspawner import PartitionSpawner

pytestmark = pytest.mark.quick

REPO = Path(__file__).resolve().parent.parent
CLASSES = (SlurmGPUSpawner, PartitionSpawner, PortalAuthenticator)


def setting_traits(cls) -> dict:
    return cls.class_traits(setting=lambda path: path is not None)


def test_each_setting_trait_takes_its_default_and_words_from_the_setting():
    seen = set()
    for cls in CLASSES:
        for name, trait in setting_traits(cls).items():
            path = trait.metadata["setting"]
            default = _field(path).get_default(call_default_factory=True)
            assert trait.default_value == ("" if default is None else str(default) if isinstance(default, Path)
                                           else default), (cls.__name__, name)
            assert trait.help == f"portal.yaml's {path}: {_field(path).description}"
            seen.add(path)
    assert {"session.activity_interval", "slurm.squeue_interval", "ldap.throttle.account_lock"} <= seen
    assert len(seen) == 24, sorted(seen)


def test_the_hubs_configuration_hands_each_its_value_and_sets_none_by_hand():
    settings = load(REPO / "config" / "portal.yaml")
    c = Config()
    hand_down(c, settings, *CLASSES)
    assert c.SlurmGPUSpawner.activity_interval == settings.session.activity_interval
    assert c.SlurmGPUSpawner.slurm_conf == str(settings.slurm.conf or "")
    assert c.PartitionSpawner.resources_interval == settings.slurm.resources_interval
    assert c.PortalAuthenticator.account_lock == settings.ldap.throttle.account_lock
    for cls in CLASSES:
        assert set(c[cls.__name__]) == set(setting_traits(cls)), cls.__name__
    # One place: no line of the hub's configuration sets one of them itself.
    names = {name for cls in CLASSES for name in setting_traits(cls)}
    for source in ("portal/hub/config.py", "portal/hub/auth.py"):
        text = (REPO / source).read_text()
        by_hand = [m.group(0) for m in re.finditer(r"c\.\w+\.(\w+)\s*=", text) if m.group(1) in names]
        assert by_hand == [], (source, by_hand)
