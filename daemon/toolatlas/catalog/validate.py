"""Arguments checked against a tool's inputSchema before a call leaves the gateway.

An inputSchema comes from an upstream, so it is treated as hostile input:

- **No `$ref` is ever fetched or read.** Before anything compiles a schema, every `$ref` /
  `$dynamicRef` / `$recursiveRef` that is not local (does not start with `#`) is removed, and
  so is every non-anchor `$id` / `id` (a base URI could turn a local ref into a remote one).
  The part a removed ref stood for is *not enforced*; the rest of the schema still is (the
  upstream validates its own arguments anyway); logged once per schema. Belt and braces:
  fastjsonschema gets `handlers` that refuse every URI scheme, jsonschema a `referencing`
  Registry whose `retrieve` refuses. Local `#/...` refs (into `$defs` / `definitions`) work.
- **`$ref` cycles** that never consume the argument (`a -> a`) would recurse forever: a
  RecursionError while compiling or checking marks the schema as not enforced.
- **Regex patterns** (`pattern`, `patternProperties`, and `additionalProperties` next to
  `patternProperties`) never run on the `re` engine (which backtracks catastrophically and holds
  the GIL): they run on the `regex` module with a per-call time budget (`REGEX_BUDGET`, shared
  by every pattern of one check) and `concurrent=True` (the GIL is released while matching). A
  pattern that exceeds the budget rejects the call with a message naming the limit.
- `check_async` runs the check in a worker thread, bounded by `CHECK_LIMIT`, so nothing
  upstream-controlled and CPU-bound in validation runs on the event loop.

fastjsonschema (compiled, ~2 us a call) is the fast path for schemas without patterns; only
when it rejects do we ask jsonschema for every problem with its path, so a model can repair
the whole call at once. A schema that does not compile is not enforced: logged once.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import anyio
import anyio.to_thread
import fastjsonschema
import jsonschema
import referencing
import referencing.exceptions
import regex  # type: ignore[import-untyped]  # (no stubs installed)

from toolatlas.catalog.model import ToolRecord

log = logging.getLogger(__name__)

MAX_PROBLEMS = 10
PROBLEM_CHARS = 300  # of jsonschema's words for one problem, which quote the caller's value whole
_CACHE_SIZE = 4096
REGEX_BUDGET = 0.25  # seconds of regex matching one check may spend, over all its patterns
CHECK_LIMIT = 2.0  # seconds one check may take in its worker thread

_REF_KEYS = ("$ref", "$dynamicRef", "$recursiveRef")
_DATA_KEYS = frozenset({"const", "enum", "default", "examples"})  # instance data, not schemas
_NAME_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas",
                        "dependencies"})
_PATTERN_KEYS = frozenset({"pattern", "patternProperties"})


class PatternTimeout(Exception):
    """A schema's regex did not finish within the check's budget."""

    def __init__(self, pattern: str) -> None:
        super().__init__(pattern)
        self.pattern = pattern


def _refuse(uri: str) -> Any:
    raise referencing.exceptions.NoSuchResource(ref=uri)  # type: ignore[call-arg]


def _refuse_handler(uri: str) -> Any:
    raise ValueError(f"remote $ref {uri!r} is not resolved")


# Every scheme urllib would open, and then some: fastjsonschema only consults these.
_HANDLERS = {s: _refuse_handler for s in ("http", "https", "file", "ftp", "data", "jar", "urn", "")}
_REGISTRY: referencing.Registry[Any] = referencing.Registry(retrieve=_refuse)  # type: ignore[call-arg]


def sanitise(schema: Any) -> tuple[Any, list[str], bool]:
    """(a copy of `schema` without non-local refs or base ids, the refs removed, whether it
    has regex patterns)."""
    removed: list[str] = []
    patterns = False

    def walk(node: Any) -> Any:
        nonlocal patterns
        if isinstance(node, list):
            return [walk(x) for x in node]
        if not isinstance(node, dict):
            return node
        out: dict[str, Any] = {}
        for k, v in node.items():
            if k in _DATA_KEYS:
                out[k] = v
            elif k in _REF_KEYS and isinstance(v, str) and not v.startswith("#"):
                removed.append(v)
            elif k in ("$id", "id") and isinstance(v, str) and not v.startswith("#"):
                continue
            elif k in _NAME_MAPS and isinstance(v, dict):
                out[k] = {name: walk(sub) for name, sub in v.items()}
                patterns = patterns or (k == "patternProperties" and bool(v))
            else:
                if k == "pattern" and isinstance(v, str):
                    patterns = True
                out[k] = walk(v)
        return out

    return walk(schema), removed, patterns


_budget = threading.local()


@functools.lru_cache(maxsize=1024)
def _compiled(pattern: str) -> Any:
    return regex.compile(pattern)


def _search(pattern: str, text: str) -> bool:
    deadline: float = getattr(_budget, "deadline", time.monotonic() + REGEX_BUDGET)
    left = deadline - time.monotonic()
    if left <= 0:
        raise PatternTimeout(pattern)
    try:
        return _compiled(pattern).search(text, timeout=left, concurrent=True) is not None
    except TimeoutError:
        raise PatternTimeout(pattern) from None


def _pattern(validator: Any, patrn: str, instance: Any, schema: Any) -> Iterator[Any]:
    if validator.is_type(instance, "string") and not _search(patrn, instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {patrn!r}")


def _pattern_properties(validator: Any, pprops: dict[str, Any], instance: Any, schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for patrn, subschema in pprops.items():
        for k, v in instance.items():
            if _search(patrn, k):
                yield from validator.descend(v, subschema, path=k, schema_path=patrn)


def _additional_properties(validator: Any, aP: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    props = schema.get("properties", {})
    pats = schema.get("patternProperties", {})
    extras = [k for k in instance if k not in props and not any(_search(p, k) for p in pats)]
    if validator.is_type(aP, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], aP, path=extra)
    elif not aP and extras:
        yield jsonschema.ValidationError(f"Additional properties are not allowed ({', '.join(map(repr, extras))} "
                                         f"{'was' if len(extras) == 1 else 'were'} unexpected)")


_SAFE = {"pattern": _pattern, "patternProperties": _pattern_properties, "additionalProperties": _additional_properties}


class _Compiled:
    """One schema, sanitised, with its fast checker (None when it has patterns)."""

    def __init__(self, schema: Any, fast: Callable[[Any], Any] | None) -> None:
        self.schema = schema
        self.fast = fast
        base = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        self.full = jsonschema.validators.extend(base, _SAFE)(schema, registry=_REGISTRY)


def _prepared(schema: Any, what: str) -> tuple[Any, bool]:
    """(`schema` sanitised, whether it has patterns), its removed refs logged under `what`
    and its patterns compiled on `regex` (one the engine rejects raises here)."""
    clean, removed, patterns = sanitise(schema)
    if removed:
        log.warning("%s has non-local $ref %s: never fetched; that part is not checked",
                    what, ", ".join(repr(r) for r in removed[:5]))
    for p in _pattern_strings(clean):
        _compiled(p)
    return clean, patterns


class Problem(NamedTuple):
    """One problem with a call's arguments: `shown` to the caller (jsonschema's words, which
    quote the offending value, so a model can repair it) and `logged` (the path, the keyword
    and the schema's own constraint, never the value) for events and the audit trail."""

    shown: str
    logged: str

    @classmethod
    def same(cls, text: str) -> Problem:
        """A problem whose text quotes no argument."""
        return cls(text, text)


# Keywords whose schema value is said in a logged problem (a scalar or a short list of them).
_SAID = frozenset({"type", "enum", "const", "format", "required", "minLength", "maxLength", "minimum", "maximum",
                   "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minItems", "maxItems", "uniqueItems",
                   "minProperties", "maxProperties", "pattern"})


def _constraint(err: jsonschema.ValidationError) -> str:
    """` (the schema's value)` of `err`'s keyword, short, when it is one worth saying."""
    if err.validator not in _SAID:
        return ""
    said = repr(err.validator_value)
    return f" ({said if len(said) <= 80 else said[:77] + '...'})"


class ArgumentValidator:
    """Compiled validators cached by tool content hash (a changed schema recompiles)."""

    def __init__(self) -> None:
        self._compiled: OrderedDict[str, _Compiled | None] = OrderedDict()
        self._lock = threading.Lock()
        self._workers: anyio.CapacityLimiter | None = None  # made on first use, inside the loop

    def _get(self, rec: ToolRecord) -> _Compiled | None:
        key = rec.content_hash
        with self._lock:
            if key in self._compiled:
                self._compiled.move_to_end(key)
                return self._compiled[key]
        got: _Compiled | None
        try:
            schema, patterns = _prepared(rec.input_schema, f"inputSchema of {rec.name}")
            fast = None if patterns else fastjsonschema.compile(schema, handlers=_HANDLERS)
            got = _Compiled(schema, fast)
        except (Exception, RecursionError) as exc:  # any schema error: do not enforce, say so once
            log.warning("inputSchema of %s does not compile (%s); its arguments are not checked", rec.name, exc)
            got = None
        self._remember(key, got)
        return got

    def _remember(self, key: str, got: _Compiled | None) -> None:
        with self._lock:
            self._compiled[key] = got
            while len(self._compiled) > _CACHE_SIZE:
                self._compiled.popitem(last=False)

    def check(self, rec: ToolRecord, arguments: dict[str, Any]) -> list[Problem]:
        """Problems with `arguments`, each naming its path; [] when they are valid."""
        c = self._get(rec)
        if c is None:
            return []
        _budget.deadline = time.monotonic() + REGEX_BUDGET
        try:
            if c.fast is not None:
                try:
                    c.fast(arguments)
                    return []
                except fastjsonschema.JsonSchemaException:
                    pass
            errors = sorted(c.full.iter_errors(arguments), key=lambda e: list(e.absolute_path))
            if not errors and c.fast is None:
                return []
        except PatternTimeout as exc:
            return [Problem.same(f"the schema's pattern {exc.pattern[:80]!r} did not finish within the "
                                 f"{REGEX_BUDGET} s regex time limit on these arguments; the call was not sent")]
        except RecursionError:
            log.warning("inputSchema of %s recurses without end ($ref cycle); its arguments are not checked", rec.name)
            self._remember(rec.content_hash, None)
            return []
        except Exception:
            log.exception("checking arguments against the inputSchema of %s failed", rec.name)
            return [Problem.same("the arguments could not be checked against the tool's inputSchema; "
                                 "the call was not sent")]
        finally:
            del _budget.deadline
        problems: list[Problem] = []
        for err in errors[:MAX_PROBLEMS]:
            path = "/".join(str(p) for p in err.absolute_path)
            at = f"at {'/' + path if path else 'the top level'}"
            said = err.message if len(err.message) <= PROBLEM_CHARS else err.message[:PROBLEM_CHARS] + "..."
            problems.append(Problem(f"{at}: {said}", f"{at}: fails {err.validator}{_constraint(err)}"))
        if len(errors) > MAX_PROBLEMS:
            problems.append(Problem.same(f"and {len(errors) - MAX_PROBLEMS} more"))
        return problems or [Problem.same("the arguments were rejected by the schema")]

    async def check_async(self, rec: ToolRecord, arguments: dict[str, Any]) -> list[Problem]:
        """`check` in a worker thread (off the event loop), bounded by CHECK_LIMIT.

        The common case stays on the loop: a schema already compiled, without patterns, whose
        compiled fastjsonschema check accepts the arguments (microseconds, linear in them).
        Compiling, patterns and reporting problems go to the thread."""
        with self._lock:
            c = self._compiled.get(rec.content_hash)
        if c is not None and c.fast is not None:
            try:
                c.fast(arguments)
                return []
            except fastjsonschema.JsonSchemaException:
                pass  # the thread lists every problem
            except RecursionError:
                pass  # a $ref cycle: the thread path reports it as not enforced
        if self._workers is None:
            self._workers = anyio.CapacityLimiter(2)
        with anyio.move_on_after(CHECK_LIMIT):
            return await anyio.to_thread.run_sync(self.check, rec, arguments, limiter=self._workers,
                                                  abandon_on_cancel=True)
        return [Problem.same(f"checking the arguments against the inputSchema did not finish within the "
                             f"{CHECK_LIMIT} s limit; the call was not sent")]


class OutputValidator:
    """Structured content against a tool's outputSchema, with the messages of the SDK
    client's `validate_tool_result`, checked like arguments (above): an outputSchema comes
    from the upstream too. The SDK's own check ran `re` on the event loop, where one
    catastrophic `pattern` in an outputSchema, met by the upstream's own result, froze every
    client of the daemon. Here no `$ref` is fetched, patterns run on `regex` within
    REGEX_BUDGET, and only an accepted result of a schema without patterns is checked on the
    loop (compiled fastjsonschema, microseconds; the SDK's jsonschema took ~0.06 ms a call).

    Compiled once per tool and schema object (a listing that changes a tool's schema brings
    a new object). Thread-safe."""

    def __init__(self) -> None:
        self._compiled: dict[str, tuple[Any, _Compiled | str | None]] = {}
        self._lock = threading.Lock()
        self._workers: anyio.CapacityLimiter | None = None

    def _get(self, tool: str, schema: Any) -> _Compiled | str | None:
        """The check of `schema`, the SDK's message when the schema itself is invalid, or
        None when it cannot be enforced (logged)."""
        with self._lock:
            held = self._compiled.get(tool)
        if held is not None and held[0] is schema:
            return held[1]
        got: _Compiled | str | None
        try:
            jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator).check_schema(schema)
        except jsonschema.SchemaError as exc:
            got = f"Invalid schema for tool {tool}: {exc}"
        else:
            try:
                clean, patterns = _prepared(schema, f"outputSchema of {tool}")
                fast = None
                if not patterns:
                    try:
                        fast = fastjsonschema.compile(clean, handlers=_HANDLERS)
                    except (Exception, RecursionError):  # noqa: BLE001 - jsonschema alone checks it
                        fast = None
                got = _Compiled(clean, fast)
            except (Exception, RecursionError) as exc:  # noqa: BLE001 - not enforced, said once
                log.warning("outputSchema of %s does not compile (%s); its results are not checked", tool, exc)
                got = None
        with self._lock:
            self._compiled[tool] = (schema, got)
        return got

    def accepts(self, tool: str, schema: Any, content: Any) -> bool:
        """Whether the compiled check of a schema without patterns accepts `content` (the
        case the event loop may run); False means: ask `check`."""
        with self._lock:
            held = self._compiled.get(tool)
        if held is None or held[0] is not schema or not isinstance(held[1], _Compiled) or held[1].fast is None:
            return False
        try:
            held[1].fast(content)
            return True
        except (fastjsonschema.JsonSchemaException, RecursionError):
            return False

    def check(self, tool: str, schema: Any, content: Any) -> str | None:
        """None when `content` conforms to `schema` (or the schema cannot be enforced), else
        the message the call fails with. Blocking: call it from a worker thread."""
        c = self._get(tool, schema)
        if not isinstance(c, _Compiled):
            return c
        _budget.deadline = time.monotonic() + REGEX_BUDGET
        try:
            if c.fast is not None:
                try:
                    c.fast(content)
                    return None
                except fastjsonschema.JsonSchemaException:
                    pass
            error = jsonschema.exceptions.best_match(c.full.iter_errors(content))
        except PatternTimeout as exc:
            return (f"Structured content returned by tool {tool} could not be checked: its outputSchema's pattern "
                    f"{exc.pattern[:80]!r} did not finish within the {REGEX_BUDGET} s regex time limit")
        except referencing.exceptions.Unresolvable as exc:
            return f"Invalid schema for tool {tool}: {exc}"
        except RecursionError:
            log.warning("outputSchema of %s recurses without end ($ref cycle); its results are not checked", tool)
            with self._lock:
                self._compiled[tool] = (schema, None)
            return None
        finally:
            del _budget.deadline
        return None if error is None else f"Invalid structured content returned by tool {tool}: {error}"

    async def check_async(self, tool: str, schema: Any, content: Any) -> str | None:
        """`check`, on the loop only for `accepts`; else in a worker thread bounded by CHECK_LIMIT."""
        if self.accepts(tool, schema, content):
            return None
        if self._workers is None:
            self._workers = anyio.CapacityLimiter(2)
        with anyio.move_on_after(CHECK_LIMIT):
            return await anyio.to_thread.run_sync(self.check, tool, schema, content, limiter=self._workers,
                                                  abandon_on_cancel=True)
        return (f"checking the structured content of tool {tool} against its outputSchema did not finish within "
                f"the {CHECK_LIMIT} s limit")


def _pattern_strings(node: Any) -> Iterator[str]:
    """Every regex of a (sanitised) schema, so a pattern the regex engine rejects fails compile."""
    if isinstance(node, list):
        for x in node:
            yield from _pattern_strings(x)
    elif isinstance(node, dict):
        for k, v in node.items():
            if k in _DATA_KEYS:
                continue
            if k == "pattern" and isinstance(v, str):
                yield v
            elif k == "patternProperties" and isinstance(v, dict):
                yield from v
            yield from _pattern_strings(v)
