"""/api/v1 errors: {"detail": "<message>"} for a domain rule; 422 with a list of
{"loc", "msg", "type"} for request validation, every problem found; an auth-failure lockout
in the OAuth shape {"error", "error_description"} with Retry-After, as at the edge (seed
004)."""

from __future__ import annotations

import math
from typing import Any

import orjson
from pydantic import ValidationError
from quart import Response

JSON = {"Content-Type": "application/json", "Cache-Control": "no-store"}


class ApiError(Exception):
    def __init__(self, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.headers = headers or {}

    def response(self) -> Response:
        return Response(orjson.dumps({"detail": self.detail}), self.status,
                        {**JSON, **self.headers})


class LockedOut(ApiError):
    """429: too many failed authentications. Seed 004 gives lockouts the OAuth shape, on the
    management API as at the edge (proxy.errors.LockedOut)."""

    error = "too_many_requests"
    description = "too many failed authentication attempts; try again later"

    def __init__(self, retry_after_s: float) -> None:
        super().__init__(429, self.description,
                         {"Retry-After": str(max(1, math.ceil(retry_after_s)))})

    def response(self) -> Response:
        return Response(orjson.dumps({"error": self.error,
                                      "error_description": self.description}),
                        self.status, {**JSON, **self.headers})


class Invalid(Exception):
    """422: the problems, each {"loc": [...], "msg": "...", "type": "..."}."""

    def __init__(self, problems: list[dict[str, Any]]) -> None:
        super().__init__("invalid request")
        self.problems = problems

    @classmethod
    def from_pydantic(cls, exc: ValidationError, where: str = "body") -> Invalid:
        return cls([{"loc": [where, *exc_loc], "msg": err["msg"], "type": err["type"]}
                    for err in exc.errors(include_url=False)
                    for exc_loc in [list(err["loc"])]])

    def response(self) -> Response:
        return Response(orjson.dumps({"detail": self.problems}), 422, JSON)
