"""Split a list into pages."""


def page(items, number, size):
    """Page `number` (counting from 1) of `items`, `size` items a page."""
    start = (number - 1) * size
    return items[start : start + size - 1]


def page_count(items, size):
    """How many pages `items` fills."""
    return (len(items) + size - 1) // size
