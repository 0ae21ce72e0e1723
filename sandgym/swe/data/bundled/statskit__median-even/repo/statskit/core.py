"""Small descriptive statistics."""


def mean(values):
    values = list(values)
    if not values:
        raise ValueError("mean of an empty sequence")
    return sum(values) / len(values)


def median(values):
    s = sorted(values)
    if not s:
        raise ValueError("median of an empty sequence")
    n = len(s)
    return s[n // 2]
