"""How a factory finds the task a TRL prompt names, and what it says when it cannot (no server needed:
TaskCatalog is the part of the client that does it)."""

from __future__ import annotations

import pytest

from harbor_server import HarborSessionFactory
from harbor_server.client_base import TaskCatalog, is_prompt, task_reference
from harbor_server.models import TaskInfo


def task(index: int, task_id: str, instruction: str) -> TaskInfo:
    return TaskInfo(index=index, task_id=task_id, name=task_id, split="s", instruction=instruction,
                    has_solution=False, agent_timeout_sec=60.0)  # fmt: skip


TASKS = [task(0, "a", "Fix the parser.\n"), task(1, "b", "Write a cache."), task(2, "c", "Write a cache.")]


def test_a_prompt_finds_its_task_by_instruction() -> None:
    catalog = TaskCatalog(TASKS, num_tasks=None, indices=None)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "Fix the parser."}]
    assert catalog.find(messages).task_id == "a"
    assert (
        catalog.find([{"role": "user", "content": [{"type": "text", "text": "Fix the parser."}]}]).task_id
        == "a"
    )
    assert catalog.find("Fix the parser.").task_id == "a"


def test_no_match_or_several_name_the_prompt() -> None:
    catalog = TaskCatalog(TASKS, num_tasks=None, indices=None)
    with pytest.raises(ValueError, match="'Solve world hunger now'... is the instruction of none of the 3"):
        catalog.find([{"role": "user", "content": "Solve world hunger now"}])
    with pytest.raises(ValueError, match=r"of 2 tasks \(b, c\); pass a task id"):
        catalog.find("Write a cache.")
    with pytest.raises(ValueError, match="needs a user message"):
        catalog.find([{"role": "system", "content": "hi"}])


def test_indices_and_num_tasks_cut_what_is_offered() -> None:
    assert [t.task_id for t in TaskCatalog(TASKS, num_tasks=2, indices=None).tasks] == ["a", "b"]
    assert [r["task_id"] for r in TaskCatalog(TASKS, num_tasks=None, indices=[2, 0]).rows()] == ["c", "a"]
    with pytest.raises(ValueError, match=r"indices \[7\] are out of range: the split has 3 tasks"):
        TaskCatalog(TASKS, num_tasks=None, indices=[0, 7])
    with pytest.raises(ValueError, match="indices is empty"):
        HarborSessionFactory("http://127.0.0.1:9", split="s", harness="nop", indices=[])
    with pytest.raises(ValueError, match="num_tasks=0: offer at least one task"):
        HarborSessionFactory("http://127.0.0.1:9", split="s", harness="nop", num_tasks=0)


def test_a_task_id_is_not_taken_for_a_prompt() -> None:
    assert not is_prompt("fix-pagination") and not is_prompt(3) and not is_prompt({"task_id": "x"})
    assert is_prompt("Fix the pagination bug") and is_prompt([{"role": "user", "content": "x"}])


def test_a_trl_dataset_row_that_names_no_task_stands_for_its_prompt() -> None:
    """TRL's harness trainer hands the factory `row["prompt"]`; ours hands it the row, which a TRL
    dataset fills with a prompt and columns of its own, and no task id."""
    messages = [{"role": "user", "content": "Fix the parser."}]
    row = {"prompt": messages, "difficulty": "easy"}
    assert task_reference(row) is messages and is_prompt(task_reference(row))
    catalog = TaskCatalog(TASKS, num_tasks=None, indices=None)
    assert catalog.find(task_reference(row)).task_id == "a"
    # A row that names its task keeps naming it, whatever its prompt says.
    assert task_reference({"prompt": messages, "task_id": "b"}) == {"prompt": messages, "task_id": "b"}
    assert task_reference({"prompt": messages, "task_index": 0}) == {"prompt": messages, "task_index": 0}
    assert task_reference({"difficulty": "easy"}) == {"difficulty": "easy"}
