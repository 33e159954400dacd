"""Real servers for the tests, started by the Rust test kit's launcher
(``target/debug/fencelock-testkit-server ENGINE``: random loopback port,
temporary data directory, one JSON line, then ``pause``/``resume``/``kill``/
``start`` on stdin). Closing its stdin stops the server and deletes its data.

A missing launcher or CLI binary fails the tests; it is never a skip.

Time: (b) the helpers' bounds (a CLI run, a request to the service, a
server's stop) are base figures scaled by the last budget the test measured
(``Patience.current()``, tests/patience.py).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import tempfile
import urllib.error
import urllib.request
from typing import Any, Iterator, List, Optional, Tuple

import pytest

from patience import Patience

ROOT = pathlib.Path(__file__).resolve().parents[3]
TARGET = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
LAUNCHER = TARGET / "debug" / "fencelock-testkit-server"
#: The Rust CLI, built with ``cargo build -p fencelock-cli --all-features``.
CLI = TARGET / "debug" / "fencelock"


def need(binary: pathlib.Path, build: str) -> str:
    if not binary.exists():
        pytest.fail(f"{binary} is missing: build it with `{build}`", pytrace=False)
    return str(binary)


class Server:
    """One running server: its fencelock ``url`` and its controls."""

    def __init__(self, engine: str) -> None:
        launcher = need(LAUNCHER, "cargo build -p fencelock-testkit --bin fencelock-testkit-server")
        self.engine = engine
        self._process = subprocess.Popen(
            [launcher, engine],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._process.stdout is not None
        line = self._process.stdout.readline()
        if not line:
            self._process.wait()
            raise RuntimeError(f"the {engine} server did not start (exit {self._process.returncode})")
        started = json.loads(line)
        self.url: str = started["url"]
        self.port: int = started["port"]

    def command(self, command: str) -> None:
        """``pause`` (SIGSTOP), ``resume``, ``kill`` or ``start``."""
        assert self._process.stdin is not None and self._process.stdout is not None
        self._process.stdin.write(command + "\n")
        self._process.stdin.flush()
        answer = self._process.stdout.readline().strip()
        if answer != "ok":
            raise RuntimeError(f"{command}: {answer}")

    def stop(self) -> None:
        assert self._process.stdin is not None
        self._process.stdin.close()
        self._process.wait(timeout=Patience.current().scale(60))


@pytest.fixture(scope="session")
def redis() -> Iterator[Server]:
    server = Server("redis")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def postgres() -> Iterator[Server]:
    server = Server("postgres")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def sqlite_url() -> Iterator[str]:
    with tempfile.TemporaryDirectory() as directory:
        yield f"sqlite://{directory}/locks.db"


@pytest.fixture(params=["sqlite", "redis", "postgres"])
def url(request: pytest.FixtureRequest) -> str:
    """Each of the engines every binding is tested on, in turn."""
    if request.param == "sqlite":
        value: str = request.getfixturevalue("sqlite_url")
        return value
    server: Server = request.getfixturevalue(request.param)
    return server.url


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Runs the Rust CLI (``--json``) on ``url``."""
    binary = need(CLI, "cargo build -p fencelock-cli --all-features")
    env = {k: v for k, v in os.environ.items() if k != "RUST_LOG"}
    env["FENCELOCK_URL"] = url
    timeout = Patience.current().scale(120)
    return subprocess.run([binary, "--json", *args], capture_output=True, text=True, env=env, timeout=timeout)


def cli_json(url: str, *args: str) -> dict:  # type: ignore[type-arg]
    out = cli(url, *args)
    lines: List[str] = out.stdout.strip().splitlines()
    assert len(lines) == 1, (args, out.stdout, out.stderr)
    value: dict = json.loads(lines[0])  # type: ignore[type-arg]
    return value


#: The tokens of :class:`Service`: one admin, one client (namespace ``pytest``).
ADMIN_TOKEN = "admin-token-0123456789abcdef"
CLIENT_TOKEN = "client-token-0123456789abcdef"


class Service:
    """``fencelock serve`` over ``url`` (the CLI above) with an admin and a
    client token; its address is ``base`` (``http://127.0.0.1:PORT``)."""

    def __init__(self, url: str) -> None:
        binary = need(CLI, "cargo build -p fencelock-cli --all-features")
        self._directory = tempfile.TemporaryDirectory()
        tokens = pathlib.Path(self._directory.name) / "tokens.txt"
        tokens.write_text(f"admin {ADMIN_TOKEN}\nclient {CLIENT_TOKEN} pytest\n")
        tokens.chmod(0o600)
        env = {k: v for k, v in os.environ.items() if k != "FENCELOCK_HTTP_TOKEN"}
        env["RUST_LOG"] = "error"  # not the warning every admin reset logs
        self._process = subprocess.Popen(
            [binary, "--url", url, "serve", "--listen", "127.0.0.1:0", "--token-file", str(tokens)],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self._process.stdout is not None
        # The service prints `listening on http://ADDR` once it listens;
        # an early exit ends stdout instead.
        for line in self._process.stdout:
            if line.startswith("listening on "):
                self.base: str = line.removeprefix("listening on ").strip()
                break
        else:
            self._process.wait()
            raise RuntimeError(f"fencelock serve did not start (exit {self._process.returncode})")

    def fence_url(self, token: str) -> str:
        """The ``http://`` URL of this service with ``token``."""
        return self.base.replace("http://", f"http://:{token}@", 1)

    def request(self, method: str, path: str, token: str, body: Optional[Any] = None) -> Tuple[int, Any]:
        """``method path`` with ``token``; the status and the JSON answer."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=Patience.current().scale(30)) as answer:
                return int(answer.status), json.loads(answer.read())
        except urllib.error.HTTPError as refused:
            return refused.code, json.loads(refused.read())

    def stop(self) -> None:
        self._process.terminate()
        self._process.wait(timeout=Patience.current().scale(60))
        assert self._process.stdout is not None
        self._process.stdout.close()
        self._directory.cleanup()
