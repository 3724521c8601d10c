"""The webhook's Flask app as `raygate webhook` builds it, on offline state (default config, every
namespace opted in), with a 1 MiB body limit. Every response Flask itself makes carries the header
`X-Flask`, so a served test can see which requests went through Flask."""

from __future__ import annotations

from flask import Response

from raygate.kube.configsource import ConfigSource
from raygate.webhook.app import create_app
from raygate.webhook.body_limits import BodyLimits
from raygate.webhook.state import WebhookState

MAX_BODY = 1024 * 1024

_state = WebhookState(config_source=ConfigSource(None).start())
_state.certificate_loaded.set()
app = create_app(_state, BodyLimits(max_body=MAX_BODY, large=MAX_BODY // 4))


@app.after_request
def _mark(response: Response) -> Response:
    response.headers["X-Flask"] = "1"
    return response
