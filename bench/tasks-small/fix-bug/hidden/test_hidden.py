import unittest

from calc import add, multiply, subtract


class HiddenTest(unittest.TestCase):
    def test_all(self):
        self.assertEqual(subtract(10, 4), 6)
        self.assertEqual(subtract(0, 7), -7)
        self.assertEqual(add(-1, 1), 0)
        self.assertEqual(multiply(-2, 3), -6)


if __name__ == "__main__":
    unittest.main()
