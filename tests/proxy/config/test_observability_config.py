"""`[observability]`: its defaults (the issue's, exactly), and a bad value refused at start-up
in one line that names the key and never shows the metrics token."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.config import ConfigError, from_dict, load


def test_defaults() -> None:
    o = from_dict({}, env={}).observability
    assert (o.metrics, o.metrics_token, o.metrics_public, o.otlp_endpoint, o.service_name,
            o.log_format) == (True, "", False, "", "tollhouse", "text")


def test_the_token_comes_from_the_environment() -> None:
    cfg = from_dict({"observability": {"metrics_token": "${METRICS_TOKEN}"}},
                    env={"METRICS_TOKEN": "a-long-enough-metrics-token"})
    assert cfg.observability.metrics_token == "a-long-enough-metrics-token"


def test_the_example_documents_the_table(tmp_path: Path) -> None:
    example = Path(__file__).parents[3] / "config.example.toml"
    text = example.read_text()
    for key in ("[observability]", "metrics = true", 'metrics_token = ""',
                "metrics_public = false", 'otlp_endpoint = ""', 'service_name = "tollhouse"',
                'log_format = "text"'):
        assert key in text, key
    assert load(example, env={"EVERYTHING_TOKEN": "t"}).observability.log_format == "text"


@pytest.mark.parametrize(("raw", "message"), [
    ({"log_format": "xml"}, "'observability.log_format' must be one of text, json"),
    ({"service_name": ""}, "'observability.service_name' must be 1-64"),
    ({"service_name": "a b"}, "'observability.service_name' must be 1-64"),
    ({"otlp_endpoint": "collector:4318"}, "'observability.otlp_endpoint' must be an http"),
    ({"metrics": "yes"}, "'observability.metrics' must be true or false"),
    ({"metrics_token": "short-SECRET"}, "'observability.metrics_token' must be at least 16"),
    ({"metrics_token": "with a space SECRET-long"}, "'observability.metrics_token' must be"),
    ({"metrics_port": 9}, "unknown key 'observability.metrics_port'"),
])
def test_a_bad_value_names_the_key(raw: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        from_dict({"observability": raw}, env={})
    text = str(info.value)
    assert message in text and "\n" not in text
    assert "SECRET" not in text
