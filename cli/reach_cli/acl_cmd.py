"""``reach acl``: the ``ACL SETUSER`` lines of least-privilege users for a namespace."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from reach import acl
from reach.config import read_secret_file

from .common import DEFAULT_NS, Json, Namespace, cli_errors, fail, print_json, require_text, warn


def acl_cmd(
    role: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option(
            "--role",
            metavar="ROLE",
            help="agent (a worker), caller (a Client, reach send/task) or operator (the "
            "CLI's looking and repairing); repeat for several (default: all three).",
        ),
    ] = None,
    user: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--user",
            metavar="NAME",
            help="The user's name, with one --role (default: reach-NS-ROLE).",
        ),
    ] = None,
    password_file: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(
            "--password-file",
            metavar="FILE",
            help="A file holding the users' password: the lines carry its SHA-256 "
            "(#...), never the password. Not given: the users get no password (they "
            "cannot log in until one is added).",
        ),
    ] = None,
    namespace: Namespace = DEFAULT_NS,
    json_: Json = False,
) -> None:
    """Print the ACL SETUSER line of a least-privilege Redis user per role for a
    namespace: its keys only (no other namespace's, not even a prefix-sharing one), no
    pub/sub channel, only the commands the role runs. Pipe them to redis-cli as an admin
    user; see docs/security.md.

    Example: reach acl -n prod --role agent --password-file /run/secrets/reach-agent | redis-cli
    """
    require_text({"namespace": namespace, "user": user, "role": role})
    with cli_errors():
        roles = [acl.check_role(r) for r in dict.fromkeys(role or acl.ROLES)]
        if user is not None and len(roles) != 1:
            fail("--user names one user: give exactly one --role with it.")
        password = None if password_file is None else read_secret_file(password_file)
        users = []
        for r in roles:
            name = user or acl.default_user(namespace, r)
            rules = acl.rules(namespace, r, password=password)
            users.append(
                {
                    "role": r,
                    "user": name,
                    "rules": rules,
                    "line": acl.setuser_line(name, rules),
                }
            )
    if json_:
        print_json(
            {
                "namespace": namespace,
                "key_patterns": acl.key_patterns(namespace),
                "users": users,
            }
        )
    else:
        for u in users:
            print(u["line"])
    if password is None:
        warn(
            "no --password-file: these users have no password and cannot log in until "
            "one is set (ACL SETUSER NAME >PASSWORD, or run again with --password-file)."
        )
