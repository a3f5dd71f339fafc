"""What the config file decides for each call, as one immutable snapshot.

The gateway holds one `Live` and a call reads it once, when it starts (with its
`UpstreamRoute`, read from the route table in the same step), so a reload (SIGHUP,
`proxy.reload`) that swaps in a new snapshot changes the next call and never one in flight.
Building a snapshot compiles everything a call needs (the policy chain with its rules,
profiles and metering backend); nothing is rebuilt per call.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.chain import Chain
from proxy.config import Config


@dataclass(frozen=True, slots=True)
class Live:
    cfg: Config  # the config as it applies now (keys that cannot change live as at start-up)
    chain: Chain
