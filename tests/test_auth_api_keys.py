"""The ``api_keys`` authenticator, its options, and ``shuniu keys``."""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from shuniu.core.cli import build_cli
from shuniu.core.config.loader import load_deployment
from shuniu.core.errors import ConfigError, GatewayError
from shuniu.core.http.asgi import header_map
from shuniu.core.plugin_manager import load_plugins
from shuniu.core.tenancy.auth import AuthChain, bearer_token, bearer_token_of
from shuniu.core.types import Principal
from shuniu.plugins.auth.api_keys import KEY_PREFIX, ApiKeys, ApiKeysOptions, hash_key, new_key


def _options(*keys: str, **extra: object) -> ApiKeysOptions:
    entries = [
        {"id": f"k{i}", "hash": hash_key(key), "tenant": f"tenant-{i}", "tier": "default"}
        for i, key in enumerate(keys)
    ]
    return ApiKeysOptions.model_validate({"keys": entries, **extra})


def test_new_keys_are_long_random_and_prefixed() -> None:
    keys = {new_key() for _ in range(100)}
    assert len(keys) == 100
    for key in keys:
        assert key.startswith(KEY_PREFIX)
        assert len(key) - len(KEY_PREFIX) >= 43  # 256 bits, base64url


def test_hash_is_sha256_of_the_key() -> None:
    assert hash_key("abc") == "sha256:" + hashlib.sha256(b"abc").hexdigest()


def test_known_key_gives_its_principal_and_unknown_passes() -> None:
    a, b = new_key(), new_key()
    auth = ApiKeys(_options(a, b))
    pa = auth.authenticate(a, ())
    pb = auth.authenticate(b, ())
    assert pa is not None and pa.tenant == "tenant-0" and pa.key_id == "k0"
    assert pb is not None and pb.tenant == "tenant-1"
    assert auth.authenticate(a + "x", ()) is None
    assert auth.authenticate(a[:-1], ()) is None
    assert auth.authenticate("", ()) is None


def test_a_key_that_passed_is_not_hashed_again_and_a_failed_one_is_not_remembered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import shuniu.plugins.auth.api_keys as module

    a, b = new_key(), new_key()
    auth = ApiKeys(_options(a, b))
    first = auth.authenticate(a, ())
    for _ in range(200):  # wrong keys: each hashed, none remembered
        assert auth.authenticate(new_key(), ()) is None
    assert len(auth._verified) == 1

    def no_hashing(data: bytes) -> object:
        raise AssertionError("a remembered key was hashed again")

    monkeypatch.setattr(module.hashlib, "sha256", no_hashing)
    assert auth.authenticate(a, ()) is first
    with pytest.raises(AssertionError):  # b never passed: it still needs its hash
        auth.authenticate(b, ())


class Counting:
    """An authenticator that accepts one credential and counts how often it is asked."""

    def __init__(self, credential: str, stable: bool) -> None:
        self.credential = credential
        self.stable = stable
        self.asked = 0

    def authenticate(self, credential: str, headers: Any) -> Principal | None:
        self.asked += 1
        return Principal(tenant="t", key_id="k", tier="default") if credential == self.credential else None


@pytest.mark.parametrize("second_stable", [True, False])
def test_the_chain_remembers_credentials_only_when_every_authenticator_is_stable(
    second_stable: bool,
) -> None:
    # A stable chain asks no authenticator again for a credential one accepted; with one
    # authenticator that is not stable (tokens that expire, keys revoked at run time) every
    # request asks them all again. A refused credential is never remembered.
    key = new_key()
    first, second = Counting("other", True), Counting(key, second_stable)
    chain = AuthChain([first, second])
    headers = [(b"authorization", b"Bearer " + key.encode())]
    principals = [chain.authenticate(headers) for _ in range(3)]
    assert principals[0] == principals[2] and principals[0].tenant == "t"
    assert (first.asked, second.asked) == ((1, 1) if second_stable else (3, 3))
    assert (principals[0] is principals[2]) == second_stable
    for _ in range(2):
        with pytest.raises(GatewayError):
            chain.authenticate([(b"authorization", b"Bearer nope")])
    assert len(chain.known) == (1 if second_stable else 0)
    assert first.asked == (3 if second_stable else 5)


def test_api_keys_are_stable_and_jwt_is_not() -> None:
    from shuniu.plugins.auth.jwt_auth import JwtAuthenticator

    assert ApiKeys.stable is True
    assert getattr(JwtAuthenticator, "stable", False) is False


def test_key_models_and_limits_reach_the_principal() -> None:
    key = new_key()
    opts = ApiKeysOptions.model_validate(
        {
            "keys": [
                {
                    "id": "ci",
                    "hash": hash_key(key),
                    "tenant": "team-a",
                    "tier": "free",
                    "models": ["chat"],
                    "limits": {"rpm": 5, "concurrency": 2},
                }
            ]
        }
    )
    p = ApiKeys(opts).authenticate(key, ())
    assert p is not None
    assert p.tier == "free" and p.models == frozenset({"chat"})
    assert p.limits is not None and p.limits.rpm == 5 and p.limits.concurrency == 2 and p.limits.tpm is None


@pytest.mark.parametrize(
    ("entry", "fragment"),
    [
        ({"id": "a", "hash": "not-a-hash", "tenant": "t"}, "64 hex digits"),
        ({"id": "a", "hash": "sha256:" + "g" * 64, "tenant": "t"}, "64 hex digits"),
        ({"id": "a", "hash": "sha256:" + "a" * 64}, "tenant"),
        ({"id": "a", "hash": "sha256:" + "a" * 64, "tenant": "t", "extra": 1}, "extra"),
    ],
)
def test_bad_key_entries_are_refused(entry: dict[str, object], fragment: str) -> None:
    with pytest.raises(ValidationError) as info:
        ApiKeysOptions.model_validate({"keys": [entry]})
    assert fragment in str(info.value)


def test_duplicate_ids_and_hashes_are_refused() -> None:
    h = hash_key("x")
    with pytest.raises(ValidationError, match="used twice"):
        ApiKeysOptions.model_validate(
            {
                "keys": [
                    {"id": "a", "hash": h, "tenant": "t"},
                    {"id": "a", "hash": hash_key("y"), "tenant": "t"},
                ]
            }
        )
    with pytest.raises(ValidationError, match="same hash"):
        ApiKeysOptions.model_validate(
            {"keys": [{"id": "a", "hash": h, "tenant": "t"}, {"id": "b", "hash": h, "tenant": "t"}]}
        )
    with pytest.raises(ValidationError, match="no keys"):
        ApiKeysOptions.model_validate({})


def test_keys_from_a_file_and_from_the_environment(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    a, b = new_key(), new_key()
    path = tmp_path / "keys.json"
    path.write_text(json.dumps([{"id": "file", "hash": hash_key(a), "tenant": "f"}]))
    monkeypatch.setenv("TEST_KEYS", f"- {{id: env, hash: '{hash_key(b)}', tenant: e}}")
    auth = ApiKeys(ApiKeysOptions.model_validate({"keys_file": str(path), "keys_env": "TEST_KEYS"}))
    assert auth.authenticate(a, ()).tenant == "f"  # type: ignore[union-attr]
    assert auth.authenticate(b, ()).tenant == "e"  # type: ignore[union-attr]
    with pytest.raises(ValidationError, match="cannot read"):
        ApiKeysOptions.model_validate({"keys_file": str(tmp_path / "missing.yaml")})
    monkeypatch.delenv("TEST_KEYS")
    with pytest.raises(ValidationError, match="TEST_KEYS is not set"):
        ApiKeysOptions.model_validate({"keys_env": "TEST_KEYS"})
    path.write_text('[{"id": "x", "hash": "nope", "tenant": "t"}]')
    with pytest.raises(ValidationError, match=r"entry 0: hash"):
        ApiKeysOptions.model_validate({"keys_file": str(path)})


def test_chain_refuses_missing_and_unknown_credentials_without_echoing_them(caplog) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.DEBUG)
    key = new_key()
    chain = AuthChain([ApiKeys(_options(key))])
    with pytest.raises(GatewayError) as missing:
        chain.authenticate([])
    assert missing.value.status == 401 and missing.value.code == "missing_api_key"
    wrong = new_key()
    with pytest.raises(GatewayError) as refused:
        chain.authenticate([(b"authorization", f"Bearer {wrong}".encode())])
    assert refused.value.status == 401 and refused.value.code == "invalid_api_key"
    assert wrong not in refused.value.body().decode()
    assert wrong not in caplog.text
    # Basic auth is not a bearer credential; Azure's api-key header is.
    with pytest.raises(GatewayError):
        chain.authenticate([(b"authorization", b"Basic Zm9vOmJhcg==")])
    assert chain.authenticate([(b"api-key", key.encode())]).tenant == "tenant-0"
    assert chain.authenticate([(b"authorization", f"bearer {key}".encode())]).tenant == "tenant-0"


DEPLOYMENT = """
tiers:
  free: {{}}
auth:
  authenticators:
    - kind: api_keys
      options:
        keys:
          - {{id: a, hash: "{hash}", tenant: t, tier: {tier}, models: [{model}]}}
models:
  chat:
    endpoints: [{{kind: sim}}]
"""


def test_deployment_checks_the_tiers_and_models_keys_name() -> None:
    plugins = load_plugins()
    good = DEPLOYMENT.format(hash=hash_key("k"), tier="free", model="chat")
    resolved = load_deployment("d.yaml", plugins, text=good)
    assert resolved.authenticator_options[0].keys[0].tier == "free"
    bad = DEPLOYMENT.format(hash=hash_key("k"), tier="gold", model="chatty")
    with pytest.raises(ConfigError) as info:
        load_deployment("d.yaml", plugins, text=bad)
    text = str(info.value)
    assert "names tier 'gold'" in text and "names model 'chatty'" in text
    assert "auth.authenticators[0].options" in text
    unknown = good.replace("kind: api_keys", "kind: api_keyz")
    with pytest.raises(ConfigError, match="unknown authenticator 'api_keyz'"):
        load_deployment("d.yaml", plugins, text=unknown)


def test_keys_new_prints_a_key_and_the_entry_with_its_hash() -> None:
    runner = CliRunner()
    cli = build_cli()
    result = runner.invoke(
        cli, ["keys", "new", "--tenant", "team-a", "--tier", "free", "--id", "ci", "--json"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["entry"] == {"id": "ci", "hash": hash_key(data["key"]), "tenant": "team-a", "tier": "free"}
    ApiKeysOptions.model_validate({"keys": [data["entry"]]})
    hashed = runner.invoke(cli, ["keys", "hash"], input=data["key"] + "\n")
    assert hashed.exit_code == 0 and hashed.output.strip() == data["entry"]["hash"]
    text = runner.invoke(cli, ["keys", "new", "--tenant", "t"])
    assert text.exit_code == 0 and KEY_PREFIX in text.output and "sha256:" in text.output


@pytest.mark.parametrize(
    ("headers", "credential"),
    [
        ([], None),
        ([(b"authorization", b"Bearer sk-one")], "sk-one"),
        ([(b"authorization", b"bearer   sk-one  ")], "sk-one"),
        ([(b"authorization", b"Bearer ")], None),
        ([(b"authorization", b"Basic Zm9vOmJhcg==")], None),
        ([(b"api-key", b"sk-azure")], "sk-azure"),
        ([(b"x-api-key", b" sk-anthropic ")], "sk-anthropic"),
        ([(b"x-api-key", b"")], None),
        (
            [
                (b"content-type", b"application/json"),
                (b"authorization", b"Bearer sk-one"),
                (b"x-api-key", b"sk-two"),
            ],
            "sk-one",
        ),
        # Authorization decides when it is there, wherever it stands; then api-key, then x-api-key.
        ([(b"api-key", b"sk-azure"), (b"authorization", b"Basic Zm9vOmJhcg==")], None),
        ([(b"x-api-key", b"sk-anthropic"), (b"api-key", b"sk-azure")], "sk-azure"),
        ([(b"authorization", b"Bearer sk-first"), (b"authorization", b"Bearer sk-second")], "sk-first"),
    ],
)
def test_the_credential_is_read_the_same_from_the_pairs_and_from_the_header_map(
    headers: list[tuple[bytes, bytes]], credential: str | None
) -> None:
    # The request path reads it from its header map (name -> first value); views from the raw pairs.
    assert bearer_token(headers) == credential
    assert bearer_token_of(header_map(headers)) == credential
