import unittest

from shapes import area_of
from shapes.report import describe

SQUARE = [(0, 0), (2, 0), (2, 2), (0, 2)]


class ShapesTest(unittest.TestCase):
    def test_area(self):
        self.assertEqual(area_of(SQUARE), 4.0)

    def test_describe(self):
        self.assertEqual(describe("sq", SQUARE), "sq: area 4.0 m², perimeter 8.0 m")
