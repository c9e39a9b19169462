"""The Redis keys every process agrees on: where task specs, their generations and automatic training live.

The bus stores a task's spec as opaque JSON under its name; what a spec means is the engine's
(services/engine/task_spec.py).
"""

from __future__ import annotations

TASKS_KEY = "openbook:tasks"  # hash: task name -> spec JSON
# hash: task name -> how many times a task of that name was deleted. Never deleted itself, so a job or
# checkpoint made for an earlier task of the same name can be told from one of the task that exists now.
GENERATIONS_KEY = "openbook:task-generations"
TASK_NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"  # also what makes a name safe as a directory name


def autotrain_key(task: str) -> str:
    """Hash: the example count the task's last automatic job was queued at, and that job's id."""
    return f"openbook:task:{task}:autotrain"
