"""The log of labelled examples: one Redis Stream per task, the truth the stores are built from.

An append is acknowledged only once Redis has it on disk (WAITAOF after an
`appendfsync always` write). Example ids are int64 (the store's ids); a
client may choose them, so a retried POST is idempotent: an id already in the
log with the same text and label is a no-op, with different content a
conflict, and a batch with a conflict writes nothing (one Lua script checks
and appends atomically, and counts the examples added: automatic training's
clock). The same script refuses a label that the task's stored spec lacks: a
label removed from the task (services/bus/task_labels.py) cannot gain an
example between the removal's check and its write; a batch that brings labels of its own stores the
grown spec in the same script (`SpecSwap`). Deleting appends a
tombstone, so a replica that replays the log ends with the same store as one
that saw every request; relabelling appends a tombstone and the example under
its new label, in one script.

A replica reads the entries it has not applied yet before each batch it serves, in the same round trip
as the task's stored spec and generation (`read_with_spec`): it serves every example acknowledged
before the batch, by any replica, and never a task changed or deleted meanwhile.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, cast

import redis
from openbook.prompting import TextInput

from services.bus.keys import GENERATIONS_KEY, TASKS_KEY
from services.bus.replies import StreamEntry

MAX_ID = 2**63 - 1

_APPEND = """
local n = tonumber(ARGV[1])
local task, expected, grown = ARGV[2 + 3 * n], ARGV[3 + 3 * n], ARGV[4 + 3 * n]
local spec = redis.call('HGET', KEYS[4], task)
if grown ~= '' then
  if spec ~= expected then
    return redis.error_reply('SPEC_CHANGED')
  end
  spec = grown
end
if spec then
  local labels = cjson.decode(spec)['labels']
  for i = 0, n - 1 do
    if labels[cjson.decode(ARGV[4 + 3 * i])['label']] == nil then
      return redis.error_reply('UNKNOWN_LABEL ' .. i)
    end
  end
end
for i = 0, n - 1 do
  local id = ARGV[2 + 3 * i]
  if id ~= '' then
    local existing = redis.call('HGET', KEYS[2], id)
    if existing and existing ~= ARGV[3 + 3 * i] then
      return redis.error_reply('CONFLICT ' .. id)
    end
  end
end
if grown ~= '' then
  redis.call('HSET', KEYS[4], task, grown)
end
local out = {}
for i = 0, n - 1 do
  local id = ARGV[2 + 3 * i]
  if id == '' then
    repeat id = tostring(redis.call('INCR', KEYS[3])) until redis.call('HEXISTS', KEYS[2], id) == 0
  end
  if redis.call('HEXISTS', KEYS[2], id) == 1 then
    table.insert(out, {id, ''})
  else
    local offset = redis.call('XADD', KEYS[1], '*', 'op', 'add', 'id', id, 'example', ARGV[4 + 3 * i])
    redis.call('HSET', KEYS[2], id, ARGV[3 + 3 * i])
    redis.call('INCR', KEYS[5])  -- examples added: automatic training's clock (services.engine.autotrain)
    table.insert(out, {id, offset})
  end
end
return out
"""

_DELETE = """
if redis.call('HDEL', KEYS[2], ARGV[1]) == 0 then
  return false
end
return redis.call('XADD', KEYS[1], '*', 'op', 'delete', 'id', ARGV[1])
"""


# A label changed in one step: a tombstone and the example again under its new label, so a replica that
# replays the log re-embeds it with that label. The example must still be the one the caller read (its
# digest), and the new label one of the task's.
_RELABEL = """
local existing = redis.call('HGET', KEYS[2], ARGV[1])
if not existing then
  return false
end
if existing ~= ARGV[2] then
  return redis.error_reply('CONFLICT ' .. ARGV[1])
end
local spec = redis.call('HGET', KEYS[3], ARGV[5])
if spec and cjson.decode(spec)['labels'][ARGV[6]] == nil then
  return redis.error_reply('UNKNOWN_LABEL 0')
end
redis.call('XADD', KEYS[1], '*', 'op', 'delete', 'id', ARGV[1])
local offset = redis.call('XADD', KEYS[1], '*', 'op', 'add', 'id', ARGV[1], 'example', ARGV[4])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
return offset
"""


class LogError(RuntimeError):
    """The log could not take the write durably (e.g. the server's AOF is off or failing)."""


class UnknownLabel(ValueError):
    """An example's label is not (or no longer) one of the task's; nothing of its batch was written."""

    def __init__(self, position: int, label: str) -> None:
        super().__init__(f"label {label!r} is not one of the task's labels")
        self.position = position  # in the batch


class SpecChanged(RuntimeError):
    """The task's spec is no longer the one a batch's spec change was decided on; nothing was written."""


@dataclass(frozen=True)
class SpecSwap:
    """A change of the task's spec that a batch brings (labels it adds), stored with it or not at all."""

    expected: bytes  # the spec as stored when the change was decided
    replacement: str  # the spec stored in its place


class ConflictError(ValueError):
    def __init__(self, example_id: int) -> None:
        super().__init__(f"example id {example_id} is already in the log with a different text or label")
        self.example_id = example_id


@dataclass(frozen=True)
class NewExample:
    text: TextInput
    label: str
    id: int | None = None  # None: the log assigns one


@dataclass(frozen=True)
class Appended:
    id: int
    offset: str | None  # stream entry id; None when the example was already in the log (a retry)


@dataclass(frozen=True)
class LogEntry:
    offset: str
    op: Literal["add", "delete"]
    id: int
    text: TextInput | None = None
    label: str | None = None


Examples = dict[int, tuple[TextInput, str]]  # id -> (text, label)


@dataclass(frozen=True)
class Folded:
    """What some log entries leave, applied in order (`fold`): each id's last state among them."""

    examples: Examples = field(default_factory=dict)  # ids whose last entry adds them: (text, label)
    deleted: frozenset[int] = frozenset()  # ids whose last entry deletes them
    offset: str | None = None  # the last entry's; None: no entry


def fold(entries: Iterable[LogEntry]) -> Folded:
    """The one fold of the log: adds minus deletes, in order, so that a later entry for an id supersedes
    an earlier one. The worker folds the whole log into the examples it trains on; a replica folds what it
    has not applied yet into its store (services/engine/replay.py) and its texts (runtime.py)."""
    examples: Examples = {}
    deleted: set[int] = set()
    offset = None
    for entry in entries:
        if entry.op == "add":
            assert entry.text is not None and entry.label is not None  # an add always carries both
            examples[entry.id] = (entry.text, entry.label)
            deleted.discard(entry.id)
        else:
            examples.pop(entry.id, None)
            deleted.add(entry.id)
        offset = entry.offset
    return Folded(examples, frozenset(deleted), offset)


def _payload(example: NewExample) -> str:
    text = example.text if isinstance(example.text, str) else list(example.text)
    return json.dumps({"text": text, "label": example.label}, ensure_ascii=False, sort_keys=True)


@dataclass(frozen=True)
class SpecAndEntries:
    """The task as Redis holds it at one moment: its spec, its generation, and log entries."""

    spec: bytes | None  # the stored spec, opaque JSON (None: no such task)
    generation: bytes  # how many times a task of this name was deleted (keys.GENERATIONS_KEY)
    entries: list[LogEntry]  # the log's entries after the offset asked for, oldest first


class ExampleLog:
    def __init__(self, client: redis.Redis, task: str, *, durability_timeout_ms: int = 5000) -> None:
        self.client = client
        self.task = task
        prefix = f"openbook:task:{task}"
        self.stream_key = f"{prefix}:examples"
        self.ids_key = f"{prefix}:example-ids"
        self.counter_key = f"{prefix}:next-id"
        # How many examples were ever added (deletes and retries do not count): automatic training's clock.
        self.added_key = f"{prefix}:added"
        self.durability_timeout_ms = durability_timeout_ms
        self._append = client.register_script(_APPEND)
        self._delete = client.register_script(_DELETE)
        self._relabel = client.register_script(_RELABEL)

    def append(self, examples: Sequence[NewExample], *, spec_swap: SpecSwap | None = None) -> list[Appended]:
        """Append atomically and durably; raises ConflictError on a changed id and UnknownLabel on a label
        the task's stored spec lacks (nothing written). With no spec stored, any label goes.

        With `spec_swap`, the task's spec is replaced in the same step, and the labels are checked against
        the replacement: both are written or neither (SpecChanged if the stored spec is not the expected
        one), so a label added for the batch never lands without it, nor the batch without its labels.
        """
        given = [e.id for e in examples if e.id is not None]
        for example_id in given:
            if not 0 <= example_id <= MAX_ID:
                raise ValueError(f"example id {example_id} is outside 0..2^63-1")
        if len(set(given)) != len(given):
            raise ValueError("a batch repeats an example id")
        args: list[str | int | bytes] = [len(examples)]
        for example in examples:
            payload = _payload(example)
            args += ["" if example.id is None else str(example.id), _digest(payload), payload]
        args += [self.task, *((spec_swap.expected, spec_swap.replacement) if spec_swap else ("", ""))]
        keys = [self.stream_key, self.ids_key, self.counter_key, TASKS_KEY, self.added_key]
        try:
            rows = self._append(keys=keys, args=args)
        except redis.ResponseError as error:
            if str(error).startswith("SPEC_CHANGED"):
                raise SpecChanged(f"the spec of task {self.task!r} changed meanwhile") from None
            if str(error).startswith("CONFLICT"):
                raise ConflictError(int(str(error).split()[1])) from None
            if str(error).startswith("UNKNOWN_LABEL"):
                position = int(str(error).split()[1])
                raise UnknownLabel(position, examples[position].label) from None
            raise
        self._wait_durable()
        return [Appended(int(i), o.decode() if o else None) for i, o in ((r[0], r[1]) for r in rows)]

    def delete(self, example_id: int) -> bool:
        """Tombstone an example; False if the log does not hold it."""
        offset = self._delete(keys=[self.stream_key, self.ids_key], args=[str(example_id)])
        if offset is None:
            return False
        self._wait_durable()
        return True

    def relabel(self, example: NewExample, old_label: str) -> bool:
        """Give the example `example.id`, now labelled `old_label`, the label `example.label`, durably and
        atomically; False if the log does not hold it. ConflictError when the log holds it with another
        text or label than the caller read, UnknownLabel when the task lacks the new label."""
        assert example.id is not None
        if old_label == example.label:
            return example.id in self
        old, new = _payload(NewExample(example.text, old_label)), _payload(example)
        keys = [self.stream_key, self.ids_key, TASKS_KEY]
        args = [str(example.id), _digest(old), _digest(new), new, self.task, example.label]
        try:
            offset = self._relabel(keys=keys, args=args)
        except redis.ResponseError as error:
            if str(error).startswith("CONFLICT"):
                raise ConflictError(example.id) from None
            if str(error).startswith("UNKNOWN_LABEL"):
                raise UnknownLabel(0, example.label) from None
            raise
        if offset is None:
            return False
        self._wait_durable()
        return True

    def __contains__(self, example_id: object) -> bool:
        return bool(self.client.hexists(self.ids_key, str(example_id)))

    def read(self, after: str = "0-0", count: int | None = None) -> list[LogEntry]:
        """Entries strictly after `after` (a stream offset), oldest first."""
        raw = cast(
            list[StreamEntry], self.client.xrange(self.stream_key, min=f"({after}", max="+", count=count)
        )
        return [_entry(offset, fields) for offset, fields in raw]

    def examples(self) -> Folded:
        """The whole log folded: the examples it holds now, and the offset of its last entry."""
        return fold(self.read())

    def read_with_spec(self, after: str = "0-0") -> SpecAndEntries:
        """The task's stored spec and generation, and the entries strictly after `after`: one round trip
        (a pipeline, not a transaction: the three reads are sent together, answered in order)."""
        pipe = self.client.pipeline(transaction=False)
        pipe.hget(TASKS_KEY, self.task)
        pipe.hget(GENERATIONS_KEY, self.task)
        pipe.xrange(self.stream_key, min=f"({after}", max="+")
        spec, generation, raw = pipe.execute()
        entries = [_entry(offset, fields) for offset, fields in cast(list[StreamEntry], raw)]
        return SpecAndEntries(spec, generation or b"0", entries)

    def __len__(self) -> int:
        return int(self.client.hlen(self.ids_key))

    def _wait_durable(self) -> None:
        local, _replicas = self.client.execute_command("WAITAOF", 1, 0, self.durability_timeout_ms)
        if int(local) < 1:
            raise LogError("Redis did not confirm the write on disk (is appendonly on?)")


def _digest(payload: str) -> str:
    return hashlib.sha256(payload.encode()).hexdigest()


def _entry(offset: bytes, fields: dict[bytes, bytes]) -> LogEntry:
    op = fields[b"op"].decode()
    example_id = int(fields[b"id"])
    if op == "delete":
        return LogEntry(offset.decode(), "delete", example_id)
    example = json.loads(fields[b"example"])
    text = example["text"] if isinstance(example["text"], str) else tuple(example["text"])
    return LogEntry(offset.decode(), "add", example_id, text, example["label"])
