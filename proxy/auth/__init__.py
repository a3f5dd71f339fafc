"""Identity: who is calling, settled by the spine (`Gateway.post`) before any policy; it answers a Principal or raises
Unauthenticated, and it is not a policy (policies decide what a known principal may do).

The authenticators are in `proxy.auth.authenticator`, not imported here: a policy that needs
`Principal` loads no HTTP client, JWT library or database with it.
"""

from proxy.auth.principal import ANONYMOUS, Principal

__all__ = ["ANONYMOUS", "Principal"]
