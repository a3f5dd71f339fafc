from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Principal:
    """The authenticated caller, as every later step sees it."""

    subject: str
    issuer: str = ""
    display_name: str = ""
    groups: frozenset[str] = field(default_factory=frozenset)
    scopes: frozenset[str] = field(default_factory=frozenset)
    authenticated: bool = True

    @property
    def key(self) -> str:
        """A stable identity across issuers, for binding sessions and in-flight calls."""
        return f"{self.issuer}|{self.subject}"


ANONYMOUS = Principal(subject="anonymous", authenticated=False)
