"""The admin key policy: where the key comes from, and which keys a gateway refuses to start with.

The admin key opens every tenant's keys and usage, so a guessable one is an open door: the gateway does not start
without one, with one that shipped in an example, or with one too short or too repetitive to resist guessing.
"""

from __future__ import annotations

from config.gateway import GatewaySettings
from config.settings import SettingsError

MIN_LENGTH = 32
MIN_DISTINCT_CHARACTERS = 8
# values that appeared in examples, docs or tests of this project or are common placeholders
KNOWN_EXAMPLES = frozenset({
    "change-me-please", "change-me", "changeme", "your-admin-key", "admin", "admin-key", "secret", "password",
    "admin-secret-for-tests", "live-stack-admin-key", "reliability-admin-key", "bench-admin-key",
    "dashboard-admin-key", "replace-with-32-or-more-random-characters",
})
WHERE = "admin_key or admin_key_file in the config file, or env TIDEGATE_GATEWAY__ADMIN_KEY"


def configured_admin_key(settings: GatewaySettings) -> str | None:
    """The admin key from `admin_key`, or read from `admin_key_file`; None when neither is set."""
    if settings.admin_key_file is None:
        return settings.admin_key
    if settings.admin_key:
        raise SettingsError("set admin_key or admin_key_file, not both")
    path = settings.admin_key_file.expanduser()
    try:
        return path.read_text().strip() or None
    except OSError as exc:
        raise SettingsError(f"cannot read admin_key_file {path}: {exc.strerror} "
                            f"(`tidegate admin-key --file {path}` creates one)") from None


def admin_key_problem(key: str | None) -> str | None:
    """Why a gateway must not start with this admin key, or None when it may; never repeats the key."""
    if not key:
        return f"no admin key is set: generate 32+ random characters (openssl rand -hex 32) and set {WHERE}"
    if key in KNOWN_EXAMPLES or key.lower().startswith(("change-me", "your-")):
        return f"the admin key is a published example value: generate your own and set {WHERE}"
    if len(key) < MIN_LENGTH:
        return f"the admin key has {len(key)} characters, fewer than {MIN_LENGTH}: set a longer one in {WHERE}"
    if len(set(key)) < MIN_DISTINCT_CHARACTERS:
        return f"the admin key repeats too few characters to be random: generate one and set {WHERE}"
    return None


def required_admin_key(settings: GatewaySettings) -> str:
    """The admin key a gateway may start with, or SettingsError saying in one line what is wrong."""
    key = configured_admin_key(settings)
    problem = admin_key_problem(key)
    if problem is not None or key is None:
        raise SettingsError(problem or "no admin key")
    return key
