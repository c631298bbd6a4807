"""``jwt``: JSON Web Tokens signed by an identity provider (HS, RS, PS, ES, EdDSA).

What a token may be is fixed by configuration, never by the token: the accepted signing
algorithms, the issuer, the audience, and that it expires. The token's header is read
before its signature is checked only to choose a key, and the key is chosen by the
*configured* family of the token's ``alg``: HS algorithms use only ``secret``, RS/PS only
RSA keys, ES only EC keys on that algorithm's curve, EdDSA only OKP keys. So ``alg: none``
is refused outright, and an RS-configured public key can never be taken as an HMAC secret
(the HS/RS confusion attack). Claims map to the principal's tenant, tier, models and key id.

Keys are read once, when the options are validated; a missing or unusable key file is a
configuration error. Tokens, secrets and claim values never appear in errors or logs:
refusals name the kind of problem only.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import ConfigDict, Field, PrivateAttr, SecretStr, field_validator, model_validator

from shuniu.core import hookimpl
from shuniu.core.config import Options
from shuniu.core.contracts import Authenticator, RegisterAuthenticator
from shuniu.core.errors import GatewayError
from shuniu.core.extras import MissingExtraError, require
from shuniu.core.tenancy.auth import invalid_credentials
from shuniu.core.types import Principal

__all__ = ["ALGORITHMS", "JwtAuthenticator", "JwtOptions"]

log = logging.getLogger("shuniu.auth.jwt")

# RFC 7518 §3.2: an HMAC key at least as long as the hash output.
_HMAC_MIN_BYTES = {"HS256": 32, "HS384": 48, "HS512": 64}
_RSA_ALGS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512")
_EC_CURVES = {"ES256": "P-256", "ES384": "P-384", "ES512": "P-521"}
_OKP_ALGS = ("EdDSA",)
ALGORITHMS: tuple[str, ...] = (*_HMAC_MIN_BYTES, *_RSA_ALGS, *_EC_CURVES, *_OKP_ALGS)
"""The signing algorithms ``algorithms`` may list."""

_MIN_RSA_BITS = 2048  # NIST SP 800-131A; PyJWT warns below this too
_MAX_KEY_FILE_BYTES = 1 << 20
_MAX_NAME_CHARS = 128
_MAX_MODELS = 1024
# JWK members that only a private key has (RFC 7518 §6.2.2, §6.3.2; RFC 8037 §2).
_PRIVATE_JWK_MEMBERS = ("d", "p", "q", "dp", "dq", "qi", "oth", "k")
_CURVE_NAMES = {"secp256r1": "P-256", "secp384r1": "P-384", "secp521r1": "P-521"}

# Three base64url segments (the last empty for an unsigned token, which is then refused,
# not passed on). Trailing '=' is tolerated as PyJWT does (some issuers pad). Anything else,
# an API key for instance, is not ours and falls through to the next authenticator.
_JWT_SHAPE = re.compile(r"[A-Za-z0-9_-]+={0,2}\.[A-Za-z0-9_-]+={0,2}\.[A-Za-z0-9_-]*={0,2}")

_now: Callable[[], float] = time.time
"""The clock for expiry checks on cached tokens (and our own exp/nbf checks); tests
replace it. PyJWT's own checks use the system clock as well."""

_NonEmpty = Annotated[str, Field(min_length=1)]


def _family(alg: str) -> tuple[str, str | None]:
    """The key type (JWK ``kty``) and curve an algorithm verifies with."""
    if alg in _HMAC_MIN_BYTES:
        return "oct", None
    if alg in _RSA_ALGS:
        return "RSA", None
    if alg in _EC_CURVES:
        return "EC", _EC_CURVES[alg]
    return "OKP", None


@dataclass(frozen=True, slots=True)
class _Key:
    """One public key, with what the JWK says about where it may be used."""

    kid: str | None
    kty: str
    crv: str | None
    alg: str | None
    key: Any  # a cryptography public key object: PyJWT takes it as is, never as bytes
    where: str  # for start-up errors: "jwks_file key 2 (kid 'a')"

    def fits(self, alg: str) -> bool:
        """Whether this key may verify ``alg``: same family (and curve), and the JWK's own
        ``alg``, when it names one, agrees. Never true for HS: a public key is not a secret."""
        if self.alg is not None and self.alg != alg:
            return False
        kty, crv = _family(alg)
        if kty == "oct" or kty != self.kty:
            return False
        return crv is None or crv == self.crv


@dataclass(slots=True)
class _KeyIndex:
    """The keys that fit one algorithm."""

    by_kid: dict[str, Any] = field(default_factory=dict)
    unnamed: list[Any] = field(default_factory=list)
    count: int = 0
    only: Any = None


class JwtOptions(Options):
    """Options of the ``jwt`` authenticator."""

    # pydantic would otherwise print the raw options, secret included, in its errors.
    model_config = ConfigDict(hide_input_in_errors=True)

    algorithms: list[str] = Field(min_length=1)
    """Signing algorithms accepted (``HS256``/``384``/``512``, ``RS…``, ``PS…``,
    ``ES256``/``384``/``512``, ``EdDSA``). A token whose header names any other algorithm
    is refused before its signature is looked at; ``none`` cannot be listed."""
    issuer: _NonEmpty | Annotated[list[_NonEmpty], Field(min_length=1)]
    """Accepted ``iss`` (one, or a list of which any matches). Required."""
    audience: _NonEmpty | Annotated[list[_NonEmpty], Field(min_length=1)]
    """Accepted ``aud``: the token must name this audience (or one of these). Required."""
    leeway_s: float = Field(30.0, ge=0, le=300)
    """Clock skew tolerated on ``exp``, ``nbf`` and ``iat``, in seconds."""
    secret: SecretStr | None = None
    """Shared secret for HS algorithms, at least as long as the hash (32 bytes for HS256,
    48 for HS384, 64 for HS512; RFC 7518 §3.2). Write ``${JWT_SECRET}`` to take it from
    the environment rather than the file. Never logged."""
    jwks_file: str | None = None
    """Path of a JWKS file (``{"keys": [...]}``) with the public keys for RS, PS, ES and
    EdDSA. Keys marked for another ``use``/``alg`` are skipped; private or symmetric keys
    are refused. Read at start-up."""
    public_key_file: str | None = None
    """Path of one PEM public key (or certificate), instead of or besides ``jwks_file``.
    It has no key id, so it verifies tokens whose ``kid`` no JWKS key has."""
    tenant_claim: _NonEmpty = "tenant"
    """Claim holding the tenant. A dotted path (``org.id``) reaches into an object when no
    claim has the literal name. A token without it is refused unless ``default_tenant``
    is set."""
    default_tenant: _NonEmpty | None = None
    """Tenant of tokens without ``tenant_claim``. Unset: such tokens are refused."""
    tier_claim: _NonEmpty = "tier"
    """Claim holding the tier (dotted paths as for ``tenant_claim``)."""
    default_tier: _NonEmpty = "default"
    """Tier of tokens without ``tier_claim``."""
    models_claim: _NonEmpty | None = None
    """Claim holding a list of model names (or aliases) the token may use. It narrows the
    tier: a model must be in both the tier's list and the token's. Unset or absent:
    whatever the tier allows."""
    key_id_claim: _NonEmpty | None = "sub"
    """Claim naming the credential in logs and metrics (the principal's ``key_id``); the
    token itself never is. ``None``: no key id."""
    required_claims: list[_NonEmpty] = Field(default_factory=lambda: ["exp", "iss", "aud"])
    """Claims a token must carry. ``exp`` is required whatever this says."""
    max_token_bytes: int = Field(8192, ge=256, le=1 << 20)
    """Longer tokens are refused without being parsed."""
    cache_size: int = Field(4096, ge=0, le=1 << 20)
    """Verified tokens remembered (by hash, until they expire) so a client reusing one
    token does not pay a signature check per request. 0: no cache."""

    _secret: bytes | None = PrivateAttr(default=None)
    _keys: dict[str, _KeyIndex] = PrivateAttr(default_factory=dict)

    @field_validator("algorithms")
    @classmethod
    def _known_algorithms(cls, value: list[str]) -> list[str]:
        out: list[str] = []
        for alg in value:
            if alg.lower() == "none":
                raise ValueError("algorithm 'none' is never accepted: an unsigned token proves nothing")
            if alg not in ALGORITHMS:
                raise ValueError(f"unknown algorithm {alg!r}; expected one of: {', '.join(ALGORITHMS)}")
            if alg not in out:
                out.append(alg)
        return out

    @field_validator("secret", mode="before")
    @classmethod
    def _secret_is_text(cls, value: Any) -> Any:
        # A value_error, unlike pydantic's type errors, is reported without the input.
        if value is not None and not isinstance(value, str | SecretStr):
            raise ValueError("secret must be a string (quote it in YAML)")
        return value

    @field_validator("required_claims")
    @classmethod
    def _exp_always(cls, value: list[str]) -> list[str]:
        return value if "exp" in value else [*value, "exp"]

    @model_validator(mode="after")
    def _load_keys(self) -> JwtOptions:
        hmac_algs = [a for a in self.algorithms if a in _HMAC_MIN_BYTES]
        asym_algs = [a for a in self.algorithms if a not in _HMAC_MIN_BYTES]
        if hmac_algs:
            self._secret = _check_secret(self.secret, hmac_algs)
        elif self.secret is not None:
            raise ValueError("secret is set but algorithms lists no HS algorithm")
        key_files = self.jwks_file is not None or self.public_key_file is not None
        if not asym_algs:
            if key_files:
                raise ValueError("jwks_file/public_key_file are set but algorithms lists only HS algorithms")
            return self
        if not key_files:
            raise ValueError(f"{_listed(asym_algs)} jwks_file or public_key_file")
        try:
            jwt = require("jwt", "jwt", "The jwt authenticator")
            require("cryptography", "jwt", "The jwt authenticator")
        except MissingExtraError as exc:
            raise ValueError(str(exc)) from None
        check_pyjwt(jwt.__version__)
        keys: list[_Key] = []
        if self.jwks_file is not None:
            keys.extend(_jwks_keys(jwt, self.jwks_file, self.algorithms))
        if self.public_key_file is not None:
            keys.append(_pem_key(self.public_key_file))
        self._keys = _index(keys, asym_algs)
        return self


def _listed(algs: list[str]) -> str:
    return f"{', '.join(algs)} {'needs' if len(algs) == 1 else 'need'}"


def _check_secret(secret: SecretStr | None, hmac_algs: list[str]) -> bytes:
    if secret is None:
        raise ValueError(f"{_listed(hmac_algs)} a secret")
    raw = secret.get_secret_value().encode("utf-8")
    head = raw.lstrip()[:32]
    # A key pasted where a shared secret belongs is a configuration mistake, and the
    # classic confusion attack's premise: refuse it rather than HMAC with public bytes.
    if head.startswith((b"-----BEGIN", b"ssh-", b"ecdsa-sha2-", b"{")):
        raise ValueError(
            "secret looks like a key or a JWK; HS algorithms take a shared secret, "
            "public keys go in jwks_file or public_key_file"
        )
    strongest = max(hmac_algs, key=_HMAC_MIN_BYTES.__getitem__)
    needed = _HMAC_MIN_BYTES[strongest]
    if len(raw) < needed:
        # Neither the secret nor its length is shown.
        raise ValueError(f"secret is shorter than the {needed} bytes {strongest} needs (RFC 7518 §3.2)")
    return raw


def _read(path: str, option: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_KEY_FILE_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"{option}: cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > _MAX_KEY_FILE_BYTES:
        raise ValueError(f"{option}: {path} is larger than {_MAX_KEY_FILE_BYTES} bytes")
    return data


def _jwks_keys(jwt: Any, path: str, algorithms: list[str]) -> list[_Key]:
    try:
        data = json.loads(_read(path, "jwks_file"))
    except ValueError as exc:
        if str(exc).startswith("jwks_file:"):
            raise
        raise ValueError(f"jwks_file: {path} is not valid JSON") from None
    if isinstance(data, dict) and "kty" in data:
        data = {"keys": [data]}  # a lone JWK
    entries = data.get("keys") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ValueError(f'jwks_file: {path} has no "keys" list')
    builders = {
        "RSA": jwt.algorithms.RSAAlgorithm.from_jwk,
        "EC": jwt.algorithms.ECAlgorithm.from_jwk,
        "OKP": jwt.algorithms.OKPAlgorithm.from_jwk,
    }
    keys = []
    for i, jwk in enumerate(entries):
        if not isinstance(jwk, dict):
            raise ValueError(f"jwks_file key {i} is not a JSON object")
        kid = jwk.get("kid")
        where = f"jwks_file key {i}" + (f" (kid {kid!r})" if isinstance(kid, str) else "")
        if kid is not None and not isinstance(kid, str):
            raise ValueError(f"{where}: kid is not a string")
        kty = jwk.get("kty")
        if kty == "oct":
            raise ValueError(f"{where} is a symmetric key; an HMAC secret goes in secret")
        if any(member in jwk for member in _PRIVATE_JWK_MEMBERS):
            raise ValueError(f"{where} holds private key material; give public keys only")
        if kty not in builders:
            continue  # a kind of key no configured algorithm uses
        use, ops, alg = jwk.get("use"), jwk.get("key_ops"), jwk.get("alg")
        if use is not None and use != "sig":
            continue  # an encryption key
        if ops is not None and (not isinstance(ops, list) or "verify" not in ops):
            continue
        if alg is not None and alg not in algorithms:
            continue  # meant for an algorithm this deployment does not accept
        try:
            key = builders[kty](jwk)
        except Exception:  # PyJWT's InvalidKeyError, or cryptography's ValueError
            raise ValueError(f"{where} is not a valid {kty} public key") from None
        crv = jwk.get("crv") if kty != "RSA" else None
        keys.append(_Key(kid, kty, crv, alg, key, where))
    return keys


def _pem_key(path: str) -> _Key:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa

    data = _read(path, "public_key_file")
    if b"PRIVATE KEY" in data:
        raise ValueError(f"public_key_file: {path} holds a private key; give the public key")
    try:
        key: Any = serialization.load_pem_public_key(data)
    except (ValueError, TypeError):
        try:
            key = x509.load_pem_x509_certificate(data).public_key()
        except (ValueError, TypeError):
            raise ValueError(f"public_key_file: {path} is not a PEM public key or certificate") from None
    where = "public_key_file"
    if isinstance(key, rsa.RSAPublicKey):
        return _Key(None, "RSA", None, None, key, where)
    if isinstance(key, ec.EllipticCurvePublicKey):
        crv = _CURVE_NAMES.get(key.curve.name)
        if crv is None:
            raise ValueError(f"public_key_file: curve {key.curve.name} is not supported")
        return _Key(None, "EC", crv, None, key, where)
    if isinstance(key, ed25519.Ed25519PublicKey):
        return _Key(None, "OKP", "Ed25519", None, key, where)
    if isinstance(key, ed448.Ed448PublicKey):
        return _Key(None, "OKP", "Ed448", None, key, where)
    raise ValueError(f"public_key_file: {path} holds a kind of key no algorithm here uses")


def _index(keys: list[_Key], asym_algs: list[str]) -> dict[str, _KeyIndex]:
    for key in keys:
        if key.kty == "RSA" and key.key.key_size < _MIN_RSA_BITS:
            raise ValueError(f"{key.where}: RSA keys need at least {_MIN_RSA_BITS} bits")
    out = {}
    for alg in asym_algs:
        index = _KeyIndex()
        for key in keys:
            if not key.fits(alg):
                continue
            if key.kid is None:
                index.unnamed.append(key.key)
            elif key.kid in index.by_kid:
                raise ValueError(f"{key.where}: another {alg} key has the same kid")
            else:
                index.by_kid[key.kid] = key.key
            index.count += 1
            index.only = key.key
        if not index.count:
            raise ValueError(f"no key in jwks_file or public_key_file can verify {alg}")
        if index.count > 1:
            index.only = None
        out[alg] = index
    return out


def _claim_path(name: str) -> tuple[str, tuple[str, ...] | None]:
    return name, (tuple(name.split(".")) if "." in name else None)


_MISSING: Any = object()


def _lookup(payload: dict[str, Any], claim: tuple[str, tuple[str, ...] | None]) -> Any:
    """The claim's value; the literal name first (namespaced claims such as
    ``https://example.com/tenant`` contain dots), then the dotted path. JSON null counts
    as absent."""
    name, path = claim
    value = payload.get(name)
    if value is None and path is not None:
        node: Any = payload
        for part in path:
            if not isinstance(node, dict):
                return _MISSING
            node = node.get(part)
        value = node
    return _MISSING if value is None else value


def _as_name(value: Any) -> str | None:
    """A claim value usable as a tenant, tier, model or key id; ``None`` if it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        value = str(value)
    if isinstance(value, str) and 0 < len(value) <= _MAX_NAME_CHARS and value.isprintable():
        return value
    return None


def _is_time(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _refuse(reason: str) -> GatewayError:
    log.debug("jwt: refused: %s", reason)  # the reason only; never the token
    return invalid_credentials(reason)


MIN_PYJWT = (2, 12, 0)
"""PyJWT 2.12.0 fixes CVE-2026-32597 (unknown ``crit`` headers accepted) and includes the
2.10.1 fix of CVE-2024-53861 (issuer matched as a substring); shuniu also guards both itself."""


def check_pyjwt(version: str) -> None:
    """Refuse to verify tokens with a PyJWT older than :data:`MIN_PYJWT`."""
    parts = []
    for piece in version.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    if tuple(parts) < MIN_PYJWT:
        wanted = ".".join(map(str, MIN_PYJWT))
        raise ValueError(
            f"PyJWT {version} is installed; the jwt authenticator needs {wanted} or newer "
            "(CVE-2024-53861, CVE-2026-32597): pip install 'shuniu[jwt]'"
        )


_UNDERSTOOD_CRIT = frozenset({"b64"})
"""Header parameters a token may list in ``crit``: only ``b64`` (checked above: it must be
``true``, a normal JWS); anything else is refused."""


class JwtAuthenticator(Authenticator):
    """Verifies JWTs against fixed algorithms, keys, issuer and audience."""

    def __init__(self, options: JwtOptions) -> None:
        jwt = require("jwt", "jwt", "The jwt authenticator")
        check_pyjwt(jwt.__version__)
        self._jwt = jwt
        self._decode = jwt.decode
        self._header = jwt.get_unverified_header
        self._algorithms = frozenset(options.algorithms)
        self._secret = options._secret
        self._keys = options._keys
        for alg in options.algorithms:
            if (self._secret is None) if alg in _HMAC_MIN_BYTES else (alg not in self._keys):
                raise ValueError(f"the jwt authenticator needs validated options (no key for {alg})")
        # Always a list: PyJWT before 2.10.1 matched a single string issuer as a substring
        # ("acme" accepted "acme-evil", CVE-2024-53861); list membership is exact.
        self._issuer = [options.issuer] if isinstance(options.issuer, str) else list(options.issuer)
        self._audience = options.audience if isinstance(options.audience, str) else list(options.audience)
        self._leeway = float(options.leeway_s)
        self._decode_options = {
            "require": list(options.required_claims),
            "verify_signature": True,
            "verify_exp": True,
            "verify_nbf": True,
            "verify_iat": True,
            "verify_iss": True,
            "verify_aud": True,
            # Lengths are checked at start-up; this only makes a weak key fail, not warn.
            "enforce_minimum_key_length": True,
        }
        self._max_bytes = options.max_token_bytes
        self._tenant = _claim_path(options.tenant_claim)
        self._default_tenant = options.default_tenant
        self._tier = _claim_path(options.tier_claim)
        self._default_tier = options.default_tier
        self._models = _claim_path(options.models_claim) if options.models_claim else None
        self._key_id = _claim_path(options.key_id_claim) if options.key_id_claim else None
        self._cache_size = options.cache_size
        # sha256(token) → (principal, time after which the token is expired). Keyed by a
        # hash so the process does not hold thousands of bearer credentials in memory
        # (a heap dump or a debugger would otherwise show them all). OrderedDict: O(1)
        # eviction of the oldest entry.
        self._cache: OrderedDict[bytes, tuple[Principal, float]] = OrderedDict()

    def authenticate(self, credential: str, headers: Any) -> Principal | None:
        """The token's principal; ``None`` when the credential is not a JWT at all."""
        if _JWT_SHAPE.fullmatch(credential) is None:
            return None
        if len(credential) > self._max_bytes:
            raise _refuse("The token is too large.")
        now = _now()
        digest = b""
        if self._cache_size:
            digest = hashlib.sha256(credential.encode("ascii")).digest()
            hit = self._cache.get(digest)
            if hit is not None:
                if now < hit[1]:
                    return hit[0]
                self._cache.pop(digest, None)
                raise _refuse("The token has expired.")
        principal, valid_until = self._verify(credential, now)
        if self._cache_size:
            cache = self._cache
            if len(cache) >= self._cache_size:
                try:
                    cache.popitem(last=False)
                except KeyError:  # emptied meanwhile by another thread
                    pass
            cache[digest] = (principal, valid_until)
        return principal

    def _verify(self, token: str, now: float) -> tuple[Principal, float]:
        jwt = self._jwt
        try:
            header = self._header(token)
        except Exception:
            raise _refuse("The token is malformed.") from None
        alg = header.get("alg")
        # The algorithm allow-list, before anything else: this is what refuses 'none' and
        # an HS token aimed at an RS deployment.
        if not isinstance(alg, str) or alg not in self._algorithms:
            raise _refuse("The token's signing algorithm is not accepted.")
        if "b64" in header and header["b64"] is not True:
            raise _refuse("The token's format is not supported.")  # detached payloads
        crit = header.get("crit")
        if crit is not None and (
            not isinstance(crit, list) or not crit or any(c not in _UNDERSTOOD_CRIT for c in crit)
        ):
            # RFC 7515 4.1.11: a header parameter listed in "crit" must be understood, or the
            # token refused (PyJWT before 2.12.0 accepted any, CVE-2026-32597).
            raise _refuse("The token requires header extensions this gateway does not support.")
        key = self._secret if alg in _HMAC_MIN_BYTES else self._key_for(alg, header.get("kid"))
        try:
            payload = self._decode(
                token,
                key,
                algorithms=[alg],
                audience=self._audience,
                issuer=self._issuer,
                leeway=self._leeway,
                options=self._decode_options,
            )
        except jwt.ExpiredSignatureError:
            raise _refuse("The token has expired.") from None
        except jwt.ImmatureSignatureError:
            raise _refuse("The token is not valid yet.") from None
        except jwt.InvalidAudienceError:
            raise _refuse("The token's audience is not accepted.") from None
        except jwt.InvalidIssuerError:
            raise _refuse("The token's issuer is not accepted.") from None
        except jwt.MissingRequiredClaimError as exc:
            raise _refuse(f"The token lacks the claim {exc.claim!r}.") from None  # a configured name
        except jwt.InvalidSignatureError:
            raise _refuse("The token's signature is invalid.") from None
        except jwt.InvalidAlgorithmError:
            raise _refuse("The token's signing algorithm is not accepted.") from None
        except jwt.InvalidIssuedAtError:
            raise _refuse("The token's issue time is not a valid date.") from None
        except jwt.DecodeError:
            raise _refuse("The token is malformed.") from None
        except Exception as exc:  # whatever else: a 401 without details, never a 500
            log.debug("jwt: verification failed: %s", type(exc).__name__)
            raise _refuse("The token is not valid.") from None
        # Our own time checks with our clock (PyJWT used the system clock): strict types,
        # where PyJWT would take exp "1700000000" as a string, and the cache's notion of
        # expiry is the same one as here.
        leeway = self._leeway
        exp = payload.get("exp")
        if not _is_time(exp):
            raise _refuse("The token's expiry is not a valid date.")
        valid_until = exp + leeway
        if now >= valid_until:
            raise _refuse("The token has expired.")
        nbf = payload.get("nbf")
        if nbf is not None:
            if not _is_time(nbf):
                raise _refuse("The token's not-before time is not a valid date.")
            if nbf > now + leeway:
                raise _refuse("The token is not valid yet.")
        return self._principal(payload), valid_until

    def _key_for(self, alg: str, kid: Any) -> Any:
        index = self._keys[alg]
        if isinstance(kid, str):
            key = index.by_kid.get(kid)
            if key is not None:
                return key
            if len(index.unnamed) == 1:
                return index.unnamed[0]  # a PEM key has no kid; its signature still decides
            raise _refuse("The token's key id is not known.")
        if index.only is not None:
            return index.only
        raise _refuse("The token names no key id, and more than one key could verify it.")

    def _principal(self, payload: dict[str, Any]) -> Principal:
        tenant_claim = self._tenant
        raw = _lookup(payload, tenant_claim)
        if raw is _MISSING:
            if self._default_tenant is None:
                raise _refuse(f"The token lacks the claim {tenant_claim[0]!r}.")
            tenant = self._default_tenant
        else:
            tenant = self._name(raw, tenant_claim)
        raw = _lookup(payload, self._tier)
        tier = self._default_tier if raw is _MISSING else self._name(raw, self._tier)
        key_id = None
        if self._key_id is not None:
            raw = _lookup(payload, self._key_id)
            key_id = None if raw is _MISSING else self._name(raw, self._key_id)
        models = None
        if self._models is not None:
            raw = _lookup(payload, self._models)
            if raw is not _MISSING:
                if not isinstance(raw, list) or len(raw) > _MAX_MODELS:
                    raise _refuse(f"The token's claim {self._models[0]!r} is not a list of model names.")
                models = frozenset(self._name(item, self._models) for item in raw)
        return Principal(tenant=tenant, key_id=key_id, tier=tier, models=models)

    @staticmethod
    def _name(value: Any, claim: tuple[str, tuple[str, ...] | None]) -> str:
        name = _as_name(value)
        if name is None:
            # The claim's configured name, never its value.
            raise _refuse(f"The token's claim {claim[0]!r} is not a valid name.")
        return name


@hookimpl
def register_authenticators(register: RegisterAuthenticator) -> None:
    register(
        "jwt",
        JwtAuthenticator,
        options=JwtOptions,
        description=(
            "JSON Web Tokens (HS, RS, PS, ES, EdDSA) with fixed algorithms, issuer, audience and expiry"
        ),
    )
