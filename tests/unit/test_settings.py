"""One way to configure every process: each setting by variable and by file, the order of
sources, and the README's table generated from the settings classes."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import typer
from pydantic import SecretStr, ValidationError
from typer.testing import CliRunner

from coordinator.settings import (
    PROCESS_NAMES,
    ConfigFileError,
    CoordinatorSettings,
    LakelogSettings,
    load,
    process_settings,
)
from service.cli import app
from service.settings import Settings, settings_table

ROOT = Path(__file__).resolve().parents[2]

#: Valid non-default values for settings whose type alone does not give one: (the value
#: as a variable holds it, as TOML writes it, as the field holds it).
SAMPLES: dict[str, tuple[str, str, Any]] = {
    "host": ("10.1.2.3", '"10.1.2.3"', "10.1.2.3"),
    "store": ("s3://bucket/prefix", '"s3://bucket/prefix"', "s3://bucket/prefix"),
    "store_endpoint": ("http://minio:9000", '"http://minio:9000"', "http://minio:9000"),
    "store_region": ("eu-west-1", '"eu-west-1"', "eu-west-1"),
    "db": ("postgresql://u@pg/lakelog", '"postgresql://u@pg/lakelog"', "postgresql://u@pg/lakelog"),
    "db_shards": ("postgresql://u@pg/s1,postgresql://u@pg/s2",
                  '["postgresql://u@pg/s1", "postgresql://u@pg/s2"]',
                  ["postgresql://u@pg/s1", "postgresql://u@pg/s2"]),
    "cluster_id": ("EV-5o5e3SViiGP0hpgKn1g", '"EV-5o5e3SViiGP0hpgKn1g"', "EV-5o5e3SViiGP0hpgKn1g"),
    "advertised_url": ("https://lb.example", '"https://lb.example"', "https://lb.example"),
    "forwarded_allow_ips": ("10.0.0.0/8", '"10.0.0.0/8"', "10.0.0.0/8"),
    "agent_id": ("agent-7", '"agent-7"', "agent-7"),
    "coordinator": ("http://c1:8083,http://c2:8083", '"http://c1:8083,http://c2:8083"',
                    "http://c1:8083,http://c2:8083"),
    "compression": ("zstd", '"zstd"', "zstd"),
    "log_level": ("error", '"error"', "error"),
    "janitors": ("tier,gc", '"tier,gc"', "tier,gc"),
    "janitor_interval": ("tier=7,gc=9", "{ tier = 7, gc = 9 }", {"tier": 7.0, "gc": 9.0}),
    "kafka_advertised": ("kafka.example:9093", '"kafka.example:9093"', "kafka.example:9093"),
    "quota_overrides": ("a=requests:5", '"a=requests:5"', "a=requests:5"),
    # heartbeats must renew fetch leases: at most half of consumer_fetch_lease_ms
    "consumer_heartbeat_interval_ms": ("2000", "2000", 2000),
    "authentication": ("basic", '"basic"', "basic"),
    "authorization": ("acl", '"acl"', "acl"),
    "super_users": ("User:admin;User:ops", '"User:admin;User:ops"', "User:admin;User:ops"),
    "coordinator_secret": (
        "s3cret-value-of-at-least-32-bytes",
        '"s3cret-value-of-at-least-32-bytes"',
        SecretStr("s3cret-value-of-at-least-32-bytes"),
    ),
    "tls_cert_file": ("/etc/tls/cert.pem", '"/etc/tls/cert.pem"', "/etc/tls/cert.pem"),
    "tls_key_file": ("/etc/tls/key.pem", '"/etc/tls/key.pem"', "/etc/tls/key.pem"),
    "tls_ca_file": ("/etc/tls/ca.pem", '"/etc/tls/ca.pem"', "/etc/tls/ca.pem"),
    "tls_client_ca_file": ("/etc/tls/cl.pem", '"/etc/tls/cl.pem"', "/etc/tls/cl.pem"),
    "oauth_jwks": ("https://idp/jwks.json", '"https://idp/jwks.json"', "https://idp/jwks.json"),
    "oauth_issuer": ("https://idp", '"https://idp"', "https://idp"),
    "oauth_audience": ("lakelog", '"lakelog"', "lakelog"),
    "oauth_principal_claim": ("email", '"email"', "email"),
    "tls_principal_mapping_rules": ("RULE:^CN=(.*?),.*$/$1/L,DEFAULT",
                                    '"RULE:^CN=(.*?),.*$/$1/L,DEFAULT"',
                                    "RULE:^CN=(.*?),.*$/$1/L,DEFAULT"),
}  # fmt: skip


def sample(cls: type[LakelogSettings], name: str) -> tuple[str, str, Any]:
    """A valid value other than the default: from SAMPLES, else derived from its type."""
    if name in SAMPLES:
        return SAMPLES[name]
    default = cls.model_fields[name].default
    if isinstance(default, bool):
        return (str(not default).lower(), str(not default).lower(), not default)
    if isinstance(default, int):
        return (str(default * 2 + 1), str(default * 2 + 1), default * 2 + 1)
    if isinstance(default, float):
        return (str(default + 1.5), str(default + 1.5), default + 1.5)
    raise AssertionError(f"no sample value for {cls.__name__}.{name}: add one to SAMPLES")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No LAKELOG_* variable of the machine leaks in; relative paths land in tmp."""
    import os

    for key in list(os.environ):
        if key.startswith("LAKELOG_"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)


def every_setting() -> list[tuple[str, str]]:
    return [(p, name) for p, cls in process_settings().items() for name in cls.model_fields]


def test_every_process_has_settings() -> None:
    assert set(process_settings()) == set(PROCESS_NAMES)


@pytest.mark.parametrize(("process", "name"), every_setting())
def test_every_setting_is_settable_by_variable_and_by_file(
    process: str, name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cls = process_settings()[process]
    env_text, toml_text, value = sample(cls, name)
    assert getattr(load(cls, process), name) != value  # the sample is not the default

    monkeypatch.setenv(f"LAKELOG_{name.upper()}", env_text)
    assert getattr(load(cls, process), name) == value
    monkeypatch.delenv(f"LAKELOG_{name.upper()}")

    top = tmp_path / "top.toml"
    top.write_text(f"{name} = {toml_text}\n")
    assert getattr(load(cls, process, top), name) == value
    table = tmp_path / "table.toml"
    table.write_text(f"[{process}]\n{name} = {toml_text}\n")
    assert getattr(load(cls, process, table), name) == value
    monkeypatch.setenv("LAKELOG_CONFIG", str(table))  # the variable names the file too
    assert getattr(load(cls, process), name) == value


def test_order_flags_variables_process_table_top_level_defaults(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = tmp_path / "lakelog.toml"
    config.write_text(
        'store = "s3://top/x"\nlinger_ms = 7\nport = 9000\n\n'
        "[coordinator]\nport = 9100\n\n[agent]\nlinger_ms = 8\n"
    )
    agent = load(Settings, "agent", config)
    assert (agent.store, agent.linger_ms, agent.port) == ("s3://top/x", 8, 9000)
    coordinator = load(CoordinatorSettings, "coordinator", config)
    assert (coordinator.store, coordinator.port) == ("s3://top/x", 9100)
    serve = load(Settings, "serve", config)
    assert (serve.linger_ms, serve.flush_bytes) == (7, 4 << 20)  # [agent] is not serve's
    monkeypatch.setenv("LAKELOG_PORT", "9200")
    assert load(CoordinatorSettings, "coordinator", config).port == 9200
    assert load(CoordinatorSettings, "coordinator", config, port=9300, host=None).port == 9300


def test_config_file_errors_name_the_problem(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('lingr_ms = 5\n[agent]\nport = 1\nsotre = "x"\n')
    with pytest.raises(ConfigFileError, match=r"unknown settings lingr_ms, agent\.sotre"):
        load(Settings, "agent", bad)
    bad.write_text("port = \n")
    with pytest.raises(ConfigFileError, match="not TOML"):
        load(Settings, "agent", bad)
    with pytest.raises(ConfigFileError, match="cannot read"):
        load(Settings, "agent", tmp_path / "missing.toml")
    bad.write_text("port = 70000\n")
    with pytest.raises(ValidationError, match="port"):
        load(CoordinatorSettings, "coordinator", bad)


def test_the_cli_exits_2_on_bad_settings(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('gc_grace_s = -1\n[coordinator]\njanitors = "tier,sweep"\n')
    for args, name in (
        (["coordinator", "--config", str(bad)], "janitors"),
        (["janitor", "gc", "--config", str(bad)], "gc_grace_s"),
    ):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2, result.output
        assert "invalid settings: " in result.output and f"{name}: " in result.output
    bad.write_text("colour = 1\n")
    result = CliRunner().invoke(app, ["serve", "--config", str(bad)])
    assert result.exit_code == 2 and "unknown settings colour" in result.output


def test_every_server_flag_is_a_setting() -> None:
    """Flags map to settings of the same name (so each is settable the same three ways)."""
    group: Any = typer.main.get_command(app)
    commands = {
        "serve": ("serve", Settings),
        "agent": ("agent", Settings),
        "coordinator": ("coordinator", CoordinatorSettings),
    }
    for command_name, (_, cls) in commands.items():
        command = group.get_command(group.context_class(group), command_name)
        names = {p.name for p in command.params} - {"config"}
        assert names <= set(cls.model_fields), (command_name, names - set(cls.model_fields))
    janitor = group.get_command(group.context_class(group), "janitor")
    tier = janitor.get_command(janitor.context_class(janitor), "tier")
    names = {p.name for p in tier.params} - {"config", "topic"}
    assert names <= set(process_settings()["janitor"].model_fields)


def test_readme_table_is_the_generated_one() -> None:
    """The README's settings table is exactly ``lakelog settings``' output."""
    readme = (ROOT / "README.md").read_text()
    found = re.search(
        r"<!-- settings-table: start -->\n(.*?)<!-- settings-table: end -->", readme, re.S
    )
    assert found, "README.md lacks the settings table markers"
    assert found.group(1) == settings_table(), (
        "README.md's settings table is stale: regenerate it with `lakelog settings`"
    )
    result = CliRunner().invoke(app, ["settings"])
    assert result.exit_code == 0 and result.output == settings_table()


def test_readme_security_tables_are_the_generated_ones() -> None:
    """README "Security"'s tables of what each REST route, Kafka API and coordinator route
    needs are exactly ``lakelog acls rules``' output: built from the rule tables the doors
    decide with (``service.security.acl.RULES``, ``service.kafka.acl.RULES``,
    ``coordinator.security.access.RULES``), so they cannot drift."""
    from service.security.cli import rules_tables

    readme = (ROOT / "README.md").read_text()
    found = re.search(
        r"<!-- rules-tables: start -->\n(.*?)<!-- rules-tables: end -->", readme, re.S
    )
    assert found, "README.md lacks the rules tables markers"
    assert found.group(1) == rules_tables(), (
        "README.md's security tables are stale: regenerate them with `lakelog acls rules`"
    )
    result = CliRunner().invoke(app, ["acls", "rules"])
    assert result.exit_code == 0 and result.output == rules_tables()


def test_the_readme_example_config_file_works(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    (example,) = re.findall(r"```toml\n(.*?)```", readme, re.S)
    config = tmp_path / "lakelog.toml"
    config.write_text(example)
    coordinator = load(CoordinatorSettings, "coordinator", config)
    assert coordinator.db.startswith("postgresql://") and coordinator.store == "s3://lakelog/data"
    assert coordinator.background_janitors().interval_s("tier") == 30
    agent = load(Settings, "agent", config)
    assert (agent.coordinator_urls(), agent.linger_ms) == (["http://127.0.0.1:8083"], 20)
    assert agent.store_endpoint == "http://127.0.0.1:9000"


@pytest.mark.parametrize("cls", [Settings, CoordinatorSettings])
@pytest.mark.parametrize(
    ("host", "authentication", "allow", "refused"),
    [
        ("127.0.0.1", "none", False, False),
        ("127.0.0.2", "none", False, False),
        ("::1", "none", False, False),
        ("localhost", "none", False, False),
        ("0.0.0.0", "none", False, True),
        ("::", "none", False, True),
        ("10.1.2.3", "none", False, True),
        ("lakelog.example", "none", False, True),  # a name may resolve to any interface
        ("0.0.0.0", "none", True, False),
        ("0.0.0.0", "basic", False, False),
    ],
)
def test_listening_beyond_loopback_without_authentication_takes_the_flag(
    cls: type[Settings] | type[CoordinatorSettings],
    host: str,
    authentication: str,
    allow: bool,
    refused: bool,
) -> None:
    secret = SecretStr("x" * 40)  # authentication on a coordinator needs it
    settings = cls(
        host=host,
        authentication=authentication,
        allow_unauthenticated=allow,
        coordinator_secret=secret,
    )
    problems = [p for p in settings.security_problems() if "listens beyond" in p]
    assert bool(problems) == refused, problems


def test_the_development_default_listens_on_loopback() -> None:
    for cls in (Settings, CoordinatorSettings):
        settings = cls()
        assert (settings.host, settings.security_problems()) == ("127.0.0.1", []), cls


@pytest.mark.parametrize("value", ["0", "-1", "-67108864", "lots", "1.5", "64MiB", ""])
def test_the_coordinator_body_limit_refuses_what_is_not_a_positive_count(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``coordinator_max_request_bytes`` is a whole number of bytes > 0: 0 would refuse
    every request with a body, a negative one every request; both are typos, refused at
    start with pydantic's message naming the setting, on the coordinator and on serve."""
    monkeypatch.setenv("LAKELOG_COORDINATOR_MAX_REQUEST_BYTES", value)
    for cls, process in ((CoordinatorSettings, "coordinator"), (Settings, "serve")):
        with pytest.raises(ValidationError, match="coordinator_max_request_bytes") as info:
            load(cls, process)
        (error,) = info.value.errors()
        assert error["type"] in ("greater_than", "int_parsing", "int_from_float"), error
    result = CliRunner().invoke(app, ["coordinator"])
    assert result.exit_code == 2, result.output
    assert "invalid settings: " in result.output
    assert "coordinator_max_request_bytes: " in result.output


def test_the_coordinator_body_limit_default_and_where_it_goes(tmp_path: Path) -> None:
    """64 MiB unless set; the config file's [coordinator] table sets it for the
    coordinator only, and an app refuses a limit that is not > 0 as the setting does."""
    from coordinator.http.server import create_app
    from coordinator.local import LocalCoordinator

    assert CoordinatorSettings().coordinator_max_request_bytes == 64 << 20
    config = tmp_path / "lakelog.toml"
    config.write_text("[coordinator]\ncoordinator_max_request_bytes = 1048576\n")
    assert load(CoordinatorSettings, "coordinator", config).coordinator_max_request_bytes == 1 << 20
    assert load(Settings, "serve", config).coordinator_max_request_bytes == 64 << 20
    with LocalCoordinator(f"sqlite:///{tmp_path}/m.db") as coord:
        for bad in (0, -1):
            with pytest.raises(ValueError, match="max_request_bytes must be > 0"):
                create_app(coord, max_request_bytes=bad)
