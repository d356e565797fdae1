"""Who is asking: every handler acts for the visitor of its request, through a studio bound to them.

A visitor is named by their login (`--auth`: gradio's `request.username`), else their Hugging Face sign-in (a Space's
OAuth session), else, on a Space, the Hub user of the token an API client passes (`Client(url, oauth_token=...)`,
or an `Authorization: Bearer` header: MCP clients); otherwise they are anonymous. Never by their address.
`Studio.as_visitor` then decides what that visitor sees.

    @per_visitor
    def stop(self, run: str | None = None, request: gr.Request | None = None) -> str:
        self.studio.stop(run)  # this tab's studio, acting for the visitor of `request`
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import time
from collections.abc import Callable
from typing import Any

import gradio as gr

from finetune.studio import Studio


def signed_in_user(request: gr.Request | None) -> str | None:
    """The Hugging Face user signed in with the page's login button (a Space's OAuth session), if any."""
    underlying = getattr(request, "request", None) if request is not None else None
    scope = getattr(underlying, "scope", None)
    session = scope.get("session") if isinstance(scope, dict) else None
    info = session.get("oauth_info") if isinstance(session, dict) else None
    if not isinstance(info, dict) or (info.get("expires_at") or float("inf")) < time.time():
        return None
    name = (info.get("userinfo") or {}).get("preferred_username")
    return str(name) if name else None


def visitor_name(request: gr.Request | None, oauth_token: Any = None, studio: Studio | None = None) -> str | None:
    """The visitor's name (login, Hugging Face sign-in, or on a Space the owner of an API client's token), or None
    for an anonymous visitor."""
    if request is not None and getattr(request, "username", None):
        return str(request.username)
    user = signed_in_user(request)
    if user:
        return user
    token = getattr(oauth_token, "token", None) or _bearer(request)
    if token and studio is not None and studio.policy.space:
        return studio.token_user(token)
    return None


def _bearer(request: gr.Request | None) -> str | None:
    """The Hugging Face token an MCP client sends as `Authorization: Bearer hf_…`. Not gradio_client's
    `x-hf-authorization`: that is whatever token the client's machine holds, sent to reach a private Space (gradio's
    MCP server sends the server's own with every tool call); an API client names itself with `oauth_token=`."""
    headers = getattr(request, "headers", None) or {}
    value = str(headers.get("authorization") or "")
    return value[7:].strip() or None if value.lower().startswith("bearer ") else None


def for_visitor(studio: Studio, request: gr.Request | None, oauth_token: Any = None) -> Studio:
    """The studio acting for the visitor of `request`."""
    return studio.as_visitor(visitor_name(request, oauth_token, studio))


def per_visitor(method: Callable) -> Callable:
    """Run a tab's handler (a method of a dataclass with a `studio`) on a copy of the tab whose studio acts for the
    visitor of its `request` argument (and `oauth_token`, where the handler takes one). The handler keeps its own
    signature, so gradio still fills in `request`."""
    signature = inspect.signature(method)

    def visiting(args: tuple, kwargs: dict) -> tuple[Any, tuple, dict]:
        bound = signature.bind(*args, **kwargs)
        tab, *rest = bound.args
        request, token = bound.arguments.get("request"), bound.arguments.get("oauth_token")
        if request is None and token is None:  # a call from another handler (or a test): its studio as it is
            return tab, tuple(rest), bound.kwargs
        return dataclasses.replace(tab, studio=for_visitor(tab.studio, request, token)), tuple(rest), bound.kwargs

    if inspect.isgeneratorfunction(method):

        @functools.wraps(method)
        def streaming(*args: Any, **kwargs: Any) -> Any:
            tab, rest, named = visiting(args, kwargs)
            yield from method(tab, *rest, **named)

        return streaming

    @functools.wraps(method)
    def handler(*args: Any, **kwargs: Any) -> Any:
        tab, rest, named = visiting(args, kwargs)
        return method(tab, *rest, **named)

    return handler
