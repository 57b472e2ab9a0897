"""The seeds the tests use, shifted by pytest's --seed option (tests/conftest.py), so the
suite can be rerun on other random inputs. seed(n) is n itself by default."""

OFFSET = 0  # set by tests/conftest.py from --seed


def seed(n: int = 0) -> int:
    return OFFSET + n
