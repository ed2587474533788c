"""Polygons given as lists of (x, y) points."""


def area_of(points):
    """The area of a simple polygon (the shoelace formula)."""
    total = 0.0
    for (x1, y1), (x2, y2) in zip(points, points[1:] + points[:1]):
        total += x1 * y2 - x2 * y1
    return abs(total) / 2


def perimeter(points):
    """The length of the polygon's boundary."""
    pairs = zip(points, points[1:] + points[:1])
    return sum(((x2 - x1) ** 2 + (y2 - y1) ** 2) ** 0.5 for (x1, y1), (x2, y2) in pairs)
