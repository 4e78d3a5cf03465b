import re
import subprocess
from collections import Counter
from pathlib import Path

SCRIPT = Path("/app/report.sh")


def expected(log: str) -> list[str]:
    counts = Counter()
    for line in log.splitlines():
        m = re.match(r'^(\S+) .*" (\d{3}) \S+$', line)
        if m and m.group(2).startswith("5"):
            counts[m.group(1)] += 1
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
    return [f"{c} {ip}" for ip, c in ranked]


def run(path) -> list[str]:
    out = subprocess.run(["bash", str(SCRIPT), str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()


def line(ip, status, path="/x"):
    return f'{ip} - - [12/Mar/2024:10:00:01 +0000] "GET {path} HTTP/1.1" {status} 100'


def test_example_log():
    assert run("/app/access.log") == expected(Path("/app/access.log").read_text())


def test_other_log_with_ties(tmp_path):
    log = "\n".join([line("192.168.1.20", 500)] * 2 + [line("192.168.1.3", 503)] * 2 + [line("8.8.8.8", 502), line("1.1.1.1", 200), line("1.1.1.1", 200), line("7.7.7.7", 404), line("9.9.9.9", 504, "/500")]) + "\n"
    f = tmp_path / "a.log"
    f.write_text(log)
    assert run(f) == ["2 192.168.1.20", "2 192.168.1.3", "1 8.8.8.8"]


def test_status_in_path_does_not_count(tmp_path):
    f = tmp_path / "b.log"
    f.write_text(line("5.5.5.5", 200, "/500") + "\n")
    assert run(f) == []


def test_shell_only():
    text = SCRIPT.read_text()
    assert not re.search(r"\b(python3?|perl)\b", text)
