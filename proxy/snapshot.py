"""What the config file decides for each call, as one immutable snapshot.

The gateway holds one `Live` and a call reads it once, when it starts (with its
`UpstreamRoute`, read from the route table in the same step), so a reload (SIGHUP,
`proxy.runtime.reload`) that swaps in a new snapshot changes the next call and never one in flight.
A snapshot is built by `proxy.compiled.compile`, at start-up and by every reload alike: it
holds everything a call needs compiled (the policy chain with its rules, profiles, egress
table and metering backend, the config's upstream routes); nothing is rebuilt per call.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from proxy.chain import Chain
from proxy.config import Config

if TYPE_CHECKING:
    from policies.access import Access
    from policies.cedar.gate import Gate
    from policies.metering import MeteringBackend
    from proxy.upstream import UpstreamRoute


@dataclass(frozen=True, slots=True)
class Live:
    cfg: Config  # the config as it applies now (keys that cannot change live as at start-up)
    chain: Chain
    # the config's upstreams (the serving table adds the management API's to them)
    routes: Mapping[str, UpstreamRoute] = field(default_factory=dict)
    backend: MeteringBackend | None = None  # [metering]'s, timed when there are metrics
    access: Access | None = None  # the chain's access policy (what a consent page asks)
    # the Cedar gate built for this config, whether or not it is in the chain: one with no
    # policy stays out of it (the API's first policy puts it in: Serving.policies_changed)
    gate: Gate | None = None
