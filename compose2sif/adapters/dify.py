"""Dify's own images (langgenius/dify-*): the variables their entrypoints read."""
from compose2sif.adapters.base import Adapter
from compose2sif.plan.knobs import Knob

API = Adapter(
    family="dify-api",
    images=r"dify-api$",
    ports={5001: Knob("env", "DIFY_PORT", "{port}")},
    address=Knob("env", "DIFY_BIND_ADDRESS", "{address}"),
    writable=("/app/logs",),
)
WEB = Adapter(
    family="dify-web",
    images=r"dify-web$",
    ports={3000: Knob("env", "PORT", "{port}")},
    address=Knob("env", "HOSTNAME", "{address}"),
)
PLUGIN_DAEMON = Adapter(
    family="dify-plugin-daemon",
    images=r"dify-plugin-daemon$",
    ports={5002: Knob("env", "SERVER_PORT", "{port}")},
)
SANDBOX = Adapter(
    family="dify-sandbox",
    images=r"dify-sandbox$",
    ports={8194: Knob("env", "SANDBOX_PORT", "{port}")},
)
ADAPTERS = [API, WEB, PLUGIN_DAEMON, SANDBOX]
