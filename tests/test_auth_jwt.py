"""The ``jwt`` authenticator: fixed algorithms, keys chosen by the configured family,
issuer/audience/expiry enforced, claims mapped, nothing secret in errors or logs."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from pydantic import ValidationError

from shuniu.core.errors import GatewayError
from shuniu.core.tenancy.auth import AuthChain
from shuniu.core.types import Principal
from shuniu.plugins.auth import jwt_auth
from shuniu.plugins.auth.jwt_auth import JwtAuthenticator, JwtOptions

ISS = "https://id.example.com"
AUD = "shuniu"
SECRET = "hs-secret-DO-NOT-LEAK-" + "k" * 24  # 46 bytes: enough for HS256 (RFC 7518 §3.2)
_BASE: dict[str, Any] = {"algorithms": ["HS256"], "issuer": ISS, "audience": AUD, "secret": SECRET}


# --------------------------------------------------------------------------- helpers


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _seg(obj: dict[str, Any]) -> str:
    return _b64(json.dumps(obj, separators=(",", ":")).encode())


def _claims(**overrides: Any) -> dict[str, Any]:
    claims: dict[str, Any] = {
        "iss": ISS,
        "aud": AUD,
        "exp": int(time.time()) + 300,
        "sub": "user-1",
        "tenant": "acme",
        "tier": "gold",
    }
    claims.update(overrides)
    return {k: v for k, v in claims.items() if v is not None}


def _hs256(claims: dict[str, Any], secret: str | bytes = SECRET, alg: str = "HS256") -> str:
    return jwt.encode(claims, secret, algorithm=alg)


def _forge_hmac(claims: dict[str, Any], key: bytes, alg: str = "HS256", **header: Any) -> str:
    """An HS256 token made by hand: PyJWT refuses to HMAC with a PEM key, an attacker does not."""
    signing_input = f"{_seg({'alg': alg, 'typ': 'JWT', **header})}.{_seg(claims)}"
    sig = hmac.new(key, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{_b64(sig)}"


def _refusal(auth: JwtAuthenticator, token: str) -> str:
    with pytest.raises(GatewayError) as info:
        auth.authenticate(token, ())
    assert info.value.status == 401
    assert info.value.code == "invalid_api_key"
    return info.value.message


@pytest.fixture(scope="module")
def keys() -> SimpleNamespace:
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    rsa_key2 = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ec_key = ec.generate_private_key(ec.SECP256R1())
    ed_key = ed25519.Ed25519PrivateKey.generate()
    rsa_pem = rsa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return SimpleNamespace(rsa=rsa_key, rsa2=rsa_key2, ec=ec_key, ed=ed_key, rsa_pem=rsa_pem)


def _jwk(public_key: Any, algorithm: type[Any], **extra: Any) -> dict[str, Any]:
    jwk = algorithm.to_jwk(public_key, as_dict=True)
    jwk.update(extra)
    return jwk


@pytest.fixture
def jwks_file(tmp_path: Path, keys: SimpleNamespace) -> str:
    a = jwt.algorithms
    jwks = {
        "keys": [
            _jwk(keys.rsa.public_key(), a.RSAAlgorithm, kid="rsa-1", alg="RS256", use="sig"),
            _jwk(keys.ec.public_key(), a.ECAlgorithm, kid="ec-1", use="sig"),
            _jwk(keys.ed.public_key(), a.OKPAlgorithm, kid="ed-1"),
            # An encryption key is skipped, not an error.
            _jwk(keys.rsa2.public_key(), a.RSAAlgorithm, kid="enc-1", use="enc"),
        ]
    }
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps(jwks), "utf-8")
    return str(path)


def _auth(**options: Any) -> JwtAuthenticator:
    raw: dict[str, Any] = dict(_BASE)
    raw.update(options)
    raw = {k: v for k, v in raw.items() if v is not None}
    return JwtAuthenticator(JwtOptions.model_validate(raw))


def _asym(jwks_file: str, algorithms: list[str], **options: Any) -> JwtAuthenticator:
    return _auth(algorithms=algorithms, secret=None, jwks_file=jwks_file, **options)


# --------------------------------------------------------------------------- valid tokens


def test_hs256_valid() -> None:
    principal = _auth().authenticate(_hs256(_claims()), ())
    assert principal == Principal(tenant="acme", key_id="user-1", tier="gold")


def test_rs256_via_jwks_with_kid(jwks_file: str, keys: SimpleNamespace) -> None:
    token = jwt.encode(_claims(), keys.rsa, algorithm="RS256", headers={"kid": "rsa-1"})
    assert _asym(jwks_file, ["RS256"]).authenticate(token, ()) == Principal(
        tenant="acme", key_id="user-1", tier="gold"
    )


def test_es256_valid(jwks_file: str, keys: SimpleNamespace) -> None:
    auth = _asym(jwks_file, ["ES256"])
    with_kid = jwt.encode(_claims(), keys.ec, algorithm="ES256", headers={"kid": "ec-1"})
    without_kid = jwt.encode(_claims(sub="user-2"), keys.ec, algorithm="ES256")  # the only EC key
    assert auth.authenticate(with_kid, ()).tenant == "acme"
    assert auth.authenticate(without_kid, ()).key_id == "user-2"


def test_eddsa_valid(jwks_file: str, keys: SimpleNamespace) -> None:
    token = jwt.encode(_claims(), keys.ed, algorithm="EdDSA", headers={"kid": "ed-1"})
    assert _asym(jwks_file, ["EdDSA"]).authenticate(token, ()).tier == "gold"


def test_public_key_file_pem(tmp_path: Path, keys: SimpleNamespace) -> None:
    pem = tmp_path / "key.pem"
    pem.write_bytes(keys.rsa_pem)
    auth = _auth(algorithms=["PS256"], secret=None, public_key_file=str(pem))
    assert auth.authenticate(jwt.encode(_claims(), keys.rsa, algorithm="PS256"), ()).tenant == "acme"
    # A PEM key has no kid: a token naming one is still checked against it.
    named = jwt.encode(_claims(), keys.rsa, algorithm="PS256", headers={"kid": "whatever"})
    assert auth.authenticate(named, ()).tenant == "acme"
    other = jwt.encode(_claims(), keys.rsa2, algorithm="PS256")
    assert _refusal(auth, other) == "The token's signature is invalid."


def test_audience_and_issuer_lists() -> None:
    auth = _auth(issuer=["https://a.example", ISS], audience=["other", AUD])
    assert auth.authenticate(_hs256(_claims(aud=["x", AUD])), ()).tenant == "acme"


# --------------------------------------------------------------------------- algorithm attacks


@pytest.mark.parametrize("alg", ["none", "None", "NONE"])
@pytest.mark.parametrize("signature", ["", "Ym9ndXM"])
def test_alg_none_refused(alg: str, signature: str) -> None:
    token = f"{_seg({'alg': alg, 'typ': 'JWT'})}.{_seg(_claims())}.{signature}"
    assert _refusal(_auth(), token) == "The token's signing algorithm is not accepted."


def test_alg_missing_refused() -> None:
    token = f"{_seg({'typ': 'JWT'})}.{_seg(_claims())}.{_b64(b'sig')}"
    assert _refusal(_auth(), token) == "The token's signing algorithm is not accepted."


def test_alg_not_configured_refused() -> None:
    token = _hs256(_claims(), secret=SECRET * 2, alg="HS512")  # properly signed, wrong alg
    assert _refusal(_auth(), token) == "The token's signing algorithm is not accepted."


def test_hs_rs_confusion_with_both_configured(jwks_file: str, keys: SimpleNamespace) -> None:
    """RS256 and HS256 both accepted: an HS256 token keyed with the RSA public key (which
    the attacker knows) is checked against the configured secret only, and fails."""
    auth = _auth(algorithms=["RS256", "HS256"], jwks_file=jwks_file)
    for header in ({}, {"kid": "rsa-1"}):
        forged = _forge_hmac(_claims(), keys.rsa_pem, **header)
        assert _refusal(auth, forged) == "The token's signature is invalid."
    # The same deployment still accepts both genuine kinds.
    assert auth.authenticate(_hs256(_claims()), ()).tenant == "acme"
    real = jwt.encode(_claims(), keys.rsa, algorithm="RS256", headers={"kid": "rsa-1"})
    assert auth.authenticate(real, ()).tenant == "acme"


def test_hs_rs_confusion_with_only_rs_configured(jwks_file: str, keys: SimpleNamespace) -> None:
    auth = _asym(jwks_file, ["RS256"])
    forged = _forge_hmac(_claims(), keys.rsa_pem, kid="rsa-1")
    assert _refusal(auth, forged) == "The token's signing algorithm is not accepted."
    # An RS256 header over an HMAC signature: the RSA check fails.
    mislabelled = _forge_hmac(_claims(), keys.rsa_pem, alg="RS256", kid="rsa-1")
    assert _refusal(auth, mislabelled) == "The token's signature is invalid."


def test_key_family_must_match_alg(jwks_file: str, keys: SimpleNamespace, tmp_path: Path) -> None:
    """A key is used only for algorithms of its family (and its JWK's own ``alg``)."""
    pem = tmp_path / "rsa2.pem"
    pem.write_bytes(
        keys.rsa2.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    auth = _asym(jwks_file, ["RS256", "PS256", "ES256"], public_key_file=str(pem))
    # The JWK "rsa-1" says alg RS256: a PS256 token naming it is checked against the only
    # key without a kid (the PEM), and fails.
    ps = jwt.encode(_claims(), keys.rsa, algorithm="PS256", headers={"kid": "rsa-1"})
    assert _refusal(auth, ps) == "The token's signature is invalid."
    assert auth.authenticate(jwt.encode(_claims(), keys.rsa2, algorithm="PS256"), ()).tenant == "acme"
    # An ES256 token naming the RSA key's kid finds no EC key of that name.
    es = jwt.encode(_claims(), keys.ec, algorithm="ES256", headers={"kid": "rsa-1"})
    assert _refusal(auth, es) == "The token's key id is not known."


# --------------------------------------------------------------------------- claim checks


def test_wrong_audience() -> None:
    assert _refusal(_auth(), _hs256(_claims(aud="someone-else"))) == "The token's audience is not accepted."


def test_missing_audience() -> None:
    assert _refusal(_auth(), _hs256(_claims(aud=None))) == "The token lacks the claim 'aud'."


def test_wrong_issuer() -> None:
    assert _refusal(_auth(), _hs256(_claims(iss="https://evil.example"))) == (
        "The token's issuer is not accepted."
    )


def test_expired_beyond_leeway_refused_within_accepted() -> None:
    auth = _auth(leeway_s=30)
    now = int(time.time())
    assert _refusal(auth, _hs256(_claims(exp=now - 120))) == "The token has expired."
    assert auth.authenticate(_hs256(_claims(exp=now - 10)), ()).tenant == "acme"


def test_missing_exp_refused() -> None:
    auth = _auth(required_claims=["iss"])  # exp is required all the same
    assert _refusal(auth, _hs256(_claims(exp=None))) == "The token lacks the claim 'exp'."


def test_exp_must_be_a_number() -> None:
    token = _hs256(_claims(exp=str(int(time.time()) + 300)))
    assert _refusal(_auth(), token) == "The token's expiry is not a valid date."


def test_nbf_in_the_future_refused() -> None:
    token = _hs256(_claims(nbf=int(time.time()) + 600))
    assert _refusal(_auth(), token) == "The token is not valid yet."


def test_unknown_kid_refused(jwks_file: str, keys: SimpleNamespace) -> None:
    token = jwt.encode(_claims(), keys.rsa, algorithm="RS256", headers={"kid": "rsa-9"})
    assert _refusal(_asym(jwks_file, ["RS256"]), token) == "The token's key id is not known."


def test_no_kid_with_several_candidate_keys_refused(tmp_path: Path, keys: SimpleNamespace) -> None:
    a = jwt.algorithms.RSAAlgorithm
    path = tmp_path / "two.json"
    path.write_text(
        json.dumps(
            {"keys": [_jwk(keys.rsa.public_key(), a, kid="1"), _jwk(keys.rsa2.public_key(), a, kid="2")]}
        )
    )
    auth = _asym(str(path), ["RS256"])
    assert "more than one key" in _refusal(auth, jwt.encode(_claims(), keys.rsa, algorithm="RS256"))
    named = jwt.encode(_claims(), keys.rsa2, algorithm="RS256", headers={"kid": "2"})
    assert auth.authenticate(named, ()).tenant == "acme"


def test_tampered_payload_refused() -> None:
    header, _payload, signature = _hs256(_claims(tier="free")).split(".")
    tampered = f"{header}.{_seg(_claims(tier='gold'))}.{signature}"
    assert _refusal(_auth(), tampered) == "The token's signature is invalid."


def test_malformed_token_refused() -> None:
    assert _refusal(_auth(), "eyJub3QganNvbg.eyJhIjoxfQ.c2ln") == "The token is malformed."


def test_detached_payload_refused() -> None:
    token = f"{_seg({'alg': 'HS256', 'b64': False, 'crit': ['b64']})}.{_seg(_claims())}.{_b64(b'x')}"
    assert _refusal(_auth(), token) == "The token is malformed."


def test_an_issuer_is_matched_whole_never_as_a_substring() -> None:
    """CVE-2024-53861: PyJWT before 2.10.1 took a string issuer as a substring ("in")."""
    auth = _auth(issuer="https://id.example.com/tenant-a")
    for near in ("https://id.example.com/tenant", "id.example.com", "https://id.example.com/tenant-a/x"):
        assert _refusal(auth, _hs256(_claims(iss=near))) == "The token's issuer is not accepted."
    assert auth.authenticate(_hs256(_claims(iss="https://id.example.com/tenant-a")), ()).tenant == "acme"


@pytest.mark.parametrize("crit", [["exp"], ["unknown-extension"], ["b64", "urn:x"], [], "b64"])
def test_critical_header_extensions_it_does_not_understand_are_refused(crit: Any) -> None:
    """RFC 7515 4.1.11, CVE-2026-32597: a token whose ``crit`` names what the verifier does
    not understand must be refused. PyJWT 2.12+ refuses it while reading the header; shuniu
    checks it too, which is what an older or lenient header reader leaves to it."""
    token = jwt.encode(_claims(), SECRET, algorithm="HS256", headers={"crit": crit, "unknown-extension": 1})
    auth = _auth()
    assert _refusal(auth, token) in (
        "The token is malformed.",
        "The token requires header extensions this gateway does not support.",
    )
    lenient = _auth()
    lenient._header = lambda t: json.loads(base64.urlsafe_b64decode(t.split(".")[0] + "=="))  # type: ignore[method-assign]
    assert _refusal(lenient, token) == "The token requires header extensions this gateway does not support."


def test_an_old_pyjwt_is_refused() -> None:
    from shuniu.plugins.auth.jwt_auth import check_pyjwt

    for old in ("2.8.0", "2.10.1", "2.11.9"):
        with pytest.raises(ValueError, match="CVE-2024-53861, CVE-2026-32597"):
            check_pyjwt(old)
    check_pyjwt("2.12.0")
    check_pyjwt("3.0.0a1")


# --------------------------------------------------------------------------- claims → principal


def test_claims_map_to_principal() -> None:
    auth = _auth(tenant_claim="org.id", tier_claim="plan", models_claim="models", key_id_claim="client")
    token = _hs256(
        _claims(org={"id": 42, "name": "Acme"}, plan="pro", models=["llama", "qwen"], client="app-7")
    )
    assert auth.authenticate(token, ()) == Principal(
        tenant="42", key_id="app-7", tier="pro", models=frozenset({"llama", "qwen"})
    )


def test_namespaced_claim_with_dots() -> None:
    auth = _auth(tenant_claim="https://example.com/tenant")
    token = _hs256(_claims(**{"https://example.com/tenant": "globex"}))
    assert auth.authenticate(token, ()).tenant == "globex"


def test_defaults_when_optional_claims_absent() -> None:
    auth = _auth(models_claim="models", default_tier="basic")
    principal = auth.authenticate(_hs256(_claims(tier=None, sub=None)), ())
    assert principal == Principal(tenant="acme", key_id=None, tier="basic", models=None)


def test_missing_tenant_refused_unless_default() -> None:
    token = _hs256(_claims(tenant=None))
    assert _refusal(_auth(), token) == "The token lacks the claim 'tenant'."
    assert _auth(default_tenant="public").authenticate(token, ()).tenant == "public"


@pytest.mark.parametrize(
    ("claim", "value"),
    [("tenant", {"id": 1}), ("tenant", "x" * 129), ("tenant", True), ("tenant", "a\nb"), ("tier", 1.5)],
)
def test_bad_claim_values_refused(claim: str, value: Any) -> None:
    message = _refusal(_auth(), _hs256(_claims(**{claim: value})))
    assert message == f"The token's claim {claim!r} is not a valid name."


def test_models_claim_must_be_a_list() -> None:
    auth = _auth(models_claim="models")
    assert "not a list" in _refusal(auth, _hs256(_claims(models="llama")))


# --------------------------------------------------------------------------- not ours / too big


@pytest.mark.parametrize(
    "credential", ["sk-abc123DEF456", "a.b", "abc.def.ghi.jkl", "has space.abc.def", "ключ.a.b", ""]
)
def test_non_jwt_credential_falls_through(credential: str) -> None:
    assert _auth().authenticate(credential, ()) is None


def test_oversized_token_refused() -> None:
    auth = _auth(max_token_bytes=1024)
    token = _hs256(_claims(padding="p" * 2000))
    assert _refusal(auth, token) == "The token is too large."


# --------------------------------------------------------------------------- the cache


def test_cache_returns_the_same_principal_without_reverifying(monkeypatch: pytest.MonkeyPatch) -> None:
    auth = _auth()
    token = _hs256(_claims())
    first = auth.authenticate(token, ())

    def no_decode(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a cached token was verified again")

    monkeypatch.setattr(auth, "_decode", no_decode)
    assert auth.authenticate(token, ()) is first
    assert token.encode() not in b"".join(auth._cache)  # keyed by hash, not by token


def test_cached_token_refused_once_expired(monkeypatch: pytest.MonkeyPatch) -> None:
    auth = _auth(leeway_s=0)
    start = time.time()
    token = _hs256(_claims(exp=int(start) + 2))
    assert auth.authenticate(token, ()).tenant == "acme"
    monkeypatch.setattr(jwt_auth, "_now", lambda: start + 3)
    assert _refusal(auth, token) == "The token has expired."
    # Gone from the cache, and a fresh verification refuses it by the same clock.
    assert not auth._cache
    assert _refusal(auth, token) == "The token has expired."


def test_cache_is_bounded() -> None:
    auth = _auth(cache_size=2)
    tokens = [_hs256(_claims(sub=f"user-{i}")) for i in range(3)]
    for token in tokens:
        auth.authenticate(token, ())
    assert len(auth._cache) == 2
    assert hashlib.sha256(tokens[0].encode()).digest() not in auth._cache


def test_cache_can_be_disabled() -> None:
    auth = _auth(cache_size=0)
    auth.authenticate(_hs256(_claims()), ())
    assert not auth._cache


# --------------------------------------------------------------------------- no leaks


def test_errors_and_logs_never_contain_tokens_or_secrets(
    caplog: pytest.LogCaptureFixture, jwks_file: str, keys: SimpleNamespace
) -> None:
    caplog.set_level(logging.DEBUG)
    value = "tenant-value-DO-NOT-LEAK"
    auth = _auth(algorithms=["HS256", "RS256"], jwks_file=jwks_file)
    now = int(time.time())
    header, _payload, signature = _hs256(_claims()).split(".")
    tokens = [
        _hs256(_claims(tenant=value, exp=now - 3600)),
        _hs256(_claims(tenant=value, aud="x")),
        _hs256(_claims(tenant=value, iss="x")),
        _hs256(_claims(tenant=value), secret=SECRET + "-wrong"),
        _hs256(_claims(tenant=value * 10)),
        _hs256(_claims(tenant={"v": value})),
        f"{header}.{_seg(_claims(tenant=value))}.{signature}",
        _forge_hmac(_claims(tenant=value), keys.rsa_pem),
        f"{_seg({'alg': 'none'})}.{_seg(_claims(tenant=value))}.",
        f"{_seg({'alg': 'RS256', 'kid': value})}.{_seg(_claims(tenant=value))}.{_b64(b'x' * 256)}",
        "eyJ" + value.replace("-", "_") + ".eyJ.x",
    ]
    messages = [_refusal(auth, token) for token in tokens]
    logged = [r.getMessage() for r in caplog.records]
    for text in messages + logged:
        assert SECRET not in text
        assert value not in text
        for token in tokens:
            for part in token.split("."):
                assert len(part) < 8 or part not in text


def test_secret_not_in_validation_errors_or_repr() -> None:
    short = "short-secret-DO-NOT-LEAK"
    with pytest.raises(ValidationError) as info:
        JwtOptions.model_validate({"algorithms": ["HS256"], "issuer": ISS, "audience": AUD, "secret": short})
    assert short not in str(info.value)
    assert all(e["type"] == "value_error" for e in info.value.errors())  # the loader hides their input
    with pytest.raises(ValidationError) as info:
        JwtOptions.model_validate({"algorithms": ["HS256"], "issuer": ISS, "audience": AUD, "secret": 12345})
    assert "12345" not in str(info.value)
    options = JwtOptions.model_validate(dict(_BASE))
    assert SECRET not in repr(options) and SECRET not in str(options.model_dump())


# --------------------------------------------------------------------------- option validation


def _invalid(**raw: Any) -> str:
    base: dict[str, Any] = dict(_BASE)
    base.update(raw)
    base = {k: v for k, v in base.items() if v is not None}
    with pytest.raises(ValidationError) as info:
        JwtOptions.model_validate(base)
    return str(info.value)


def test_hs_without_secret_is_invalid() -> None:
    assert "HS256 needs a secret" in _invalid(secret=None)


def test_short_secret_is_invalid() -> None:
    assert "32 bytes HS256 needs" in _invalid(secret="k" * 31)
    assert "64 bytes HS512 needs" in _invalid(algorithms=["HS256", "HS512"], secret="k" * 48)


def test_pem_as_secret_is_invalid(keys: SimpleNamespace) -> None:
    assert "looks like a key" in _invalid(secret=keys.rsa_pem.decode())


@pytest.mark.parametrize("algorithms", [["none"], ["HS256", "None"]])
def test_none_algorithm_is_invalid(algorithms: list[str]) -> None:
    assert "'none' is never accepted" in _invalid(algorithms=algorithms)


def test_unknown_or_no_algorithm_is_invalid() -> None:
    assert "unknown algorithm 'HS1'" in _invalid(algorithms=["HS1"])
    _invalid(algorithms=[])


def test_issuer_and_audience_required() -> None:
    with pytest.raises(ValidationError):
        JwtOptions.model_validate({"algorithms": ["HS256"], "secret": SECRET})


def test_missing_jwks_file_is_invalid(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    message = _invalid(algorithms=["RS256"], secret=None, jwks_file=str(missing))
    assert "jwks_file: cannot read" in message and "nope.json" in message


def test_asymmetric_without_keys_is_invalid() -> None:
    assert "RS256 needs jwks_file or public_key_file" in _invalid(algorithms=["RS256"], secret=None)


def test_jwks_without_a_key_for_an_algorithm_is_invalid(jwks_file: str) -> None:
    assert "can verify ES384" in _invalid(algorithms=["ES384"], secret=None, jwks_file=jwks_file)


def test_bad_jwks_contents_are_invalid(tmp_path: Path, keys: SimpleNamespace) -> None:
    path = tmp_path / "k.json"
    path.write_text("not json")
    assert "not valid JSON" in _invalid(algorithms=["RS256"], secret=None, jwks_file=str(path))
    private = jwt.algorithms.RSAAlgorithm.to_jwk(keys.rsa, as_dict=True)
    path.write_text(json.dumps({"keys": [private]}))
    assert "private key material" in _invalid(algorithms=["RS256"], secret=None, jwks_file=str(path))
    path.write_text(json.dumps({"keys": [{"kty": "oct", "k": _b64(b"k" * 32)}]}))
    assert "symmetric key" in _invalid(algorithms=["RS256"], secret=None, jwks_file=str(path))
    small = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    path.write_text(json.dumps({"keys": [_jwk(small.public_key(), jwt.algorithms.RSAAlgorithm)]}))
    assert "at least 2048 bits" in _invalid(algorithms=["RS256"], secret=None, jwks_file=str(path))


def test_private_pem_is_invalid(tmp_path: Path, keys: SimpleNamespace) -> None:
    path = tmp_path / "private.pem"
    path.write_bytes(
        keys.ec.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    assert "holds a private key" in _invalid(algorithms=["ES256"], secret=None, public_key_file=str(path))


def test_unused_secret_or_key_file_is_invalid(jwks_file: str) -> None:
    assert "no HS algorithm" in _invalid(algorithms=["RS256"], jwks_file=jwks_file)
    assert "only HS algorithms" in _invalid(jwks_file=jwks_file)


def test_exp_is_always_required() -> None:
    options = JwtOptions.model_validate(
        {
            "algorithms": ["HS256"],
            "issuer": ISS,
            "audience": AUD,
            "secret": SECRET,
            "required_claims": ["iss"],
        }
    )
    assert "exp" in options.required_claims


# --------------------------------------------------------------------------- in the chain


class _NotMine:
    def authenticate(self, credential: str, headers: Any) -> Principal | None:
        return None


def test_in_an_auth_chain_after_another_authenticator() -> None:
    chain = AuthChain([_NotMine(), _auth()])
    token = _hs256(_claims())
    assert chain.authenticate([(b"authorization", f"Bearer {token}".encode())]).tenant == "acme"
    with pytest.raises(GatewayError) as info:
        chain.authenticate([(b"authorization", b"Bearer sk-not-a-jwt")])
    assert info.value.message == "Incorrect API key provided."  # nobody claimed it
    with pytest.raises(GatewayError) as info:
        chain.authenticate([(b"authorization", f"Bearer {_hs256(_claims(aud='x'))}".encode())])
    assert info.value.message == "The token's audience is not accepted."


def test_registered_as_a_plugin() -> None:
    from shuniu.core.plugin_manager import PluginManager

    pm = PluginManager()
    pm.pm.register(jwt_auth, name="jwt")
    registration = pm.registered("authenticators")["jwt"]
    assert registration.factory is JwtAuthenticator
    assert registration.options is JwtOptions
    assert "EdDSA" in registration.description


def test_missing_extra_is_named(monkeypatch: pytest.MonkeyPatch, jwks_file: str) -> None:
    from shuniu.core.extras import MissingExtraError

    monkeypatch.setitem(sys.modules, "jwt", None)  # as if PyJWT were not installed
    options = JwtOptions.model_validate(dict(_BASE))
    with pytest.raises(MissingExtraError, match=r"shuniu\[jwt\]"):
        JwtAuthenticator(options)
    assert r"shuniu[jwt]" in _invalid(algorithms=["RS256"], secret=None, jwks_file=jwks_file)
