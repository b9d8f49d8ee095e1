from confmerge import DEFAULTS, load


def test_defaults_only():
    config = load()
    assert config["server"]["port"] == 8080
    assert config["logging"]["handlers"] == ["console"]


def test_overrides_are_merged_deeply():
    config = load({"server": {"port": 9000}})
    assert config["server"] == {
        "host": "127.0.0.1",
        "port": 9000,
        "tls": {"enabled": False, "cert": None},
    }


def test_environment_wins_over_overrides():
    config = load({"server": {"port": 9000}}, env={"APP_SERVER__PORT": "9100", "HOME": "/root"})
    assert config["server"]["port"] == 9100


def test_environment_coercion_and_nesting():
    config = load(env={"APP_SERVER__TLS__ENABLED": "yes", "APP_FEATURES__BETA": "off"})
    assert config["server"]["tls"]["enabled"] is True
    assert config["features"] == {"beta": False}


def test_top_level_keys_can_be_added():
    config = load({"database": {"url": "sqlite://"}})
    assert config["database"] == {"url": "sqlite://"}
    assert "database" not in DEFAULTS
