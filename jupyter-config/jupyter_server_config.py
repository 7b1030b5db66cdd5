# dsportal: a session's /proxy/<port>/ opens only its own user's services (portal/portguard.py).
from portal.portguard import host_allowlist  # noqa: E402

c.ServerProxy.host_allowlist = host_allowlist  # noqa: F821
