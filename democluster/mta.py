"""The login node's mail: Debian's exim4 (exim4-daemon-light) for local delivery only.

Slurm's mail (a session that asked for it, at BEGIN) goes from slurmctld through MailProg
(bsd-mailx's /usr/bin/mail) to /usr/sbin/sendmail, exim's, which delivers it at once to the
addressee's mailbox, /var/mail/<user>, when the address is in the demo's mail domain. Nothing
is relayed. No exim daemon is started: sendmail delivers by itself, and if a daemon runs (a
machine with systemd starts one), it listens on loopback only.
"""

from __future__ import annotations

from pathlib import Path

from democluster.base import DemoError, directory, run, say, write_if_changed

EXIM_CONFIG = Path("/etc/exim4/update-exim4.conf.conf")
SENDMAIL = Path("/usr/sbin/sendmail")
# Slurm runs MailProg as `mail -s SUBJECT ADDRESS` with an empty body.
MAIL_PROGRAM = Path("/usr/bin/mail")


def mail_domain() -> str:
    """The domain of the demo's addresses (users.yaml), delivered here."""
    return directory()["mail_domain"]


def exim_settings(domain: str) -> str:
    """Debian's exim4 configuration (debconf's keys): local delivery only, to /var/mail."""
    return "\n".join([
        "# Written by dsportal's demo (democluster/mta.py): local delivery only, nothing relayed.",
        "dc_eximconfig_configtype='local'",
        f"dc_other_hostnames='{domain}'",
        "dc_local_interfaces='127.0.0.1 ; ::1'",
        "dc_readhost=''",
        "dc_relay_domains=''",
        "dc_minimaldns='false'",
        "dc_relay_nets=''",
        "dc_smarthost=''",
        "CFILEMODE='644'",
        "dc_use_split_config='false'",
        "dc_hide_mailname=''",
        "dc_mailname_in_oh='true'",
        "dc_localdelivery='mail_spool'",
        "",
    ])


def ensure_mta() -> None:
    """exim4 set for the demo's mail domain; its configuration made anew only when it changed."""
    missing = [str(path) for path in (SENDMAIL, MAIL_PROGRAM) if not path.exists()]
    if missing or not EXIM_CONFIG.parent.is_dir():
        raise DemoError(f"the login node's mail is not installed ({', '.join(missing) or EXIM_CONFIG.parent} "
                        "missing): run scripts/install-deps.sh (exim4-daemon-light, bsd-mailx)")
    domain = mail_domain()
    if write_if_changed(EXIM_CONFIG, exim_settings(domain), 0o644):
        run(["/usr/sbin/update-exim4.conf"])
        say(f"exim4: local delivery for @{domain} to /var/mail")
