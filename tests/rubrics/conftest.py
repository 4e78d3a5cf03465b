from tests.whitebox.conftest import tiny_dir  # noqa: F401  (the tiny model, built once per session)
