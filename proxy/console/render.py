"""Rendering a console page: the template with the person, their CSRF token and the notice a
change left (a fixed word in the query, mapped to text here: nothing of the URL is echoed);
and the answer to a change (303 back on success, the API's own words and status if not)."""

from __future__ import annotations

from typing import Any

from quart import Response, render_template, request

from proxy.console.api import Answer
from proxy.console.guard import csrf_token
from proxy.people.accounts import User
from proxy.people.signin import COOKIE, see_other

NOTICES = {
    "created": "Created.", "saved": "Saved.", "deleted": "Deleted.", "revoked": "Revoked.",
    "disconnected": "Disconnected.", "approved": "Approved: the call runs.",
    "denied": "Denied: the caller is told, with your comment.",
    "ended": "Ended: their sessions are over and their upstream accounts revoked.",
}


async def render(template: str, user: User, status: int = 200, **context: Any) -> Response:
    body = await render_template(template, me=user,
                                 csrf=csrf_token(request.cookies.get(COOKIE, "")),
                                 notice=NOTICES.get(request.args.get("done", "")),
                                 here=request.path, **context)
    return Response(body, status, {"Content-Type": "text/html; charset=utf-8"})


async def after(answer: Answer, user: User, back: str, done: str) -> Response:
    """A change's answer: back to `back` with a notice, or the API's reason."""
    if answer.ok:
        return see_other(f"{back}?done={done}")
    return await render("message.html", user, max(answer.status, 400),
                        title="Not done", message=answer.detail, back=back)


async def confirmed(user: User, title: str, removes: list[str], back: str,
                    button: str) -> Response | None:
    """A destructive change's confirmation: None once the person confirmed (the form's
    `confirm`), else a page naming what the change removes, whose button sends the same
    form to the same place again, confirmed."""
    form = await request.form
    if form.get("confirm") == "yes":
        return None
    raw = request.scope.get("raw_path")  # the path as sent: a name's %23 or %2F kept
    action = raw.partition(b"?")[0].decode("latin-1") if isinstance(raw, bytes) \
        else request.path
    return await render("confirm.html", user, title=title, removes=removes, back=back,
                        button=button, action=action)


def words(value: str | None) -> list[str]:
    """A form field of names, separated by commas, spaces or new lines."""
    return [w for w in (value or "").replace(",", " ").split() if w]
