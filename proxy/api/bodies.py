"""JSON in and out of /api/v1: the request body validated by a model (one 422 listing every
problem found) and the JSON answer."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError
from quart import Response, request

from proxy.errors import Invalid

M = TypeVar("M", bound=BaseModel)
Problems = list[dict[str, Any]]
# A check of the raw body (a JSON object) beside the model: the problems it finds
Check = Callable[[dict[str, Any]], Awaitable[Problems]]
JSON = {"Content-Type": "application/json", "Cache-Control": "no-store"}


def json_response(body: Any, status: int = 200) -> Response:
    if isinstance(body, BaseModel):
        payload = body.model_dump_json().encode()
    else:
        payload = orjson.dumps(body, default=_dump)
    return Response(payload, status, JSON)


def _dump(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    raise TypeError


async def read(model: type[M], *checks: Check) -> M:
    """The request body validated by `model`, or one 422 listing every problem found: the
    model's first, then each check's, in order. The checks see the raw JSON object and run
    even when the model failed (so a body name that differs from the path is listed beside a
    bad field); they are skipped when the body is no JSON object (the model says so). A check
    looks only at values of the right type, and leaves the wrong ones to the model."""
    raw = await request.get_data()
    try:
        data = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        raise Invalid([{"loc": ["body"], "msg": "the body is not JSON",
                        "type": "json_invalid"}]) from None
    problems: Problems = []
    try:
        body = model.model_validate(data)
    except ValidationError as exc:
        problems = Invalid.from_pydantic(exc).problems
    if isinstance(data, dict):
        for check in checks:
            problems += await check(data)
    if problems:
        raise Invalid(problems)
    return body


def same_as_path(field: str, value: str) -> Check:
    """A check for `read`: the body's `field`, if it is a string, is the path's `value` (a
    PUT cannot rename). Left out or null, it is the model's to require or allow."""

    async def check(data: dict[str, Any]) -> Problems:
        sent = data.get(field)
        return [{"loc": ["body", field], "msg": f"the {field} differs from the path",
                 "type": "value_error"}] if isinstance(sent, str) and sent != value else []

    return check
