"""The public endpoint's front: nginx checks the API key, allows only the OpenAI paths and bounds the requests in
flight (429 with Retry-After beyond), before vllm-router. vllm-router's own --api-key only authenticates it to the
workers, and it serves its worker-management API on the same port, so it cannot face clients itself. Pure text.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from kiln.serve.health import PUBLIC_HEALTH
from kiln.serve.layout import ServeLayout

RETRIES = 2  # passes of a failed request back to the router, each to the next worker in its rotation
# The OpenAI API vLLM serves for a generative model; /v1/responses is what the gpt-oss recipe uses.
PUBLIC_PATHS = ("/v1/models", "/v1/completions", "/v1/chat/completions", "/v1/responses")
NGINX_CANDIDATES = ("/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/local/nginx/sbin/nginx")


@dataclass(frozen=True)
class ProxySettings:
    max_in_flight: int  # requests being served or waiting in vLLM's queues; beyond it, 429
    retry_after_s: int = 2
    workers: int = 2
    max_body_bytes: int = 64 * 2**20


def _error(message: str, kind: str, code: str) -> str:
    body = json.dumps({"error": {"message": message, "type": kind, "code": code}})
    return "'" + body.replace("\\", "\\\\").replace("'", "\\'") + "'"


def nginx_config(layout: ServeLayout, settings: ProxySettings, api_key: str) -> str:
    if not api_key or any(ch in api_key for ch in "\"'\\$; \n{}"):
        raise ValueError("the API key holds characters nginx cannot take literally")
    paths = "|".join(p.removeprefix("/v1/") for p in PUBLIC_PATHS)
    unauthorized = _error("a valid API key is required: send 'Authorization: Bearer KEY' (see `kiln status`)",
                          "invalid_request_error", "invalid_api_key")
    overloaded = _error(f"the server is at capacity ({settings.max_in_flight} requests in flight); retry later",
                        "server_error", "overloaded")
    not_found = _error(f"not served here; the API offers {', '.join(PUBLIC_PATHS)}", "invalid_request_error",
                       "not_found")
    servers = "\n".join(f"        server {layout.local_host}:{layout.router_port} max_fails=0;"
                        for _ in range(RETRIES + 1))
    return f"""\
# kiln's public endpoint, written by the kiln agent at every start. Holds the API key: root's, 0600 (0640 for nginx's
# group on the image).
worker_processes {settings.workers};
pid tmp/nginx.pid;
error_log stderr warn;

events {{
    worker_connections 8192;
}}

http {{
    access_log off;
    server_tokens off;
    default_type application/json;
    client_max_body_size {settings.max_body_bytes};
    client_body_temp_path tmp/body;
    proxy_temp_path tmp/proxy;
    fastcgi_temp_path tmp/fastcgi;
    uwsgi_temp_path tmp/uwsgi;
    scgi_temp_path tmp/scgi;

    map_hash_bucket_size 256;  # the key is longer than the default bucket
    map $http_authorization $kiln_authorized {{
        default 0;
        "Bearer {api_key}" 1;
    }}

    limit_conn_zone $server_port zone=kiln_in_flight:1m;

    # The router listed once per try: nginx passes a request on to the "next" server only while no byte of the
    # answer has gone out (vllm-router answers 500 without retrying when a stream's worker died between checks).
    upstream kiln_router {{
{servers}
        keepalive 128;
    }}

    server {{
        listen {layout.public_host}:{layout.public_port} backlog=4096;

        error_page 401 @unauthorized;
        location @unauthorized {{
            add_header WWW-Authenticate 'Bearer realm="kiln"' always;
            return 401 {unauthorized};
        }}

        limit_conn kiln_in_flight {settings.max_in_flight};
        limit_conn_status 429;
        error_page 429 @overloaded;
        location @overloaded {{
            add_header Retry-After {settings.retry_after_s} always;
            return 429 {overloaded};
        }}

        # For load balancers, without a key: 200 while an instance is routed, else 503, and no other word.
        location = /health {{
            if ($request_method != GET) {{
                return 405 '{{"status": "use GET"}}';
            }}
            proxy_pass http://{layout.local_host}:{layout.health_port}{PUBLIC_HEALTH};
            proxy_pass_request_body off;
            proxy_set_header Content-Length "";
            proxy_set_header Authorization "";
            proxy_hide_header Server;
            proxy_connect_timeout 2s;
            proxy_read_timeout 5s;
            proxy_intercept_errors on;
            error_page 502 504 = @unavailable;
        }}
        location @unavailable {{
            return 503 '{{"status": "unavailable"}}';
        }}

        location ~ ^/v1/({paths})$ {{
            if ($kiln_authorized = 0) {{
                return 401;
            }}
            proxy_pass http://kiln_router;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Authorization "";
            proxy_set_header X-Request-Id $request_id;
            proxy_next_upstream error timeout http_500 http_502 http_503 non_idempotent;
            proxy_next_upstream_tries {RETRIES + 1};
            proxy_connect_timeout 5s;
            proxy_buffering off;
            proxy_cache off;
            proxy_read_timeout 1800s;
            proxy_send_timeout 1800s;
        }}

        location / {{
            if ($kiln_authorized = 0) {{
                return 401;
            }}
            return 404 {not_found};
        }}
    }}
}}
"""


def find_nginx() -> str | None:
    found = shutil.which("nginx")
    if found:
        return found
    return next((p for p in NGINX_CANDIDATES if Path(p).is_file()), None)


def nginx_argv(nginx: str, layout: ServeLayout) -> tuple[str, ...]:
    prefix = layout.proxy_config.parent
    return (nginx, "-p", f"{prefix}/", "-c", str(layout.proxy_config), "-e", "stderr", "-g", "daemon off;")
