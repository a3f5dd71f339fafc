"""Identity: who is calling. Step 2 of the request path; it answers a Principal or raises
Unauthenticated, and it is not a policy (policies decide what a known principal may do)."""

from proxy.auth.authenticator import Authenticator, BearerAuth, NoAuth
from proxy.auth.principal import ANONYMOUS, Principal

__all__ = ["ANONYMOUS", "Authenticator", "BearerAuth", "NoAuth", "Principal"]
