"""Where the project root is found."""


def test_project_root_follows_the_root_variable_after_it_is_unset(tmp_path, monkeypatch):
    """A root set by CONDUCTOR_PROJECT_ROOT for a while (a test, a kernel) is not kept for
    the working directory once the variable is gone: three gpu-profile tests once ran
    against another test's temporary project."""
    import shutil

    from conductor_pipeline.paths import project_root

    here = project_root()
    other = tmp_path / "project"
    other.mkdir()
    shutil.copy(here / "pyproject.toml", other / "pyproject.toml")
    monkeypatch.setenv("CONDUCTOR_PROJECT_ROOT", str(other))
    assert project_root() == other
    monkeypatch.delenv("CONDUCTOR_PROJECT_ROOT")
    assert project_root() == here
