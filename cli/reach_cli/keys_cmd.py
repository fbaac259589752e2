"""``reach keys``: make the secrets signing uses (docs/security.md, *Signed envelopes*): a
shared namespace secret (HMAC mode) or an identity's Ed25519 key pair (per-identity mode).
Nothing here talks to Redis."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Annotated

import typer

from reach.errors import ConfigError
from reach.signing import keygen

from .common import Json, fail, print_json, require_text

keys_app = typer.Typer(
    help="Make signing keys: a shared namespace secret, or an identity's Ed25519 key pair.",
    no_args_is_help=True,
)

SECRET_BYTES = 32


@keys_app.command("secret")
def secret_cmd(json_: Json = False) -> None:
    """Print a new random shared secret for a namespace (32 random bytes, URL-safe text).

    Give the same secret to every agent and caller of the namespace (`REACH_SECRET`, or
    `secret=`); list two, comma-separated, during a rollover (the first signs).

    Example: reach keys secret > /run/secrets/reach-secret
    """
    value = secrets.token_urlsafe(SECRET_BYTES)
    if json_:
        print_json({"secret": value})
    else:
        print(value)


@keys_app.command("keygen")
def keygen_cmd(
    name: Annotated[
        str, typer.Argument(help="The identity's name: 1-64 letters, digits or _.:@/-.")
    ],
    out: Annotated[
        Path,
        typer.Option(
            "--out",
            "-o",
            metavar="FILE",
            help="Where to write the private key (created with mode 0600; an existing "
            "file is never overwritten).",
        ),
    ],
    json_: Json = False,
) -> None:
    """Make an Ed25519 identity: write its private key to FILE and print its trusted-keys
    line (`NAME BASE64-PUBLIC-KEY`) for the trusted-keys file every agent and caller reads.

    The process that signs as NAME gets FILE (`REACH_IDENTITY_FILE` or `identity_file=`);
    the line goes into the file given as `REACH_TRUSTED_KEYS_FILE`. Needs the
    `cryptography` package (`pip install 'reach-fabric[ed25519]'`).

    Example: reach keys keygen billing-service -o billing.key >> trusted-keys
    """
    require_text({"name": name})
    try:
        private, line = keygen(name)
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        fail(f"{out} exists: pick another file (a private key is never overwritten).")
    except (ConfigError, OSError) as e:
        fail(e)
    with os.fdopen(fd, "w") as f:
        f.write(private)
    if json_:
        print_json({"name": name, "private_key_file": str(out), "trusted_line": line.strip()})
    else:
        print(line, end="")
