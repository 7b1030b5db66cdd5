"""Defaults that more than one side needs: portal.yaml's model (portal/core/settings.py) takes them from
here (the traits of the hub's classes take theirs from the model: portal/core/settingtraits.py), and so do the
session's fallbacks and the Slurm client's. One value, one place.
No imports: the session's start reads this module too.
"""

ENVIRONMENT = "/opt/dsportal/env"  # the world-readable Python prefix sessions run from
SESSION_LOG_DIR = "{home}/.dsportal/logs"
SESSION_WORKDIR = "{home}"
SESSION_UMASK = "077"
ACTIVITY_INTERVAL = 60  # seconds between a session's activity reports
SAVE_AHEAD = 120  # seconds before the walltime's end that a session saves its documents and stops its kernels
CODE_SERVER = "/opt/dsportal/code-server/bin/code-server"  # VS Code in the browser (scripts/install-code-server.sh)
R_REPOSITORY = "https://cloud.r-project.org"  # where an R kernel's install.packages() looks
GPU_BUSY_PERCENT = 5  # GPU utilisation from which a session's GPU counts as in use

SLURM_BIN_DIR = "/usr/bin"
MEDIATOR = "/usr/local/libexec/dsportal/mediator"  # what the hub runs as a user (portal/slurm/mediator.py)
SUBMIT_AS = "runuser"
# The accounts people log in as and sessions run as (Debian's uids for people): not root, not system accounts
# (below 1000: munge, mysql, the hub's own), not package accounts (60000 up: slurm, whose jobs Slurm trusts).
# The mediator runs as no other (portal/admin/hubaccount.py); a login as any other is refused (portal/hub/auth.py).
PEOPLE_UIDS = (1000, 59999)
SQUEUE_INTERVAL = 1.0  # seconds between the shared squeue calls while sessions start

LDAP_CONNECT_TIMEOUT = 5.0
LDAP_RECEIVE_TIMEOUT = 5.0
LDAP_LOGIN_TIMEOUT = 8.0
OIDC_TIMEOUT = 5.0  # seconds for each request to an OpenID provider (portal/hub/oidc.py)
OIDC_CLOCK_SKEW = 30.0  # seconds an ID token's exp and iat may be off
RESOURCES_INTERVAL = 10.0  # seconds the spawn form's free/total resources (one sinfo) are cached

# Failed logins (portal/hub/loginthrottle.py)
LOGIN_FREE_FAILURES = 5
LOGIN_FIRST_DELAY = 5.0
LOGIN_MAX_DELAY = 60.0
LOGIN_ACCOUNT_FAILURES = 20
LOGIN_ACCOUNT_WINDOW = 300.0
LOGIN_ACCOUNT_LOCK = 30.0
