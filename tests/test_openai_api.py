"""Request parsing never fails with anything but a clean 400, whatever the client sends."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from shuniu.core.api.openai import StreamEncoder, encode_completion, parse_request
from shuniu.core.errors import GatewayError
from shuniu.core.types import Chunk, Completion, Usage

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)
fields = st.fixed_dictionaries(
    {},
    optional={
        "model": json_values | st.just("m"),
        "messages": json_values
        | st.lists(
            st.fixed_dictionaries({"role": st.sampled_from(["user", "x", 1]), "content": json_values})
        ),
        "prompt": json_values,
        "max_tokens": json_values,
        "max_completion_tokens": json_values,
        "stream": json_values,
        "stream_options": json_values,
        "stop": json_values,
        "temperature": json_values,
        "top_p": json_values,
        "n": json_values,
        "seed": json_values,
    },
)


@settings(max_examples=200, deadline=None)
@given(body=fields | json_values, api=st.sampled_from(["chat", "completions"]))
def test_parse_never_crashes(body: object, api: str) -> None:
    raw = json.dumps(body).encode()
    try:
        req = parse_request(raw, api, "id", 0.0)  # type: ignore[arg-type]
    except GatewayError as err:
        assert err.status == 400
        assert json.loads(err.body())["error"]["message"]
        return
    assert req.model and isinstance(req.prompt, str) and req.prompt_tokens >= 0


@given(raw=st.binary(max_size=64))
def test_garbage_bytes_are_400(raw: bytes) -> None:
    try:
        parse_request(raw, "chat", "id", 0.0)
    except GatewayError as err:
        assert err.status == 400


def test_encoders_produce_valid_openai_json() -> None:
    body = {
        "model": 'm"x',
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    req = parse_request(json.dumps(body).encode(), "chat", "r", 0.0)
    enc = StreamEncoder(req, created=1)
    events = [
        enc.start(),
        enc.chunk(Chunk('a "quoted"\n', 1)),
        enc.chunk(Chunk("", 1, None, extra={"tool_calls": [{"id": "t"}]})),
        enc.chunk(Chunk("", 0, "stop", Usage(3, 2, 5))),
        enc.end(),
    ]
    payloads = [
        json.loads(line[6:])
        for e in events
        for line in e.decode().split("\n\n")
        if line and line != "data: [DONE]"
    ]
    assert payloads[0]["choices"][0]["delta"]["role"] == "assistant"
    assert payloads[1]["choices"][0]["delta"]["content"] == 'a "quoted"\n'
    assert payloads[2]["choices"][0]["delta"] == {"tool_calls": [{"id": "t"}]}
    assert payloads[3]["choices"][0]["finish_reason"] == "stop" and payloads[3]["choices"][0]["delta"] == {}
    assert payloads[4]["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    assert all(p["model"] == 'm"x' and p["id"] == "chatcmpl-r" for p in payloads)
    full = json.loads(
        encode_completion(req, Completion("hi", "stop", Usage(1, 1, 2), {"tool_calls": []}), created=1)
    )
    assert full["choices"][0]["message"] == {"role": "assistant", "content": "hi", "tool_calls": []}


def test_a_prompt_of_token_ids_is_counted_and_hashed_by_its_ids() -> None:
    from shuniu.core.pools import prefix_hashes

    ids = list(range(100, 164))
    for prompt in (ids, [ids]):
        req = parse_request(json.dumps({"model": "m", "prompt": prompt}).encode(), "completions", "r", 0.0)
        assert req.token_ids == ids and req.prompt_tokens == 64
    # block_tokens hashing uses the ids: the same ids give the same chain, another id differs
    again = parse_request(json.dumps({"model": "m", "prompt": ids}).encode(), "completions", "r", 0.0)
    other = parse_request(
        json.dumps({"model": "m", "prompt": [*ids[:-1], 7]}).encode(), "completions", "r", 0.0
    )
    a, b, c = (prefix_hashes(r, 256, 16) for r in (req, again, other))
    assert len(a) == 4 and a == b and a[:3] == c[:3] and a[3] != c[3]
    text = parse_request(json.dumps({"model": "m", "prompt": "hello"}).encode(), "completions", "r", 0.0)
    assert text.token_ids is None


def test_nesting_beyond_the_limit_is_a_400_whatever_the_depth() -> None:
    from shuniu.core.api.openai import MAX_DEPTH

    for depth in (MAX_DEPTH, MAX_DEPTH + 1, 5_000, 200_000):
        nested = "[" * depth + "]" * depth
        raw = (
            '{"model": "m", "messages": [{"role": "user", "content": "hi"}], "x": ' + nested + "}"
        ).encode()
        try:
            parse_request(raw, "chat", "r", 0.0)
        except GatewayError as err:
            assert (err.status, err.code) == (400, "invalid_json") and "nested more than" in err.message
        else:  # pragma: no cover - the assertion below says why
            raise AssertionError(f"depth {depth} was accepted")
    shallow = '{"model": "m", "messages": [{"role": "user", "content": "hi"}], "x": [[[1]]]}'
    assert parse_request(shallow.encode(), "chat", "r", 0.0).body["x"] == [[[1]]]
