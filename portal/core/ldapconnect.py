"""An LDAP connection as the portal's settings say (server and failover servers, TLS strategy, the
server's certificate checked, timeouts), bound as the search's service account or anonymously: for
`dsportal check` and the hub's look-up of users' e-mail addresses. (Logins go through
ldapauthenticator with the same servers and TLS arguments: hub/auth.py.)"""

from __future__ import annotations

import math

import ldap3

from portal.core.settings import LdapSettings

# What ldap3 reads of the server after a bind: nothing. Its default (SCHEMA) reads the root DSE and
# the whole schema, parsed in Python, on every bind of a new Server: most of what a login costs the
# hub's CPU, for type checks of attribute names the portal spells itself; values come back as text
# either way.
SERVER_INFO = ldap3.NONE
# A pool of servers where none answers: ldap3 would sleep POOLING_LOOP_TIMEOUT (10 s) before giving up.
ldap3.set_config_parameter("POOLING_LOOP_TIMEOUT", 0)


def new_server(address: str, port: int, use_ssl: bool, tls_kwargs: dict, connect_timeout: float) -> ldap3.Server:
    """The LDAP server as the portal's connections see it (these and the hub's logins): its
    certificate checked as ``tls_kwargs`` say, a connect timeout, none of its schema read."""
    # No referral is followed (allowed_referral_hosts empty, auto_referrals off on every connection): ldap3 would
    # bind again, with the same password, at any host a referral names, with TLS unchecked or none.
    return ldap3.Server(address, port=port, use_ssl=use_ssl, tls=ldap3.Tls(**tls_kwargs),
                        connect_timeout=connect_timeout, get_info=SERVER_INFO, allowed_referral_hosts=[])


def new_servers(servers: list[tuple[str, int]], use_ssl: bool, tls_kwargs: dict,
                connect_timeout: float) -> ldap3.Server | ldap3.ServerPool:
    """The server, or with failover servers a pool of them tried in their order (ldap.failover_servers): a
    connection takes the first that answers, each within ``connect_timeout``, once round the list."""
    made = [new_server(host, port, use_ssl, tls_kwargs, connect_timeout) for host, port in servers]
    return made[0] if len(made) == 1 else ldap3.ServerPool(made, ldap3.FIRST, active=1, exhaust=False)


def open_connection(ldap: LdapSettings, connect_timeout: float | None = None,
                    receive_timeout: float | None = None) -> ldap3.Connection:
    """Opened (StartTLS done where the strategy says so), not bound."""
    server = new_servers(ldap.servers(), ldap.tls_strategy == "on_connect", ldap.tls_kwargs(),
                         connect_timeout or ldap.connect_timeout)
    receive = max(1, math.ceil(receive_timeout or ldap.receive_timeout))  # ldap3: whole seconds
    connection = ldap3.Connection(server, auto_bind=False, receive_timeout=receive, auto_referrals=False)
    connection.open()
    if ldap.tls_strategy == "before_bind":
        connection.start_tls()
    return connection


def bind_for_search(connection: ldap3.Connection, ldap: LdapSettings) -> bool:
    """Bind as the service account (search_bind_dn, its password from its file), else anonymously."""
    if ldap.search_bind_dn:
        connection.user, connection.password = ldap.search_bind_dn, ldap.search_password()
        connection.authentication = ldap3.SIMPLE
    return connection.bind()


def find_user(connection: ldap3.Connection, ldap: LdapSettings, username: str, attributes: list[str]):
    """``username``'s entry (ldap3's), found as a login finds it: at each bind DN template, else by a search
    under search_base for user_attribute; None where there is none, or more than one."""
    from ldap3.utils.conv import escape_filter_chars
    from ldap3.utils.dn import escape_rdn

    if ldap.search_base:
        connection.search(ldap.search_base, f"({ldap.user_attribute}={escape_filter_chars(username)})",
                          search_scope=ldap3.SUBTREE, attributes=attributes)
        return connection.entries[0] if len(connection.entries) == 1 else None
    for template in ldap.bind_dn_template:
        if connection.search(template.format(username=escape_rdn(username)), "(objectClass=*)",
                             search_scope=ldap3.BASE, attributes=attributes) and connection.entries:
            return connection.entries[0]
    return None
