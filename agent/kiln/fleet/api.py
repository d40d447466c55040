"""DigitalOcean's API through pydo, its official Python client: the one I/O boundary of `kiln fleet`.

pydo returns plain dicts. Some error statuses come back as a body instead of an exception (a 404 on a delete,
a 400 on a firewall), so every answer is checked; every error becomes a KilnError that says what to do.
Creates are never retried blindly: a retried POST could make a second set of droplets.
"""

from __future__ import annotations

import json
import os
from typing import Any

from kiln.errors import KilnError

API_URL = "https://api.digitalocean.com"
PER_PAGE = 200  # the API's maximum


def _fix_for(status: int | None, message: str) -> str:
    if status == 401:
        return "set DIGITALOCEAN_TOKEN to a token with read and write scope (cloud.digitalocean.com/account/api/tokens)"
    if status == 429:
        return "the API allows 250 requests a minute; wait a minute and run the command again"
    if "droplet limit" in message:
        return "ask DigitalOcean support to raise the droplet limit, or ask for fewer droplets"
    if "not available in this region" in message:
        return "choose a region the size is offered in (`kiln fleet up` lists them when the size is unknown)"
    return "see the message; nothing was changed by the request that failed"


class ApiError(KilnError):
    """DigitalOcean answered with an error."""


def _raise(status: int | None, body: Any, doing: str) -> None:
    body = body if isinstance(body, dict) else {}
    message = str(body.get("message") or body.get("error") or "no message")
    ident = body.get("id") or (f"HTTP {status}" if status else "error")
    raise ApiError(f"DigitalOcean refused to {doing}: {message} ({ident})", fix=_fix_for(status, message))


class DigitalOcean:
    """The calls `kiln fleet` makes. `endpoint` is DigitalOcean's unless a test serves the API locally."""

    def __init__(self, token: str, endpoint: str = API_URL) -> None:
        # pydo is 80 MB of generated code, and an extra the image does not install: only `kiln fleet` imports it.
        import pydo  # noqa: PLC0415
        from azure.core.credentials import AzureKeyCredential  # noqa: PLC0415
        from azure.core.pipeline.policies import AzureKeyCredentialPolicy  # noqa: PLC0415

        options: dict[str, Any] = {"retry_total": 0}
        if not endpoint.startswith("https://"):
            # azure-core sends a bearer token only over TLS; a local test server speaks plain HTTP.
            options["authentication_policy"] = AzureKeyCredentialPolicy(AzureKeyCredential(token), "Authorization",
                                                                        prefix="Bearer")
        self._client = pydo.Client(token=token, endpoint=endpoint, **options)

    @classmethod
    def from_environment(cls) -> DigitalOcean:
        token = os.environ.get("DIGITALOCEAN_TOKEN", "")
        if not token:
            raise KilnError("DIGITALOCEAN_TOKEN is not set",
                            fix="export DIGITALOCEAN_TOKEN=... (a token with read and write scope)")
        return cls(token, os.environ.get("DIGITALOCEAN_API_URL", API_URL))

    def _call(self, doing: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from azure.core.exceptions import HttpResponseError, ServiceRequestError  # noqa: PLC0415

        try:
            answer = fn(*args, **kwargs)
        except HttpResponseError as exc:
            try:
                body = json.loads(exc.response.text()) if exc.response is not None else {}
            except ValueError:
                body = {}
            _raise(exc.status_code, body, doing)
        except ServiceRequestError as exc:
            raise ApiError(f"DigitalOcean's API cannot be reached to {doing}: {exc}",
                           fix="check the network, then run the command again") from exc
        if isinstance(answer, dict) and "id" in answer and "message" in answer:
            _raise(None, answer, doing)
        return answer

    def _pages(self, doing: str, fn: Any, key: str, **kwargs: Any) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        page = 1
        while True:
            answer = self._call(doing, fn, per_page=PER_PAGE, page=page, **kwargs)
            out += answer.get(key, [])
            if not answer.get("links", {}).get("pages", {}).get("next") or len(out) >= answer["meta"]["total"]:
                return out
            page += 1

    # -- reads --------------------------------------------------------------------------------------------------
    def sizes(self) -> list[dict[str, Any]]:
        return self._pages("list the droplet sizes", self._client.sizes.list, "sizes")

    def droplets(self, tag: str) -> list[dict[str, Any]]:
        """Droplets with the tag. The API lists GPU droplets only when asked for them (`type=gpus`, which
        cannot be combined with a tag), so both lists are read and joined."""
        tagged = self._pages("list the fleet's droplets", self._client.droplets.list, "droplets", tag_name=tag)
        gpus = self._pages("list the GPU droplets", self._client.droplets.list, "droplets", type="gpus")
        found = {d["id"]: d for d in tagged}
        found.update({d["id"]: d for d in gpus if tag in d.get("tags", [])})
        return sorted(found.values(), key=lambda d: d["id"])

    def load_balancer(self, name: str) -> dict[str, Any] | None:
        every = self._pages("list the load balancers", self._client.load_balancers.list, "load_balancers")
        return next((lb for lb in every if lb.get("name") == name), None)

    def firewall(self, name: str) -> dict[str, Any] | None:
        every = self._pages("list the firewalls", self._client.firewalls.list, "firewalls")
        return next((fw for fw in every if fw.get("name") == name), None)

    # -- writes -------------------------------------------------------------------------------------------------
    def create_droplets(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        answer = self._call(f"create {len(body['names'])} droplet(s)", self._client.droplets.create, body=body)
        return list(answer.get("droplets") or [answer["droplet"]])

    def create_load_balancer(self, body: dict[str, Any]) -> dict[str, Any]:
        answer = self._call("create the load balancer", self._client.load_balancers.create, body=body)
        return dict(answer["load_balancer"])

    def create_firewall(self, body: dict[str, Any]) -> dict[str, Any]:
        answer = self._call("create the firewall", self._client.firewalls.create, body=body)
        return dict(answer["firewall"])

    def delete_droplet(self, droplet_id: int) -> None:
        self._call(f"delete droplet {droplet_id}", self._client.droplets.destroy, droplet_id=droplet_id)

    def delete_tagged_droplets(self, tag: str) -> None:
        self._call(f"delete the droplets tagged {tag}", self._client.droplets.destroy_by_tag, tag_name=tag)

    def delete_load_balancer(self, lb_id: str) -> None:
        self._call("delete the load balancer", self._client.load_balancers.delete, lb_id=lb_id)

    def delete_firewall(self, firewall_id: str) -> None:
        self._call("delete the firewall", self._client.firewalls.delete, firewall_id=firewall_id)
