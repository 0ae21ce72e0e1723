import unittest

from intervals import merge


class TestMerge(unittest.TestCase):
    def test_disjoint(self):
        self.assertEqual(merge([(5, 6), (1, 2)]), [(1, 2), (5, 6)])

    def test_overlap(self):
        self.assertEqual(merge([(1, 4), (2, 6)]), [(1, 6)])

    def test_empty(self):
        self.assertEqual(merge([]), [])


if __name__ == "__main__":
    unittest.main()
