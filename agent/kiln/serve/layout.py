"""Where the serving runtime listens and keeps its files. Pure values; the defaults are the documented ones."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

PUBLIC_PORT = 443  # the OpenAI API over HTTPS
HTTP_PORT = 80  # the ACME challenge and a redirect to HTTPS; the API itself with `tls: off`
LOCAL_PORT = 8000  # `kiln up` on a laptop: vLLM's own default port, no privilege needed
ROUTER_PORT = 8001  # vllm-router, localhost only
ROUTER_METRICS_PORT = 8002  # vllm-router's Prometheus exporter, localhost only
HEALTH_PORT = 8090  # kiln's /health, /ready, /status, /metrics, localhost only
PUBLIC_HEALTH = "/health/public"  # on the health port: what nginx passes the public port's /health to
IMAGE_STATE_DIR = Path("/var/lib/kiln")
# Secrets for the units' EnvironmentFile= (kiln-vllm@.service): root-only, on tmpfs, read by systemd as root
# before it drops to the instances' user, and outside /var/lib/kiln, which that user owns.
IMAGE_SECRETS_DIR = Path("/run/kiln")
HF_HOME_FOLDER = "huggingface"  # HF_HOME under a cache root: the state folder, or <scratch disk>/kiln


@dataclass(frozen=True)
class ServeLayout:
    state_dir: Path = IMAGE_STATE_DIR
    public_host: str = "0.0.0.0"  # the public endpoint; the image firewall opens only it and SSH
    public_port: int = PUBLIC_PORT
    http_port: int | None = HTTP_PORT  # None: no plain-HTTP listener (`kiln up`)
    router_port: int = ROUTER_PORT
    router_metrics_port: int = ROUTER_METRICS_PORT
    health_port: int = HEALTH_PORT
    local_host: str = "127.0.0.1"
    first_instance_port: int | None = None  # the vLLM instances' first port (localhost); None: the plan's (8100)

    @property
    def hf_home(self) -> Path:
        """HF_HOME of the instances: the Hugging Face cache the agent downloads into."""
        return self.state_dir / HF_HOME_FOLDER

    @property
    def home_dir(self) -> Path:
        """The instances' $HOME on the image: theirs to write, unlike the state folder around it, which is root's."""
        return self.state_dir / "home"

    @property
    def secrets_dir(self) -> Path:
        return IMAGE_SECRETS_DIR if self.state_dir == IMAGE_STATE_DIR else self.state_dir / "secrets"

    @property
    def hf_token_env(self) -> Path:
        """HF_TOKEN=..., for huggingface_hub inside vLLM; never in argv, runtime.json or a report."""
        return self.secrets_dir / "hf_token.env"

    @property
    def plan_file(self) -> Path:
        return self.state_dir / "plan.json"

    @property
    def runtime_file(self) -> Path:
        return self.state_dir / "runtime.json"

    @property
    def api_key_file(self) -> Path:
        """An earlier version's single key; read once into keys.json."""
        return self.state_dir / "api_key"

    @property
    def agent_pid_file(self) -> Path:
        """Where `kiln keys` and `kiln reload` find the agent to signal."""
        return self.state_dir / "agent.pid"

    @property
    def agent_health_file(self) -> Path:
        """The running agent's health URL, for `kiln status --state-dir` and `kiln keys` (its port may be any)."""
        return self.state_dir / "agent.health"

    def health_of(self, given: str | None) -> str:
        """The health endpoint: the one given, else the one the agent of this folder wrote, else the default."""
        if given:
            return given
        try:
            return self.agent_health_file.read_text(encoding="utf-8").strip() or self.health_url
        except OSError:
            return ServeLayout().health_url

    @property
    def keys_file(self) -> Path:
        return self.state_dir / "keys.json"

    @property
    def tls_dir(self) -> Path:
        return self.state_dir / "tls"

    @property
    def acme_webroot(self) -> Path:
        """Served on port 80 under /.well-known/acme-challenge/; holds nothing but a challenge's token."""
        return self.state_dir / "acme" / "webroot"

    @property
    def proxy_config(self) -> Path:
        return self.state_dir / "proxy" / "nginx.conf"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def models_dir(self) -> Path:
        return self.state_dir / "models"

    def for_router(self, n: int) -> ServeLayout:
        """Where model n's router listens when a machine serves several models: the layout's own ports for the
        first, two ports further for each next one (its API, then its metrics)."""
        if n == 0:
            return self
        return replace(self, router_port=self.router_port + 2 * n, router_metrics_port=self.router_metrics_port + 2 * n)

    @property
    def router_url(self) -> str:
        return f"http://{self.local_host}:{self.router_port}"

    @property
    def health_url(self) -> str:
        return f"http://{self.local_host}:{self.health_port}"

    def api_port(self, tls: bool) -> int:
        """Without TLS the API moves to the plain-HTTP port, when there is one (the image: 80)."""
        return self.public_port if tls or self.http_port is None else self.http_port

    def endpoint_url(self, advertised_host: str, tls: bool = True) -> str:
        scheme, port = ("https", self.api_port(tls)) if tls else ("http", self.api_port(tls))
        default = 443 if tls else 80
        host = f"[{advertised_host}]" if ":" in advertised_host else advertised_host
        return f"{scheme}://{host}" + ("" if port == default else f":{port}")
