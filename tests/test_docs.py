"""Each setting's meaning has one home, the settings model: the portal.yaml reference is written from it
and kept in step with it. No cluster needed."""

from pathlib import Path

import pytest

from portal.core import settingsdoc

pytestmark = pytest.mark.quick

REPO = Path(__file__).resolve().parent.parent


def test_the_portal_yaml_reference_is_what_the_settings_model_writes_now():
    committed = (REPO / settingsdoc.TARGET).read_text()
    assert committed == settingsdoc.render(), (
        f"{settingsdoc.TARGET} is stale: write it again, in the checkout: "
        f"python -m portal.cli docs portal-yaml > {settingsdoc.TARGET}")


def test_every_key_of_portal_yaml_says_what_it_does():
    undescribed = [f"{name}.{key}".lstrip(".") for name, model in settingsdoc.sections()
                   for key, field in settingsdoc.fields(model) if not settingsdoc.description(field).strip()]
    assert not undescribed, f"keys without a description= in portal/core/settings.py: {undescribed}"
