"""The user's e-mail address from her LDAP entry (`mail`), for Slurm's mail when her session starts.

Looked up when the form is shown and again when the session is submitted, not kept from the login:
an address changed in the directory counts from the next start, and no secret is needed to keep
it in JupyterHub's encrypted auth_state. The entry is read anonymously at the DN the login binds
to (ldap.bind_dn_template), with the login's timeouts, on a worker thread: a hung LDAP server
never stalls the hub's event loop.
"""

from __future__ import annotations

import asyncio

import ldap3
from ldap3.core.exceptions import LDAPException

from portal import ldapconnect
from portal.settings import LdapSettings

MAIL_ATTRIBUTE = "mail"


class DirectoryUnavailable(RuntimeError):
    """LDAP did not answer the look-up; the message is for the user."""


def _connection(ldap: LdapSettings) -> ldap3.Connection:
    """An anonymous connection with the login's TLS strategy and timeouts."""
    connection = ldapconnect.open_connection(ldap)
    connection.bind()
    return connection


def _first_address(connection: ldap3.Connection, ldap: LdapSettings, username: str) -> str | None:
    """The first `mail` value of the first entry a bind DN template names for ``username``."""
    for template in ldap.bind_dn_template:
        found = connection.search(template.format(username=username), "(objectClass=*)",
                                  search_scope=ldap3.BASE, attributes=[MAIL_ATTRIBUTE])
        if found and connection.entries:
            values = connection.entries[0].entry_attributes_as_dict.get(MAIL_ATTRIBUTE) or []
            return str(values[0]) if values else None
    return None


def address_in_directory(ldap: LdapSettings, username: str) -> str | None:
    """``username``'s address as LDAP holds it (unchecked), or None when her entry has none."""
    try:
        connection = _connection(ldap)
    except (LDAPException, OSError) as error:
        raise DirectoryUnavailable(f"the directory (LDAP) did not answer ({error})") from None
    try:
        return _first_address(connection, ldap, username)
    except (LDAPException, OSError) as error:
        raise DirectoryUnavailable(f"the directory (LDAP) did not answer ({error})") from None
    finally:
        connection.unbind()


async def lookup(ldap: LdapSettings, username: str) -> str | None:
    """:func:`address_in_directory` off the event loop, within the login's deadline."""
    try:
        return await asyncio.wait_for(asyncio.to_thread(address_in_directory, ldap, username), ldap.login_timeout)
    except TimeoutError:
        raise DirectoryUnavailable(f"the directory (LDAP) did not answer within {ldap.login_timeout:g} s") from None
