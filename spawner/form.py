"""The spawn form's fields, read into the options a request is made of (portal/core/rules.py checks them)."""

from __future__ import annotations

from portal.core.rules import check_length
from portal.core.settings import shown


def options_from_form(formdata: dict[str, list[str]]) -> dict:
    """The chosen profile's own fields (each profile has its own 'gpus.NAME' and 'walltime.NAME'), and
    the e-mail and sharing checkboxes ('mail', 'shared') shared by all profiles. Every field sent is measured first, those of
    the other profiles too (RequestError names the field)."""
    for key, values in formdata.items():
        for value in values:
            check_length(f"the form's field {shown(key)}", value)
    profile = (formdata.get("profile") or [""])[0]
    options = {"profile": profile}
    for key in ("gpus", "walltime"):
        values = formdata.get(f"{key}.{profile}")
        if values:
            options[key] = values[0].strip()
    for box in ("mail", "shared"):
        ticked = formdata.get(box)
        if ticked:
            # A ticked checkbox sends "on"; anything else goes on as sent, for the rules to refuse in words.
            options[box] = True if ticked[0] == "on" else ticked[0]
    return options
