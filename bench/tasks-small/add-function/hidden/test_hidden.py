import unittest

from textutil import reverse_words, shout


class HiddenTest(unittest.TestCase):
    def test_reverse_words(self):
        self.assertEqual(reverse_words("one two three"), "three two one")
        self.assertEqual(reverse_words("solo"), "solo")
        self.assertEqual(shout("a"), "A!")


if __name__ == "__main__":
    unittest.main()
