"""Usernames: what a valid one looks like (SPEC.md)."""


def username_errors(name: str) -> list[str]:
    """The codes of the rules in SPEC.md that `name` breaks, in the spec's order."""
    raise NotImplementedError
