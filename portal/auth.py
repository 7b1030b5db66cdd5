"""LDAP login through jupyterhub-ldapauthenticator (ldap3), wired from portal.yaml."""

from __future__ import annotations

from ldapauthenticator import LDAPAuthenticator


class PortalAuthenticator(LDAPAuthenticator):
    """LDAPAuthenticator with portal defaults: group members only, usernames Unix can hold."""

    def normalize_username(self, username):
        return super().normalize_username(username.strip())


def configure_ldap(c, settings) -> None:
    ldap = settings.ldap
    c.JupyterHub.authenticator_class = PortalAuthenticator
    c.LDAPAuthenticator.server_address = ldap.server_address
    c.LDAPAuthenticator.server_port = ldap.server_port
    c.LDAPAuthenticator.tls_strategy = ldap.tls_strategy
    c.LDAPAuthenticator.bind_dn_template = list(ldap.bind_dn_template)
    c.LDAPAuthenticator.allowed_groups = list(ldap.allowed_groups)
    # Unix account names only: they become Slurm job owners.
    c.LDAPAuthenticator.valid_username_regex = r"^[a-z_][a-z0-9_-]{0,31}$"
    if not ldap.allowed_groups:
        c.Authenticator.allow_all = True
