"""The ``kubernetes`` discovery source against a fake API server (tests/fake_kube_api.py):
list then watch, readiness, pod labels, a dropped watch resumed from its version, an
expired version (as an ERROR event and as HTTP 410) answered with a fresh list, and the
API server's refusals."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path

import pytest

from shuniu.core.contracts import Target
from shuniu.plugins.discovery.kubernetes import (
    KubeApiError,
    KubernetesDiscovery,
    KubernetesOptions,
    slice_targets,
)
from tests.fake_kube_api import FakeKubeApi, SliceEndpoint


@pytest.fixture
def api() -> Iterator[FakeKubeApi]:
    fake = FakeKubeApi(token="s3cret").start()
    yield fake
    fake.stop()


def _source(api: FakeKubeApi, tmp_path: Path, **options: object) -> KubernetesDiscovery:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    return KubernetesDiscovery(
        KubernetesOptions.model_validate(
            {
                "service": "vllm",
                "namespace": "llm",
                "api_url": api.url,
                "token_file": str(token),
                **options,
            }
        )
    )


class Watching:
    """The sets a source yields, read in a task; ``next()`` waits for the next one."""

    def __init__(self, source: KubernetesDiscovery) -> None:
        self.source = source
        self.seen: asyncio.Queue[Sequence[Target]] = asyncio.Queue()
        self._gen: AsyncIterator[Sequence[Target]] = source.watch()
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        async for targets in self._gen:
            await self.seen.put(targets)

    async def next(self) -> dict[str, Target]:
        async with asyncio.timeout(10):
            targets = await self.seen.get()
        return {t.key: t for t in targets}

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        await self._gen.aclose()


async def _until(predicate: Callable[[], bool]) -> None:
    async with asyncio.timeout(10):
        while not predicate():  # noqa: ASYNC110 - the state changes in another thread
            await asyncio.sleep(0.01)


def _ready(targets: dict[str, Target]) -> set[str]:
    return {k for k, t in targets.items() if t.ready}


def test_a_slice_object_gives_one_target_per_endpoint() -> None:
    obj = {
        "endpoints": [
            {
                "addresses": ["10.0.0.1"],
                "conditions": {"ready": True},
                "targetRef": {"kind": "Pod", "name": "a"},
            },
            {
                "addresses": ["10.0.0.2"],
                "conditions": {},
                "targetRef": {"kind": "Pod", "name": "b"},
                "zone": "z1",
            },
            {"addresses": ["10.0.0.3"], "conditions": {"ready": False, "terminating": True}},
            {"addresses": [], "conditions": {"ready": True}},
        ],
        "ports": [{"name": "metrics", "port": 9090}, {"name": "http", "port": 8000}],
    }
    by_key = {t.key: t for t in slice_targets(obj, "http", {"a": {"version": "v2"}})}
    assert set(by_key) == {"a", "b", "10.0.0.3-8000"}
    assert by_key["a"].ready and by_key["a"].labels == {"version": "v2"} and by_key["a"].port == 8000
    assert by_key["b"].ready and by_key["b"].labels == {"zone": "z1"}  # no condition: ready
    assert not by_key["10.0.0.3-8000"].ready
    assert {t.port for t in slice_targets(obj, None, {})} == {9090}  # default: the first port
    assert slice_targets(obj, "grpc", {}) == []  # the slice has no such port


async def test_list_then_watch_follows_pods_becoming_ready_and_going(
    api: FakeKubeApi, tmp_path: Path
) -> None:
    api.add_pod("vllm-0", {"app.kubernetes.io/version": "v7", "shuniu.io/hardware": "h200"})
    api.apply_slice("vllm-abc", "vllm", 8000, [SliceEndpoint("vllm-0", "10.1.0.5", zone="zone-a", node="n1")])
    api.apply_slice("other-xyz", "other", 8000, [SliceEndpoint("other-0", "10.1.0.9")])
    w = Watching(_source(api, tmp_path))
    try:
        first = await w.next()
        assert set(first) == {"vllm-0"}  # the other Service's slice is not ours
        t = first["vllm-0"]
        assert (t.host, t.port, t.ready) == ("10.1.0.5", 8000, True)
        assert t.labels == {"zone": "zone-a", "node": "n1", "version": "v7", "hardware": "h200"}
        api.apply_slice(
            "vllm-abc",
            "vllm",
            8000,
            [
                SliceEndpoint("vllm-0", "10.1.0.5", zone="zone-a", node="n1"),
                SliceEndpoint("vllm-1", "10.1.0.6", ready=False),
            ],
        )
        second = await w.next()
        assert set(second) == {"vllm-0", "vllm-1"} and _ready(second) == {"vllm-0"}
        api.apply_slice("vllm-def", "vllm", 8000, [SliceEndpoint("vllm-2", "10.1.0.7")])
        assert _ready(await w.next()) == {"vllm-0", "vllm-2"}
        api.delete_slice("vllm-def")
        assert set(await w.next()) == {"vllm-0", "vllm-1"}
        assert api.requests.lists == 1 and api.requests.unauthorized == 0
        # Each pod was read once, and the pod without one is read and found missing once.
        assert sorted(api.requests.pods) == ["vllm-0", "vllm-1", "vllm-2"]
    finally:
        await w.close()


async def test_a_dropped_watch_resumes_from_the_last_version_without_listing(
    api: FakeKubeApi, tmp_path: Path
) -> None:
    api.apply_slice("vllm-abc", "vllm", 8000, [SliceEndpoint("vllm-0", "10.1.0.5")])
    w = Watching(_source(api, tmp_path, pod_labels={}))
    try:
        await w.next()
        version = api.apply_slice(
            "vllm-abc", "vllm", 8000, [SliceEndpoint("vllm-0", "10.1.0.5", ready=False)]
        )
        assert _ready(await w.next()) == set()
        api.drop_watches()
        api.apply_slice("vllm-abc", "vllm", 8000, [SliceEndpoint("vllm-0", "10.1.0.5")])
        assert _ready(await w.next()) == {"vllm-0"}
        assert api.requests.lists == 1
        # The second watch resumed from the version of the last event the first delivered.
        assert str(version) in api.requests.watches[1:]
        assert api.requests.pods == []  # pod_labels: {} never reads pods
    finally:
        await w.close()


@pytest.mark.parametrize("as_status", [False, True], ids=["ERROR event", "HTTP 410"])
async def test_an_expired_version_starts_over_with_a_fresh_list(tmp_path: Path, as_status: bool) -> None:
    api = FakeKubeApi(token="s3cret", expire_as_status=as_status).start()
    try:
        api.apply_slice("vllm-abc", "vllm", 8000, [SliceEndpoint("vllm-0", "10.1.0.5")])
        w = Watching(_source(api, tmp_path, pod_labels={}))
        try:
            await w.next()
            await _until(lambda: api.open_watches == 1)
            # While the gateway is away: a pod leaves, another comes, and history is compacted.
            api.hold()
            api.apply_slice("vllm-abc", "vllm", 8000, [SliceEndpoint("vllm-1", "10.1.0.6")])
            api.compact()
            api.drop_watches()
            api.release()
            assert set(await w.next()) == {"vllm-1"}
            assert api.requests.lists == 2
        finally:
            await w.close()
    finally:
        api.stop()


async def test_a_bookmark_moves_the_resume_point(api: FakeKubeApi, tmp_path: Path) -> None:
    api.apply_slice("vllm-abc", "vllm", 8000, [SliceEndpoint("vllm-0", "10.1.0.5")])
    api.apply_slice("other-xyz", "other", 8000, [SliceEndpoint("other-0", "10.1.0.9")])
    source = _source(api, tmp_path, pod_labels={})
    w = Watching(source)
    try:
        await w.next()
        # Changes to other Services' slices move the store's version but send us nothing.
        api.apply_slice("other-xyz", "other", 8000, [SliceEndpoint("other-1", "10.1.0.8")])
        api.bookmark()
        target = str(api.version)

        await _until(lambda: source.resource_version == target)
    finally:
        await w.close()


async def test_a_refused_token_is_an_error_naming_the_status(api: FakeKubeApi, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("wrong")
    source = KubernetesDiscovery(
        KubernetesOptions(service="vllm", namespace="llm", api_url=api.url, token_file=str(token))
    )
    gen = source.watch()
    with pytest.raises(KubeApiError, match="401"):
        await gen.__anext__()
    await gen.aclose()
