from lrucache import LRUCache


def test_evicts_oldest():
    c = LRUCache(2)
    c.put("a", 1)
    c.put("b", 2)
    c.put("c", 3)
    assert "a" not in c and c.get("b") == 2 and c.get("c") == 3


def test_overwrite_keeps_size():
    c = LRUCache(2)
    c.put("a", 1)
    c.put("a", 2)
    assert len(c) == 1 and c.get("a") == 2
