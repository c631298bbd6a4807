"""Counting prompts with the model's own tokenizer (``tokenizer:`` on a model).

The expected counts come from the ``tokenizers`` package itself, run on a prompt text this
file writes out by hand (the ChatML rendering of the messages), never from the gateway's own
counting; the engine counter's from the fake TGI's published response shape.
"""

from __future__ import annotations

import asyncio
import json
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from shuniu.core.api.openai import parse_request
from shuniu.core.config.loader import load_deployment
from shuniu.core.errors import ConfigError
from shuniu.core.plugin_manager import PluginManager, load_plugins
from shuniu.core.pools.build import PoolBuilder
from shuniu.core.tokenization import engine as engine_counter
from shuniu.core.tokenization.counter import recount
from shuniu.core.tokenization.engine import EngineCounter
from shuniu.core.tokenization.local import LocalTokenizer
from shuniu.core.tokens import count_tokens
from shuniu.core.types import InferenceRequest
from tests.conftest import start_gateway
from tests.fake_tgi import FakeTGI

tokenizers = pytest.importorskip("tokenizers", reason="needs the tokenizers package (the test extra)")

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CHINESE = "你好世界今天天气很好，我们去公园散步吧"  # noqa: RUF001


def _english_tokenizer() -> Any:
    """A byte-level BPE trained on English only (as an English model's vocabulary is): each
    Chinese character costs it two or three byte tokens, far more than the estimate's one.
    Adds ``<s>`` in front of a prompt when asked for special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=["<s>", "</s>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    words = "the gateway counts every prompt in the tokens of its model say hello world user assistant"
    tok.train_from_iterator([words] * 50, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    return tok


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tokenizer")
    tok = _english_tokenizer()
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": {"content": "</s>"}, "chat_template": CHATML})
    )
    return out


@pytest.fixture(scope="module")
def reference(model_dir: Path) -> Any:
    """The same tokenizer file, loaded by the tokenizers package directly."""
    return tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))


def _chat(messages: list[dict[str, Any]], **extra: Any) -> InferenceRequest:
    return parse_request(json.dumps({"model": "m", "messages": messages, **extra}).encode(), "chat", "r", 0.0)


def _completion(prompt: Any) -> InferenceRequest:
    return parse_request(json.dumps({"model": "m", "prompt": prompt}).encode(), "completions", "r", 0.0)


def _ids(reference: Any, text: str, special: bool) -> int:
    return len(reference.encode(text, add_special_tokens=special).ids)


# --------------------------------------------------------------------------- local tokenizer


async def test_a_chat_prompt_is_counted_as_the_engine_renders_it(model_dir: Path, reference: Any) -> None:
    tok = LocalTokenizer.load(model_dir)
    req = _chat([{"role": "system", "content": "say hello"}, {"role": "user", "content": CHINESE}])
    rendered = (
        "<|im_start|>system\nsay hello<|im_end|>\n"
        f"<|im_start|>user\n{CHINESE}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    expected = _ids(reference, rendered, special=False)  # engines add no BOS to a rendered chat
    assert await tok.count(req) == expected
    assert expected > 2 * count_tokens(CHINESE)  # the point: this vocabulary spends bytes on Chinese
    await recount(req, tok)
    assert req.prompt_tokens == expected


async def test_a_completion_prompt_gets_the_special_tokens(model_dir: Path, reference: Any) -> None:
    tok = LocalTokenizer.load(model_dir / "tokenizer.json")  # the file itself: no template needed
    req = _completion("the gateway counts every prompt")
    assert await tok.count(req) == _ids(reference, "the gateway counts every prompt", special=False) + 1


async def test_content_parts_are_joined_as_text(model_dir: Path, reference: Any) -> None:
    tok = LocalTokenizer.load(model_dir)
    parts = [
        {"type": "text", "text": "hello"},
        {"type": "image_url", "image_url": {"url": "http://127.0.0.1/x.png"}},
        {"type": "text", "text": "world"},
    ]
    rendered = "<|im_start|>user\nhello\nworld<|im_end|>\n<|im_start|>assistant\n"
    assert await tok.count(_chat([{"role": "user", "content": parts}])) == _ids(reference, rendered, False)


async def test_a_template_that_refuses_leaves_the_estimate(tmp_path: Path, model_dir: Path) -> None:
    (tmp_path / "tokenizer.json").write_bytes((model_dir / "tokenizer.json").read_bytes())
    # chat_template.jinja wins over tokenizer_config.json, as in transformers
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML}))
    (tmp_path / "chat_template.jinja").write_text(
        "{% if messages[0]['role'] != 'system' %}{{ raise_exception('a system message must come first') }}"
        "{% endif %}{{ messages[0]['content'] }}"
    )
    tok = LocalTokenizer.load(tmp_path)
    req = _chat([{"role": "user", "content": CHINESE}])
    estimate = req.prompt_tokens
    assert await tok.count(req) is None
    await recount(req, tok)
    assert req.prompt_tokens == estimate
    assert await tok.count(_chat([{"role": "system", "content": "hello"}])) is not None


async def test_token_id_prompts_are_exact_already(model_dir: Path) -> None:
    req = _completion([5, 6, 7])
    await recount(req, LocalTokenizer.load(model_dir))
    assert req.prompt_tokens == 3


class _Recording:
    """A tokenizer stand-in that notes the thread each encode ran on (and counts characters)."""

    def __init__(self) -> None:
        self.threads: list[str] = []

    def encode_batch(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        self.threads.append(threading.current_thread().name)
        return [[0] * len(text) for text in texts]


async def test_long_prompts_are_tokenized_off_the_event_loop() -> None:
    rec = _Recording()
    tok = LocalTokenizer(rec, None, "recording")
    tok.offload_chars = 100
    loop_thread = threading.current_thread().name
    assert await tok.count(_completion("x" * 100)) == 100
    assert await tok.count(_completion("y" * 101)) == 101
    tok.close()
    assert rec.threads[0] == loop_thread
    assert rec.threads[1] != loop_thread and rec.threads[1].startswith("shuniu-tokenize")


async def test_the_event_loop_runs_while_a_long_prompt_is_tokenized(model_dir: Path) -> None:
    """The count runs on a worker thread without the GIL: the loop keeps turning meanwhile
    (a tokenizer call that held the GIL would let it turn only before and after)."""
    tok = LocalTokenizer.load(model_dir)
    prompt = "the gateway counts every prompt in the tokens of its model " * 20_000
    turns = 0
    counting = True

    async def spin() -> None:
        nonlocal turns
        while counting:
            turns += 1
            await asyncio.sleep(0)

    spinner = asyncio.create_task(spin())
    n = await tok.count(_completion(prompt))
    counting = False
    await spinner
    tok.close()
    assert n is not None and n > 200_000
    assert turns > 1000


# --------------------------------------------------------------------------- configuration


@pytest.fixture(scope="module")
def plugins() -> PluginManager:
    return load_plugins()


def _build(plugins: PluginManager, text: str) -> Any:
    resolved = load_deployment("deploy.yaml", plugins, text=textwrap.dedent(text), env={})
    return PoolBuilder(plugins).build(resolved)


def test_a_missing_tokenizer_names_the_field(plugins: PluginManager, tmp_path: Path) -> None:
    text = f"""
    models:
      m:
        tokenizer: {tmp_path / "nowhere"}
        endpoints: [{{kind: sim}}]
    """
    with pytest.raises(ConfigError) as err:
        _build(plugins, text)
    assert "models.m.tokenizer" in str(err.value) and "does not exist" in str(err.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"holds no tokenizer\.json"):
        _build(plugins, text.replace("nowhere", "empty"))
    (tmp_path / "empty" / "tokenizer.json").write_text("{not a tokenizer")
    with pytest.raises(ConfigError, match="not a tokenizer file"):
        _build(plugins, text.replace("nowhere", "empty"))


def test_engine_counting_needs_an_engine_that_counts(plugins: PluginManager) -> None:
    text = """
    models:
      m:
        tokenizer: engine
        endpoints: [{kind: sim}]
    """
    with pytest.raises(ConfigError, match=r"models\.m\.tokenizer.*'engine' needs an endpoint.*sim"):
        _build(plugins, text)
    vllm = text.replace("{kind: sim}", "{kind: vllm, options: {base_url: 'http://127.0.0.1:9'}}")
    built = _build(plugins, vllm)
    assert isinstance(built.pools["m"].counter, EngineCounter)
    off = vllm.replace("'http://127.0.0.1:9'}", "'http://127.0.0.1:9', tokenize_path: null}")
    with pytest.raises(ConfigError, match="'engine' needs an endpoint"):
        _build(plugins, off)


def test_a_reload_keeps_the_loaded_tokenizer(plugins: PluginManager, model_dir: Path) -> None:
    text = f"""
    models:
      m:
        tokenizer: {model_dir}
        endpoints: [{{kind: sim}}]
    """
    builder = PoolBuilder(plugins)
    first = builder.build(load_deployment("d.yaml", plugins, text=textwrap.dedent(text), env={}))
    again = builder.build(load_deployment("d.yaml", plugins, text=textwrap.dedent(text), env={}))
    # The same loaded tokenizer (a sim pool's is wrapped to keep the ids it computes on).
    loaded = [getattr(b.pools["m"].counter, "tokenizer", None) for b in (first, again)]
    assert isinstance(loaded[0], LocalTokenizer) and loaded[0] is loaded[1]
    builder.close()


async def test_a_precise_prefix_pool_keeps_the_prompts_token_ids(
    plugins: PluginManager, model_dir: Path, reference: Any
) -> None:
    text = f"""
    models:
      m:
        tokenizer: {model_dir}
        balancer: {{policy: precise_prefix}}
        endpoints: [{{kind: sim}}]
    """
    builder = PoolBuilder(plugins)
    pool = builder.build(load_deployment("d.yaml", plugins, text=textwrap.dedent(text), env={})).pools["m"]
    req = _chat([{"role": "user", "content": "say hello world " * 20}])
    assert pool.counter is not None
    await recount(req, pool.counter)
    rendered = "<|im_start|>user\n" + "say hello world " * 20 + "<|im_end|>\n<|im_start|>assistant\n"
    assert req.prompt_ids == reference.encode(rendered, add_special_tokens=False).ids
    assert req.prompt_tokens == len(req.prompt_ids)
    builder.close()


# --------------------------------------------------------------------------- through the gateway


@pytest.fixture(scope="module")
def local_gateway(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    refusing = tmp_path_factory.mktemp("refusing-tokenizer")
    (refusing / "tokenizer.json").write_bytes((model_dir / "tokenizer.json").read_bytes())
    (refusing / "chat_template.jinja").write_text("{{ raise_exception('this template renders nothing') }}")
    config = f"""
    gateway:
      max_prompt_tokens: 40
    models:
      m:
        tokenizer: {model_dir}
        endpoints:
          - kind: sim
            options: {{ttft_ms: 0, tokens_per_s: 0, output_tokens_min: 2, output_tokens_max: 2}}
      refusing:
        tokenizer: {refusing}
        endpoints:
          - kind: sim
            options: {{ttft_ms: 0, tokens_per_s: 0, output_tokens_min: 2, output_tokens_max: 2}}
      plain:
        endpoints:
          - kind: sim
            options: {{ttft_ms: 0, tokens_per_s: 0, output_tokens_min: 2, output_tokens_max: 2}}
    """
    gw = start_gateway(config, tmp_path_factory.mktemp("local-gw"))
    yield gw.url
    gw.stop()


def test_limits_count_with_the_model_tokenizer(local_gateway: str, reference: Any) -> None:
    chinese = [{"role": "user", "content": CHINESE}]
    # The estimate lets this prompt in (about 25 tokens); the model's tokenizer does not.
    assert _chat(chinese).prompt_tokens < 40
    expected = _ids(reference, f"<|im_start|>user\n{CHINESE}<|im_end|>\n<|im_start|>assistant\n", False)
    r = httpx.post(f"{local_gateway}/v1/chat/completions", json={"model": "m", "messages": chinese})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["code"] == "prompt_too_long" and f"about {expected} tokens" in error["message"]
    # Anthropic's count_tokens counts with the same tokenizer (and refuses nothing for length)
    counted = httpx.post(
        f"{local_gateway}/v1/messages/count_tokens", json={"model": "m", "messages": chinese}
    )
    assert counted.status_code == 200 and counted.json() == {"input_tokens": expected}

    english = [{"role": "user", "content": "say hello world"}]
    r = httpx.post(f"{local_gateway}/v1/chat/completions", json={"model": "m", "messages": english})
    assert r.status_code == 200, r.text
    rendered = "<|im_start|>user\nsay hello world<|im_end|>\n<|im_start|>assistant\n"
    assert r.json()["usage"]["prompt_tokens"] == _ids(reference, rendered, False)  # the simulator reports it


def test_a_prompt_no_tokenizer_counts_gets_the_estimate(local_gateway: str) -> None:
    # The path counts once the model is known: the estimate for a model without a tokenizer,
    # and for a chat prompt whose template the tokenizer cannot render.
    chat = {"messages": [{"role": "user", "content": CHINESE}]}
    completion = {"prompt": "one two three four"}
    for model, api, body in (
        ("plain", "chat/completions", chat),
        ("plain", "completions", completion),
        ("refusing", "chat/completions", chat),
    ):
        r = httpx.post(f"{local_gateway}/v1/{api}", json={"model": model, **body})
        assert r.status_code == 200, r.text
        parsed = _chat(chat["messages"]) if body is chat else _completion(completion["prompt"])
        assert r.json()["usage"]["prompt_tokens"] == parsed.prompt_tokens > 0, (model, api)


@pytest.fixture
def tgi() -> Iterator[FakeTGI]:
    fake = FakeTGI().start()
    yield fake
    fake.stop()


def test_engine_counting_asks_tgi_once_per_prompt(tgi: FakeTGI, tmp_path: Path) -> None:
    config = f"""
    gateway:
      max_prompt_tokens: 3
    models:
      m:
        tokenizer: engine
        health: {{interval_s: 0.05}}
        endpoints:
          - kind: tgi
            options: {{base_url: "{tgi.url}"}}
    """
    gw = start_gateway(config, tmp_path)
    try:
        body = {"model": "m", "messages": [{"role": "user", "content": "hello there world"}]}
        # The fake's template is Zephyr's and its tokens are words: "<|user|>", "hello",
        # "there", "world</s>", "<|assistant|>".
        for _ in range(2):
            r = httpx.post(f"{gw.url}/v1/chat/completions", json=body)
            assert r.status_code == 400 and "about 5 tokens" in r.json()["error"]["message"], r.text
        assert tgi.tokenize_calls == 1  # the second count came from the cache
        r = httpx.post(f"{gw.url}/v1/completions", json={"model": "m", "prompt": "one two"})
        assert r.status_code == 200, r.text
        assert tgi.tokenize_calls == 2
    finally:
        gw.stop()


# --------------------------------------------------------------------------- engine counter


class _Endpoint:
    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.healthy, self.ejected, self.draining = True, False, False


class _Backend:
    tokenizes = True

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.calls = 0

    async def count_tokens(self, req: InferenceRequest) -> int | None:
        self.calls += 1
        if isinstance(self.answer, BaseException):
            raise self.answer
        if self.answer == "hang":
            await asyncio.get_running_loop().create_future()
        return int(self.answer)


async def test_an_engine_that_fails_or_hangs_leaves_the_estimate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_counter, "TIMEOUT_S", 0.01)
    for answer in (OSError("connection refused"), "hang"):
        backend = _Backend(answer)
        counter = EngineCounter(lambda b=backend: [_Endpoint(b)])  # type: ignore[misc]
        req = _completion("one two three")
        estimate = req.prompt_tokens
        await recount(req, counter)
        assert req.prompt_tokens == estimate and counter.fallbacks == 1 and backend.calls == 1


async def test_engine_counts_are_cached_least_recently_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_counter, "CACHE_SIZE", 2)
    backend = _Backend(7)
    down = _Endpoint(_Backend(99))
    down.healthy = False  # never asked
    counter = EngineCounter(lambda: [down, _Endpoint(backend)])
    for prompt in ("a", "b", "a", "c", "a", "b"):
        assert await counter.count(_completion(prompt)) == 7
    # a, b, (a cached), c evicts b, (a cached), b again
    assert backend.calls == 4 and down.backend.calls == 0
