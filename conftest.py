"""pytest set-up shared by the unit tests and nbval."""


def pytest_collectstart(collector):
    """nbval: do not compare stderr (warnings differ between machines and library versions)."""
    if getattr(collector, "fspath", None) is not None and collector.fspath.ext == ".ipynb":
        collector.skip_compare += ("stderr",)
