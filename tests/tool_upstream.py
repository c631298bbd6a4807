"""An OpenAI-compatible chat server that always calls one function: a whole answer, or a
stream whose arguments arrive in two pieces (as vLLM streams them), with the usage last.
The tests of the APIs translated onto chat (Anthropic Messages, Responses) check that tool
calls survive the translation both ways."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from tests.threaded_app import ThreadedApp

__all__ = ["ToolCallingUpstream"]


class ToolCallingUpstream(ThreadedApp):
    """Calls ``name`` with ``arguments`` (JSON text) after saying ``text`` (or nothing);
    reports ``usage`` (prompt, completion tokens). Keeps the bodies it received."""

    def __init__(
        self, name: str, arguments: str, *, call_id: str, text: str | None, usage: tuple[int, int]
    ) -> None:
        super().__init__()
        self.name, self.arguments, self.call_id, self.text = name, arguments, call_id, text
        self.usage = {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}
        self.bodies: list[dict[str, Any]] = []

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self.chat)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        function = {"name": self.name, "arguments": self.arguments}
        call = {"id": self.call_id, "type": "function", "function": function}
        if not body.get("stream"):
            message = {"role": "assistant", "content": self.text, "tool_calls": [call]}
            choice = {"index": 0, "message": message, "finish_reason": "tool_calls"}
            return web.json_response(
                {"id": "x", "object": "chat.completion", "choices": [choice], "usage": self.usage}
            )
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        half = len(self.arguments) // 2
        first = {"index": 0, **call, "function": {"name": self.name, "arguments": self.arguments[:half]}}
        rest = {"index": 0, "function": {"arguments": self.arguments[half:]}}
        deltas: list[tuple[dict[str, Any], str | None]] = [
            ({"role": "assistant", "content": self.text} if self.text else {"role": "assistant"}, None),
            ({"tool_calls": [first]}, None),
            ({"tool_calls": [rest]}, None),
            ({}, "tool_calls"),
        ]
        for delta, finish in deltas:
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            chunk = {"id": "x", "object": "chat.completion.chunk", "choices": [choice]}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        tail = {"id": "x", "object": "chat.completion.chunk", "choices": [], "usage": self.usage}
        await resp.write(b"data: " + json.dumps(tail).encode() + b"\n\ndata: [DONE]\n\n")
        return resp
