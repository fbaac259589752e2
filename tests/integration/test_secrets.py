"""Secrets out of process lists and output, and TLS (docs/security.md).

A Redis user with a password; the URL and the password given as files
(``--redis-url-file``, ``--redis-password-file``, their environment variables): a ``reach
worker`` process's command line and environment do not hold the password, nor its logs
(debug level), nor what ``reach top``, ``reach doctor`` and ``reach agents`` print, nor
the errors of a wrong password or an unreachable server. Then a local Redis with TLS
(certificates of a throwaway CA made with ``openssl``): a Client and the CLI over
``rediss://`` with the CA and a client certificate; without the client certificate the
server refuses.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis
from reach_cli.app import app
from typer.testing import CliRunner

import reach
from reach.embedded import RedisServer, find_server_binary, free_port
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
SECRET = "Pw-0f-the-app-user-7d1c"
runner = CliRunner()


def cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    res = runner.invoke(app, list(args), env=env)
    assert res.exception is None or isinstance(res.exception, SystemExit), (
        args,
        repr(res.exception),
        res.output,
    )
    return res.exit_code, res.stdout, res.stderr


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer(binary=find_server_binary()) as s:
        admin = redis.Redis.from_url(s.url)
        admin.execute_command("ACL", "SETUSER", "app", "on", f">{SECRET}", "~*", "&*", "+@all")
        admin.close()
        yield s


@pytest.fixture
def files(server: RedisServer, tmp_path: Path) -> dict[str, Path]:
    url = tmp_path / "url"
    url.write_text(server.url.replace("redis://", "redis://app@") + "\n")
    pw = tmp_path / "pw"
    pw.write_text(SECRET + "\n")
    bad = tmp_path / "bad-pw"
    bad.write_text("not-" + SECRET + "\n")
    for f in (url, pw, bad):
        f.chmod(0o600)
    return {"url": url, "pw": pw, "bad": bad}


def test_a_worker_started_with_files_keeps_the_password_out_of_ps_and_logs(
    server: RedisServer, files: dict[str, Path], tmp_path: Path
) -> None:
    log = tmp_path / "worker.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("REACH_")}
    env["REACH_REDIS_PASSWORD_FILE"] = str(files["pw"])
    with open(log, "wb") as err:
        p = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "reach_cli.app",
                "worker",
                "tests.cli.worker_targets:factory",
                "--redis-url-file",
                str(files["url"]),
                "-n",
                "secrets",
                "--log-level",
                "debug",
            ],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=err,
            stderr=err,
        )
    try:
        admin = redis.Redis.from_url(server.url)

        async def registered() -> bool:
            return bool(admin.zcard("reach:{secrets}:agents"))

        try:
            anyio.run(lambda: wait_until(registered, timeout_s=20, what="the worker registered"))
        except AssertionError:
            raise AssertionError(log.read_text()) from None
        seen = (
            Path(f"/proc/{p.pid}/cmdline").read_bytes()
            + Path(f"/proc/{p.pid}/environ").read_bytes()
        )
        ps = subprocess.run(
            ["ps", "-ww", "-eo", "args"], check=False, capture_output=True, text=True
        ).stdout
        assert SECRET.encode() not in seen and SECRET not in ps
        assert str(files["url"]) in ps  # the file's name is all ps shows
        pwenv = {"REACH_REDIS_PASSWORD_FILE": str(files["pw"])}
        ns = ("--redis-url-file", str(files["url"]), "-n", "secrets")
        for args in (
            ("top", "--once"),
            ("top", "--once", "--json"),
            ("doctor", "--json"),
            ("agents",),
        ):
            code, out, err_ = cli(*args, *ns, env=pwenv)
            assert code in (0, 1), (args, out, err_)  # doctor: 1 for this test server's warnings
            assert SECRET not in out + err_, args
            assert "targets-1" in out or args[0] == "doctor", (args, out)
        code, out, _ = cli("doctor", "--json", *ns, env=pwenv)
        assert json.loads(out)["redis_url"].startswith("redis://app:***@")
        admin.close()
    finally:
        p.terminate()
        p.wait(timeout=20)
    text = log.read_text()
    assert "reach worker: targets-1 on redis://app:***@" in text
    assert "--redis-url-file" in text  # where the URL came from (the line may wrap)
    assert SECRET not in text


def test_errors_never_show_the_password(server: RedisServer, files: dict[str, Path]) -> None:
    url = ("--redis-url-file", str(files["url"]))
    code, out, err = cli("caps", *url, "--redis-password-file", str(files["bad"]))
    assert code == 2 and err.startswith("error:") and "refused the credentials" in err
    assert "not-" + SECRET not in out + err
    closed = files["url"].with_name("closed")
    closed.write_text(f"redis://app@127.0.0.1:{free_port()}/0")
    code, out, err = cli(
        "caps", "--redis-url-file", str(closed), "--redis-password-file", str(files["pw"])
    )
    assert code == 2 and err.startswith("error:") and "app:***@" in err, err
    assert SECRET not in out + err
    code, out, err = cli("caps", "--redis-url", "redis://x/0", *url)
    assert code == 2 and "not both" in err


@pytest.mark.anyio
async def test_a_client_reads_the_files_from_the_environment(
    server: RedisServer, files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("REACH_REDIS_URL", raising=False)
    monkeypatch.setenv("REACH_REDIS_URL_FILE", str(files["url"]))
    monkeypatch.setenv("REACH_REDIS_PASSWORD_FILE", str(files["pw"]))
    async with reach.Client(namespace="secrets-client") as c:
        assert await c.redis.execute_command("ACL", "WHOAMI") in (b"app", "app")


# -- TLS ------------------------------------------------------------------------------------
def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_certs(d: Path) -> dict[str, Path]:
    """A throwaway CA, a server certificate for 127.0.0.1 and a client certificate."""
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=reach test CA",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        cwd=d,
    )
    for name, ext in (
        ("server", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
        ("client", "extendedKeyUsage=clientAuth"),
    ):
        _openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            f"/CN=reach {name}",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            cwd=d,
        )
        (d / f"{name}.ext").write_text(ext + "\n")
        _openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            f"{name}.ext",
            "-out",
            f"{name}.crt",
            cwd=d,
        )
    return {n: d / n for n in ("ca.crt", "server.crt", "server.key", "client.crt", "client.key")}


def _tls_supported() -> str:
    if shutil.which("openssl") is None:
        return "no openssl to make the test certificates"
    binary = find_server_binary()
    out = subprocess.run(
        [binary.path, "--tls-port", "0", "--test-memory", "0"],
        capture_output=True,
        text=True,
        check=False,
    )
    if "not built with TLS" in out.stdout + out.stderr:
        return f"{binary.path} is built without TLS support"
    return ""


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, Path]]]:
    why = _tls_supported()
    if why:
        pytest.skip(why)
    certs = make_certs(tmp_path_factory.mktemp("tls"))
    port = free_port()
    args = (
        "--tls-port",
        str(port),
        "--tls-cert-file",
        str(certs["server.crt"]),
        "--tls-key-file",
        str(certs["server.key"]),
        "--tls-ca-cert-file",
        str(certs["ca.crt"]),
        "--tls-auth-clients",
        "yes",
    )
    with RedisServer(binary=find_server_binary(), extra_args=args):
        url = (
            f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={certs['ca.crt']}"
            f"&ssl_certfile={certs['client.crt']}&ssl_keyfile={certs['client.key']}"
        )
        yield url, certs


@pytest.mark.anyio
async def test_tls_with_a_ca_and_a_client_certificate(
    tls: tuple[str, dict[str, Path]], tmp_path: Path
) -> None:
    url, _ = tls
    agent = reach.Agent("tls-echo-1", capabilities=["tls.echo"])

    @agent.handler("tls.echo")
    async def echo(payload: Any, ctx: reach.Context) -> Any:
        return payload

    done = anyio.Event()

    async def serve() -> None:
        try:
            await agent.run(
                redis_url=url,
                namespace="tls",
                handle_signals=False,
                heartbeat_s=0.1,
                lease_s=0.3,
                evict_after_s=0.6,
            )
        finally:
            done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(serve)
        async with reach.Client(redis_url=url, namespace="tls") as client:

            async def ready() -> bool:
                try:
                    return bool(await client.eligible("tls.echo"))
                except reach.NoAgentAvailable:
                    return False

            await wait_until(ready, timeout_s=20, what="the agent over TLS")
            assert await client.request("tls.echo", "over tls", timeout_s=10) == "over tls"
        url_file = tmp_path / "url"
        url_file.write_text(url)
        code, out, err = await anyio.to_thread.run_sync(
            lambda: cli("caps", "--redis-url-file", str(url_file), "-n", "tls", "--json")
        )
        assert code == 0 and "tls.echo" in out, err
        agent.stop()
        with anyio.fail_after(10):
            await done.wait()
    # without the client certificate the server refuses: one error line
    no_cert = url.split("&ssl_certfile")[0]
    started = time.monotonic()
    code, out, err = await anyio.to_thread.run_sync(lambda: cli("caps", "--redis-url", no_cert))
    assert code == 2 and err.startswith("error:") and "Traceback" not in err, err
    assert time.monotonic() - started < 30


def test_a_worker_that_cannot_connect_does_not_show_the_password(
    files: dict[str, Path], tmp_path: Path
) -> None:
    closed = tmp_path / "closed-url"
    closed.write_text(f"redis://app@127.0.0.1:{free_port()}/0")
    env = {k: v for k, v in os.environ.items() if not k.startswith("REACH_")}
    p = subprocess.run(
        [sys.executable, "-m", "reach_cli.app", "worker", "tests.cli.worker_targets:factory"]
        + ["--redis-url-file", str(closed), "--redis-password-file", str(files["pw"])]
        + ["--log-level", "debug"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert p.returncode == 2 and "error:" in p.stderr and "app:***@" in p.stderr, p.stderr
    assert SECRET not in p.stdout + p.stderr


def test_every_command_that_takes_a_redis_url_takes_the_files() -> None:
    from reach_cli.app import command_line

    def walk(cmd: Any, path: str) -> Iterator[tuple[str, Any]]:
        yield path, cmd
        if hasattr(cmd, "commands"):
            for name, sub in cmd.commands.items():
                yield from walk(sub, f"{path} {name}".strip())

    seen = []
    for path, cmd in walk(command_line(), ""):
        opts = {o for p in cmd.params for o in getattr(p, "opts", [])}
        if "--redis-url" in opts and path != "init":  # init writes its URL to reach.toml
            assert {"--redis-url-file", "--redis-password-file"} <= opts, path
            seen.append(path)
    assert {"worker", "top", "agents", "caps", "doctor", "dlq replay", "send"} <= set(seen)
