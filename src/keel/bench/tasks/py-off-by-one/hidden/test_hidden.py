import unittest

from pager import page


class Hidden(unittest.TestCase):
    def test_pages(self):
        items = list(range(10))
        self.assertEqual(page(items, 2, 3), [3, 4, 5])
        self.assertEqual(page(items, 4, 3), [9])
        self.assertEqual(page(items, 5, 3), [])
