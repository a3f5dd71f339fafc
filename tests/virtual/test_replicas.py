"""A virtual endpoint on two replicas (shared Redis and database) behind HAProxy with no
stickiness: a member's sampling request raised through one replica is answered through the
other, its sealed id opened there under the deployment's shared key."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.sdk_client import connect
from tests.e2e.upstreams import stateful_sse_app
from tests.helpers import DEADLINE_S
from tests.replicas.harness import open_cluster
from tests.replicas.test_sessions import crossing, sampler, tool_call
from tests.servers import serve


async def test_a_members_sampling_is_answered_through_the_other_replica(tmp_path: Path
                                                                        ) -> None:
    app, probe = stateful_sse_app()
    answers: list[str] = []
    async with serve(app, graceful_timeout=1) as url, open_cluster(
            tmp_path, url, era="legacy", env={"TOLLHOUSE_SECRET_KEY": "replicas-shared-key"},
            config={"endpoints": [{"name": "team", "members": ["up"]}]}) as cluster, \
            connect(f"{cluster.lb_url}/mcp/team", sampling_callback=sampler(answers),
                    read_timeout_seconds=DEADLINE_S) as client:  # an answer lost: a failure
        async def ask(k: int) -> None:
            result = await client.call_tool("up__ask_sampling", {"prompt": f"prompt #{k}"})
            assert result.content[0].text == f"sampled prompt #{k}"

        pairs = await crossing(cluster, ask, tool_call("up__ask_sampling", "prompt",
                                                       "prompt #{}"),
                               lambda k: f"sampled prompt #{k}", lambda s: s.server)
    assert pairs[-1][0] != pairs[-1][1]
    # every answer reached the member under its own id
    posted = [x.rpc for x in probe.exchanges if x.method == "POST" and isinstance(x.rpc, dict)
              and "result" in x.rpc]
    assert len([a for a in posted if "model" in a["result"]]) == len(pairs)
    assert not any(str(a["id"]).startswith("tv1.") for a in posted)
