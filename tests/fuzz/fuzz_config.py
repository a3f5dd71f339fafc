"""Loading the TOML config file (proxy.config.load), which an operator writes and a mistake in
which must stop the start with one line naming the key.

Input: the file's bytes. Holds: loading gives a Config or raises ConfigError, nothing else; the
message is one line that starts with "config: "; the value of an environment variable that a
`${VAR}` pulls in (a secret) never appears in it.
"""

from __future__ import annotations

import atexit
import re
import shutil
import tempfile
from pathlib import Path

from proxy.config import Config, ConfigError, load

SECRET = "s3cr3t-Fz9"
ENV = {"SECRET": SECRET, "TOKEN": SECRET, "PORT": "8080", "URL": "http://127.0.0.1:9/mcp"}
_DIR = Path(tempfile.mkdtemp(prefix="tollhouse-fuzz-config-"))
atexit.register(shutil.rmtree, _DIR, True)
PATH = _DIR / "config.toml"
# what would break the one line, in a terminal or a log
BREAKS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def check(data: bytes) -> None:
    PATH.write_bytes(data)
    try:
        cfg = load(PATH, env=ENV)
    except ConfigError as exc:
        message = str(exc)
        assert message.startswith("config: ") and not BREAKS.search(message), repr(message)
        assert SECRET not in message, message
        return
    assert isinstance(cfg, Config)
