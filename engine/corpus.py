"""A small built-in corpus of English and code that the tiny tokenizer is trained on.

It sits beside the package's own source files (see `tiny_model.corpus_texts`), so the tokenizer sees
prose, Python, shell and JSON: the kinds of text an agent reads and writes.
"""

ENGLISH = """\
The quick brown fox jumps over the lazy dog. A tiny model does not know much, but it can still
speak the protocol: it reads a prompt, samples tokens one at a time, and stops when it is told to.
Reinforcement learning rewards what works. An agent runs commands in a sandbox, reads the output,
edits files and runs the tests again until they pass. Please fix the failing test in the repository.
You are Qwen, created by Alibaba Cloud. You are a helpful assistant. Answer the question using the tools you are given. The user asked you
to list the files in the current directory, then to read the README and summarise it in one line.
Thank you! The build finished without errors. The tests passed. The function returns the sum of
two numbers. Write a program that prints hello world. What is the capital of France? Paris.
One, two, three, four, five, six, seven, eight, nine, ten. Monday, Tuesday, Wednesday, Thursday.
"""

CODE = '''\
import os
import sys
import json
from pathlib import Path


def add(a: int, b: int) -> int:
    """Return the sum of a and b."""
    return a + b


class Counter:
    def __init__(self, start: int = 0) -> None:
        self.value = start

    def increment(self, step: int = 1) -> int:
        self.value += step
        return self.value


def main(argv: list[str]) -> int:
    for name in sorted(os.listdir(".")):
        if name.endswith(".py"):
            print(name)
    data = json.loads(Path("config.json").read_text())
    if not data.get("enabled", False):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
'''

SHELL = """\
ls -la
cat README.md
grep -rn "def main" src/
python -m pytest -q tests/
git diff --stat
sed -n 1,40p app.py
echo "done" && exit 0
pip install -e .
"""

JSON = """\
{"name": "bash", "arguments": {"command": "ls -la"}}
{"name": "read_file", "arguments": {"path": "src/app.py"}}
{"name": "write_file", "arguments": {"path": "hello.py", "content": "print('hello world')"}}
{"type": "function", "function": {"name": "bash", "description": "Run a shell command", "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
"""

BUILTIN_CORPUS = [ENGLISH, CODE, SHELL, JSON]
