"""Small text helpers."""


def words(text):
    """The words of `text`, split on whitespace."""
    return text.split()


def title_case(text):
    """`text` with each word capitalised."""
    return " ".join(w.capitalize() for w in words(text))


def squeeze(text):
    return " ".join(text.split())


def truncate(text, limit):
    """`text` cut to `limit` characters, with an ellipsis when it was longer."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def count_lines(text):
    """How many lines `text` has (a last line without a newline counts)."""
    return len(text.splitlines())
