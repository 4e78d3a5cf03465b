import subprocess
import sys

CLI = "/app/wordfreq.py"


def run(*args, stdin=None):
    return subprocess.run([sys.executable, CLI, *args], input=stdin, capture_output=True, text=True, timeout=60)


def test_counts_sorted_by_frequency_then_word(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("b a c b a b\nd")
    out = run(str(f))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["3\tb", "2\ta", "1\tc", "1\td"]


def test_top_and_ignore_case():
    out = run("--top", "2", "--ignore-case", "/app/sample.txt")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["4\tthe", "2\tcat"]


def test_case_sensitive_by_default_and_apostrophes():
    out = run("/app/sample.txt")
    lines = out.stdout.splitlines()
    assert "2\tthe" in lines and "2\tThe" in lines and "1\twasn't" in lines


def test_several_files_and_stdin(tmp_path):
    f = tmp_path / "x.txt"
    f.write_text("x y")
    out = run(str(f), "-", stdin="y z")
    assert out.stdout.splitlines() == ["2\ty", "1\tx", "1\tz"]


def test_missing_file():
    out = run("/nope/missing.txt")
    assert out.returncode == 2
    assert "missing.txt" in out.stderr
    assert out.stdout == ""
