"""The public endpoint's front: nginx checks the API key, allows only the OpenAI paths and bounds the requests in
flight (429 with Retry-After beyond), before vllm-router. vllm-router's own --api-key only authenticates it to the
workers, and it serves its worker-management API on the same port, so it cannot face clients itself. Pure text.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import string
from dataclasses import dataclass
from pathlib import Path

from kiln import datafiles
from kiln.choice.items import SERVED_NAME
from kiln.serve.front.keys import KeyStore
from kiln.serve.front.tls import CIPHERS_TLS12, PROTOCOLS
from kiln.serve.layout import PUBLIC_HEALTH, ServeLayout

RETRIES = 2  # passes of a failed request back to the router, each to the next worker in its rotation
# The OpenAI API vLLM serves for a generative model (/v1/responses is what the gpt-oss recipe uses), and for an
# embedding or reranking model (vLLM's /v1/embeddings and Jina/Cohere-style /v1/rerank).
PUBLIC_PATHS = ("/v1/models", "/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/embeddings",
                "/v1/rerank", "/v1/score")
# vllm-router 0.1.17 sends rerank on with its own model name ("default"), and has no /v1/score: these go straight
# to the model's instances, nginx balancing them and passing a refused connection on to the next.
TO_INSTANCES = ("/v1/rerank", "/v1/score")
KEY_HEADER = "X-Kiln-Key"  # the name of the key a request came with, set by nginx over whatever the client sent
UNSAFE = "\"'\\$; \n{}"  # characters a key may not hold in nginx's configuration
# Repeated in every block that adds a header: nginx's add_header in a location (or an `if`) replaces the server's.
HSTS = 'add_header Strict-Transport-Security "max-age=63072000" always;'
# nginx's own error pages (HTML), and the router's plain-text answers, as OpenAI's JSON errors.
NGINX_ERRORS = {400: ("the request cannot be read (malformed HTTP or headers too large)", "invalid_request_error",
                      "bad_request"),
                404: ("not found", "invalid_request_error", "not_found"),
                405: ("method not allowed on this path", "invalid_request_error", "method_not_allowed"),
                413: ("the request body is too large", "invalid_request_error", "request_too_large"),
                414: ("the request URI is too long", "invalid_request_error", "uri_too_long"),
                415: ("send the body as JSON, with Content-Type: application/json", "invalid_request_error",
                      "unsupported_media_type"),
                422: ("the request body is not a valid request", "invalid_request_error", "invalid_request"),
                500: ("internal error; retry", "server_error", "internal_error"),
                502: ("no model instance answered; retry shortly (`kiln status` shows why)", "server_error",
                      "unavailable"),
                503: ("no model instance is serving now; retry shortly (`kiln status` shows why)", "server_error",
                      "unavailable"),
                504: ("the model instance did not answer in time; retry", "server_error", "timeout"),
                # nginx's own codes for a request it cannot read, answered as 400 (ANSWERED_AS)
                494: ("the request's headers are too large", "invalid_request_error", "headers_too_large"),
                497: ("this port speaks HTTPS: send the request over TLS (https://)", "invalid_request_error",
                      "https_required"),
                501: ("the request's transfer coding is not supported", "invalid_request_error", "not_implemented"),
                505: ("the HTTP version is not supported: use HTTP/1.1", "invalid_request_error",
                      "http_version_not_supported")}
ANSWERED_AS = {494: 400, 497: 400}
# Turned to JSON on the API's paths: nginx's own (413, 502, 504) and the router's plain-text answers (405, 422, 503).
API_ERRORS = (405, 413, 415, 422, 502, 503, 504)
# vLLM's own refusals and failures reach nginx as 520 and 521, with their JSON in X-Kiln-Error (kiln_guard.py):
# answered as 400 and 500 in vLLM's words, never asked for again, nor retried by the router. A 400 or 500 that
# reaches nginx as such is the router's own, in plain text.
FROM_VLLM = {520: 400, 521: 500}
ROUTER_400 = ("the request body is not valid JSON for this API", "invalid_request_error", "invalid_json")
# The router's 422 is plain text, and names the field for no one: the same request goes once to an instance,
# whose vLLM answers what is wrong (a 400, as 520) or serves it. Its other answers keep nginx's 422 page.
REPLAY_422_PAGES = ("error_page 520 = @vllm_520;", "error_page 521 = @vllm_521;",
                    "error_page 422 500 502 503 504 =422 /.kiln-error/422;")
NGINX_CANDIDATES = ("/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/local/nginx/sbin/nginx")
# nginx's JavaScript module (Debian's and Ubuntu's libnginx-mod-http-js), which reads a request's `model` to route it.
NJS_MODULE_CANDIDATES = ("/usr/lib/nginx/modules/ngx_http_js_module.so",
                         "/usr/lib64/nginx/modules/ngx_http_js_module.so", "/etc/nginx/modules/ngx_http_js_module.so",
                         "/usr/local/nginx/modules/ngx_http_js_module.so")
# With routing by model the body is read in memory before it is passed on, so it is bounded lower than one model's.
ROUTED_MAX_BODY_BYTES = 16 * 2**20


@dataclass(frozen=True)
class ModelRoute:
    """One model behind the endpoint: the names clients ask for (its own and its adapters'), its router and its
    vLLM instances."""

    names: tuple[str, ...]
    router_port: int
    instance_ports: tuple[int, ...] = ()


@dataclass(frozen=True)
class ProxySettings:
    max_in_flight: int  # requests being served or waiting in vLLM's queues; beyond it, 429
    retry_after_s: int = 2
    workers: int = 2
    max_body_bytes: int = 64 * 2**20
    worker_user: str | None = None  # with a root master (the image): the workers' user, who reads no secret file
    # This machine's vLLM instances: a request the router refuses as malformed is asked of one of them, once (422)
    instance_ports: tuple[int, ...] = ()
    # Several models: each one's served names, router and instances; () is one model behind layout.router_port
    routes: tuple[ModelRoute, ...] = ()
    njs_module: str | None = None  # nginx's JavaScript module, which routing by model or keys scoped to models need

    def model_routes(self, layout: ServeLayout) -> tuple[ModelRoute, ...]:
        return self.routes or (ModelRoute((), layout.router_port, self.instance_ports),)


@dataclass(frozen=True)
class TlsFiles:
    """What nginx serves TLS with; None in nginx_config means plain HTTP (`tls: off`)."""
    certificate: Path
    private_key: Path


def _error(message: str, kind: str, code: str) -> str:
    body = json.dumps({"error": {"message": message, "type": kind, "code": code}})
    return "'" + body.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _literal(secret: str) -> str:
    """A key as a regular expression matching only itself (a key holds letters, digits and ._~+-)."""
    return re.sub(r"([.+])", r"\\\1", secret)


def _key_lines(keys: KeyStore) -> tuple[str, str, str]:
    """The map from the Authorization header to a key's name, and one rate-limit zone per limited key."""
    for key in keys.keys:
        if len(key.secret) < 16 or any(ch in key.secret for ch in UNSAFE):
            raise ValueError(f"the key named {key.name} holds characters nginx cannot take literally")
    # A regular expression (`~`) compares exactly: nginx compares a map's plain strings without regard to case, so a
    # key with its letters' case changed would pass, and two such keys would make a configuration nginx refuses.
    # The scheme alone is compared without regard to case, as RFC 7235 says.
    names = "\n".join(f'        "~^(?i:bearer) +{_literal(k.secret)}$" {k.name};' for k in keys.keys)
    zones, limits = [], []
    for i, key in enumerate(k for k in keys.keys if k.requests_per_minute):
        rate = key.requests_per_minute or 0
        zones.append(f"    map $kiln_key $kiln_rate_{i} {{\n        default \"\";\n        {key.name} $kiln_key;\n"
                     f"    }}\n    limit_req_zone $kiln_rate_{i} zone=kiln_rate_{i}:1m rate={rate}r/m;")
        limits.append(f"            limit_req zone=kiln_rate_{i} burst={max(1, rate // 6)} nodelay;")
    return names, "\n".join(zones), "\n".join(limits)


class _NginxTemplate(string.Template):
    """nginx's configuration with @@{name} placeholders: `$` is nginx's own, for its variables."""

    delimiter = "@@"


@functools.cache
def _template() -> _NginxTemplate:
    return _NginxTemplate(datafiles.read_text("nginx/nginx.conf.template"))


def nginx_config(layout: ServeLayout, settings: ProxySettings, keys: KeyStore, tls: TlsFiles | None) -> str:
    """The template (data/nginx/nginx.conf.template) filled with what depends on the settings, keys and TLS."""
    paths = "|".join(p.removeprefix("/v1/") for p in PUBLIC_PATHS)
    unauthorized = _error("a valid API key is required: send 'Authorization: Bearer KEY' (see `kiln status`)",
                          "invalid_request_error", "invalid_api_key")
    overloaded = _error(f"the server is at capacity ({settings.max_in_flight} requests in flight); retry later",
                        "server_error", "overloaded")
    rate_limited = _error("this key's rate limit (requests per minute) is reached; retry later",
                          "rate_limit_error", "rate_limit_exceeded")
    not_found = _error(f"not served here; the API offers {', '.join(PUBLIC_PATHS)}", "invalid_request_error",
                       "not_found")
    routes = settings.model_routes(layout)
    routed = by_model(settings, keys)
    key_names, rate_zones, rate_limits = _key_lines(keys)
    hsts = f"            {HSTS}" if tls else ""
    # Plain internal locations, not named ones: nginx cannot redirect a request whose line it refused (414) to a
    # named location (it answers 500).
    error_locations = "\n".join(f"""        location = /.kiln-error/{code} {{
            internal;
{hsts}
            return {ANSWERED_AS.get(code, code)} {_error(*NGINX_ERRORS[code])};
        }}""" for code in NGINX_ERRORS)
    vllm_locations = "\n".join([*(f"""        location @vllm_{code} {{
            default_type application/json;
{hsts}
            return {status} $upstream_http_x_kiln_error;
        }}""" for code, status in FROM_VLLM.items()), f"""        location @router_400 {{
{hsts}
            return 400 {_error(*ROUTER_400)};
        }}""", *(_replay_422(n, route) for n, route in enumerate(routes) if route.instance_ports)])
    own = ["error_page 401 @unauthorized;", "error_page 429 @overloaded;"]
    server_pages = "\n".join(f"        {p}" for p in [*own, *(f"error_page {c} /.kiln-error/{c};"
                                                             for c in NGINX_ERRORS)])
    if routed:
        api_body = (f"            client_max_body_size {ROUTED_MAX_BODY_BYTES};\n"
                    f"            client_body_buffer_size {ROUTED_MAX_BODY_BYTES};\n"
                    "            js_content kiln.route;")
        model_locations = "\n".join(f"        location @kiln_model_{n} {{\n{_proxy_block(n, route, own)}\n        }}"
                                    for n, route in enumerate(routes))
        model_locations += "".join(f"\n        location @kiln_pool_{n} {{\n{_pool_block(n, route, own)}\n        }}"
                                   for n, route in enumerate(routes) if route.instance_ports)
        model_locations += "\n" + _models_locations(layout, routes)
    else:
        api_body, model_locations = _proxy_block(0, routes[0], own), ""
    pool_location = ""
    if not routed and routes[0].instance_ports:  # before the API's location: nginx takes the first regex matching
        pool_location = f"""        location ~ ^/v1/({"|".join(p.removeprefix("/v1/") for p in TO_INSTANCES)})$ {{
            if ($kiln_key = "") {{
                return 401;
            }}
            limit_conn kiln_in_flight {settings.max_in_flight};
            limit_conn_status 429;
{rate_limits}
{_pool_block(0, routes[0], own)}
        }}
"""
    user = f"user {settings.worker_user};\n" if settings.worker_user else ""
    api_port = layout.api_port(tls is not None)
    if tls:
        listen = (f"        listen {layout.public_host}:{api_port} ssl backlog=4096;\n"
                  f"        ssl_certificate {tls.certificate};\n"
                  f"        ssl_certificate_key {tls.private_key};\n"
                  f"        ssl_protocols {' '.join(PROTOCOLS)};\n"
                  f"        ssl_ciphers {':'.join(CIPHERS_TLS12)};\n"
                  "        ssl_prefer_server_ciphers off;\n"
                  "        ssl_ecdh_curve X25519:prime256v1:secp384r1;\n"
                  "        ssl_session_cache shared:kiln_tls:10m;\n"
                  "        ssl_session_timeout 1d;\n"
                  "        ssl_session_tickets off;\n"
                  f"        {HSTS}")
    else:
        listen = f"        listen {layout.public_host}:{api_port} backlog=4096;"
    challenge = f"""
        # ACME HTTP-01: the CA fetches the token the agent wrote; nothing else is read from disk.
        location ^~ /.well-known/acme-challenge/ {{
            root {layout.acme_webroot};
            default_type text/plain;
            try_files $uri =404;
        }}"""
    redirect_server = "" if not (tls and layout.http_port) else f"""
    # Port 80: the ACME challenge, and a redirect to the API's HTTPS for everything else.
    server {{
        listen {layout.public_host}:{layout.http_port};
{challenge}
        location / {{
            return 301 https://$host{'' if api_port == 443 else f':{api_port}'}$request_uri;
        }}
    }}
"""
    return _template().substitute(
        user=user, workers=settings.workers, max_body_bytes=settings.max_body_bytes, key_names=key_names,
        rate_zones=rate_zones,
        redirect_server=redirect_server, listen=listen, modules=_njs_line(settings) if routed else "",
        routing=_routing(routes, keys) if routed else "", upstreams=_upstreams(layout, routes),
        challenge="" if tls else challenge, server_pages=server_pages, hsts=hsts, unauthorized=unauthorized,
        error_locations=error_locations, rate_limited=rate_limited, retry_after_s=settings.retry_after_s,
        overloaded=overloaded, health_url=f"{layout.health_url}{PUBLIC_HEALTH}", paths=paths,
        max_in_flight=settings.max_in_flight, rate_limits=rate_limits, api_body=api_body, pool_location=pool_location,
        model_locations=model_locations, vllm_locations=vllm_locations, not_found=not_found)


def by_model(settings: ProxySettings, keys: KeyStore) -> bool:
    """Whether requests are routed by their `model` (several models, or a key limited to some): nginx's JavaScript
    module reads the body. One model for every key needs no reading: the body goes straight to its router."""
    return len(settings.routes) > 1 or any(k.models is not None for k in keys.keys)


def _njs_line(settings: ProxySettings) -> str:
    if not settings.njs_module:
        raise ValueError("routing by model (several models, or a key limited to some) needs nginx's JavaScript "
                         "module, which is not installed (apt-get install libnginx-mod-http-js)")
    return f"load_module {settings.njs_module};\n"


def _upstreams(layout: ServeLayout, routes: tuple[ModelRoute, ...]) -> str:
    blocks = []
    for n, route in enumerate(routes):
        servers = "\n".join(f"        server {layout.local_host}:{route.router_port} max_fails=0;"
                            for _ in range(RETRIES + 1))
        blocks.append(f"    upstream {_router_upstream(n)} {{\n{servers}\n        keepalive 128;\n    }}")
        if route.instance_ports:
            servers = "\n".join(f"        server {layout.local_host}:{port} max_fails=0;"
                                for port in route.instance_ports)
            blocks.append(f"    # {_names_comment(route)}'s vLLM instances, asked only what its router refused as "
                          f"malformed (@router_422_{n}).\n"
                          f"    upstream kiln_instances_{n} {{\n{servers}\n        keepalive 8;\n    }}")
    return "\n".join(blocks)


def _router_upstream(n: int) -> str:
    return "kiln_router" if n == 0 else f"kiln_router_{n}"


def _names_comment(route: ModelRoute) -> str:
    return ", ".join(route.names) or "the model"


def _routing(routes: tuple[ModelRoute, ...], keys: KeyStore) -> str:
    """The tables kiln_route.js reads: each served name's route, and the served names each limited key may use."""
    table: dict[str, int] = {}
    for n, route in enumerate(routes):
        for name in route.names:
            if not re.fullmatch(SERVED_NAME, name):
                raise ValueError(f"the served name {name[:40]!r} holds characters nginx cannot take literally")
            table.setdefault(name, n)
    scoped = "\n".join(f'        {k.name} " {" ".join(k.models)} ";' for k in keys.keys if k.models is not None)
    return f"""
    # Routing by model (kiln_route.js): the served names, and the models each limited key may ask for.
    js_import kiln from {Path(datafiles.data_dir("nginx")) / "kiln_route.js"};
    js_var $kiln_routes '{json.dumps(table, separators=(",", ":"))}';
    map $kiln_key $kiln_key_models {{
        default "";
{scoped}
    }}
"""


def _models_locations(layout: ServeLayout, routes: tuple[ModelRoute, ...]) -> str:
    """GET /v1/models: every model's list (from its router), merged by kiln_route.js."""
    lists = "\n".join(f"""        location = /.kiln-models/{n} {{
            internal;
            proxy_pass http://{layout.local_host}:{route.router_port}/v1/models;
            proxy_pass_request_body off;
            proxy_set_header Content-Length "";
            proxy_set_header Authorization "";
            proxy_connect_timeout 2s;
            proxy_read_timeout 10s;
        }}""" for n, route in enumerate(routes))
    return f"""        location = /v1/models {{
            if ($kiln_key = "") {{
                return 401;
            }}
            js_content kiln.models;
        }}
{lists}"""


def _proxied(upstream: str, next_upstream: str, pages: list[str]) -> str:
    """A proxy_pass to `upstream`, passing the key's name on, with when to try the next server (`next_upstream`,
    its lines) and the error pages; what every location that reaches the router or an instance shares."""
    lines = "\n".join(f"            {page}" for page in pages)
    return f"""            proxy_pass http://{upstream};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Authorization "";
            proxy_set_header {KEY_HEADER} $kiln_key;
            proxy_set_header X-Request-Id $request_id;
{next_upstream}
            proxy_intercept_errors on;
{lines}
            proxy_hide_header X-Kiln-Error;
            proxy_connect_timeout 5s;
            proxy_buffering off;
            proxy_cache off;
            proxy_read_timeout 1800s;
            proxy_send_timeout 1800s;"""


def _proxy_block(n: int, route: ModelRoute, own: list[str]) -> str:
    """How a request reaches model n's router, and how that router's and vLLM's errors reach the client."""
    replay = bool(route.instance_ports)
    pages = [*(f"error_page {code} = @vllm_{code};" for code in FROM_VLLM), "error_page 400 = @router_400;",
             "error_page 500 /.kiln-error/500;"]
    if replay:  # the replay's own error pages apply too: nginx follows one error_page per request unless told
        pages += [f"error_page 422 = @router_422_{n};", "recursive_error_pages on;"]
    # A location's own error_page replaces every one it would inherit: the API's location lists those it needs,
    # less 400 and 500, which vLLM answers in JSON with what is wrong (nginx's 400 comes before any location).
    api_pages = [*own, *(f"error_page {c} /.kiln-error/{c};" for c in API_ERRORS if not (replay and c == 422))]
    return _proxied(_router_upstream(n), f"""\
            # Only where the router did not answer, had no worker, or could not reach one (its own 500 in plain text:
            # vLLM's errors come as 520 and 521): an answer of vLLM's, an error too, is never sent again.
            proxy_next_upstream error timeout http_500 http_502 http_503 non_idempotent;
            proxy_next_upstream_tries {RETRIES + 1};
            # The router's plain-text answers become JSON; vLLM's own errors come in its words (520, 521, or a 404).""",
                    [*api_pages, *pages])


def _pool_block(n: int, route: ModelRoute, own: list[str]) -> str:
    """How a rerank or score request reaches model n's instances themselves (TO_INSTANCES)."""
    pages = [*own, *(f"error_page {code} = @vllm_{code};" for code in FROM_VLLM),
             *(f"error_page {c} /.kiln-error/{c};" for c in API_ERRORS)]
    return _proxied(f"kiln_instances_{n}", f"""\
            # An instance that refuses the connection (restarting) passes the request on to the next.
            proxy_next_upstream error timeout non_idempotent;
            proxy_next_upstream_tries {max(len(route.instance_ports), 1)};""", pages)


def _replay_422(n: int, route: ModelRoute) -> str:
    block = _proxied(f"kiln_instances_{n}", f"""\
            proxy_next_upstream error timeout;
            proxy_next_upstream_tries {len(route.instance_ports)};""", list(REPLAY_422_PAGES))
    return f"        location @router_422_{n} {{\n{block}\n        }}"


def find_njs_module() -> str | None:
    return next((p for p in NJS_MODULE_CANDIDATES if Path(p).is_file()), None)


def find_nginx() -> str | None:
    found = shutil.which("nginx")
    if found:
        return found
    return next((p for p in NGINX_CANDIDATES if Path(p).is_file()), None)


def nginx_test_argv(nginx: str, layout: ServeLayout, config: Path) -> tuple[str, ...]:
    """nginx's own check of a configuration (`nginx -t`), with the prefix the live one runs with."""
    return (nginx, "-t", "-q", "-p", f"{layout.proxy_config.parent}/", "-c", str(config), "-e", "stderr")


def nginx_argv(nginx: str, layout: ServeLayout) -> tuple[str, ...]:
    prefix = layout.proxy_config.parent
    return (nginx, "-p", f"{prefix}/", "-c", str(layout.proxy_config), "-e", "stderr", "-g", "daemon off;")
