"""Arguments checked against a tool's inputSchema before a call leaves the gateway.

fastjsonschema (compiled, ~2 us a call) is the fast path; only when it rejects do we ask
jsonschema for every problem with its path, so a model can repair the whole call at once.
A schema that does not compile is not enforced (the upstream still validates): logged once.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import fastjsonschema
import jsonschema

from toolatlas.catalog.model import ToolRecord

log = logging.getLogger(__name__)

MAX_PROBLEMS = 10
_CACHE_SIZE = 4096


class ArgumentValidator:
    """Compiled validators cached by tool content hash (a changed schema recompiles)."""

    def __init__(self) -> None:
        self._compiled: OrderedDict[str, Callable[[Any], Any] | None] = OrderedDict()
        self._lock = threading.Lock()

    def _get(self, rec: ToolRecord) -> Callable[[Any], Any] | None:
        key = rec.content_hash
        with self._lock:
            if key in self._compiled:
                self._compiled.move_to_end(key)
                return self._compiled[key]
        try:
            fn: Callable[[Any], Any] | None = fastjsonschema.compile(rec.input_schema)
        except Exception as exc:  # any schema error: do not enforce, say so once
            log.warning("inputSchema of %s does not compile (%s); its arguments are not checked", rec.name, exc)
            fn = None
        with self._lock:
            self._compiled[key] = fn
            while len(self._compiled) > _CACHE_SIZE:
                self._compiled.popitem(last=False)
        return fn

    def check(self, rec: ToolRecord, arguments: dict[str, Any]) -> list[str]:
        """Problems with `arguments`, each naming its path; [] when they are valid."""
        fn = self._get(rec)
        if fn is None:
            return []
        try:
            fn(arguments)
            return []
        except fastjsonschema.JsonSchemaException:
            pass
        try:
            validator = jsonschema.validators.validator_for(rec.input_schema)(rec.input_schema)
            errors = sorted(validator.iter_errors(arguments), key=lambda e: list(e.absolute_path))
        except Exception as exc:
            return [f"(schema check failed: {exc})"]
        problems = []
        for err in errors[:MAX_PROBLEMS]:
            path = "/".join(str(p) for p in err.absolute_path)
            problems.append(f"at {'/' + path if path else 'the top level'}: {err.message}")
        if len(errors) > MAX_PROBLEMS:
            problems.append(f"and {len(errors) - MAX_PROBLEMS} more")
        return problems or ["the arguments were rejected by the schema"]
