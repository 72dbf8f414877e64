"""The enrich-table flow: real Prefect flow runs against the local endpoint and a real cache."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pytest
from pydantic import ValidationError

from flows.enrich import EnrichConfig, config_of, enrich_table, main, open_table, report_table
from llm_ops import ConfigError, JobAbortedError, ModelUsage, RunReport
from llm_ops._pricing import price_hint
from llm_ops.tables import Counters
from llm_ops.testing import expected_reply

NOW = datetime.now(UTC)

SECRET = "sk-gateway-0123456789"
AZURE = "https://res.openai.azure.com/openai/deployments/gpt?api-version=2024-10-21"
FLOW = Path(__file__).resolve().parents[1] / "flows" / "enrich.py"
TEXTS = ["great fit", "runs small", None, "great fit", "love it", None, "runs small"] * 3


@pytest.fixture
def config(tmp_path, endpoint, cache):
    source = tmp_path / "reviews.parquet"
    pl.DataFrame({"id": range(len(TEXTS)), "text": TEXTS}).write_parquet(source)
    return EnrichConfig(
        input=str(source),
        output=str(tmp_path / "out.parquet"),
        prompt="{text}",
        base_url=endpoint.base_url,
        cache=str(cache),
        chunk_size=2,
        rows_per_read=5,
    )


def _artifact_figures() -> dict[str, int]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        latest = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["enrich-report"])),
            sort="CREATED_DESC",
            limit=1,
        )[0]
    table = latest.data if isinstance(latest.data, list) else __import__("json").loads(latest.data)
    return {row["figure"]: row["value"] for row in table}


def test_flow_enriches_a_table_and_reports_what_the_endpoint_saw(prefect, config, endpoint):
    enrich_table(config)
    out = pl.read_parquet(config.output)
    assert out.columns == ["id", "text", "summary", "summary_status", "summary_error"]
    assert out["summary"].to_list() == [
        expected_reply(t, model="sim") if t else None for t in TEXTS
    ]
    assert out["summary_status"].to_list() == ["skipped" if t is None else "ok" for t in TEXTS]
    figures, seen = _artifact_figures(), endpoint.stats()
    assert figures["requests sent"] == seen["requests"] == 3
    assert figures["distinct requests"] == seen["distinct_prompts"]
    assert figures["rows skipped"] == 6 and figures["cache"] == config.cache


def test_flow_rerun_sends_nothing(prefect, config, endpoint):
    enrich_table(config)
    endpoint.reset()
    enrich_table(config)
    assert endpoint.stats()["requests"] == 0
    statuses = pl.read_parquet(config.output)["summary_status"]
    assert set(statuses.unique()) == {"cached", "skipped"}


def test_a_flow_that_died_midway_completes_on_rerun(prefect, config, endpoint, tmp_path):
    source = tmp_path / "many.parquet"
    pl.DataFrame({"text": [f"review {i}" for i in range(40)]}).write_parquet(source)
    config = config.model_copy(update={"input": str(source), "chunk_size": 5, "concurrency": 2})
    endpoint.configure(quota_requests=12)
    with pytest.raises(JobAbortedError):
        enrich_table(config)
    endpoint.configure()
    enrich_table(config)
    out = pl.read_parquet(config.output)
    assert set(out["summary_status"].unique()) == {"ok", "cached"}
    assert endpoint.stats()["answered"] == 40


def test_flow_runs_a_cascade(prefect, config, endpoint):
    cascade = config.model_copy(
        update={"model": ["sim-small", "sim"], "escalate": "summary LIKE '%love%'"}
    )
    enrich_table(cascade)
    models = pl.read_parquet(config.output)["summary_model"].to_list()
    assert models == [
        {"great fit": "sim-small", "runs small": "sim-small", "love it": "sim", None: None}[t]
        for t in TEXTS
    ]
    assert _artifact_figures()["saved by cascade (requests, $)"].startswith("2, ")


def test_a_missing_input_fails_the_run_early_and_writes_nothing(prefect, config, tmp_path):
    config = config.model_copy(update={"input": str(tmp_path / "nope.parquet")})
    with pytest.raises(ConfigError, match="no input file matches"):
        enrich_table(config)
    assert not (tmp_path / "out.parquet").exists()


def test_unknown_column_is_refused_before_anything_runs(config):
    with pytest.raises(ConfigError, match="'body'"):
        open_table(config.model_copy(update={"prompt": "{body}"}))


def test_output_equal_to_input_is_refused(config):
    with pytest.raises(ConfigError, match="is also an input"):
        open_table(config.model_copy(update={"output": config.input}))


def test_media_paths_are_read_beside_the_input_unless_media_folders_says(config, tmp_path):
    table = open_table(config.model_copy(update={"images": ["text"]}))
    assert table.job.spec.media.images.folders == (str(tmp_path),)
    wide = config.model_copy(update={"images": ["text"], "media_folders": ["/srv/scans"]})
    assert open_table(wide).job.spec.media.images.folders == ("/srv/scans",)


def test_counters_of_chunks_add_up():
    total = Counters()
    total.add(Counters(sent=2, retries=1, by_status={"ok": 2}))
    total.add(Counters(sent=3, by_status={"ok": 1, "failed": 1}))
    assert (total.sent, total.retries, total.by_status) == (5, 1, {"ok": 3, "failed": 1})


def test_flow_in_batch_mode_submits_then_waits_and_shows_its_batches(prefect, config, endpoint):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    endpoint.configure(batch_seconds=0.3, batch_validation_seconds=0.05)
    enrich_table(config.model_copy(update={"batch": True, "batch_poll_seconds": 0.05}))
    out = pl.read_parquet(config.output)
    assert out["summary"].to_list() == [
        expected_reply(t, model="sim") if t else None for t in TEXTS
    ]
    assert (endpoint.stats()["requests"], endpoint.stats()["batches"]) == (0, 2)  # 2 chunks
    with get_client(sync_client=True) as client:
        latest = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["enrich-batches"])),
            sort="CREATED_DESC",
            limit=1,
        )[0]
    table = latest.data if isinstance(latest.data, list) else __import__("json").loads(latest.data)
    assert [row["state"] for row in table] == ["collected", "collected"]


@pytest.mark.parametrize(
    "url",
    [
        f"https://gateway.example/v1?key={SECRET}",
        f"{AZURE}&key={SECRET}",
        f"https://user:{SECRET}@gateway.example/v1",
        f"https://gateway.example/v1#{SECRET}",
    ],
)
def test_a_base_url_holding_a_key_is_refused_without_showing_it(url):
    with pytest.raises(ValidationError, match="base_url must") as refused:
        EnrichConfig(base_url=url)
    assert SECRET not in str(refused.value)


def test_the_refusal_says_where_the_key_goes():
    with pytest.raises(ValidationError, match=r"OPENAI_API_KEY .* api_key_secret"):
        EnrichConfig(base_url=f"https://gateway.example/v1?key={SECRET}")


def test_azures_api_version_is_the_one_query_let_through():
    assert EnrichConfig(base_url=AZURE).base_url == AZURE


@pytest.mark.parametrize(
    "given",
    [
        {"base_url": f"https://gw.example/v1?k={SECRET}"},
        {"headers": {"api-key": SECRET}},
        {"proxy": f"http://user:{SECRET}@proxy.example:3128"},
    ],
    ids=["base_url", "headers", "proxy"],
)
def test_the_api_refuses_a_deployment_run_holding_a_credential_and_stores_nothing(prefect, given):
    from prefect.client.orchestration import get_client
    from prefect.exceptions import PrefectHTTPStatusError

    deployment = enrich_table.to_deployment(name="keys-refused").apply()
    with get_client(sync_client=True) as client:
        with pytest.raises(PrefectHTTPStatusError, match="409"):
            client.create_flow_run_from_deployment(deployment, parameters={"config": given})
        runs = client.read_flow_runs()
    assert SECRET not in json.dumps([run.parameters for run in runs])


@pytest.mark.parametrize(
    ("given", "refusal"),
    [
        ({"headers": {"api-key": SECRET}}, "header_secrets"),
        ({"headers": {"X-Gateway-Token": SECRET}}, "header_secrets"),
        ({"proxy": f"http://user:{SECRET}@proxy.example:3128"}, "HTTPS_PROXY"),
    ],
)
def test_a_credential_among_the_connection_parameters_is_refused_without_showing_it(given, refusal):
    with pytest.raises(ValidationError, match=refusal) as refused:
        EnrichConfig(**given)
    assert SECRET not in str(refused.value)


def test_the_connection_parameters_become_the_endpoints_settings():
    settings = EnrichConfig(
        headers={"X-Tenant": "acme"}, verify=False, cert="c.pem", cert_key="k.pem"
    ).settings()
    assert (settings["headers"], settings["verify"]) == ({"X-Tenant": "acme"}, False)
    assert settings["cert"] == ("c.pem", "k.pem") and "cert_key" not in settings


def test_a_header_secret_is_read_from_its_block(prefect):
    from prefect.blocks.system import Secret

    Secret(value=SECRET).save("gateway-key", overwrite=True)
    config = EnrichConfig(headers={"X-Tenant": "a"}, header_secrets={"api-key": "gateway-key"})
    assert config.settings()["headers"] == {"X-Tenant": "a", "api-key": SECRET}


def test_the_command_line_help_exits_without_running_anything(tmp_path):
    done = subprocess.run(
        [sys.executable, str(FLOW), "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0
    assert done.stdout.startswith("usage: python flows/enrich.py")
    assert "--base-url URL" in done.stdout and "--output-column NAME" in done.stdout
    assert list(tmp_path.iterdir()) == []


def test_no_arguments_is_the_demo():
    assert config_of([]) == EnrichConfig()


def test_the_command_line_becomes_the_flows_parameters():
    config = config_of(["--model", "small", "--model", "large", "--temperature", "0"])
    assert (config.model, config.temperature) == (["small", "large"], 0.0)


def test_a_wrong_parameter_on_the_command_line_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        config_of(["--concurrency", "0"])
    assert exit_.value.code == 2
    assert "--concurrency: Input should be greater than or equal to 1" in capsys.readouterr().err


def test_the_command_line_runs_the_flow_on_the_local_simulator(prefect, tmp_path, cache):
    source, out = tmp_path / "reviews.parquet", tmp_path / "out.parquet"
    pl.DataFrame({"text": ["great fit", None, "runs small"]}).write_parquet(source)
    files = ["--input", str(source), "--output", str(out), "--cache", str(cache)]
    main([*files, "--prompt", "{text}", "--output-column", "fit"])
    written = pl.read_parquet(out)
    replies = [expected_reply(text, model="sim") for text in ("great fit", "runs small")]
    assert written["fit"].to_list() == [replies[0], None, replies[1]]
    assert written["fit_status"].to_list() == ["ok", "skipped", "ok"]


def test_the_report_artifact_says_how_to_give_a_price():
    usage = {"mystery": ModelUsage(rows=1, requests=1, cost=None)}
    report = RunReport("r", NOW, NOW, "mystery", "e", 1, 1, 0, 1, 0, models=usage)
    figures = {row["figure"]: row["value"] for row in report_table(report)}
    assert figures["cost unknown"] == price_hint(["mystery"])


def test_a_failed_run_names_the_flow_parameter(prefect, config, endpoint):
    root = endpoint.base_url.removesuffix("/v1")
    with pytest.raises(ConfigError, match=f"did you mean base_url='{root}/v1'"):
        enrich_table(config.model_copy(update={"base_url": root}))
