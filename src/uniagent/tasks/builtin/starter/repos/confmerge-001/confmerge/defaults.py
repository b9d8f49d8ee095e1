"""Built-in defaults.  Treat as read-only."""

DEFAULTS: dict = {
    "server": {
        "host": "127.0.0.1",
        "port": 8080,
        "tls": {"enabled": False, "cert": None},
    },
    "logging": {
        "level": "INFO",
        "handlers": ["console"],
    },
    "features": {},
}
