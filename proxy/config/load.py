"""Reading the config file: TOML, `${VAR}` from the environment inside any string, one
dataclass per table (proxy.config.tables) built by walking the field types, so an unknown key,
a missing required key or a wrong type is refused with one line that names the key; then
`validate`, the section checks in the order they run."""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import tomllib
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from proxy.config import (
    approvals,
    audit_chain,
    audit_exports,
    auth,
    endpoints,
    guardrails,
    metering,
    observability,
    policy,
    presets,
    rates,
    server,
    stores,
    upstreams,
    zones,
)
from proxy.config.errors import ConfigError
from proxy.config.tables import Config

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def load(path: str | os.PathLike[str], env: typing.Mapping[str, str] | None = None) -> Config:
    """Read, substitute and validate the file at `path`; raise ConfigError on the first fault."""
    try:
        raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config: file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config: cannot read {path}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config: {path} is not valid TOML: {exc}") from None
    return from_dict(raw, os.environ if env is None else env, base_dir=Path(path).parent)


def from_dict(raw: dict[str, Any], env: typing.Mapping[str, str] | None = None,
              base_dir: Path | None = None) -> Config:
    cfg: Config = presets.apply(_build(Config, raw, "", os.environ if env is None else env))
    validate(cfg, base_dir or Path.cwd())
    return cfg


def validate(cfg: Config, base_dir: Path) -> None:
    """Every check across keys and tables; raise ConfigError on the first fault. A reload
    runs it again on the config it would apply (proxy.runtime.reload). The checks run in this order,
    one section each; an issuer's key file is read relative to `base_dir`."""
    checks: tuple[Callable[[Config], None], ...] = (
        server.check, functools.partial(auth.check, base_dir=base_dir), stores.check_database,
        stores.check_state, server.check_processes, upstreams.check, endpoints.check,
        observability.check, metering.check, guardrails.check, rates.check, zones.check,
        policy.check, approvals.check, audit_exports.check,
        functools.partial(audit_chain.check, base_dir=base_dir),
    )
    for check in checks:
        check(cfg)


def _build(cls: type[Any], raw: Any, where: str, env: typing.Mapping[str, str]) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"config: {where or 'the file'} must be a table")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in raw:
        if key not in fields:
            raise ConfigError(f"config: unknown key '{_join(where, key)}'")
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        key = _join(where, name)
        if name not in raw:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ConfigError(f"config: missing required key '{key}'")
            continue
        kwargs[name] = _value(hints[name], raw[name], key, env)
    return cls(**kwargs)


def _value(tp: Any, raw: Any, key: str, env: typing.Mapping[str, str]) -> Any:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return _build(tp, raw, key, env)  # type: ignore[arg-type]
    if origin is list:
        (item,) = typing.get_args(tp)
        if not isinstance(raw, list):
            raise ConfigError(f"config: '{key}' must be an array, got {_kind(raw)}")
        return [_value(item, v, f"{key}[{i}]", env) for i, v in enumerate(raw)]
    if origin is tuple:  # tuple[T, ...]
        return tuple(_value(list[typing.get_args(tp)[0]], raw, key, env))  # type: ignore[misc]
    if origin is typing.Literal:
        choices = typing.get_args(tp)
        if raw not in choices:
            raise ConfigError(f"config: '{key}' must be one of {', '.join(map(str, choices))}")
        return raw
    if origin is dict:
        _, item = typing.get_args(tp)
        if not isinstance(raw, dict):
            raise ConfigError(f"config: '{key}' must be a table, got {_kind(raw)}")
        return {str(k): _value(item, v, f"{key}.{k}", env) for k, v in raw.items()}
    if tp is str:
        if not isinstance(raw, str):
            raise ConfigError(f"config: '{key}' must be a string, got {_kind(raw)}")
        return _substitute(raw, key, env)
    if tp is bool:
        if not isinstance(raw, bool):
            raise ConfigError(f"config: '{key}' must be true or false, got {_kind(raw)}")
        return raw
    if tp is int:
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise ConfigError(f"config: '{key}' must be an integer, got {_kind(raw)}")
        return raw
    if tp is float:
        if isinstance(raw, bool) or not isinstance(raw, (int, float)):
            raise ConfigError(f"config: '{key}' must be a number, got {_kind(raw)}")
        return float(raw)
    if isinstance(tp, types.UnionType):  # pragma: no cover - no optional fields yet
        raise ConfigError(f"config: '{key}' has an unsupported type")
    raise ConfigError(f"config: '{key}' has an unsupported type")  # pragma: no cover


def _substitute(text: str, key: str, env: typing.Mapping[str, str]) -> str:
    def repl(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in env:
            raise ConfigError(f"config: '{key}' refers to ${{{name}}}, which is not set")
        return env[name]

    return _ENV_REF.sub(repl, text) if "${" in text else text


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _kind(raw: Any) -> str:
    return {str: "a string", bool: "a boolean", int: "an integer", float: "a number",
            list: "an array", dict: "a table"}.get(type(raw), type(raw).__name__)
