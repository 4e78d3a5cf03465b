import subprocess
from pathlib import Path

REPO = Path("/app/service")
EXPECTED = "[server]\nport = 8080\nworkers = 4\n\n[db]\nurl = sqlite:///data.db\n"


def git(*args):
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True).stdout


def test_file_restored_in_work_tree():
    assert (REPO / "config" / "settings.ini").read_text() == EXPECTED


def test_restoration_committed():
    assert git("show", "HEAD:config/settings.ini") == EXPECTED
    assert "restore" in git("log", "-1", "--format=%B").lower()
    assert git("status", "--porcelain", "--untracked-files=no").strip() == ""


def test_history_kept():
    subjects = git("log", "--format=%s").splitlines()
    for subject in ["Initial service", "Tune server", "Add database settings", "Clean up config", "App v2"]:
        assert subject in subjects
    old = git("rev-list", "--max-parents=0", "HEAD").strip()
    assert subprocess.run(["git", "-C", str(REPO), "merge-base", "--is-ancestor", old, "HEAD"]).returncode == 0
    assert (REPO / "src" / "app.py").read_text() == 'print("v2")\n'
