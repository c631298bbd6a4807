"""The pooling APIs' wire format: ``/v1/embeddings`` (OpenAI's), ``/v1/rerank`` (the
Jina/Cohere shape vLLM and TEI serve) and ``/v1/score`` (vLLM's).

A request is checked and counted here into an :class:`~shuniu.core.types.InferenceRequest`
with a :class:`~shuniu.core.types.PoolingJob` (``api`` ``embeddings``, ``rerank`` or
``score``); engines answer with :class:`~shuniu.core.types.Embeddings` or
:class:`~shuniu.core.types.Scores`, which are written back in the API's shape. The parts of a
split request are made (:func:`split`) and put back together (:func:`merge`) here too.

Vectors an engine sent as JSON are kept as raw JSON (``msgspec.Raw``) and written out as
they came: a gateway in front of an embedding service does not parse and re-print every
float.
"""

from __future__ import annotations

import base64
import struct
import time
from typing import Any

import msgspec

from shuniu.core.api.openai import decode_body
from shuniu.core.errors import GatewayError, bad_request
from shuniu.core.tokens import count_tokens
from shuniu.core.types import Embeddings, InferenceRequest, PoolingJob, Scores

__all__ = [
    "encode_embeddings",
    "encode_rerank",
    "encode_score",
    "floats_of",
    "merge",
    "parse_embeddings",
    "parse_rerank",
    "parse_score",
    "split",
    "to_base64",
]

_encode = msgspec.json.Encoder().encode
_decode_floats = msgspec.json.Decoder(list[float]).decode

MAX_INPUTS = 2048
"""The most inputs (or documents) one request may carry, as OpenAI's embeddings API allows."""

_FORMATS = frozenset({"float", "base64"})


def _missing(param: str) -> GatewayError:
    return bad_request(f"Missing required parameter: '{param}'.", param, "missing_required_parameter")


def _model(body: dict[str, Any]) -> str:
    model = body.get("model")
    if model is None:
        raise _missing("model")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' must be a non-empty string.", "model", "invalid_value")
    return model


def _no_stream(body: dict[str, Any], api: str) -> None:
    if body.get("stream"):
        raise bad_request(
            f"The {api} API does not stream; send 'stream': false.", "stream", "unsupported_value"
        )


def _too_many(param: str, n: int) -> GatewayError:
    return bad_request(
        f"'{param}' has {n} entries; at most {MAX_INPUTS} are accepted per request.", param, "too_many_inputs"
    )


def _request(
    body: dict[str, Any],
    api: str,
    request_id: str,
    now: float,
    model: str,
    job: PoolingJob,
    prompt: str,
) -> InferenceRequest:
    return InferenceRequest(
        id=request_id,
        api=api,  # type: ignore[arg-type]  # one of the pooling APIs
        model=model,
        body=body,
        prompt=prompt,
        prompt_tokens=sum(job.tokens),
        max_tokens=0,
        arrival=now,
        wire=api,
        pooling=job,
        priority=body["priority"] if type(body.get("priority")) is int else 0,
    )


# -- embeddings --------------------------------------------------------------------------


def parse_embeddings(raw: bytes, request_id: str, now: float) -> InferenceRequest:
    """``POST /v1/embeddings``: ``input`` as a string, a list of strings, a list of token
    ids or a list of lists of token ids; ``encoding_format``; ``dimensions``."""
    body = decode_body(raw)
    model = _model(body)
    _no_stream(body, "embeddings")
    if "input" not in body:
        raise _missing("input")
    value = body["input"]
    texts: list[str] | None = None
    ids: list[list[int]] | None = None
    if isinstance(value, str):
        texts = [value]
    elif isinstance(value, list) and value:
        first = value[0]
        if isinstance(first, str) and all(isinstance(v, str) for v in value):
            texts = value
        elif type(first) is int and all(type(v) is int for v in value):
            ids = [value]
        elif isinstance(first, list) and all(
            isinstance(v, list) and v and all(type(t) is int for t in v) for v in value
        ):
            ids = value
    if texts is None and ids is None:
        raise bad_request(
            "'input' must be a non-empty string, a list of strings, a list of token ids, or a "
            "list of lists of token ids.",
            "input",
            "invalid_type",
        )
    if texts is not None:
        for i, text in enumerate(texts):
            if not text:
                where = "input" if isinstance(value, str) else f"input[{i}]"
                raise bad_request(f"'{where}' must not be an empty string.", where, "invalid_value")
        tokens = [count_tokens(t) for t in texts]
        prompt = "\n".join(texts)
    else:
        assert ids is not None
        tokens = [len(v) for v in ids]
        prompt = ""
    if len(tokens) > MAX_INPUTS:
        raise _too_many("input", len(tokens))
    fmt = body.get("encoding_format", "float")
    if fmt is None:
        fmt = "float"
    if not isinstance(fmt, str) or fmt not in _FORMATS:
        raise bad_request(
            f"Invalid value for 'encoding_format': {fmt!r}; expected 'float' or 'base64'.",
            "encoding_format",
            "invalid_value",
        )
    dimensions = body.get("dimensions")
    if dimensions is not None and (type(dimensions) is not int or dimensions < 1):
        raise bad_request("'dimensions' must be a positive integer.", "dimensions", "invalid_value")
    if "user" in body and not isinstance(body["user"], str):
        raise bad_request("'user' must be a string.", "user", "invalid_type")
    job = PoolingJob(texts=texts, ids=ids, tokens=tokens, encoding_format=fmt, dimensions=dimensions)
    return _request(body, "embeddings", request_id, now, model, job, prompt)


def to_base64(vector: Any) -> str:
    """A vector (floats, or their JSON) as OpenAI's base64: little-endian float32 bytes."""
    floats = floats_of(vector)
    return base64.b64encode(struct.pack(f"<{len(floats)}f", *floats)).decode("ascii")


def floats_of(vector: Any) -> list[float]:
    """A vector as floats, whichever way an engine sent it (floats, raw JSON, base64)."""
    if isinstance(vector, msgspec.Raw):
        return _decode_floats(vector)
    if isinstance(vector, str):
        data = base64.b64decode(vector)
        return list(struct.unpack(f"<{len(data) // 4}f", data))
    return list(vector)


class _EmbeddingItem(msgspec.Struct, kw_only=True):
    object: str = "embedding"
    index: int
    embedding: Any


class _Usage(msgspec.Struct):
    prompt_tokens: int
    total_tokens: int


class _EmbeddingsBody(msgspec.Struct, kw_only=True):
    object: str = "list"
    data: list[_EmbeddingItem]
    model: str
    usage: _Usage


def encode_embeddings(req: InferenceRequest, result: Embeddings) -> bytes:
    """OpenAI's embeddings response, vectors in input order."""
    job = req.pooling
    assert job is not None
    vectors = result.vectors
    if job.encoding_format == "base64":
        vectors = [v if isinstance(v, str) else to_base64(v) for v in vectors]
    p = result.prompt_tokens
    return _encode(
        _EmbeddingsBody(
            data=[_EmbeddingItem(index=i, embedding=v) for i, v in enumerate(vectors)],
            model=req.model,
            usage=_Usage(p, p),
        )
    )


# -- rerank and score --------------------------------------------------------------------


def _documents(value: Any, param: str) -> list[str]:
    """Documents as strings or ``{"text": ...}`` objects (Cohere's and Jina's forms)."""
    if not isinstance(value, list) or not value:
        raise bad_request(f"'{param}' must be a non-empty list of strings.", param, "invalid_type")
    out: list[str] = []
    for i, doc in enumerate(value):
        if isinstance(doc, dict) and isinstance(doc.get("text"), str):
            doc = doc["text"]
        if not isinstance(doc, str):
            raise bad_request(
                f"'{param}[{i}]' must be a string (or an object with a string 'text').",
                f"{param}[{i}]",
                "invalid_type",
            )
        out.append(doc)
    if len(out) > MAX_INPUTS:
        raise _too_many(param, len(out))
    return out


def _pair_job(queries: list[str], docs: list[str]) -> PoolingJob:
    query_tokens = {q: count_tokens(q) for q in set(queries)}
    if len(queries) == 1:
        q = query_tokens[queries[0]]
        tokens = [q + count_tokens(d) for d in docs]
    else:
        tokens = [query_tokens[q] + count_tokens(d) for q, d in zip(queries, docs, strict=True)]
    return PoolingJob(texts=docs, queries=queries, tokens=tokens)


def parse_rerank(raw: bytes, request_id: str, now: float) -> InferenceRequest:
    """``POST /v1/rerank``: ``query``, ``documents``, ``top_n`` (0 or absent: all),
    ``return_documents`` (default true)."""
    body = decode_body(raw)
    model = _model(body)
    _no_stream(body, "rerank")
    query = body.get("query")
    if query is None:
        raise _missing("query")
    if not isinstance(query, str) or not query:
        raise bad_request("'query' must be a non-empty string.", "query", "invalid_value")
    if "documents" not in body:
        raise _missing("documents")
    docs = _documents(body["documents"], "documents")
    top_n = body.get("top_n")
    if top_n is not None and (type(top_n) is not int or top_n < 0):
        raise bad_request("'top_n' must be a non-negative integer.", "top_n", "invalid_value")
    back = body.get("return_documents", True)
    if not isinstance(back, bool):
        raise bad_request("'return_documents' must be a boolean.", "return_documents", "invalid_type")
    job = _pair_job([query], docs)
    return _request(body, "rerank", request_id, now, model, job, query + "\n" + "\n".join(docs))


def parse_score(raw: bytes, request_id: str, now: float) -> InferenceRequest:
    """``POST /v1/score`` (vLLM's): ``text_1`` and ``text_2``, each a string or a list;
    one ``text_1`` is scored against every ``text_2``, or lists of equal length pairwise."""
    body = decode_body(raw)
    model = _model(body)
    _no_stream(body, "score")
    for param in ("text_1", "text_2"):
        if param not in body:
            raise _missing(param)
    first = body["text_1"]
    second = body["text_2"]
    queries = _documents([first] if isinstance(first, str) else first, "text_1")
    docs = _documents([second] if isinstance(second, str) else second, "text_2")
    if len(queries) != 1 and len(queries) != len(docs):
        raise bad_request(
            f"'text_1' has {len(queries)} entries and 'text_2' {len(docs)}: send one 'text_1', "
            "or as many as 'text_2' (scored pairwise).",
            "text_1",
            "invalid_value",
        )
    job = _pair_job(queries, docs)
    prompt = "\n".join(queries) + "\n" + "\n".join(docs)
    return _request(body, "score", request_id, now, model, job, prompt)


class _Document(msgspec.Struct):
    text: str


class _RerankResult(msgspec.Struct, omit_defaults=True):
    index: int
    relevance_score: float
    document: _Document | None = None


class _RerankUsage(msgspec.Struct):
    total_tokens: int


class _RerankBody(msgspec.Struct):
    id: str
    model: str
    usage: _RerankUsage
    results: list[_RerankResult]


def encode_rerank(req: InferenceRequest, result: Scores) -> bytes:
    """The rerank response (vLLM's and Jina's shape): the documents by descending relevance,
    the first ``top_n``."""
    job = req.pooling
    assert job is not None and job.texts is not None
    docs = job.texts
    order = sorted(range(len(result.scores)), key=lambda i: (-result.scores[i], i))
    top_n = req.body.get("top_n") or len(order)
    back = req.body.get("return_documents", True)
    results = [
        _RerankResult(i, result.scores[i], _Document(docs[i]) if back else None) for i in order[:top_n]
    ]
    return _encode(_RerankBody("rerank-" + req.id, req.model, _RerankUsage(result.prompt_tokens), results))


class _ScoreItem(msgspec.Struct, kw_only=True):
    index: int
    object: str = "score"
    score: float


class _ScoreUsage(msgspec.Struct):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int = 0


class _ScoreBody(msgspec.Struct, kw_only=True):
    id: str
    object: str = "list"
    created: int
    model: str
    data: list[_ScoreItem]
    usage: _ScoreUsage


def encode_score(req: InferenceRequest, result: Scores) -> bytes:
    """vLLM's score response: one score per pair, in ``text_2`` order."""
    p = result.prompt_tokens
    data = [_ScoreItem(index=i, score=s) for i, s in enumerate(result.scores)]
    body = _ScoreBody(
        id="score-" + req.id, created=int(time.time()), model=req.model, data=data, usage=_ScoreUsage(p, p)
    )
    return _encode(body)


# -- splitting ---------------------------------------------------------------------------


def split(req: InferenceRequest, size: int) -> list[InferenceRequest]:
    """``req`` as parts of at most ``size`` inputs (itself when it is no longer), each with
    its slice of the inputs in both the job and the body engines receive."""
    job = req.pooling
    assert job is not None
    n = job.size
    if n <= size:
        return [req]
    parts: list[InferenceRequest] = []
    for k, start in enumerate(range(0, n, size)):
        end = min(start + size, n)
        tokens = job.tokens[start:end]
        queries = job.queries if len(job.queries) <= 1 else job.queries[start:end]
        part_job = msgspec.structs.replace(
            job,
            texts=job.texts[start:end] if job.texts is not None else None,
            ids=job.ids[start:end] if job.ids is not None else None,
            tokens=tokens,
            queries=queries,
            offset=start,
        )
        body = dict(req.body)
        if req.api == "embeddings":
            body["input"] = part_job.texts if part_job.texts is not None else part_job.ids
        elif req.api == "rerank":
            body["documents"] = part_job.texts
            body.pop("top_n", None)
        else:
            body["text_1"] = queries[0] if len(queries) == 1 else queries
            body["text_2"] = part_job.texts
        parts.append(
            msgspec.structs.replace(
                req,
                id=f"{req.id}-{k}",
                body=body,
                prompt="\n".join(part_job.texts) if part_job.texts is not None else "",
                prompt_tokens=sum(tokens),
                pooling=part_job,
                prefix_hashes=None,
            )
        )
    return parts


def merge(results: list[Any]) -> Embeddings | Scores:
    """The parts' answers (in part order) as one."""
    first = results[0]
    tokens = sum(r.prompt_tokens for r in results)
    if isinstance(first, Embeddings):
        return Embeddings([v for r in results for v in r.vectors], tokens)
    return Scores([s for r in results for s in r.scores], tokens)
