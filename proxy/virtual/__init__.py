"""Virtual endpoints: several upstream members behind one /mcp/<name>
(docs/virtual-endpoints.md). `VirtualRoute` is what the edge routes; `VirtualForwarder` is the forwarding step
the spine takes for it."""

from proxy.virtual.route import VirtualRoute
from proxy.virtual.spread import VirtualForwarder

__all__ = ["VirtualForwarder", "VirtualRoute"]
