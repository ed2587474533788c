import unittest

from shapes import rectangle_area, square_area


class ShapesTest(unittest.TestCase):
    def test_square(self):
        self.assertEqual(square_area(3), 9)

    def test_rectangle(self):
        self.assertEqual(rectangle_area(2, 5), 10)

    def test_zero(self):
        self.assertEqual(square_area(0), 0)

    def test_unit(self):
        self.assertEqual(rectangle_area(1, 1), 1)


if __name__ == "__main__":
    unittest.main()
