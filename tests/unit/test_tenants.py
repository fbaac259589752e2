"""The tenant map (issue 32 item 1): reach.toml's [tenants] and Client(tenants=...), and the
errors that say what is wrong and where."""

from __future__ import annotations

from pathlib import Path

import pytest

import reach
from reach.errors import ConfigError, UnknownTenant
from reach.tenants import Tenant, Tenants, find_tenant_file, read_tenants


def write(tmp_path: Path, text: str) -> Path:
    f = tmp_path / "reach.toml"
    f.write_text(text)
    return f


def test_named_tenants_their_defaults_and_the_rest(tmp_path: Path) -> None:
    f = write(
        tmp_path,
        'redis_url = "redis://shared:6379/0"\n'
        '[tenants.acme]\nredis_url = "redis://acme:6379/0"\n'
        '[tenants.globex]\nnamespace = "globex-prod"\n'
        '[tenants.default]\nnamespace = "t-{tenant}"\n',
    )
    m = read_tenants(f)
    assert m.ids == ("acme", "globex")
    assert m.resolve("acme") == Tenant("redis://acme:6379/0", "acme")  # namespace: its id
    assert m.resolve("globex") == Tenant("redis://shared:6379/0", "globex-prod")
    assert m.resolve("small") == Tenant("redis://shared:6379/0", "t-small")
    assert list(m.targets()) == ["acme", "globex", "default"]


def test_default_without_namespace_gives_each_tenant_its_own(tmp_path: Path) -> None:
    f = write(tmp_path, '[tenants.default]\nredis_url = "redis://s:1/0"\n')
    assert read_tenants(f).resolve("beta") == Tenant("redis://s:1/0", "beta")


def test_unknown_tenant_without_default_names_the_known_ones(tmp_path: Path) -> None:
    f = write(
        tmp_path,
        '[tenants.acme]\nredis_url = "redis://a:1/0"\n[tenants.beta]\nredis_url = "redis://b:1/0"\n',
    )
    with pytest.raises(UnknownTenant) as e:
        read_tenants(f).resolve("acmee")
    assert e.value.tenant == "acmee" and e.value.known == ("acme", "beta")
    assert "acme, beta" in str(e.value) and str(f) in str(e.value)
    assert isinstance(e.value, reach.ReachError) and isinstance(e.value, ConfigError)


def test_redis_url_file_relative_to_the_project_file(tmp_path: Path) -> None:
    (tmp_path / "acme.url").write_text("redis://secret@acme:1/0\n")
    f = write(tmp_path, '[tenants.acme]\nredis_url_file = "acme.url"\n')
    assert read_tenants(f).resolve("acme").redis_url == "redis://secret@acme:1/0"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('tenants = "acme"\n', "tenants must be a table"),
        ("[tenants]\nacme = 3\n", "[tenants.acme] must be a table"),
        ('[tenants.acme]\nredis_url = "redis://a:1/0"\nurl = "x"\n', "unknown setting url"),
        ("[tenants.acme]\nnamespace = 'acme'\n", "[tenants.acme] names no Redis"),
        ('[tenants.acme]\nredis_url = ""\n', "redis_url must be a non-empty string"),
        ('[tenants.acme]\nredis_url = "redis://a:1/0"\nnamespace = "a:b"\n', "Invalid namespace"),
        ('[tenants."a b"]\nredis_url = "redis://a:1/0"\n', "Invalid tenant id"),
        (
            '[tenants.acme]\nredis_url = "redis://a:1/0"\nredis_url_file = "f"\n',
            "not both",
        ),
        (
            '[tenants.acme]\nredis_url = "redis://a:1/0"\nnamespace = "x-{tenant}"\n',
            "only the default's namespace may hold {tenant}",
        ),
        ("[tenants.acme\n", "is not valid TOML"),
    ],
)
def test_mistakes_say_what_and_where(tmp_path: Path, text: str, says: str) -> None:
    f = write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        read_tenants(f)
    assert says in str(e.value)
    assert str(f) in str(e.value)


def test_a_namespace_too_long_once_the_id_is_in_it() -> None:
    m = Tenants({"default": ("redis://s:1/0", "x" * 60 + "{tenant}")})
    with pytest.raises(ConfigError, match="Invalid namespace"):
        m.resolve("tenant-id")


def test_the_nearest_file_with_tenants_is_found(tmp_path: Path) -> None:
    write(tmp_path, '[tenants.acme]\nredis_url = "redis://a:1/0"\n')
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    (deep / "reach.toml").write_text('redis_url = "redis://other:1/0"\n')  # no [tenants]
    assert find_tenant_file(deep) == tmp_path / "reach.toml"
    loaded = Tenants.load(deep)
    assert loaded is not None and loaded.ids == ("acme",)


def test_client_takes_a_mapping_or_tenants() -> None:
    c = reach.Client(
        redis_url="redis://x:1/0",
        tenants={"acme": ("redis://a:1/0", "acme"), "default": reach.Tenant("redis://s:1/0", "s")},
    )
    assert c.tenants.resolve("acme") == Tenant("redis://a:1/0", "acme")
    assert c.tenants.resolve("zzz") == Tenant("redis://s:1/0", "s")
    with pytest.raises(ConfigError, match="tenants= takes"):
        reach.Client(redis_url="redis://x:1/0", tenants=["acme"])  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="give \\(redis_url, namespace\\)"):
        reach.Client(redis_url="redis://x:1/0", tenants={"acme": "redis://a:1/0"})  # type: ignore[dict-item]


def test_a_call_naming_a_tenant_without_a_map_says_how_to_give_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    c = reach.Client(redis_url="redis://x:1/0")
    with pytest.raises(ConfigError, match="tenant= needs a tenant map"):
        c.tenants.resolve("acme")


def test_writing_the_url_keeps_the_tenant_map(tmp_path: Path) -> None:
    from reach.config import write_project_url

    f = write(
        tmp_path,
        'redis_url = "redis://old:1/0"\nretries = [1, 2]\n'
        '[tenants.acme]\nredis_url = "redis://a:1/0"\nnamespace = "acme"\n'
        '[tenants."x.y"]\nredis_url = "redis://xy:1/0"\n',
    )
    write_project_url("redis://new:1/0", f)
    m = read_tenants(f)
    assert m.resolve("acme") == Tenant("redis://a:1/0", "acme")
    assert m.resolve("x.y") == Tenant("redis://xy:1/0", "x.y")
    import tomllib

    data = tomllib.loads(f.read_text())
    assert data["redis_url"] == "redis://new:1/0" and data["retries"] == [1, 2]


def test_a_client_with_a_map_and_no_redis_is_the_default_tenant_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for var in ("REACH_REDIS_URL", "REACH_REDIS_URL_FILE", "REACH_REDIS_PASSWORD_FILE"):
        monkeypatch.delenv(var, raising=False)
    tenants = {"acme": ("redis://a:1/0", "acme"), "default": ("redis://s:1/0", "t-{tenant}")}
    c = reach.Client(tenants=tenants)
    assert (c.redis_url, c.namespace) == ("redis://s:1/0", "t-default")
    c = reach.Client(tenants=tenants, namespace="ops")
    assert (c.redis_url, c.namespace) == ("redis://s:1/0", "ops")
    with pytest.raises(ConfigError, match="has a Redis of its own too"):
        reach.Client(tenants={"acme": ("redis://a:1/0", "acme")})
    # the project file's map, when it has a default and no top-level redis_url
    write(tmp_path, '[tenants.default]\nredis_url = "redis://f:1/0"\nnamespace = "shared"\n')
    c = reach.Client()
    assert (c.redis_url, c.namespace) == ("redis://f:1/0", "shared")
    assert c.tenants.resolve("zzz") == Tenant("redis://f:1/0", "shared")
    # a Redis configured the usual way wins
    monkeypatch.setenv("REACH_REDIS_URL", "redis://env:1/0")
    assert reach.Client(tenants=tenants).redis_url == "redis://env:1/0"
