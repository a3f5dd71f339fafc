"""A property-based run of the OpenAPI document the gateway serves against the live API:
whatever schemathesis generates (valid and invalid bodies, paths, queries), no answer is a
500, and every status answered is one the document lists for that operation."""

from __future__ import annotations

import asyncio
from pathlib import Path

import schemathesis
from hypothesis import HealthCheck, given, settings

from tests.api.test_api import env


async def test_no_generated_request_gets_a_500(tmp_path: Path) -> None:
    async with env(tmp_path, per_user=True) as e:  # every route: /me/connections too
        served = await e.admin.get(e.api("/openapi.json"))
        document = served.json()
        schema = schemathesis.openapi.from_dict(document)
        headers = {"Authorization": f"Bearer {e.admin_key}"}
        failures: list[str] = []

        def run() -> int:
            count = 0
            for result in schema.get_all_operations():
                operation = result.ok()

                @settings(max_examples=30, deadline=None, database=None,
                          suppress_health_check=list(HealthCheck))
                @given(case=operation.as_strategy())
                def check(case: schemathesis.Case) -> None:
                    nonlocal count
                    count += 1
                    response = case.call(base_url=e.url, headers=headers, timeout=10)
                    listed = document["paths"][case.path][case.method.lower()]["responses"]
                    if response.status_code >= 500 or str(response.status_code) not in listed:
                        failures.append(f"{case.method} {case.formatted_path} -> "
                                        f"{response.status_code} {response.text[:200]}")

                check()
            return count

        sent = await asyncio.to_thread(run)
        assert sent > 100
        assert failures == []
