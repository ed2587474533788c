import unittest

from users import username_errors


class Spec(unittest.TestCase):
    def test_cases(self):
        cases = {
            "alice": [],
            "a_b_c9": [],
            "abc": [],
            "a" * 16: [],
            "ab": ["length"],
            "a" * 17: ["length"],
            "": ["length", "start"],
            "Alice": ["charset", "start"],
            "9lives": ["start"],
            "_x_y": ["start"],
            "a__b": ["underscores"],
            "é_and": ["charset", "start"],
            "x-y z": ["charset"],
            "__": ["length", "start", "underscores"],
        }
        for name, want in cases.items():
            with self.subTest(name=name):
                self.assertEqual(username_errors(name), want)
