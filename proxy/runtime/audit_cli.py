"""`tollhouse audit verify` and `tollhouse audit public-key` (docs/audit-evidence.md): the
audit chains checked with the public key alone, and that key exported for an auditor."""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from proxy.config import ConfigError, load


def add_commands(audit: argparse.ArgumentParser) -> None:
    """`verify` and `public-key` under `tollhouse audit` (which, without one, lists records)."""
    sub = audit.add_subparsers(dest="audit_command", metavar="{verify,public-key}")
    verify = sub.add_parser(
        "verify", help="check every link and signature of the audit chains; exit 1 naming "
                       "the first record changed, removed, inserted or reordered")
    _config(verify)
    verify.add_argument("--db", help="the database to verify (a URL, or a SQLite file), "
                                     "instead of the one the config names")
    verify.add_argument("--public-key", action="append", default=[], metavar="FILE",
                        help="a PEM public key the checkpoints are signed with (`tollhouse "
                             "audit public-key`); repeat for a rotated key. Default: the "
                             "public half of the config's [audit.chain] signing_key")
    verify.add_argument("--since", help="verify from this time: a duration such as 7d, or "
                                        "an ISO time (default: everything kept)")
    verify.add_argument("--by", help="who verifies, as recorded (default: the OS user)")
    public = sub.add_parser("public-key", help="print the public key the audit checkpoints "
                                               "are verified with (PEM)")
    _config(public)


def _config(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=os.environ.get("TOLLHOUSE_CONFIG"),
                   help="path to the TOML config (default: $TOLLHOUSE_CONFIG)")


def command(args: argparse.Namespace, parse_since: Callable[[str], float]) -> int:
    """`parse_since`: how the command line reads a time (proxy.runtime.cli)."""
    if args.audit_command == "public-key":
        return _public_key(args)
    return _verify(args, parse_since(args.since) if args.since else None)


def _signing_key(args: argparse.Namespace) -> Any:
    from proxy.config.audit_chain import signing_key

    if not args.config:
        raise ConfigError("config: no file given: pass --config PATH or set TOLLHOUSE_CONFIG")
    cfg = load(args.config)
    return cfg, signing_key(cfg.audit.chain, Path(args.config).resolve().parent)


def _public_key(args: argparse.Namespace) -> int:
    from proxy.audit.chain import public_pem

    _, key = _signing_key(args)
    sys.stdout.write(public_pem(key))
    return 0


def _keys(args: argparse.Namespace) -> tuple[list[Any], str | None]:
    """The public keys to verify with, and the database URL the config names (if read)."""
    from proxy.audit.chain import load_public

    if not args.public_key:
        if not args.config:
            raise ConfigError("audit verify: give the public key (--public-key FILE, from "
                              "`tollhouse audit public-key`) or the config (--config PATH) "
                              "whose [audit.chain] signing_key signs the checkpoints")
        cfg, key = _signing_key(args)
        return [key.public_key()], cfg.database.url
    keys = []
    for path in args.public_key:
        try:
            keys.append(load_public(Path(path).read_bytes()))
        except OSError as exc:
            raise ConfigError(f"--public-key: {path} cannot be read: {exc.strerror}") from None
        except (ValueError, TypeError):
            raise ConfigError(f"--public-key: {path} is not an Ed25519 public key in PEM "
                              "(`tollhouse audit public-key` prints one)") from None
    url = load(args.config).database.url if args.config and not args.db else None
    return keys, url


def _verify(args: argparse.Namespace, since: float | None) -> int:
    from proxy.audit import verify
    from proxy.audit.chain import key_id
    from proxy.storage import db

    keys, url = _keys(args)
    target = args.db or url
    if not target:
        raise ConfigError("audit verify: which database? pass --config PATH or --db URL")
    out = sys.stdout
    database = db.resolve(target)
    try:
        out.write(f"verifying the audit log in {database!r} with key "
                  f"{', '.join(key_id(k) for k in keys)}\n")
        unreadable: tuple[type[Exception], ...] = (FileNotFoundError, *database.errors)
        try:
            outcome = verify.verify(database, keys, since)
        except unreadable as exc:
            print(f"tollhouse: audit verify: cannot read the database: {exc}", file=sys.stderr)
            return 2
        for start in outcome.starts:
            out.write(f"  chain {start}\n")
        if outcome.ok:
            out.write(f"OK: {outcome.detail}\n")
        else:
            out.write(f"FAILED: {outcome.problems[0]}\n")
            for problem in outcome.problems[1:]:
                out.write(f"  also: {problem}\n")
        by = args.by or getpass.getuser()
        try:
            verify.record(database, outcome, by)
        except database.errors as exc:
            print(f"tollhouse: audit verify: the outcome could not be recorded: {exc}",
                  file=sys.stderr)
    finally:
        if database is not target:
            database.close()
    return 0 if outcome.ok else 1
