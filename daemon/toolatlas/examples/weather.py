"""Example MCP server: weather forecasts and alerts from canned data (default transport: SSE).

    python -m toolatlas.examples.weather [--transport stdio|sse|http] [--port N]

The data is fixed and deterministic (no network): good for demos and tests, useless for
planning a picnic.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from toolatlas.examples import _serve

CITIES: dict[str, dict[str, Any]] = {
    "oslo": {"country": "NO", "region": "eastern norway", "base_c": 4, "conditions": ["snow", "cloudy", "clear"]},
    "berlin": {"country": "DE", "region": "brandenburg", "base_c": 9, "conditions": ["cloudy", "rain", "clear"]},
    "lisbon": {"country": "PT", "region": "lisbon", "base_c": 17, "conditions": ["clear", "clear", "windy"]},
    "new york": {"country": "US", "region": "new york", "base_c": 11, "conditions": ["rain", "clear", "cloudy"]},
    "tokyo": {"country": "JP", "region": "kanto", "base_c": 14, "conditions": ["clear", "rain", "humid"]},
    "cairo": {"country": "EG", "region": "cairo", "base_c": 24, "conditions": ["clear", "dust", "clear"]},
}

ALERTS: dict[str, list[dict[str, str]]] = {
    "eastern norway": [{"event": "Snow", "severity": "moderate", "text": "15-25 cm of snow expected above 300 m."}],
    "new york": [{"event": "Coastal flood", "severity": "minor", "text": "Minor flooding at high tide along the shore."}],
    "cairo": [{"event": "Dust storm", "severity": "moderate", "text": "Reduced visibility in the afternoon."}],
}


def _city(name: str) -> dict[str, Any]:
    key = name.strip().lower()
    if key not in CITIES:
        raise ToolError(f"unknown city {name!r}; known cities: {', '.join(sorted(CITIES))}")
    return CITIES[key]


def _to_unit(celsius: float, units: str) -> float:
    return round(celsius * 9 / 5 + 32, 1) if units == "fahrenheit" else round(celsius, 1)


def build() -> MCPServer:
    server = MCPServer("weather", instructions="Canned weather data for a few cities: forecasts, current conditions, alerts.")

    @server.tool(description="Daily weather forecast for a city: high/low temperature, conditions and chance of rain per day.")
    def get_forecast(
        city: Annotated[str, Field(description="City name, e.g. 'Oslo' (see list_cities)")],
        days: Annotated[int, Field(description="Number of days, 1-7", ge=1, le=7)] = 3,
        units: Annotated[Literal["celsius", "fahrenheit"], Field(description="Temperature unit")] = "celsius",
    ) -> dict[str, Any]:
        c = _city(city)
        out = []
        for d in range(days):
            high = c["base_c"] + (d * 3) % 5
            cond = c["conditions"][d % len(c["conditions"])]
            out.append({"day": d + 1, "high": _to_unit(high, units), "low": _to_unit(high - 6, units),
                        "conditions": cond, "chance_of_rain": 70 if cond == "rain" else 10})
        return {"city": city.strip().title(), "units": units, "days": out}

    @server.tool(description="Current weather conditions in a city: temperature, conditions, wind speed and humidity.")
    def get_current_conditions(
        city: Annotated[str, Field(description="City name, e.g. 'Lisbon'")],
        units: Annotated[Literal["celsius", "fahrenheit"], Field(description="Temperature unit")] = "celsius",
    ) -> dict[str, Any]:
        c = _city(city)
        return {"city": city.strip().title(), "temperature": _to_unit(c["base_c"], units), "units": units,
                "conditions": c["conditions"][0], "wind_kmh": 12 + len(city) % 9, "humidity_pct": 55 + len(city) % 30}

    @server.tool(description="Active severe-weather alerts (warnings and advisories) for the region around a city.")
    def get_alerts(city: Annotated[str, Field(description="City name whose region to check")]) -> dict[str, Any]:
        c = _city(city)
        return {"city": city.strip().title(), "region": c["region"], "alerts": ALERTS.get(c["region"], [])}

    @server.tool(description="List the cities this weather service has data for, with their country codes.")
    def list_cities() -> list[dict[str, str]]:
        return [{"city": name.title(), "country": c["country"]} for name, c in sorted(CITIES.items())]

    return server


def main(argv: Sequence[str] | None = None) -> None:
    args = _serve.parser("Example MCP server: canned weather data.", "sse", 8931).parse_args(argv)
    _serve.run(build(), args)


if __name__ == "__main__":
    main()
