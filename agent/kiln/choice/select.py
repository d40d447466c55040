"""From the user's choice to a profile, with the documented fallback. Pure but for the loader passed in."""

from __future__ import annotations

from collections.abc import Callable

from kiln.choice.schema import Choice, Problem
from kiln.errors import KilnError
from kiln.profiles.catalog import Catalog
from kiln.profiles.schema import Profile

# The image's fallback: small enough for every NVIDIA GPU Droplet (20 GB RTX 4000 Ada included), and not
# gated on Hugging Face, so it downloads without a token.
FALLBACK_PROFILE = "qwen3-8b"


def select_profile(choice: Choice, catalog: Catalog, load_model_dir: Callable[[str], Profile],
                   fallback: str = FALLBACK_PROFILE) -> tuple[Profile, tuple[Problem, ...]]:
    """The chosen profile, or the fallback with a problem saying why the choice could not be used; the owner's
    trust_remote_code, when given, over the profile's."""
    profile, problems = _selected(choice, catalog, load_model_dir, fallback)
    if choice.trust_remote_code is None or choice.trust_remote_code == profile.serving.trust_remote_code:
        return profile, problems
    serving = profile.serving.model_copy(update={"trust_remote_code": choice.trust_remote_code})
    return profile.model_copy(update={"serving": serving}), problems


def _selected(choice: Choice, catalog: Catalog, load_model_dir: Callable[[str], Profile],
              fallback: str) -> tuple[Profile, tuple[Problem, ...]]:
    try:
        if choice.model:
            return load_model_dir(choice.model), ()
        if choice.profile:
            return catalog.get(choice.profile), ()
    except KilnError as exc:
        field = "model" if choice.model else "profile"
        problem = Problem("choice", field, f"{exc.what}; serving the fallback profile {fallback} instead",
                          exc.fix or "fix the setting and restart kiln")
        return catalog.get(fallback), (problem,)
    return catalog.get(fallback), ()
