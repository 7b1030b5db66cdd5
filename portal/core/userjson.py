"""Small things both sides judge before, or without, the settings model (portal.core.settings, pydantic):
what a user sent as JSON in words, a request for more walltime, a user's Unix groups.

A session's server imports this at start (its sharing gate, its walltime API); portal.core.rules and
portal.core.settings, which a session loads only when its job launcher is first used, build on it.
No imports but the standard library's.
"""

from __future__ import annotations

import grp
import os
import pwd
import time

MOST_EXTENSION_MINUTES = 24 * 60  # one request for more walltime; the profile's max_walltime caps the total


def json_kind(value) -> str:
    """What a value sent as JSON is, in words: 'a list', 'an object', 'true/false', 'null', ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "text"
    return "a list" if isinstance(value, list) else "an object" if isinstance(value, dict) else type(value).__name__


def extension_minutes(body) -> int:
    """The minutes of a request for more walltime, ``{"minutes": N, ...}`` (portal.hub.extend and the
    session's ExtendHandler judge it alike), or ValueError in words."""
    minutes = body.get("minutes") if isinstance(body, dict) else None
    if not isinstance(minutes, int) or isinstance(minutes, bool) or not 1 <= minutes <= MOST_EXTENSION_MINUTES:
        given = (json_kind(body) if not isinstance(body, dict) else json_kind(minutes) if "minutes" in body
                 else "an object without 'minutes'")
        if isinstance(minutes, int) and not isinstance(minutes, bool) and abs(minutes) < 10**9:
            given = str(minutes)
        raise ValueError(f"expected {{'minutes': <1-{MOST_EXTENSION_MINUTES}>}}, not {given}")
    return minutes


GROUP_NAME_SECONDS = 300.0  # a group's name (by gid) is looked up again after this; who is in it, at every call
_group_names: dict[int, tuple[float, str | None]] = {}


def unix_groups(username: str) -> set[str]:
    """The user's groups as the cluster sees them (LDAP via NSS on a real cluster): who belongs to which group
    is asked anew at every call (getgrouplist); the names of the groups, by gid, are remembered for
    GROUP_NAME_SECONDS. getgrgid returns a group with its whole member list: a login group of thousands made
    every call cost as much as all its members' names, on the hub's event loop."""
    try:
        entry = pwd.getpwnam(username)
    except KeyError:
        return set()
    return {name for gid in os.getgrouplist(username, entry.pw_gid) if (name := _group_name(gid)) is not None}


def _group_name(gid: int) -> str | None:
    now = time.monotonic()
    known = _group_names.get(gid)
    if known is not None and now - known[0] < GROUP_NAME_SECONDS:
        return known[1]
    try:
        name = grp.getgrgid(gid).gr_name
    except KeyError:
        name = None
    if len(_group_names) >= 4096:  # a bound: a directory of many groups is forgotten, then learnt again
        _group_names.clear()
    _group_names[gid] = (now, name)
    return name
