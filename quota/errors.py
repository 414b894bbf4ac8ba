"""The errors quota/'s admin calls raise; the gateway maps them to 400 and 404."""

from __future__ import annotations


class InvalidRequest(ValueError):
    """Bad input to an admin call; the message says which field and why (the gateway answers 400)."""


class NotFound(KeyError):
    """The account, sub-account or key does not exist (the gateway answers 404)."""
