import re


def slugify(text: str) -> str:
    """A URL-safe slug: lowercase ASCII letters and digits joined by dashes."""
    return re.sub(r"[^a-z0-9]", "-", text.lower())
