"""Which redirect URIs a client may register and be sent back to (RFC 8252 for native apps).

- `https` to any host, matched exactly.
- `http` on a loopback IP literal (`127.0.0.1`, `[::1]`): the port is whatever the app got from
  the system when it started listening, so any port matches a registered URI with the same path
  and query (section 7.3), unless `loopback_any_port = false`.
- `http://localhost`: accepted, matched exactly, port included. Section 8.3 recommends the IP
  literal over `localhost`, which a host file or a resolver may point elsewhere, so the
  any-port rule is kept for the literals.
- a private-use scheme (section 7.1): a reverse-domain scheme (`com.example.app:/cb`, a dot in
  the scheme) when `reverse_domain_schemes`, or one of `private_use_schemes` (the IDEs'
  well-known `cursor://`, `vscode://`...), matched exactly. Never one a browser runs or reads
  itself (`javascript:`, `data:`, `file:`...), whatever the configuration says.

Every URI is visible ASCII with no backslash, no userinfo and no fragment: Python and browsers
disagree on `http://evil.example\\@127.0.0.1/cb` (Python reads host 127.0.0.1, a browser
evil.example), `https://trusted@evil.example/` shows a misleading name on the consent page, and
a whitespace or control character breaks the Location header the code is sent in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

from proxy.config import OAuthServerConfig

LOOPBACK_LITERALS = frozenset({"127.0.0.1", "::1"})
# schemes a browser handles itself: never a place to send an authorization code
NEVER = frozenset({"javascript", "data", "file", "blob", "about", "vbscript", "filesystem",
                   "ftp", "ws", "wss", "chrome", "view-source", "http", "https"})
_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*$")
_HOST = re.compile(r"^[a-z0-9.-]+$|^[0-9a-f:.]+$")  # a name, or an IPv6 literal unbracketed


def _parts(uri: str) -> SplitResult | None:
    if not uri or "\\" in uri or not all("!" <= c <= "~" for c in uri):
        return None
    try:
        parts = urlsplit(uri)
        _ = parts.port  # raises ValueError on a port that is not a number
    except ValueError:
        return None
    if parts.fragment or "@" in parts.netloc or not _SCHEME.match(parts.scheme):
        return None
    return parts


@dataclass(frozen=True)
class RedirectPolicy:
    loopback_any_port: bool = True
    reverse_domain_schemes: bool = True
    private_use_schemes: frozenset[str] = frozenset()

    @classmethod
    def from_config(cls, cfg: OAuthServerConfig) -> RedirectPolicy:
        return cls(cfg.loopback_any_port, cfg.reverse_domain_schemes,
                   frozenset(s.lower() for s in cfg.private_use_schemes) - NEVER)

    def valid(self, uri: str) -> bool:
        parts = _parts(uri)
        if parts is None:
            return False
        if parts.scheme == "https":  # a name a CSP source and a Location carry as it is
            return bool(parts.hostname and _HOST.match(parts.hostname))
        if parts.scheme == "http":
            return parts.hostname in LOOPBACK_LITERALS or parts.hostname == "localhost"
        return self.private_use(parts.scheme)

    def private_use(self, scheme: str) -> bool:
        if scheme in NEVER:
            return False
        return scheme in self.private_use_schemes or (self.reverse_domain_schemes
                                                      and "." in scheme)

    def matches(self, requested: str, registered: tuple[str, ...]) -> bool:
        """`requested` is one of `registered`, or differs from one only in the port of a
        loopback IP literal; and it is valid under the policy as it is now (a client
        registered under an older rule may hold a URI it breaks)."""
        if not self.valid(requested):
            return False
        if requested in registered:
            return True
        if not self.loopback_any_port:
            return False
        asked = urlsplit(requested)
        if asked.scheme != "http" or asked.hostname not in LOOPBACK_LITERALS:
            return False
        return any(_same_but_port(asked, urlsplit(r)) for r in registered if self.valid(r))

    @property
    def described(self) -> str:
        schemes = sorted(self.private_use_schemes)
        kinds = ["https", "http on a loopback address (127.0.0.1, [::1], localhost)"]
        if self.reverse_domain_schemes:
            kinds.append("a reverse-domain private-use scheme (com.example.app:/cb)")
        if schemes:
            kinds.append(f"one of the schemes {', '.join(s + '://' for s in schemes)}")
        return "redirect URIs must be " + ", or ".join(kinds) + "; without a fragment"


def _same_but_port(a: SplitResult, b: SplitResult) -> bool:
    return (b.scheme == a.scheme and b.hostname == a.hostname and b.path == a.path
            and b.query == a.query)


def redirect_source(uri: str) -> str:
    """The CSP source expression that lets a form's redirect reach `uri` (already valid): its
    origin for http(s), its scheme (`cursor:`) for a private-use one."""
    parts = urlsplit(uri)
    if parts.scheme in ("http", "https"):
        return f"{parts.scheme}://{parts.netloc}"
    return f"{parts.scheme}:"
