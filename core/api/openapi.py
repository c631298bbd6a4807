"""The gateway's OpenAPI 3.1 document (``GET /openapi.json``): its public routes, request
bodies as the parser takes them (the schemas come from the parser's own msgspec structs,
so the document cannot drift from what is accepted), and the OpenAI-style error body every
4xx and 5xx carries. Clients generate SDKs from it; the fuzz tests drive the gateway from it.
"""

from __future__ import annotations

from typing import Any

import msgspec

from shuniu.core.api.openai import _ChatBody, _CompletionBody
from shuniu.core.version import __version__

__all__ = ["openapi_document"]

_RENAME = {
    "_ChatBody": "ChatCompletionRequest",
    "_CompletionBody": "CompletionRequest",
    "_Message": "ChatMessage",
    "_StreamOptions": "StreamOptions",
}

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}


_ANTHROPIC_ERROR = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {
        "type": {"const": "error"},
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
        },
    },
}

_BLOCK = {"type": "object", "required": ["type"], "properties": {"type": {"type": "string"}}}
_MESSAGES_REQUEST = {
    "type": "object",
    "required": ["model", "max_tokens", "messages"],
    "properties": {
        "model": {"type": "string", "minLength": 1},
        "max_tokens": {"type": "integer", "minimum": 1},
        "messages": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["role", "content"],
                "properties": {
                    "role": {"enum": ["user", "assistant"]},
                    "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": _BLOCK}]},
                },
            },
        },
        "system": {"anyOf": [{"type": "string"}, {"type": "array", "items": _BLOCK}]},
        "stop_sequences": {"type": "array", "items": {"type": "string"}},
        "stream": {"type": "boolean"},
        "temperature": {"type": "number", "minimum": 0, "maximum": 1},
        "top_p": {"type": "number"},
        "top_k": {"type": "integer"},
        "tools": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "input_schema"],
                "properties": {
                    "name": {"type": "string"},
                    "description": {"type": "string"},
                    "input_schema": {"type": "object"},
                },
            },
        },
        "tool_choice": {"type": "object", "required": ["type"], "properties": {"type": {"type": "string"}}},
        "metadata": {"type": "object"},
    },
}
"""Anthropic's Messages request, as :mod:`shuniu.core.api.anthropic` checks it."""

_RESPONSES_REQUEST = {
    "type": "object",
    "required": ["model", "input"],
    "properties": {
        "model": {"type": "string", "minLength": 1},
        "input": {
            "anyOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": {"type": "object"}}]
        },
        "instructions": {"type": "string"},
        "max_output_tokens": {"type": "integer", "minimum": 1},
        "temperature": {"type": "number", "minimum": 0, "maximum": 2},
        "top_p": {"type": "number"},
        "stream": {"type": "boolean"},
        "store": {"const": False},
        "tools": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["type", "name"],
                "properties": {"type": {"const": "function"}, "name": {"type": "string"}},
            },
        },
        "tool_choice": {"anyOf": [{"enum": ["auto", "none", "required"]}, {"type": "object"}]},
        "text": {"type": "object"},
        "reasoning": {"type": "object"},
        "metadata": {"type": "object"},
        "user": {"type": "string"},
    },
}
"""OpenAI's Responses request, the stateless part :mod:`shuniu.core.api.responses` serves."""


_TOKEN_IDS = {"type": "array", "items": {"type": "integer"}, "minItems": 1}
_TEXTS = {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1, "maxItems": 2048}
_EMBEDDINGS_REQUEST = {
    "type": "object",
    "required": ["model", "input"],
    "properties": {
        "model": {"type": "string", "minLength": 1},
        "input": {
            "anyOf": [
                {"type": "string", "minLength": 1},
                _TEXTS,
                _TOKEN_IDS,
                {"type": "array", "items": _TOKEN_IDS, "minItems": 1, "maxItems": 2048},
            ]
        },
        "encoding_format": {"enum": ["float", "base64"]},
        "dimensions": {"type": "integer", "minimum": 1},
        "user": {"type": "string"},
    },
}
"""OpenAI's embeddings request (:mod:`shuniu.core.api.pooling`)."""
_DOCUMENTS = {
    "type": "array",
    "items": {
        "anyOf": [
            {"type": "string"},
            {"type": "object", "required": ["text"], "properties": {"text": {"type": "string"}}},
        ]
    },
    "minItems": 1,
    "maxItems": 2048,
}
_RERANK_REQUEST = {
    "type": "object",
    "required": ["model", "query", "documents"],
    "properties": {
        "model": {"type": "string", "minLength": 1},
        "query": {"type": "string", "minLength": 1},
        "documents": _DOCUMENTS,
        "top_n": {"type": "integer", "minimum": 0},
        "return_documents": {"type": "boolean"},
    },
}
"""The rerank request vLLM, TEI (through shuniu), Jina and Cohere share."""
_SCORE_REQUEST = {
    "type": "object",
    "required": ["model", "text_1", "text_2"],
    "properties": {
        "model": {"type": "string", "minLength": 1},
        "text_1": {"anyOf": [{"type": "string"}, _DOCUMENTS]},
        "text_2": {"anyOf": [{"type": "string"}, _DOCUMENTS]},
    },
}
"""vLLM's score request."""


def _errors(*statuses: int, schema: str = "Error") -> dict[str, Any]:
    ref = {"content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}}}
    what = "An Anthropic-style error." if schema == "AnthropicError" else "An OpenAI-style error."
    return {str(s): {"description": what, **ref} for s in statuses}


def _inference(summary: str, schema: str, error: str = "Error", *, streams: bool = True) -> dict[str, Any]:
    answer: dict[str, Any] = {"application/json": {"schema": {"type": "object"}}}
    if streams:
        answer["text/event-stream"] = {"schema": {"type": "string"}}
    return {
        "post": {
            "summary": summary,
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}},
            },
            "responses": {
                "200": {
                    "description": "The answer: JSON, or Server-Sent Events when `stream` is true."
                    if streams
                    else "The answer (JSON).",
                    "content": answer,
                },
                **_errors(400, 401, 403, 404, 413, 429, 431, 502, 503, 504, schema=error),
            },
        }
    }


def _get(summary: str, content_type: str = "application/json", *errors: int) -> dict[str, Any]:
    schema = {"type": "object"} if content_type == "application/json" else {"type": "string"}
    return {
        "get": {
            "summary": summary,
            "responses": {
                "200": {"description": summary, "content": {content_type: {"schema": schema}}},
                **_errors(*errors),
            },
        }
    }


def openapi_document() -> dict[str, Any]:
    """The document, built once per gateway."""
    _, components = msgspec.json.schema_components(
        [_ChatBody, _CompletionBody], ref_template="#/components/schemas/{name}"
    )
    text = msgspec.json.encode(components).decode()
    for old, new in _RENAME.items():
        text = text.replace(f'"{old}"', f'"{new}"').replace(f'/{old}"', f'/{new}"')
    schemas = msgspec.json.decode(text)
    schemas["Error"] = _ERROR
    schemas["MessagesRequest"] = _MESSAGES_REQUEST
    schemas["AnthropicError"] = _ANTHROPIC_ERROR
    schemas["ResponsesRequest"] = _RESPONSES_REQUEST
    schemas["CountTokensRequest"] = {**_MESSAGES_REQUEST, "required": ["model", "messages"]}
    schemas["EmbeddingsRequest"] = _EMBEDDINGS_REQUEST
    schemas["RerankRequest"] = _RERANK_REQUEST
    schemas["ScoreRequest"] = _SCORE_REQUEST
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "shuniu gateway",
            "version": __version__,
            "description": "An OpenAI-compatible gateway. Errors are OpenAI-style JSON bodies.",
        },
        "paths": {
            "/v1/chat/completions": _inference("Chat completions (OpenAI)", "ChatCompletionRequest"),
            "/v1/completions": _inference("Text completions (OpenAI)", "CompletionRequest"),
            "/v1/messages": _inference("Messages (Anthropic)", "MessagesRequest", "AnthropicError"),
            "/v1/messages/count_tokens": _inference(
                "Count a Messages request's input tokens (Anthropic)", "CountTokensRequest", "AnthropicError"
            ),
            "/v1/responses": _inference("Responses (OpenAI), stateless", "ResponsesRequest"),
            "/v1/embeddings": _inference("Embeddings (OpenAI)", "EmbeddingsRequest", streams=False),
            "/v1/rerank": _inference("Rerank documents against a query", "RerankRequest", streams=False),
            "/v2/rerank": _inference("Rerank (Cohere's path)", "RerankRequest", streams=False),
            "/v1/score": _inference("Score text pairs (vLLM)", "ScoreRequest", streams=False),
            "/v1/models": _get("The models this gateway serves, with their aliases"),
            "/health": _get("Liveness of the gateway process"),
            "/ready": _get(
                "Readiness: started, not draining, a healthy endpoint per model", "application/json", 503
            ),
            "/status.json": _get("The status page's data", "application/json", 401),
            "/metrics": _get("Prometheus metrics", "text/plain", 401),
            "/openapi.json": _get("This document"),
        },
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{}, {"bearer": []}],
    }
