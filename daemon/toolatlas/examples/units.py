"""Example MCP server: arithmetic and unit conversion (default transport: streamable HTTP).

    python -m toolatlas.examples.units [--transport stdio|sse|http] [--port N]
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Sequence
from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from toolatlas.examples import _serve

# Factor to the category's base unit (metre, kilogram, second, litre, pascal, byte).
UNITS: dict[str, dict[str, float]] = {
    "length": {"mm": 0.001, "cm": 0.01, "m": 1.0, "km": 1000.0, "in": 0.0254, "ft": 0.3048,
               "yd": 0.9144, "mi": 1609.344, "nmi": 1852.0},
    "mass": {"mg": 1e-6, "g": 0.001, "kg": 1.0, "t": 1000.0, "oz": 0.028349523125, "lb": 0.45359237},
    "time": {"ms": 0.001, "s": 1.0, "min": 60.0, "h": 3600.0, "day": 86400.0, "week": 604800.0},
    "volume": {"ml": 0.001, "l": 1.0, "m3": 1000.0, "tsp": 0.00492892, "tbsp": 0.0147868,
               "cup": 0.236588, "gal": 3.785411784},
    "pressure": {"pa": 1.0, "kpa": 1000.0, "bar": 100000.0, "atm": 101325.0, "psi": 6894.757},
    "data": {"b": 1.0, "kb": 1e3, "mb": 1e6, "gb": 1e9, "kib": 1024.0, "mib": 1024.0**2, "gib": 1024.0**3},
}
TEMPERATURE = ("c", "f", "k")

_OPS: dict[type, Callable[..., float]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
    ast.USub: operator.neg, ast.UAdd: operator.pos,
}
_FUNCS: dict[str, Callable[..., float]] = {
    "sqrt": math.sqrt, "log": math.log, "log10": math.log10, "exp": math.exp,
    "sin": math.sin, "cos": math.cos, "tan": math.tan, "abs": abs, "round": round,
}
_CONSTS = {"pi": math.pi, "e": math.e}


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 1000:
            raise ToolError("exponent too large")
        return _OPS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.Name) and node.id in _CONSTS:
        return _CONSTS[node.id]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS and not node.keywords:
        return _FUNCS[node.func.id](*[_eval(a) for a in node.args])
    raise ToolError(f"unsupported expression element: {ast.dump(node)[:80]}")


def _category(unit: str) -> str:
    for cat, table in UNITS.items():
        if unit in table:
            return cat
    raise ToolError(f"unknown unit {unit!r}; list_units shows the supported ones")


def build() -> MCPServer:
    server = MCPServer("units", instructions="Arithmetic and unit conversion, computed locally.")

    @server.tool(description="Evaluate an arithmetic expression: + - * / // % **, parentheses, pi, e, and sqrt, log, log10, exp, sin, cos, tan, abs, round.")
    def calculate(
        expression: Annotated[str, Field(description="e.g. '2 * (3 + 4) ** 2' or 'sqrt(2) * pi'", max_length=500)],
    ) -> dict[str, Any]:
        try:
            tree = ast.parse(expression, mode="eval")
        except SyntaxError as exc:
            raise ToolError(f"not an arithmetic expression: {exc.msg}") from None
        try:
            value = _eval(tree)
        except ZeroDivisionError:
            raise ToolError("division by zero") from None
        except (ValueError, OverflowError, TypeError) as exc:  # math domain errors, bad arity
            raise ToolError(f"cannot evaluate {expression!r}: {exc}") from None
        return {"expression": expression, "result": value}

    @server.tool(description="Convert a quantity between units of length, mass, time, volume, pressure or data size (e.g. miles to km, lb to kg, GiB to GB).")
    def convert_units(
        value: Annotated[float, Field(description="The amount to convert")],
        from_unit: Annotated[str, Field(description="Unit symbol to convert from, e.g. 'mi'")],
        to_unit: Annotated[str, Field(description="Unit symbol to convert to, e.g. 'km'")],
    ) -> dict[str, Any]:
        src, dst = from_unit.strip().lower(), to_unit.strip().lower()
        cat_src, cat_dst = _category(src), _category(dst)
        if cat_src != cat_dst:
            raise ToolError(f"cannot convert {cat_src} ({src}) to {cat_dst} ({dst})")
        result = value * UNITS[cat_src][src] / UNITS[cat_dst][dst]
        return {"value": value, "from": src, "to": dst, "result": round(result, 10), "category": cat_src}

    @server.tool(description="Convert a temperature between Celsius (c), Fahrenheit (f) and Kelvin (k).")
    def convert_temperature(
        value: Annotated[float, Field(description="The temperature to convert")],
        from_scale: Annotated[str, Field(description="'c', 'f' or 'k'")],
        to_scale: Annotated[str, Field(description="'c', 'f' or 'k'")],
    ) -> dict[str, Any]:
        src, dst = from_scale.strip().lower()[:1], to_scale.strip().lower()[:1]
        if src not in TEMPERATURE or dst not in TEMPERATURE:
            raise ToolError("temperature scales are c, f and k")
        celsius = {"c": value, "f": (value - 32) * 5 / 9, "k": value - 273.15}[src]
        result = {"c": celsius, "f": celsius * 9 / 5 + 32, "k": celsius + 273.15}[dst]
        return {"value": value, "from": src, "to": dst, "result": round(result, 6)}

    @server.tool(description="List the unit symbols convert_units accepts, grouped by category (length, mass, time, volume, pressure, data).")
    def list_units(
        category: Annotated[str | None, Field(description="Only this category")] = None,
    ) -> dict[str, list[str]]:
        if category is not None and category not in UNITS:
            raise ToolError(f"unknown category {category!r}; one of {', '.join(UNITS)}")
        return {cat: list(table) for cat, table in UNITS.items() if category in (None, cat)}

    return server


def main(argv: Sequence[str] | None = None) -> None:
    args = _serve.parser("Example MCP server: arithmetic and unit conversion.", "http", 8932).parse_args(argv)
    _serve.run(build(), args)


if __name__ == "__main__":
    main()
