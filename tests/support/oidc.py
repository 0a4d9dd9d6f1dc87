"""A real OpenID Provider on loopback for the gateway's OAuth tests: oidc-provider (npm, installed by the
Makefile into the venv's `node/` folder) run by tests/support/oidc_server.mjs."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx2
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.support.waiting import wait_until
from worker.dev.embedded import free_port

NODE_MODULES = Path(sys.prefix) / "node" / "node_modules"  # the venv the tests run in (Makefile)
SCRIPT = Path(__file__).with_name("oidc_server.mjs")


@dataclass(frozen=True)
class OidcClient:
    """A client registered at the provider, with the client-credentials grant."""

    client_id: str
    client_secret: str
    scope: str
    tenant: str


@dataclass
class SigningKey:
    kid: str
    private: rsa.RSAPrivateKey

    @classmethod
    def new(cls, kid: str) -> SigningKey:
        return cls(kid, rsa.generate_private_key(public_exponent=65537, key_size=2048))

    def jwk(self, private: bool = True) -> dict[str, Any]:
        key = self.private if private else self.private.public_key()
        data: dict[str, Any] = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key))
        data.pop("key_ops", None)  # the provider looks for keys usable to verify as well as to sign
        return {**data, "kid": self.kid, "alg": "RS256", "use": "sig"}


@dataclass
class OidcServer:
    directory: Path
    resource: str
    clients: list[OidcClient]
    port: int = field(default_factory=free_port)
    keys: list[SigningKey] = field(default_factory=lambda: [SigningKey.new("key-1")])
    process: subprocess.Popen[bytes] | None = None
    # More of oidc_server.mjs's configuration: "upstream", "userClients", "exchangeClients" (end users' tokens).
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def issuer(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> OidcServer:
        if shutil.which("node") is None or not (NODE_MODULES / "oidc-provider").is_dir():
            pytest.fail(f"oidc-provider is not installed in {NODE_MODULES}: run `make test` (it installs it)")
        config = self.directory / "oidc.json"
        body = {
            "port": self.port,
            "resource": self.resource,
            "keys": [k.jwk() for k in self.keys],
            "clients": [c.__dict__ for c in self.clients],
            **self.extra,
        }
        config.write_text(json.dumps(body))
        with (self.directory / "oidc.log").open("ab") as log:
            argv = ["node", str(SCRIPT), str(NODE_MODULES), str(config)]
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()  # a provider that never answered is not left running (nor its Popen to warn later)
            raise
        return self

    def _wait_ready(self, timeout_s: float = 30.0) -> None:
        def answers() -> bool:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError((self.directory / "oidc.log").read_text()[-3000:])
            try:
                return httpx2.get(self.issuer + "/.well-known/openid-configuration", timeout=5).status_code == 200
            except httpx2.TransportError:
                return False

        wait_until(answers, timeout_s, "oidc-provider to answer")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(10)
            self.process = None

    def rotate(self, kid: str) -> SigningKey:
        """The provider restarted signing with a new key (the old one still published, as a rotation does)."""
        self.stop()
        self.keys.insert(0, SigningKey.new(kid))
        self.start()
        return self.keys[0]

    def token(self, client: OidcClient) -> str:
        """An access token for the resource, by the client-credentials grant."""
        form = {"grant_type": "client_credentials", "scope": client.scope, "resource": self.resource}
        answer = httpx2.post(
            self.issuer + "/token", data=form, auth=(client.client_id, client.client_secret), timeout=10
        )
        assert answer.status_code == 200, answer.text
        token: str = answer.json()["access_token"]
        return token

    def sign(self, claims: dict[str, Any], key: SigningKey | None = None, **header: Any) -> str:
        """A token signed with one of the provider's own keys (or `key`), for the cases it would not issue."""
        key = key or self.keys[-1]
        return jwt.encode(claims, key.private, algorithm="RS256", headers={"kid": key.kid, **header})

    def claims(self, client: OidcClient, **changes: Any) -> dict[str, Any]:
        """The claims the provider puts in `client`'s access token, with `changes`."""
        now = int(time.time())
        base = {"iss": self.issuer, "aud": self.resource, "sub": client.client_id, "client_id": client.client_id}
        return {**base, "iat": now, "exp": now + 300, "scope": client.scope, "tenant": client.tenant, **changes}


def consent(link: str, login: str) -> tuple[dict[str, list[str]], httpx2.Response]:
    """A scripted browser: open the connect link, log in as `login` and allow. The query the gateway sent the
    browser to the authorization server with, and the gateway's last page."""
    with httpx2.Client(follow_redirects=True, timeout=20) as browser:
        page = browser.get(link)
        assert page.status_code == 200 and "/interaction/" in str(page.url), (page.status_code, page.text[:500])
        authorize = parse_qs(urlsplit(page.history[0].headers["location"]).query)
        uid = re.search(r"/interaction/([^/?#]+)", str(page.url))
        assert uid is not None
        done = browser.post(
            str(page.url).split("/interaction/")[0] + f"/interaction/{uid.group(1)}", data={"login": login}
        )
        return authorize, done
