"""The console script: `tollhouse serve | demo | audit | usage | db | users | keys | policy
| config`."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import logging
import os
import re
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import orjson

from proxy import confine
from proxy.config import Config, ConfigError, load
from proxy.runtime import audit_cli
from proxy.runtime.serve import (
    configure_logging,
    run_hypercorn,
    run_loop,
    serving_app,
    tune_collector,
)

T = TypeVar("T")

log = logging.getLogger("tollhouse")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    commands: dict[str, Callable[[argparse.Namespace], int]] = {
        "serve": _serve, "demo": _demo, "keys": _keys, "usage": _usage, "users": _users,
        "db": _db, "audit": _audit, "policy": _policy, "config": _config}
    try:
        return commands[args.command](args)
    except ConfigError as exc:
        print(f"tollhouse: {exc}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    """Every command and its options; the account commands' in `_account_commands`."""
    parser = argparse.ArgumentParser(prog="tollhouse", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the gateway")
    _config_arg(serve)
    serve.add_argument("--log-level", default="info",
                       choices=["debug", "info", "warning", "error"])

    demo = sub.add_parser("demo", help="run a demo MCP server and the gateway in front of it")
    demo.add_argument("--port", type=int, default=8080, help="the gateway's port (0: any free)")
    demo.add_argument("--db", default=None,
                      help="SQLite file for the audit log (default: a temporary directory)")
    demo.add_argument("--log-level", default="info",
                      choices=["debug", "info", "warning", "error"])

    audit = sub.add_parser("audit", help="print recent audit records, newest first")
    _config_arg(audit)
    audit.add_argument("--db", help="the database to read (a URL, or a SQLite file), "
                                    "instead of the one the config names")
    audit.add_argument("--status", choices=["ok", "denied", "error", "cancelled"])
    audit.add_argument("--endpoint")
    audit.add_argument("--since", help="a duration such as 30s, 15m, 2h, 7d, or an ISO time")
    audit.add_argument("--limit", type=int, default=50)
    audit.add_argument("--json", action="store_true", help="one JSON object per line")
    audit_cli.add_commands(audit)  # audit verify, audit public-key

    usage = sub.add_parser("usage", help="calls per principal, endpoint and tool over a period")
    _config_arg(usage)
    usage.add_argument("--db", help="the database to read (a URL, or a SQLite file), "
                                    "instead of the config's")
    usage.add_argument("--since", default="24h",
                       help="a duration such as 30m, 24h, 7d, or an ISO time (default 24h)")
    usage.add_argument("--json", action="store_true", help="one JSON object per line")

    database = sub.add_parser("db", help="the database schema")
    database_sub = database.add_subparsers(dest="db_command", required=True)
    upgrade = database_sub.add_parser("upgrade", help="apply pending schema migrations")
    _config_arg(upgrade)
    rollups = database_sub.add_parser(
        "rollups", help="rebuild the audit rollups (what the usage aggregates read) from the "
                        "audit records, after records were added or removed by other means")
    _config_arg(rollups)
    config = sub.add_parser("config", help="the config file's keys")
    config.add_subparsers(dest="config_command", required=True).add_parser(
        "reference", help="print the Markdown reference of every key (docs/config-reference.md)")
    _account_commands(sub)
    _policy_commands(sub)
    return parser


def _account_commands(sub: Any) -> None:
    """`users` (local accounts) and `keys` (API keys)."""
    users = sub.add_parser("users", help="local user accounts")
    users_sub = users.add_subparsers(dest="users_command", required=True)
    ucreate = users_sub.add_parser("create", help="create a local user")
    _config_arg(ucreate)
    ucreate.add_argument("name")
    ucreate.add_argument("--admin", action="store_true")
    ucreate.add_argument("--password-stdin", action="store_true",
                         help="read the password from standard input (else: prompt)")
    ulist = users_sub.add_parser("list", help="list users")
    _config_arg(ulist)
    ulist.add_argument("--json", action="store_true")

    keys = sub.add_parser("keys", help="create, list and revoke API keys")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    create = keys_sub.add_parser("create", help="create a key; its secret is shown once")
    _config_arg(create)
    create.add_argument("--name", required=True)
    create.add_argument("--endpoint", action="append", default=[],
                        help="limit the key to this endpoint (repeatable; default: all)")
    create.add_argument("--role", choices=["admin", "auditor"], default="",
                        help="admin: the management API; auditor: reads the audit evidence "
                             "through it and changes nothing (names no endpoint)")
    create.add_argument("--expires-in", type=float, metavar="DAYS")
    create.add_argument("--json", action="store_true")
    listing = keys_sub.add_parser("list", help="list keys (never their secrets)")
    _config_arg(listing)
    listing.add_argument("--json", action="store_true")
    revoke = keys_sub.add_parser("revoke", help="revoke a key; it fails on its next request")
    _config_arg(revoke)
    revoke.add_argument("id")


def _policy_commands(sub: Any) -> None:
    """`policy check | test | explain | schema` (proxy.runtime.policy_cli)."""
    policy = sub.add_parser("policy", help="check, test and explain the Cedar policies")
    policy_sub = policy.add_subparsers(dest="policy_command", required=True)
    commands = {
        "check": "validate the policies against the schema; non-zero on any problem",
        "test": "run the cases of a TOML file; non-zero on any mismatch",
        "explain": "the decision on each case, the policies that decided, the shadow decision",
        "schema": "print the Cedar schema generated from the upstreams' tools as last seen"}
    for name, text in commands.items():
        command = policy_sub.add_parser(name, help=text)
        _config_arg(command)
        command.add_argument("--tools", metavar="FILE",
                             help="the tools as JSON ({endpoint: [tool, ...]}) instead of those "
                                  "last seen in the database")
        if name in ("test", "explain"):
            command.add_argument("cases", metavar="CASES.toml")
        if name == "explain":
            command.add_argument("--case", type=int, metavar="N", help="only case N (from 1)")


def _policy(args: argparse.Namespace) -> int:
    from proxy.runtime import policy_cli

    return policy_cli.command(args)


def _config_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=os.environ.get("TOLLHOUSE_CONFIG"),
                   help="path to the TOML config (default: $TOLLHOUSE_CONFIG)")


def _load(args: argparse.Namespace,
          env: Mapping[str, str] | None = None) -> tuple[Config, Path]:
    if not args.config:
        raise ConfigError("config: no file given: pass --config PATH or set TOLLHOUSE_CONFIG")
    return load(args.config, env), Path(args.config).resolve().parent


def _serve(args: argparse.Namespace) -> int:
    env = confine.Environment(os.environ)  # from here on the config and secrets read this
    cfg, base_dir = _load(args, env)
    _check_secrets(cfg, base_dir, env)
    from proxy.compiled import preflight

    preflight(cfg, base_dir)  # the Cedar policies, against the tools as last seen
    configure_logging(args.log_level, log_format=cfg.observability.log_format)
    confine.undumpable()  # the environment of its exec holds the secrets: closed to others
    env.withdraw()  # and os.environ holds them no more
    if cfg.server.workers > 1:
        return _serve_workers(cfg, Path(args.config).resolve(), args.log_level, env)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # until the loop's handler reloads
    app = serving_app(cfg, base_dir, env)
    tune_collector(app, cfg.server)
    log.info("tollhouse listening on %s, endpoints: %s", cfg.server.listen, _endpoints(cfg))
    try:
        run_loop(run_hypercorn(app, [cfg.server.listen], cfg.server.shutdown_grace_s,
                                config_path=Path(args.config).resolve(), env=env),
                 cfg.server.event_loop)
    except OSError as exc:
        print(f"tollhouse: cannot listen on {cfg.server.listen}: {exc.strerror}",
              file=sys.stderr)
        return 1
    return 0


def _endpoints(cfg: Config) -> str:
    return ", ".join(f"/mcp/{u.name}" for u in cfg.upstreams) or "(none)"


def _serve_workers(cfg: Config, config_path: Path, log_level: str,
                   env: confine.Environment) -> int:
    """`server.workers` > 1 (proxy.runtime.workers): the address bound and the schema migrated here,
    once, before any worker starts; then the workers, supervised until a stop signal."""
    from proxy.runtime import workers
    from proxy.storage.db import Database

    try:
        sock = workers.listen_socket(cfg.server.listen)
    except OSError as exc:
        print(f"tollhouse: cannot listen on {cfg.server.listen}: {exc.strerror}",
              file=sys.stderr)
        return 1
    with sock:
        with Database(cfg.database.url, busy_timeout_s=cfg.database.busy_timeout_s) as db:
            try:
                db.ensure_schema()  # N workers starting at once then find nothing to migrate
            except db.errors as exc:
                print(f"tollhouse: database {db!r}: {exc}", file=sys.stderr)
                return 1
        where = workers.address(sock)

        def announce() -> None:
            log.info("tollhouse listening on %s with %d workers, endpoints: %s", where,
                     cfg.server.workers, _endpoints(cfg))

        return workers.serve(cfg, config_path, sock, log_level, announce, env)


def _check_secrets(cfg: Config, base_dir: Path, env: Mapping[str, str]) -> None:
    """Every secret serve will read, checked before anything is opened or written (no database
    file, no migration): a missing or malformed one is a config error, one line and exit 2."""
    from proxy.connect.vault import keys_from_env
    from proxy.oauth.keys import NO_SECRET

    if cfg.oauth_server.enabled and not env.get("TOLLHOUSE_SECRET_KEY"):
        raise ConfigError(NO_SECRET)
    if any(u.auth == "per_user" for u in cfg.upstreams):
        keys_from_env(env)  # raises VaultKeyMissing, a ConfigError naming what to set
    if cfg.auth.signing_key_pem and any(u.identity == "jwt" for u in cfg.upstreams):
        _check_pem(cfg.auth.signing_key_pem, "auth.signing_key_pem", base_dir, private=True)
    for i, issuer in enumerate(cfg.auth.issuers if cfg.auth.mode == "jwt" else ()):
        if issuer.public_key_pem:
            _check_pem(issuer.public_key_pem, f"auth.issuers[{i}].public_key_pem", base_dir,
                       private=False)


def _check_pem(value: str, key: str, base_dir: Path, *, private: bool) -> None:
    """A PEM key inline (often `${VAR}`) or in a file, parsed as the gateway will parse it."""
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import (
        load_pem_private_key,
        load_pem_public_key,
    )

    kind = "an EC P-256 private key" if private else "a public key"
    if "-----BEGIN" in value:
        pem, where = value, ""
    else:
        where = f" ({base_dir / value})"
        try:
            pem = (base_dir / value).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = getattr(exc, "strerror", None) or "not UTF-8 text"
            raise ConfigError(f"config: '{key}'{where} cannot be read: {reason}: set it to "
                              f"{kind} in PEM, inline or as a file next to the config") from None
    try:
        parsed: Any = (load_pem_private_key(pem.encode(), password=None) if private
                       else load_pem_public_key(pem.encode()))
    except (ValueError, TypeError):  # the cryptography error text names no key: ours does
        parsed = None
    if parsed is None or (private and not (isinstance(parsed, ec.EllipticCurvePrivateKey)
                                           and parsed.curve.name == "secp256r1")):
        raise ConfigError(f"config: '{key}'{where} is not {kind} in PEM: set it to one, inline "
                          "or as a file next to the config")


def _demo(args: argparse.Namespace) -> int:
    configure_logging(args.log_level)
    from proxy.config import from_dict
    from proxy.demo import demo_app
    from proxy.runtime.app import create_app

    demo_sock = socket.socket()
    demo_sock.bind(("127.0.0.1", 0))
    demo_sock.listen(128)
    demo_port = demo_sock.getsockname()[1]
    db = args.db or os.path.join(tempfile.mkdtemp(prefix="tollhouse-demo-"), "tollhouse.db")
    gw_sock = socket.socket()
    gw_sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        gw_sock.bind(("127.0.0.1", args.port))
    except OSError as exc:
        print(f"tollhouse: cannot listen on 127.0.0.1:{args.port}: {exc.strerror}",
              file=sys.stderr)
        return 1
    gw_sock.listen(1024)
    port = gw_sock.getsockname()[1]
    cfg = from_dict({
        "server": {"listen": f"127.0.0.1:{port}", "public_url": f"http://127.0.0.1:{port}"},
        "auth": {"mode": "none"},
        "database": {"url": f"sqlite:///{db}"},
        "upstreams": [{"name": "demo", "url": f"http://127.0.0.1:{demo_port}/mcp"}],
    })
    app = create_app(cfg)
    password = _demo_admin(cfg.database.url)
    print(f"Tollhouse demo: MCP URL  http://127.0.0.1:{port}/mcp/demo", flush=True)
    print(f"  web console: http://127.0.0.1:{port}/console/  (sign in as demo-admin"
          + (f", one-time password {password})" if password else ")"), flush=True)
    print(f"  audit log: tollhouse audit --db {db}", flush=True)
    print("  Ctrl-C to stop", flush=True)

    # the demo's own MCP server says where it listens only at --log-level debug: the URL to
    # paste is the gateway's, printed above
    inner = "tollhouse.demo.upstream"
    logging.getLogger(inner).setLevel(logging.DEBUG if args.log_level == "debug"
                                      else logging.WARNING)

    async def run() -> None:
        stop = asyncio.Event()
        await asyncio.gather(
            run_hypercorn(demo_app(), [f"fd://{demo_sock.detach()}"], 2.0, stop,
                          errorlog=inner),
            run_hypercorn(app, [f"fd://{gw_sock.detach()}"], 5.0, stop),
        )

    run_loop(run())
    return 0


def _demo_admin(url: str) -> str | None:
    """The demo's administrator for the web console, with a new random password printed once;
    None when the demo database (--db) has one already (its password is the one printed then)."""
    import secrets

    from proxy.people.accounts import Accounts, UserExists

    accounts = Accounts(url)
    password = secrets.token_urlsafe(12)
    try:
        accounts.create_local("demo-admin", password, admin=True)
    except UserExists:
        return None
    finally:
        accounts.close()
    return password


def _config(args: argparse.Namespace) -> int:
    """`tollhouse config reference`: the reference generated from the config tables."""
    from proxy.config import reference

    sys.stdout.write(reference.render())
    return 0


def _db(args: argparse.Namespace) -> int:
    from proxy.audit import rollup  # registers the rollup tables' migrations
    from proxy.storage import migrations
    from proxy.storage.db import Database

    cfg, _ = _load(args)
    if args.db_command == "rollups":
        with Database(cfg.database.url) as database:
            began = time.monotonic()
            try:
                rollup.rebuild(database)
            except database.errors as exc:
                print(f"tollhouse: db rollups: {database!r}: {exc}", file=sys.stderr)
                return 1
        print(f"audit rollups rebuilt in {time.monotonic() - began:.1f} s")
        return 0
    with Database(cfg.database.url) as database:
        return migrations.command(database)


def _users(args: argparse.Namespace) -> int:
    from proxy.people.accounts import USER_NAME, Accounts, UserExists

    cfg, _ = _load(args)
    accounts = Accounts(cfg.database.url)
    if args.users_command == "list":
        for user in accounts.list():
            row = {"id": user.id, "name": user.name, "issuer": user.issuer,
                   "subject": user.subject, "admin": user.is_admin}
            sys.stdout.write((orjson.dumps(row).decode() if args.json else
                              f"{user.id}  {user.name:<24} {'admin' if user.is_admin else ''}")
                             + "\n")
        return 0
    if not re.fullmatch(USER_NAME, args.name):
        print("tollhouse: users create: NAME must be 1-64 letters, digits, '_', '.', '@' or '-'",
              file=sys.stderr)
        return 2
    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        import getpass

        password = getpass.getpass("password: ")
        if getpass.getpass("again: ") != password:
            print("tollhouse: users create: the passwords differ", file=sys.stderr)
            return 2
    if len(password) < 8:
        print("tollhouse: users create: the password needs at least 8 characters",
              file=sys.stderr)
        return 2
    try:
        user = accounts.create_local(args.name, password, admin=args.admin)
    except UserExists:
        print(f"tollhouse: users create: a user named {args.name} exists", file=sys.stderr)
        return 1
    sys.stdout.write(f"created user {user.name} ({user.id}){' as admin' if user.is_admin else ''}"
                     "\n")
    return 0


def _printed_plainly(rows: list[dict[str, Any]], as_json: bool, empty: str) -> bool:
    """JSON lines, or the message for no rows: True when nothing is left to print."""
    if as_json:
        for row in rows:
            sys.stdout.write(orjson.dumps(row).decode() + "\n")
        return True
    if not rows:
        sys.stdout.write(empty + "\n")
        return True
    return False


def _usage(args: argparse.Namespace) -> int:
    from proxy.audit.database import usage

    path = args.db if args.db else _load(args)[0].database.url
    rows = usage(path, since=parse_since(args.since))
    out = sys.stdout
    if _printed_plainly(rows, args.json, "no calls in that period"):
        return 0
    out.write(f"{'principal':<28} {'endpoint':<14} {'tool':<24} {'calls':>6} {'ok':>6} "
              f"{'denied':>6} {'error':>6} {'bytes in':>10} {'bytes out':>10}\n")
    for r in rows:
        out.write(f"{r['principal'][:28]:<28} {r['endpoint'][:14]:<14} "
                  f"{(r['tool'] or '-')[:24]:<24} {r['calls']:>6} {r['ok']:>6} "
                  f"{r['denied']:>6} {r['error']:>6} {r['bytes_in']:>10} {r['bytes_out']:>10}\n")
    return 0


def _keys(args: argparse.Namespace) -> int:
    from proxy.auth import keys

    cfg, _ = _load(args)
    path = cfg.database.url
    out = sys.stdout
    if args.keys_command == "create":
        unknown = [e for e in args.endpoint if cfg.upstream(e) is None]
        if unknown:
            print(f"tollhouse: keys create: no endpoint named {', '.join(unknown)} in the config",
                  file=sys.stderr)
            return 2
        if args.expires_in is not None and args.expires_in <= 0:
            print("tollhouse: keys create: --expires-in must be a positive number of days",
                  file=sys.stderr)
            return 2
        if args.role == "auditor" and args.endpoint:
            print("tollhouse: keys create: an auditor key names no --endpoint",
                  file=sys.stderr)
            return 2
        key, secret = keys.create(path, args.name, args.endpoint, args.role, args.expires_in)
        if args.json:
            out.write(orjson.dumps({"id": key.id, "key": secret, "name": key.name}).decode()
                      + "\n")
        else:
            scope = ", ".join(sorted(key.endpoints)) or "every endpoint"
            if key.role == "auditor":
                scope = "the management API, to read the audit evidence (no endpoint)"
            out.write(f"created API key {key.id} ({key.name}) for {scope}; "
                      "the secret below is shown once:\n")
            out.write(secret + "\n")
        return 0
    if args.keys_command == "list":
        rows = [k.public() for k in keys.list_keys(path)]
        if args.json:
            for row in rows:
                out.write(orjson.dumps(row).decode() + "\n")
            return 0
        for row in rows:
            out.write(f"{row['id']}  {row['status']:<8} {row['name']:<24} "
                      f"{','.join(row['endpoints']) or '*'}  {row['role']}\n")
        return 0
    if keys.revoke(path, args.id):
        out.write(f"revoked API key {args.id}\n")
        return 0
    print(f"tollhouse: keys revoke: no active key with id {args.id}", file=sys.stderr)
    return 1


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")


def parse_since(text: str, now: float | None = None) -> float:
    now = dt.datetime.now(dt.UTC).timestamp() if now is None else now
    match = _DURATION.match(text.strip())
    if match:
        value, unit = float(match.group(1)), match.group(2)
        return now - value * {"s": 1, "m": 60, "h": 3600, "d": 86400}[unit]
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(f"--since: '{text}' is neither a duration (30s, 15m, 2h, 7d) nor an "
                          "ISO time") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


def _audit(args: argparse.Namespace) -> int:
    from proxy.audit import query

    if getattr(args, "audit_command", None):
        return audit_cli.command(args, parse_since)

    path = args.db if args.db else _load(args)[0].database.url
    since = parse_since(args.since) if args.since else None
    rows = query(path, status=args.status, endpoint=args.endpoint,
                 since=since, limit=args.limit)
    out = sys.stdout
    if _printed_plainly(rows, args.json, "no audit records"):
        return 0
    out.write(f"{'time (UTC)':<20} {'status':<9} {'endpoint':<14} {'method':<24} "
              f"{'ms':>8}  principal / reason\n")
    for r in rows:
        when = dt.datetime.fromtimestamp(r["ts"], dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
        method = r["method"] or "-"
        if r["tool"]:
            method = f"{method} {r['tool']}"
        reason = r["denied_reason"] or r["error_message"] or ""
        out.write(f"{when:<20} {r['status']:<9} {r['endpoint']:<14} {method[:24]:<24} "
                  f"{r['duration_ms']:>8.1f}  {r['principal']}"
                  f"{' / ' + reason if reason else ''}\n")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
