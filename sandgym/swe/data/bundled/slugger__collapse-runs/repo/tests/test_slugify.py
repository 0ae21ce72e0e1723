from slugger import slugify


def test_lowercase():
    assert slugify("ABC") == "abc"


def test_simple():
    assert slugify("hello world") == "hello-world"
