"""The one way a request reaches the app's long-lived objects: `held()`, the serving app's
`proxy.runtime.app.Services`, kept in its one `app.extensions` slot."""

from __future__ import annotations

from typing import TYPE_CHECKING

from quart import current_app

if TYPE_CHECKING:
    from proxy.runtime.app import Services

EXTENSION = "tollhouse"


def held() -> Services:
    """The serving app's holder (inside a request)."""
    services: Services = current_app.extensions[EXTENSION]
    return services
