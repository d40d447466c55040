"""Who may set what: every source of settings with its trust level, in one table that resolve.py enforces and
docs/user-data.md shows. A public source never carries a secret and never lowers security; remote code runs only
where the owner asked for it."""

from __future__ import annotations

from dataclasses import dataclass

OWNER = "owner"  # whoever controls the droplet: their settings apply as given
PUBLIC = "public"  # readable by anyone who can see the droplet, and set by anyone who may edit its tags
FOREIGN = "someone else's"  # another party's files or code: read as data, run only where the owner asked
STRANGER = "a stranger's"  # a client of the endpoint: bounded, authenticated, never trusted with the machine


@dataclass(frozen=True)
class Source:
    name: str
    trust: str
    may_set: str


SOURCES: tuple[Source, ...] = (
    Source("cloud-init user-data", OWNER, "every setting"),
    Source("droplet tags", PUBLIC, "every setting but those of PUBLIC_REFUSED"),
    Source("/etc/kiln/kiln.yaml", OWNER, "every setting; `kiln reload` re-reads it"),
    Source("the command line (`kiln up`, `kiln keys`, `kiln reload`)", OWNER, "every setting it has a flag for"),
    Source("the metadata service", OWNER, "nothing of its own: it carries user-data and tags, each at its trust"),
    Source("a Hub repository's files", FOREIGN,
           "the model's size and architecture, read as data; its code runs only with `trust_remote_code: true` "
           "from the owner, or where the catalog's profile names the repository"),
    Source("a request to the endpoint", STRANGER, "nothing: it is bounded by key, rate, size and sequences"),
)

# What a public source may not set, and why: a secret would be readable by anyone who can see the droplet, and
# the rest would lower the security the owner chose.
PUBLIC_REFUSED: dict[str, str] = {
    "api_key": "a key in a tag is readable by anyone who can see the droplet",
    "api_keys": "keys and their rate limits in a tag are readable by anyone who can see the droplet",
    "hf_token": "a token in a tag is readable by anyone who can see the droplet",
    "do_token": "a token in a tag is readable by anyone who can see the droplet",
    "tls": "TLS is the owner's to set: a tag could turn it off or hand it a certificate",
    "trust_remote_code": "running a repository's code is the owner's decision, not a tag's",
    "models": "a list of models, with their adapters' sources and remote code, is the owner's to set; a tag names "
              "one profile",
}


def refused_from_public(field: str) -> str | None:
    """Why a public source may not set `field`; None when it may."""
    return PUBLIC_REFUSED.get(field)
