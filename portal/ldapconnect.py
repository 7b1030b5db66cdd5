"""An anonymous LDAP connection as the portal's settings say (server, TLS strategy, the server's
certificate checked, timeouts): for `dsportal check` and the hub's look-up of users' e-mail
addresses. (Logins go through ldapauthenticator with the same TLS arguments: hub/auth.py.)"""

from __future__ import annotations

import math

import ldap3

from .settings import LdapSettings

# What ldap3 reads of the server after a bind: nothing. Its default (SCHEMA) reads the root DSE and
# the whole schema, parsed in Python, on every bind of a new Server: most of what a login costs the
# hub's CPU, for type checks of attribute names the portal spells itself; values come back as text
# either way.
SERVER_INFO = ldap3.NONE


def new_server(address: str, port: int, use_ssl: bool, tls_kwargs: dict, connect_timeout: float) -> ldap3.Server:
    """The LDAP server as the portal's connections see it (these and the hub's logins): its
    certificate checked as ``tls_kwargs`` say, a connect timeout, none of its schema read."""
    return ldap3.Server(address, port=port, use_ssl=use_ssl, tls=ldap3.Tls(**tls_kwargs),
                        connect_timeout=connect_timeout, get_info=SERVER_INFO)


def open_connection(ldap: LdapSettings, connect_timeout: float | None = None,
                    receive_timeout: float | None = None) -> ldap3.Connection:
    """Opened (StartTLS done where the strategy says so), not bound."""
    server = new_server(ldap.server_address, ldap.server_port, ldap.tls_strategy == "on_connect", ldap.tls_kwargs(),
                        connect_timeout or ldap.connect_timeout)
    receive = max(1, math.ceil(receive_timeout or ldap.receive_timeout))  # ldap3: whole seconds
    connection = ldap3.Connection(server, auto_bind=False, receive_timeout=receive)
    connection.open()
    if ldap.tls_strategy == "before_bind":
        connection.start_tls()
    return connection
