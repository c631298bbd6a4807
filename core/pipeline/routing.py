"""Routing: which pool serves a request. The model name (or alias) the client sent, the
tier's degradation while that pool is overloaded, the model's routing rules and version
split (:class:`~shuniu.core.pipeline.router.Router`), and the chosen pool's context window.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from shuniu.core.contracts import Classifier
from shuniu.core.errors import (
    api_not_served,
    context_too_long,
    input_too_long,
    model_not_found,
    unsupported_modality,
)
from shuniu.core.pipeline.degradation import OverloadMonitor, degrade
from shuniu.core.pipeline.router import Router
from shuniu.core.pools.pool import Pool
from shuniu.core.tenancy.tenancy import Tier
from shuniu.core.types import InferenceRequest

__all__ = ["check_context", "check_modalities", "check_served", "classify", "lookup", "route"]

log = logging.getLogger("shuniu.routing")


def lookup(routes: Mapping[str, Pool], req: InferenceRequest) -> Pool:
    """The pool the request's model names (404 when the gateway serves no such model)."""
    pool = routes.get(req.model)
    if pool is None:
        raise model_not_found(req.model)
    return pool


def check_served(req: InferenceRequest, pool: Pool, pools: Mapping[str, Pool]) -> None:
    """400 when the model does not serve the request's API (embeddings sent to a chat model,
    chat sent to an embedding model), naming the models that do."""
    if req.api not in pool.serves:
        others = sorted(name for name, p in pools.items() if req.api in p.serves)
        raise api_not_served(req.model, pool.name, req.api, sorted(pool.serves), others)


def route(
    req: InferenceRequest,
    tier: Tier | None,
    pool: Pool,
    pools: Mapping[str, Pool],
    router: Router,
    overload: OverloadMonitor,
) -> tuple[Pool, bytes | None]:
    """The pool that serves ``req`` and what degradation did (``None``: nothing), with
    ``req.version`` set when the pool splits traffic. Raises 503 when the tier is shed,
    400 for an unknown pinned version or a prompt that does not fit."""
    degraded = None
    if (
        tier is not None
        and tier.degrade is not None
        and overload.degraded(pool.name, tier.name, tier.degrade)
    ):
        pool, degraded = degrade(req, tier, pool, pools, overload)
    pool = router.resolve(req, pool)
    check_modalities(req, pool)
    check_context(req, pool)
    return pool, degraded


async def classify(req: InferenceRequest, classifier: Classifier) -> None:
    """Label ``req`` with the model's classifier (a classifier that fails gives no label: it
    must not fail the request)."""
    try:
        req.label = await classifier.classify(req)
    except Exception:
        log.debug("the classifier failed on request %s", req.id, exc_info=True)
        req.label = None


def check_modalities(req: InferenceRequest, pool: Pool) -> None:
    """400 when the request carries input (images, audio, video, files) the pool's model
    does not take: it is never sent to an engine that would ignore or reject it."""
    missing = req.modalities - pool.accepts
    if missing:
        raise unsupported_modality(req.model, pool.name, sorted(missing), sorted(pool.accepts))


def check_context(req: InferenceRequest, pool: Pool) -> None:
    """400 when the prompt plus ``max_tokens`` exceed the pool's context window."""
    limit = pool.max_model_len
    if limit is None:
        return
    job = req.pooling
    if job is not None:
        body = req.body
        if body.get("truncate_prompt_tokens") is not None or body.get("truncate") is True:
            return  # the engine truncates inputs that are too long
        for i, tokens in enumerate(job.tokens):
            if tokens > limit:
                param = (
                    "input" if req.api == "embeddings" else "documents" if req.api == "rerank" else "text_2"
                )
                raise input_too_long(limit, job.offset + i, tokens, param)
        return
    wanted = req.max_tokens or 0
    if req.prompt_tokens + wanted > limit or req.prompt_tokens >= limit:
        raise context_too_long(limit, req.prompt_tokens, wanted)
