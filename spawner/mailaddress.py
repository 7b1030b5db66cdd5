"""The user's e-mail address from her LDAP entry (`mail`), for Slurm's mail when her session starts.

Looked up when the form is shown and again when the session is submitted, not kept from the login:
an address changed in the directory counts from the next start, and no secret is needed to keep
it in JupyterHub's encrypted auth_state. The entry is read where the login finds it (at
ldap.bind_dn_template, or searched under ldap.search_base as the search's service account), with
the login's timeouts, on a worker thread: a hung LDAP server never stalls the hub's event loop.
"""

from __future__ import annotations

import asyncio

import ldap3
from ldap3.core.exceptions import LDAPException

from portal.core import ldapconnect
from portal.core.settings import LdapSettings

MAIL_ATTRIBUTE = "mail"


class DirectoryUnavailable(RuntimeError):
    """LDAP did not answer the look-up; the message is for the user."""


def _connection(ldap: LdapSettings) -> ldap3.Connection:
    """A connection with the login's servers, TLS strategy and timeouts, bound as the search's service
    account (ldap.search_bind_dn), else anonymously."""
    connection = ldapconnect.open_connection(ldap)
    if not ldapconnect.bind_for_search(connection, ldap):
        connection.unbind()
        raise DirectoryUnavailable("the directory (LDAP) refused the portal's own account; please tell your admin")
    return connection


def _first_address(connection: ldap3.Connection, ldap: LdapSettings, username: str) -> str | None:
    """The first `mail` value of the user's entry, found as her login finds it."""
    entry = ldapconnect.find_user(connection, ldap, username, [MAIL_ATTRIBUTE])
    values = (entry.entry_attributes_as_dict.get(MAIL_ATTRIBUTE) or []) if entry is not None else []
    return str(values[0]) if values else None


def address_in_directory(ldap: LdapSettings, username: str) -> str | None:
    """``username``'s address as LDAP holds it (unchecked), or None when her entry has none."""
    try:
        connection = _connection(ldap)
    except (LDAPException, OSError) as error:
        raise DirectoryUnavailable(f"the directory (LDAP) did not answer ({error})") from None
    except ValueError:  # SettingsError (the service account's password file): the admin's `dsportal check` says which
        raise DirectoryUnavailable("the portal cannot read its own directory settings; please tell your admin") from None
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
